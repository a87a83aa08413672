"""A SIP user agent server over real UDP, scripted per callee (the Request-URI's user), for what a
softphone will not do on cue: challenge with digest (401, 407), decline (603), answer with
strays and garbage first, send early media (183 with SDP), ring until cancelled. It keeps RFC
3261's rules for a server transaction: 100 Trying at once, a To tag on every other answer, a
final refusal resent (T1 doubling, Timer G) until its ACK, a retransmitted INVITE answered
again, CANCEL answered 200 then 487. Everything it receives is kept for the test to read."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, cast

from voice.transports.sip.message import (
    SipMessage,
    SipParseError,
    new_tag,
    parse_auth_params,
    parse_message,
    response_to,
)
from voice.transports.sip.syntax import uri_user

REALM = "trunk.test"
Script = Callable[["Exchange", tuple[str, int]], Coroutine[Any, Any, None]]
OPAQUE = "5ccc069c403ebaf9f0171e9517f40e41"


def md5(text: str) -> str:
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


@dataclass
class Exchange:
    """One INVITE transaction as the UAS saw it."""

    invite: SipMessage
    to_tag: str = field(default_factory=new_tag)
    acked: asyncio.Event = field(default_factory=asyncio.Event)
    final: bytes | None = None


@dataclass
class ScriptedUas(asyncio.DatagramProtocol):
    """Answers INVITEs on 127.0.0.1:`port` by callee; `received` keeps every message."""

    port: int
    user: str = "hotline"
    password: str = "trunk-secret"
    received: list[SipMessage] = field(default_factory=list)
    nonces: list[str] = field(default_factory=list)
    rtp_packets: int = 0  # early media that came to our 183's SDP
    rtp_came: asyncio.Event = field(default_factory=asyncio.Event)  # ten RTP packets came
    _transport: asyncio.DatagramTransport | None = None
    _rtp: asyncio.DatagramTransport | None = None
    # callee -> the scripts its INVITEs play, one each in turn (the last one from then on)
    plays: dict[str, list[str]] = field(default_factory=dict)
    _exchanges: dict[str, Exchange] = field(default_factory=dict)  # by Via branch
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def __aenter__(self) -> ScriptedUas:
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(lambda: self, local_addr=("127.0.0.1", self.port))
        self._rtp, _ = await loop.create_datagram_endpoint(
            lambda: _Counter(self), local_addr=("127.0.0.1", 0)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        if self._transport is not None:
            self._transport.close()
        if self._rtp is not None:
            self._rtp.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.DatagramTransport, transport)  # (3.11: not a subclass)

    def requests(self, method: str) -> list[SipMessage]:
        return [m for m in self.received if m.method == method]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            message = parse_message(data)
        except SipParseError:
            return
        self.received.append(message)
        branch = message.branch or ""
        if message.method == "INVITE":
            known = self._exchanges.get(branch)
            if known is not None:  # a retransmission: the same answer again
                if known.final is not None:
                    self._send(known.final, addr)
                return
            exchange = self._exchanges[branch] = Exchange(message)
            self._spawn(self._script(exchange, addr))
        elif message.method == "ACK":  # a refusal's has its INVITE's branch; a 2xx's its own
            acked = self._exchanges.get(branch) or next(
                (e for e in self._exchanges.values() if _answered(e, message.call_id)), None
            )
            if acked is not None:
                acked.acked.set()
        elif message.method == "BYE":
            self._send(response_to(message, 200, "OK").to_bytes(), addr)
        elif message.method == "CANCEL" and branch in self._exchanges:
            exchange = self._exchanges[branch]
            self._send(response_to(message, 200, "OK", to_tag=exchange.to_tag).to_bytes(), addr)
            self._final(exchange, addr, 487, "Request Terminated")

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _send(self, data: bytes, addr: tuple[str, int]) -> None:
        assert self._transport is not None
        self._transport.sendto(data, addr)

    def _answer(
        self,
        exchange: Exchange,
        addr: tuple[str, int],
        status: int,
        reason: str,
        headers: list[tuple[str, str]] | None = None,
        body: bytes = b"",
    ) -> bytes:
        tag = None if status == 100 else exchange.to_tag
        kind = "application/sdp" if body else None
        answer = response_to(
            exchange.invite,
            status,
            reason,
            to_tag=tag,
            headers=headers or [],
            body=body,
            content_type=kind,
        )
        data = answer.to_bytes()
        self._send(data, addr)
        return data

    def _final(self, exchange: Exchange, addr: tuple[str, int], status: int, reason: str) -> None:
        """A refusal, resent T1, 2·T1 … until its ACK (Timer G)."""
        if exchange.final is not None:
            return
        exchange.final = self._answer(exchange, addr, status, reason)
        self._spawn(self._resend_until_acked(exchange, addr))

    async def _resend_until_acked(self, exchange: Exchange, addr: tuple[str, int]) -> None:
        interval = 0.5
        for _ in range(6):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(exchange.acked.wait(), interval)
                return
            assert exchange.final is not None
            self._send(exchange.final, addr)
            interval = min(interval * 2, 4.0)

    async def _script(self, exchange: Exchange, addr: tuple[str, int]) -> None:
        self._answer(exchange, addr, 100, "Trying")
        callee = uri_user(exchange.invite.uri or "") or ""
        queued = self.plays.get(callee)
        if queued:
            callee = queued.pop(0) if len(queued) > 1 else queued[0]
        script: Script = {
            "busy": self._busy,
            "decline": self._decline,
            "challenge-401": self._challenge,
            "challenge-407": self._challenge,
            "strays": self._strays,
            "early": self._early,
            "ring": self._ring,
            "answer": self._answer_it,
        }.get(callee, self._decline)
        await script(exchange, addr)

    async def _answer_it(self, exchange: Exchange, addr: tuple[str, int]) -> None:
        """200 with SDP (towards our RTP counter) and a Contact, resent until its ACK (RFC 3261
        §13.3.1.4); a BYE later is answered 200."""
        contact = [("Contact", f"<sip:answer@127.0.0.1:{self.port}>")]
        exchange.final = self._answer(exchange, addr, 200, "OK", contact, self._sdp())
        self._spawn(self._resend_until_acked(exchange, addr))

    def _sdp(self) -> bytes:
        assert self._rtp is not None
        port = self._rtp.get_extra_info("sockname")[1]
        return (
            "v=0\r\no=uas 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
            f"m=audio {port} RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\n"
            "a=rtpmap:101 telephone-event/8000\r\na=sendrecv\r\n"
        ).encode()

    async def _ring(self, exchange: Exchange, addr: tuple[str, int]) -> None:
        """180, then nothing until a CANCEL (answered 200, and the INVITE 487)."""
        self._answer(exchange, addr, 180, "Ringing")

    async def _busy(self, exchange: Exchange, addr: tuple[str, int]) -> None:
        self._final(exchange, addr, 486, "Busy Here")

    async def _decline(self, exchange: Exchange, addr: tuple[str, int]) -> None:
        self._final(exchange, addr, 603, "Decline")

    async def _challenge(self, exchange: Exchange, addr: tuple[str, int]) -> None:
        """401 (qop=auth, opaque) or 407 (RFC 2069: no qop) first; the answer's INVITE is
        checked here and answered 486 when its credentials are right, 403 if not."""
        proxy = (uri_user(exchange.invite.uri or "") or "").endswith("407")
        header = "Proxy-Authorization" if proxy else "Authorization"
        given = exchange.invite.header(header)
        if given is None:
            nonce = secrets.token_hex(12)
            self.nonces.append(nonce)
            if proxy:
                value = f'Digest realm="{REALM}", nonce="{nonce}", algorithm=MD5'
                extra = [("Proxy-Authenticate", value)]
                exchange.final = self._answer(
                    exchange, addr, 407, "Proxy Authentication Required", headers=extra
                )
            else:
                value = f'Digest realm="{REALM}", nonce="{nonce}", opaque="{OPAQUE}", qop="auth"'
                extra = [("WWW-Authenticate", value)]
                exchange.final = self._answer(exchange, addr, 401, "Unauthorized", headers=extra)
            self._spawn(self._resend_until_acked(exchange, addr))
            return
        if self.checks(exchange.invite, header):
            self._final(exchange, addr, 486, "Busy Here")
        else:
            self._final(exchange, addr, 403, "Forbidden")

    def checks(self, invite: SipMessage, header: str) -> bool:
        """Whether the credentials in `header` are this user's, for the last nonce."""
        _, params = parse_auth_params(invite.header(header) or "")
        ha1 = md5(f"{self.user}:{REALM}:{self.password}")
        ha2 = md5(f"INVITE:{params.get('uri')}")
        counted = "qop" in params  # RFC 2617 with qop=auth, else RFC 2069
        middle = f"{params['nc']}:{params['cnonce']}:{params['qop']}:" if counted else ""
        expected = md5(f"{ha1}:{self.nonces[-1]}:{middle}{ha2}")
        return params.get("response") == expected and params.get("username") == self.user

    async def _strays(self, exchange: Exchange, addr: tuple[str, int]) -> None:
        """Garbage, an answer to nobody's request, an answer with the INVITE's branch but
        another CSeq; then 180 and 480 Temporarily Unavailable."""
        self._send(b"SIP/2.0 200 OK\r\nthis is not a header line\r\n\r\n", addr)
        stray = SipMessage(status=200, reason="OK")
        for name, value in exchange.invite.headers:
            if name in ("From", "To", "Call-ID", "CSeq"):
                stray.add_header(name, value)
        stray.add_header("Via", "SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bKnobodys")
        self._send(stray.to_bytes(), addr)
        other = response_to(exchange.invite, 200, "OK", to_tag=exchange.to_tag)
        other.set_header("CSeq", "77 OPTIONS")
        self._send(other.to_bytes(), addr)
        self._answer(exchange, addr, 180, "Ringing")
        self._final(exchange, addr, 480, "Temporarily Unavailable")

    async def _early(self, exchange: Exchange, addr: tuple[str, int]) -> None:
        """183 with SDP towards our RTP counter; once early media came, 486."""
        self._answer(exchange, addr, 183, "Session Progress", body=self._sdp())
        with contextlib.suppress(TimeoutError):  # none at all: the test says so
            await asyncio.wait_for(self.rtp_came.wait(), 5)
        self._final(exchange, addr, 486, "Busy Here")


def _answered(exchange: Exchange, call_id: str) -> bool:
    """Whether `exchange` is of `call_id` and was answered 2xx."""
    final = exchange.final or b""
    return exchange.invite.call_id == call_id and final.startswith(b"SIP/2.0 2")


class _Counter(asyncio.DatagramProtocol):
    def __init__(self, uas: ScriptedUas) -> None:
        self.uas = uas

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.uas.rtp_packets += 1
        if self.uas.rtp_packets >= 10:
            self.uas.rtp_came.set()
