"""One SIP dialog as the answering side sees it (RFC 3261 §12): made from the INVITE we answered,
it builds the requests we send inside it (BYE, REFER) and keeps resending our 2xx until the
caller's ACK (§13.3.1.4). Before it, the INVITE's server transaction (§17.2.1): what a CANCEL
must match (§9.2) and what tells a retransmission from a second INVITE (§8.2.2.2)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from voice.transports.sip.endpoint import T1, T2, TRANSACTION_S, Peer, SipEndpoint
from voice.transports.sip.message import (
    SipMessage,
    SipParseError,
    new_branch,
    new_tag,
    parse_name_addr,
    parse_via,
)
from voice.transports.sip.syntax import uri_user

log = logging.getLogger(__name__)


def transaction_key(message: SipMessage) -> tuple[str, str, str] | None:
    """What names a request's server transaction (RFC 3261 §17.2.3), the method aside: the top
    Via's branch and sent-by, and the Call-ID. None without a branch (nothing can match it)."""
    with contextlib.suppress(SipParseError):
        vias = message.header_values("Via")
        via = parse_via(vias[0]) if vias else None
        if via is not None and via.branch:
            return via.branch, f"{via.host.lower()}:{via.port or ''}", message.call_id
    return None


def same_transaction(first: SipMessage, second: SipMessage) -> bool:
    """Whether two requests are of one transaction: a retransmission, or a CANCEL (or the ACK
    of a non-2xx answer) and the INVITE it is for."""
    key = transaction_key(first)
    return key is not None and key == transaction_key(second)


@dataclass(eq=False)
class InviteTransaction:
    """An INVITE from its arrival to its final answer (RFC 3261 §17.2.1). `local_tag` is the To
    tag of every answer to it (a 487 after a CANCEL included) and of the dialog a 200 makes;
    `cancelled` is set by the CANCEL that matched it before the final answer."""

    invite: SipMessage
    peer: Peer
    local_tag: str = field(default_factory=new_tag)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    final: bool = False  # a final answer (2xx, 487 or a refusal) was sent

    def retransmission(self, request: SipMessage, peer: Peer) -> bool:
        """`request` is this INVITE again, from where it came from."""
        return peer.host == self.peer.host and same_transaction(self.invite, request)


@dataclass
class SipDialog:
    """The dialog of one answered INVITE."""

    invite: SipMessage
    peer: Peer
    local_tag: str
    sent_by: str  # our host:port for Via headers
    contact: str  # our Contact URI
    local_cseq: int = 1
    acked: asyncio.Event = field(default_factory=asyncio.Event)
    ended: bool = False
    ack: SipMessage | None = None  # the last ACK (a late offer's answer is in its body)
    # An offerless re-INVITE (RFC 3261 §14.2) answered with our offer: its CSeq number, and
    # set when its ACK (with the answer) came.
    reoffer_cseq: int | None = None
    reacked: asyncio.Event = field(default_factory=asyncio.Event)

    def acknowledged(self, ack: SipMessage) -> None:
        """An ACK of this dialog: of the re-INVITE we offered in, or of the INVITE's 2xx."""
        self.ack = ack
        number = None
        with contextlib.suppress(SipParseError):
            number = ack.cseq[0]
        if self.reoffer_cseq is not None and number == self.reoffer_cseq:
            self.reacked.set()
        else:
            self.acked.set()

    @property
    def call_id(self) -> str:
        return self.invite.call_id

    @property
    def remote_tag(self) -> str | None:
        return parse_name_addr(self.invite.header("From") or "").tag

    def remote_target(self) -> str:
        """Where requests inside the dialog go: the caller's Contact (else its From URI)."""
        with contextlib.suppress(SipParseError):
            contacts = self.invite.header_values("Contact")
            if contacts:
                return parse_name_addr(contacts[0]).uri
        return parse_name_addr(self.invite.header("From") or "").uri

    def matches(self, message: SipMessage) -> bool:
        """Whether a request belongs to this dialog (Call-ID and both tags)."""
        if message.call_id != self.call_id:
            return False
        with contextlib.suppress(SipParseError):
            to_tag = parse_name_addr(message.header("To") or "").tag
            from_tag = parse_name_addr(message.header("From") or "").tag
            return to_tag == self.local_tag and from_tag == self.remote_tag
        return False

    def retransmission(self, request: SipMessage, peer: Peer) -> bool:
        """`request` is the dialog's INVITE again, from where it came from."""
        return peer.host == self.peer.host and same_transaction(self.invite, request)

    def request(
        self, method: str, headers: list[tuple[str, str]] | None = None, *, cseq: int | None = None
    ) -> SipMessage:
        """A request inside the dialog: our To (with tag) as From, their From as To. The next
        CSeq number, or `cseq` (the ACK of a 2xx takes its INVITE's, RFC 3261 §13.2.2.4)."""
        if cseq is None:
            self.local_cseq += 1
        local = self.invite.header("To") or ""
        if ";tag=" not in local:
            local = f"{local};tag={self.local_tag}"
        message = SipMessage(method=method, uri=self.remote_target())
        message.add_header(
            "Via", f"SIP/2.0/{self.peer.transport} {self.sent_by};branch={new_branch()};rport"
        )
        message.add_header("Max-Forwards", "70")
        message.add_header("From", local)
        message.add_header("To", self.invite.header("From") or "")
        message.add_header("Call-ID", self.call_id)
        message.add_header("CSeq", f"{self.local_cseq if cseq is None else cseq} {method}")
        for route in self.invite.header_values("Record-Route"):
            message.add_header("Route", route)
        message.add_header("Contact", f"<{self.contact}>")
        message.add_header("User-Agent", "Hotline")
        for name, value in headers or []:
            message.add_header(name, value)
        return message

    async def resend_until_acked(
        self, endpoint: SipEndpoint, answer: SipMessage, acked: asyncio.Event | None = None
    ) -> bool:
        """Resend our 2xx over UDP (T1 doubling up to T2) until the ACK comes (`acked`: the
        INVITE's by default); False if it never does within 32 s (the caller should then be
        sent BYE, RFC 3261 §13.3.1.4)."""
        event = self.acked if acked is None else acked
        interval = T1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TRANSACTION_S
        while not event.is_set():
            left = deadline - loop.time()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), min(interval, left))
                return True
            if self.peer.transport == "UDP":
                endpoint.send(answer, self.peer)
            interval = min(interval * 2, T2)
        return True


def header_user(value: str | None) -> str | None:
    """The user part of a From/To header's URI (the caller's number), if any."""
    with contextlib.suppress(SipParseError):
        return uri_user(parse_name_addr(value or "").uri)
    return None


def called_user(request: SipMessage) -> str | None:
    """The called number: the Request-URI's user, else the To header's."""
    return uri_user(request.uri or "") or header_user(request.header("To"))
