"""An INVITE we send to start a call, as its INVITE client transaction runs it (RFC 3261 §17.1.1),
and its CANCEL (§9.1).

- Calling: over UDP the INVITE is sent again after T1, 2·T1, 4·T1 … (Timer A) until an answer
  comes; none within 64·T1 (Timer B), an ICMP error for the destination (§18.4) or the endpoint
  closing is `Unreachable`. Over TCP and TLS it is sent once.
- Proceeding: each provisional answer (101-199) goes to `on_provisional`. The final answer may
  take as long as the callee rings: the caller's ring timeout is a CANCEL, not a timer here.
- A final 3xx-6xx is ACKed inside the transaction (§17.1.1.3: the INVITE's Request-URI,
  Call-ID, From, CSeq number, top Via and Route headers, the answer's To), and so is every
  retransmission of it within 64·T1 (Timer D).
- A 2xx is ACKed end to end by whoever made the INVITE (§13.2.2.4: `ack_2xx` builds that ACK from
  the dialog); each retransmission within 64·T1 gets the same ACK again (RFC 6026, Accepted).
- CANCEL (§9.1) is sent only once a provisional answer came (asked earlier, it waits for one),
  with the INVITE's Request-URI, Call-ID, From, To, CSeq number, Route and top Via, so its
  answers share the INVITE's branch and are told apart by their CSeq method. Over UDP it is
  resent (T1 doubling to T2) until answered, at most 64·T1; the INVITE's final answer (a 487)
  is then awaited 64·T1 at most, after which the INVITE counts as cancelled (`final` None).

Answers that fit none of this (another CSeq, a malformed one) are logged and dropped."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from voice.transports.sip.endpoint import T1, T2, Peer, SipEndpoint, SipError
from voice.transports.sip.message import SipMessage, SipParseError, parse_name_addr

log = logging.getLogger(__name__)


class Unreachable(SipError):
    """No answer at all to the INVITE: Timer B, an ICMP error, or the endpoint closed."""


def hop_ack(invite: SipMessage, response: SipMessage) -> SipMessage:
    """The ACK of a 3xx-6xx to `invite`, inside its transaction (RFC 3261 §17.1.1.3)."""
    ack = SipMessage(method="ACK", uri=invite.uri)
    ack.add_header("Via", invite.header_values("Via")[0])
    ack.add_header("Max-Forwards", "70")
    ack.add_header("From", invite.header("From") or "")
    ack.add_header("To", response.header("To") or "")
    ack.add_header("Call-ID", invite.call_id)
    ack.add_header("CSeq", f"{invite.cseq[0]} ACK")
    for route in invite.header_values("Route"):
        ack.add_header("Route", route)
    return ack


def cancel_of(invite: SipMessage) -> SipMessage:
    """The CANCEL of `invite` (RFC 3261 §9.1)."""
    cancel = SipMessage(method="CANCEL", uri=invite.uri)
    cancel.add_header("Via", invite.header_values("Via")[0])
    cancel.add_header("Max-Forwards", "70")
    for name in ("From", "To", "Call-ID"):
        cancel.add_header(name, invite.header(name) or "")
    cancel.add_header("CSeq", f"{invite.cseq[0]} CANCEL")
    for route in invite.header_values("Route"):
        cancel.add_header("Route", route)
    return cancel


class InviteClient:
    """One INVITE of ours, from its first send to the last ACK of its final answer."""

    def __init__(
        self,
        endpoint: SipEndpoint,
        peer: Peer,
        invite: SipMessage,
        *,
        on_provisional: Callable[[SipMessage], None],
        ack_2xx: Callable[[SipMessage], SipMessage | None],
        t1: float = T1,
    ) -> None:
        self.endpoint, self.peer, self.invite, self.t1 = endpoint, peer, invite, t1
        self.on_provisional, self.ack_2xx = on_provisional, ack_2xx
        self.branch = invite.branch or ""
        self.sent = 0  # the INVITE's sends, retransmissions included
        self.proceeding = False  # a provisional answer came
        self.final_answer: SipMessage | None = None
        self.cancel_sent: SipMessage | None = None
        self._cancel_wanted = False
        self._answered = asyncio.Event()  # any answer (or a failure): Timer A stops
        self._finished = asyncio.Event()  # the final answer, a failure, or a CANCEL given up
        self._cancel_answered = asyncio.Event()
        self._failure: str | None = None
        self._acks: dict[str | None, SipMessage | None] = {}  # by the final answer's To tag
        self._timers: list[asyncio.TimerHandle] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def final(self) -> SipMessage | None:
        """Send the INVITE; its final answer (ACKed), or None: cancelled, and no final answer
        came within 64·T1 of the CANCEL. Unreachable if no answer came at all."""
        loop = asyncio.get_running_loop()
        self.endpoint.listen(self.branch, self.received, self.closed)
        unwatch = self.endpoint.failures.watch(self.peer.address, self.unreachable)
        try:
            await self._send_until_answered(loop)
            await self._finished.wait()
        except BaseException:
            self._forget()
            raise
        finally:
            unwatch()
        if self._failure is not None:
            self._forget()
            raise Unreachable(self._failure)
        linger = 0.0 if self.peer.transport != "UDP" else 64 * self.t1  # Timer D, Accepted
        self._timers.append(loop.call_later(linger, self._forget))
        return self.final_answer

    async def _send_until_answered(self, loop: asyncio.AbstractEventLoop) -> None:
        resend = self.peer.transport == "UDP"
        deadline = loop.time() + 64 * self.t1
        interval = self.t1
        self._send(self.invite)
        self.sent += 1
        while not self._answered.is_set():
            left = deadline - loop.time()
            if left <= 0:
                self._failure = f"no answer from {_where(self.peer)} after {self.sent} sends"
                self._finished.set()
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._answered.wait(), min(interval, left))
            if resend and not self._answered.is_set() and loop.time() < deadline:
                self._send(self.invite)
                self.sent += 1
                interval *= 2  # Timer A doubles without a cap (§17.1.1.2)

    def _send(self, message: SipMessage) -> None:
        try:
            self.endpoint.send(message, self.peer)
        except ValueError as exc:  # a part that would break the framing: never sent
            log.warning("sip: %s to %s not sent: %s", message.method, _where(self.peer), exc)

    def cancel(self) -> None:
        """Cancel the INVITE: now if a provisional answer came, else as soon as one does;
        nothing once its final answer came."""
        if self.final_answer is not None or self._cancel_wanted or self._failure is not None:
            return
        self._cancel_wanted = True
        if self.proceeding:
            self._start_cancel()

    def _start_cancel(self) -> None:
        loop = asyncio.get_running_loop()
        self.cancel_sent = cancel_of(self.invite)
        task = loop.create_task(self._send_cancel(self.cancel_sent, loop))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._timers.append(loop.call_later(64 * self.t1, self._finished.set))  # §9.1

    async def _send_cancel(self, cancel: SipMessage, loop: asyncio.AbstractEventLoop) -> None:
        """The CANCEL's own transaction (non-INVITE, §17.1.2): sent again (Timer E) until any
        answer, for 64·T1 at most (Timer F)."""
        deadline = loop.time() + 64 * self.t1
        interval = self.t1
        while True:
            self._send(cancel)
            left = deadline - loop.time()
            if self.peer.transport != "UDP" or left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._cancel_answered.wait(), min(interval, left))
                return
            interval = min(interval * 2, T2)

    def received(self, response: SipMessage) -> None:
        """An answer with the INVITE's branch: to the CANCEL, or to the INVITE."""
        try:
            number, method = response.cseq
        except SipParseError as exc:
            log.warning("sip: an answer to our INVITE %s dropped: %s", self.branch, exc)
            return
        if method == "CANCEL":
            self._cancel_answered.set()
            return
        if method != "INVITE" or number != self.invite.cseq[0]:
            log.warning(
                "sip: a %s for %d %s dropped: not our INVITE", response.status, number, method
            )
            return
        self._answered.set()
        if (response.status or 0) < 200:
            self._provisional(response)
            return
        if self.final_answer is None and self._failure is None:
            self.final_answer = response
            self._finished.set()
        self._ack(response)

    def _provisional(self, response: SipMessage) -> None:
        if self.final_answer is not None:
            return  # late, after the final answer
        if not self.proceeding:
            self.proceeding = True
            if self._cancel_wanted:
                self._start_cancel()
        if (response.status or 0) > 100:
            self.on_provisional(response)

    def _ack(self, response: SipMessage) -> None:
        """ACK a final answer (again, for a retransmission)."""
        try:
            tag = parse_name_addr(response.header("To") or "").tag
        except SipParseError as exc:
            log.warning("sip: a %s to our INVITE has a bad To: %s", response.status, exc)
            return
        if tag not in self._acks:
            is_2xx = 200 <= (response.status or 0) < 300
            self._acks[tag] = self.ack_2xx(response) if is_2xx else hop_ack(self.invite, response)
        ack = self._acks[tag]
        if ack is not None:
            self._send(ack)

    def closed(self) -> None:
        """The endpoint closed: no answer will come."""
        self._fail("the SIP endpoint closed")

    def unreachable(self, why: str) -> None:
        """An ICMP error for the INVITE's destination (before any answer: else it was for
        something else sent there, and the answers say more)."""
        if not self._answered.is_set():
            self._fail(f"{_where(self.peer)}: {why}")

    def _fail(self, why: str) -> None:
        if self.final_answer is None and self._failure is None:
            self._failure = why
        self._answered.set()
        self._finished.set()

    def _forget(self) -> None:
        self.endpoint.forget(self.branch)
        for timer in self._timers:
            timer.cancel()
        for task in list(self._tasks):
            task.cancel()


def _where(peer: Peer) -> str:
    host, port = peer.address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
