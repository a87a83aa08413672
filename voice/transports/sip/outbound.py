"""One call Hotline places over SIP, as its user agent client runs it (RFC 3261 §13.2):

- the INVITE (§8.1.1, §13.2.1): Request-URI and To the callee, From our caller id with a fresh
  tag, a new Call-ID, CSeq 1, Contact and Allow, our SDP offer;
- its answers through the INVITE client transaction (`uac.InviteClient`): provisional ones to
  `on_progress` (a 183's SDP starts early media), a 401 or 407 answered once with the trunk's
  digest credentials (§22.2: the same Call-ID and From tag, CSeq + 1, a new branch);
- the ring timeout and a hang-up before the answer: CANCEL (§9.1);
- a 2xx: its dialog (§12.1.2) and its ACK (§13.2.2.4: the INVITE's CSeq number and credentials);
  a 2xx that crossed our hang-up's CANCEL is ACKed and sent BYE (§15), and so is a second 2xx
  from another fork;
- the end, as a call record says it (`Outcome.cause`): answered, busy (486, 600), no answer
  (the ring timeout, 408, 480), rejected (403, 603, any other 3xx-6xx but 5xx), failed (5xx),
  unreachable (no answer at all: Timer B, ICMP, DNS) or cancelled (hung up before the answer)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from voice.transports.sip.credentials import ChallengeError, answer, read_challenge
from voice.transports.sip.dialog import SipDialog
from voice.transports.sip.endpoint import T1, Peer, SipEndpoint, SipError
from voice.transports.sip.message import (
    SipMessage,
    SipParseError,
    new_branch,
    new_tag,
    parse_name_addr,
)
from voice.transports.sip.trunk import SipTrunk, from_uri, request_uri
from voice.transports.sip.uac import InviteClient, Unreachable

log = logging.getLogger(__name__)

_AUTH_HEADERS = ("Authorization", "Proxy-Authorization")
BUSY, NO_ANSWER = frozenset({486, 600}), frozenset({408, 480})
_BACKGROUND: set[asyncio.Task[None]] = set()  # BYEs in flight


@dataclass(frozen=True)
class Outcome:
    """How a placed call's INVITE ended."""

    cause: str  # answered | busy | no_answer | rejected | failed | unreachable | cancelled
    status: int | None = None  # the final SIP status (None: none came)
    reason: str = ""  # its reason phrase, or what happened instead
    answer: SipMessage | None = None  # the 2xx, when answered
    dialog: SipDialog | None = None  # the dialog it made

    def describe(self) -> str:
        """`486 Busy Here`, or what happened when no status came."""
        return f"{self.status} {self.reason}".strip() if self.status else self.reason


def cause_of(status: int, *, rang_out: bool) -> str:
    """The cause a final status gives (`rang_out`: our ring timeout's CANCEL was sent)."""
    if 200 <= status < 300:
        return "answered"
    if status in BUSY:
        return "busy"
    if status in NO_ANSWER or (status == 487 and rang_out):
        return "no_answer"
    return "failed" if 500 <= status < 600 else "rejected"


@dataclass(frozen=True)
class Placement:
    """What the INVITE says and where it goes."""

    trunk: SipTrunk
    peer: Peer  # the trunk, resolved
    to: str  # a number or a SIP URI
    caller: str | None  # our caller id (None: the trunk's)
    sent_by: str  # our host:port, for Via
    contact: str  # our Contact URI
    offer: bytes  # our SDP
    allow: str  # the methods we take inside a call
    ring_timeout_s: float
    call_id: str  # the SIP Call-ID (`message.new_call_id`)


