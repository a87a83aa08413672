"""The scripted SIP caller's signalling (`voice.devtools.sip_caller`): one dialog with the
server over UDP (requests retransmitted, timers A/E), TCP or TLS, its client transactions, and the
server's requests (BYE ends the call); and the caller's SDP offer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import ssl
import time
from collections.abc import Sequence
from typing import Any, Literal

from voice.transports.sip.endpoint import T1, T2, TRANSACTION_S
from voice.transports.sip.message import (
    MAX_MESSAGE_BYTES,
    SipMessage,
    SipParseError,
    StreamFramer,
    new_branch,
    new_call_id,
    new_tag,
    parse_message,
    parse_name_addr,
    response_to,
)

log = logging.getLogger(__name__)

DTMF_PAYLOAD_TYPE = 101
SipTransport = Literal["udp", "tcp", "tls"]


def hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class SipLeg(asyncio.DatagramProtocol):
    """The caller's SIP: one dialog with the server over UDP or TCP from a local port, its
    client transactions (every response, by branch), and the server's requests (a BYE for the
    dialog sets `hung_up`)."""

    def __init__(
        self,
        transport: SipTransport,
        remote: tuple[str, int],
        target: str,
        tls: ssl.SSLContext | None = None,
        accept_refer: bool = False,
    ) -> None:
        """`tls`: the context a "tls" leg checks the server's certificate with; `accept_refer`:
        a REFER (a transfer) is accepted and reported done, else refused (501)."""
        self.transport, self.remote, self.target = transport, remote, target
        self.tls = tls
        self.accept_refer = accept_refer
        self.hung_up = asyncio.Event()
        self.call_id = self.sent_by = self.local = self.contact = ""
        self.remote_party = f"<{target}>"  # To: gets the server's tag from its answer
        self.routes: list[str] = []
        self.cseq = 1
        self._ack: SipMessage | None = None  # sent again for a retransmitted 2xx
        self._udp: asyncio.DatagramTransport | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader: asyncio.Task[None] | None = None
        self._waiting: dict[str, asyncio.Queue[SipMessage]] = {}
        self.referred_to: str | None = None  # the Refer-To of the server's REFER (a transfer)
        self._notifying: set[asyncio.Task[None]] = set()

    async def open(self, local_host: str, caller: str) -> None:
        if self.transport in ("tcp", "tls"):
            secure = None
            if self.transport == "tls":
                secure = self.tls or ssl.create_default_context()
            reader, self._writer = await asyncio.open_connection(
                *self.remote, local_addr=(local_host, 0), ssl=secure
            )
            self._reader = asyncio.create_task(self._read(reader))
            port = self._writer.get_extra_info("sockname")[1]
        else:
            loop = asyncio.get_running_loop()
            self._udp, _ = await loop.create_datagram_endpoint(
                lambda: self, local_addr=(local_host, 0)
            )
            port = self._udp.get_extra_info("sockname")[1]
        self.sent_by = hostport(local_host, int(port))
        self.call_id = new_call_id(local_host)
        self.local = f"<sip:{caller}@{self.sent_by}>;tag={new_tag()}"
        self.contact = f"<sip:{caller}@{self.sent_by};transport={self.transport}>"

    def close(self) -> None:
        if self._udp is not None:
            self._udp.close()
        if self._writer is not None and self._reader is not None:
            self._writer.close()
            self._reader.cancel()

    def request(self, method: str, uri: str, cseq: int, branch: str | None = None) -> SipMessage:
        via = f"SIP/2.0/{self.transport.upper()} {self.sent_by}"
        headers = [("Via", f"{via};branch={branch or new_branch()};rport")]
        headers += [("Max-Forwards", "70"), ("From", self.local), ("To", self.remote_party)]
        headers += [("Call-ID", self.call_id), ("CSeq", f"{cseq} {method}")]
        headers += [("Route", route) for route in self.routes]
        headers += [("Contact", self.contact), ("User-Agent", "hotline-sip-caller")]
        return SipMessage(method=method, uri=uri, headers=headers)

    async def invite(self, sdp: str, provisional: list[int]) -> SipMessage | None:
        """Send the INVITE and ACK its final answer, which is returned (None: no answer). A 2xx
        sets up the dialog: the server's tag, its Contact as target, the route set."""
        invite = self.request("INVITE", self.target, 1)
        invite.headers.append(("Content-Type", "application/sdp"))
        invite.body = sdp.encode()
        final = await self.transact(invite, provisional)
        if final is None:
            return None
        if (final.status or 0) >= 300:  # ACKed in the INVITE's own transaction
            ack = self.request("ACK", self.target, 1, branch=invite.branch)
            ack.set_header("To", final.header("To") or self.remote_party)
            self.send(ack)
            return final
        self.remote_party = final.header("To") or self.remote_party
        contacts = final.header_values("Contact")
        if contacts:
            self.target = parse_name_addr(contacts[0]).uri
        self.routes = list(reversed(final.header_values("Record-Route")))
        self._ack = self.request("ACK", self.target, 1)
        self.send(self._ack)
        return final

    async def bye(self) -> int | None:
        """Hang up; the status of the answer (None if none came)."""
        self.cseq += 1
        answer = await self.transact(self.request("BYE", self.target, self.cseq))
        return answer.status if answer is not None else None

    def send(self, message: SipMessage) -> None:
        data = message.to_bytes()
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(data)
        elif self._udp is not None:
            self._udp.sendto(data, self.remote)

    async def transact(
        self, message: SipMessage, provisional: list[int] | None = None
    ) -> SipMessage | None:
        """Send a request and return its final response (None after 32 s without one). Over
        UDP it is resent, T1 doubling, until a response: an INVITE until any (timer A), other
        requests until a final one (timer E, at most T2 apart)."""
        branch = message.branch or ""
        queue: asyncio.Queue[SipMessage] = asyncio.Queue()
        self._waiting[branch] = queue
        invite, resend = message.method == "INVITE", self.transport == "udp"
        deadline, interval = time.monotonic() + TRANSACTION_S, T1
        try:
            self.send(message)
            while (left := deadline - time.monotonic()) > 0:
                try:
                    response = await asyncio.wait_for(
                        queue.get(), min(interval, left) if resend else left
                    )
                except TimeoutError:
                    if resend:  # (without, the wait was for everything left)
                        self.send(message)
                        interval = interval * 2 if invite else min(interval * 2, T2)
                    continue
                if (response.status or 0) >= 200:
                    return response
                if provisional is not None:
                    provisional.append(response.status or 0)
                resend, interval = resend and not invite, T2
            return None
        finally:
            self._waiting.pop(branch, None)

    # -- receiving ---------------------------------------------------------------------------

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        if data.strip():
            try:
                self._received(parse_message(data))
            except SipParseError as exc:
                log.debug("sip caller: malformed message dropped: %s", exc)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        framer = StreamFramer()
        with contextlib.suppress(ConnectionError, OSError, SipParseError):
            while data := await reader.read(MAX_MESSAGE_BYTES):
                for message in framer.feed(data):
                    self._received(message)

    def _received(self, message: SipMessage) -> None:
        if not message.is_request:
            queue = self._waiting.get(message.branch or "")
            if queue is not None:
                queue.put_nowait(message)
            elif self._ack is not None and message.cseq == (1, "INVITE"):
                self.send(self._ack)  # our ACK was lost: the server resends its 2xx
        elif message.method == "BYE" and message.call_id == self.call_id:
            self.hung_up.set()
            self.send(response_to(message, 200, "OK"))
        elif message.method == "REFER" and message.call_id == self.call_id and self.accept_refer:
            self._referred(message)
        elif message.method == "OPTIONS":
            self.send(response_to(message, 200, "OK"))
        elif message.method != "ACK":
            self.send(response_to(message, 501, "Not Implemented"))

    def _referred(self, refer: SipMessage) -> None:
        """A blind transfer (RFC 3515): accepted (202), and reported done at once by NOTIFY
        ("SIP/2.0 200 OK"), as a phone whose call to the target was answered."""
        with contextlib.suppress(SipParseError):
            self.referred_to = parse_name_addr(refer.header("Refer-To") or "").uri
        self.send(response_to(refer, 202, "Accepted"))
        task = asyncio.get_running_loop().create_task(self._notify("SIP/2.0 200 OK"))
        self._notifying.add(task)
        task.add_done_callback(self._notifying.discard)

    async def _notify(self, status_line: str) -> None:
        self.cseq += 1
        notify = self.request("NOTIFY", self.target, self.cseq)
        notify.headers += [
            ("Event", "refer"),
            ("Subscription-State", "terminated;reason=noresource"),
            ("Content-Type", "message/sipfrag;version=2.0"),
        ]
        notify.body = f"{status_line}\r\n".encode()
        await self.transact(notify)


def offer_sdp(address: str, port: int, codecs: Sequence[str]) -> str:
    """The caller's SDP offer: `codecs` (PCMU, PCMA) and telephone-event/8000."""
    family, kinds = ("IP6" if ":" in address else "IP4"), {"PCMU": 0, "PCMA": 8}
    types = [kinds[name] for name in codecs]
    lines = [
        "v=0",
        f"o=hotline-caller {secrets.randbelow(2**31)} 1 IN {family} {address}",
        "s=Hotline caller",
        f"c=IN {family} {address}",
        "t=0 0",
        f"m=audio {port} RTP/AVP {' '.join(map(str, [*types, DTMF_PAYLOAD_TYPE]))}",
        *(f"a=rtpmap:{kinds[name]} {name}/8000" for name in codecs),
        f"a=rtpmap:{DTMF_PAYLOAD_TYPE} telephone-event/8000",
        f"a=fmtp:{DTMF_PAYLOAD_TYPE} 0-15",
        "a=ptime:20",
        "a=sendrecv",
    ]
    return "\r\n".join(lines) + "\r\n"