class Placing:
    """One outbound INVITE, from its first send to the call's answer or its failure."""

    def __init__(
        self,
        endpoint: SipEndpoint,
        placement: Placement,
        *,
        on_progress: Callable[[SipMessage], None] | None = None,
        t1: float = T1,
    ) -> None:
        self.endpoint, self.placement, self.t1 = endpoint, placement, t1
        self.on_progress = on_progress or (lambda response: None)
        self.call_id = placement.call_id
        self.tag = new_tag()
        self.uri = request_uri(placement.to, placement.trunk)
        self.cseq = 0
        self.invite = self._invite()
        self.dialog: SipDialog | None = None
        self.hung_up: str | None = None  # why we hung up before the answer
        self.rang_out = False  # the ring timeout passed
        self._client: InviteClient | None = None

    def hang_up(self, why: str) -> None:
        """Give up before the answer (CANCEL; a 2xx that still comes is sent BYE)."""
        if self.hung_up is None:
            self.hung_up = why
            if self._client is not None:
                self._client.cancel()

    async def run(self) -> Outcome:
        """Ring the callee until the answer, a refusal, the ring timeout or our hang-up."""
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.placement.ring_timeout_s, self._ring_out)
        try:
            final = await self._attempt(self.invite)
            if final is not None and final.status in (401, 407) and not self._giving_up:
                retry = self._authorized(final)
                if retry is not None:
                    final = await self._attempt(retry)
        except Unreachable as exc:
            return Outcome("cancelled" if self.hung_up else "unreachable", reason=str(exc))
        finally:
            timer.cancel()
        return self._outcome(final)

    @property
    def _giving_up(self) -> bool:
        return self.hung_up is not None or self.rang_out

    def _ring_out(self) -> None:
        self.rang_out = True
        if self._client is not None:
            self._client.cancel()

    async def _attempt(self, invite: SipMessage) -> SipMessage | None:
        self.invite = invite
        self._client = InviteClient(
            self.endpoint,
            self.placement.peer,
            invite,
            on_provisional=self.on_progress,
            ack_2xx=self._ack_2xx,
            t1=self.t1,
        )
        if self._giving_up:
            self._client.cancel()
        return await self._client.final()

    def _outcome(self, final: SipMessage | None) -> Outcome:
        if final is None:  # CANCEL sent, no final answer within 64·T1 (§9.1)
            cause = "cancelled" if self.hung_up else "no_answer"
            return Outcome(cause, reason="no final answer to our CANCEL")
        status, reason = final.status or 0, final.reason
        if self.hung_up is not None and not 200 <= status < 300:  # our CANCEL's 487, mostly
            return Outcome("cancelled", status, reason)
        if not 200 <= status < 300:
            return Outcome(cause_of(status, rang_out=self.rang_out), status, reason)
        if self.dialog is None:
            return Outcome("failed", status, f"{reason}: a 2xx we cannot ACK (no To tag)")
        if self.hung_up is not None:  # it crossed our CANCEL: the callee answered, we leave
            self.bye(self.dialog)
            return Outcome("cancelled", status, f"{reason}, as we hung up: BYE sent")
        return Outcome("answered", status, reason, final, self.dialog)

    def _invite(self, extra: list[tuple[str, str]] | None = None) -> SipMessage:
        """An INVITE of this call: the next CSeq, a new branch (§8.1.1.7)."""
        placement = self.placement
        self.cseq += 1
        invite = SipMessage(method="INVITE", uri=self.uri)
        transport = placement.peer.transport
        invite.add_header(
            "Via", f"SIP/2.0/{transport} {placement.sent_by};branch={new_branch()};rport"
        )
        invite.add_header("Max-Forwards", "70")
        invite.add_header("From", f"<{from_uri(placement.caller, placement.trunk)}>;tag={self.tag}")
        invite.add_header("To", f"<{self.uri}>")
        invite.add_header("Call-ID", self.call_id)
        invite.add_header("CSeq", f"{self.cseq} INVITE")
        invite.add_header("Contact", f"<{placement.contact}>")
        invite.add_header("Allow", placement.allow)
        invite.add_header("User-Agent", "Hotline")
        for name, value in extra or []:
            invite.add_header(name, value)
        invite.add_header("Content-Type", "application/sdp")
        invite.body = placement.offer
        return invite

    def _authorized(self, challenged: SipMessage) -> SipMessage | None:
        """The INVITE again with credentials for the challenge (None: we have none to give,
        or cannot answer it: the 401 or 407 stands). Answered once: a second one stands."""
        trunk = self.placement.trunk
        credentials = trunk.credentials
        if credentials is None:
            log.warning(
                "sip: trunk %s asks for credentials (%d); it has none",
                trunk.name,
                challenged.status,
            )
            return None
        try:
            challenge = read_challenge(challenged)
        except ChallengeError as exc:
            log.warning(
                "sip: trunk %s: cannot answer its %d: %s", trunk.name, challenged.status, exc
            )
            return None
        value = answer(challenge, *credentials, "INVITE", self.uri)
        return self._invite([(challenge.header, value)])

    def _ack_2xx(self, ok: SipMessage) -> SipMessage | None:
        """The ACK of a 2xx (§13.2.2.4); the first one's dialog is the call's, another fork's
        is ACKed and ended with BYE."""
        try:
            dialog = answered_dialog(self.invite, ok, self.placement)
        except SipParseError as exc:
            log.warning("sip: call %s: a %s we cannot ACK: %s", self.call_id, ok.status, exc)
            return None
        if self.dialog is None:
            self.dialog = dialog
        elif dialog.remote_tag != self.dialog.remote_tag:
            log.info("sip: call %s: answered by a second fork: BYE", self.call_id)
            self._later(self._bye(dialog))
        ack = dialog.request("ACK", cseq=self.invite.cseq[0])
        for name in _AUTH_HEADERS:  # the ACK carries the INVITE's credentials
            for value in self.invite.header_values(name):
                ack.add_header(name, value)
        return ack

    def bye(self, dialog: SipDialog) -> None:
        """End `dialog` (in the background)."""
        self._later(self._bye(dialog))

    async def _bye(self, dialog: SipDialog) -> None:
        try:
            answered = await self.endpoint.request(dialog.request("BYE"), dialog.peer)
            log.info("sip: call %s: BYE answered %s", self.call_id, answered.status)
        except (SipError, ValueError) as exc:
            log.warning("sip: call %s: BYE: %s", self.call_id, exc)

    def _later(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        _BACKGROUND.add(task)  # held here: the call's objects may be gone before its BYE is
        task.add_done_callback(_BACKGROUND.discard)


def answered_dialog(invite: SipMessage, ok: SipMessage, placement: Placement) -> SipDialog:
    """The dialog a 2xx to our INVITE makes (RFC 3261 §12.1.2), as `SipDialog` keeps one.
    SipDialog was written for the answering side and reads its state from the INVITE the far
    end sent; its stand-in here is that INVITE as if the callee had sent it: their To (with
    their tag) as its From, our From (with our tag) as its To, their Contact (the remote
    target), and the 2xx's Record-Route reversed (the route set). SipParseError without a To
    tag or our From tag."""
    remote, local = ok.header("To") or "", invite.header("From") or ""
    local_tag = parse_name_addr(local).tag
    if parse_name_addr(remote).tag is None or local_tag is None:
        raise SipParseError("no To tag in the 2xx")
    mirror = SipMessage(method="INVITE", uri=invite.uri)
    mirror.add_header("From", remote)
    mirror.add_header("To", local)
    mirror.add_header("Call-ID", invite.call_id)
    mirror.add_header("CSeq", invite.header("CSeq") or "")
    for contact in ok.header_values("Contact")[:1]:
        mirror.add_header("Contact", contact)
    for route in reversed(ok.header_values("Record-Route")):
        mirror.add_header("Record-Route", route)
    peer, sent_by, contact = placement.peer, placement.sent_by, placement.contact
    return SipDialog(mirror, peer, local_tag, sent_by, contact, local_cseq=invite.cseq[0])
