"""A re-INVITE we send inside a call (a session refresh, RFC 4028 §7.4), as its INVITE client
transaction runs it (RFC 3261 §17.1.1). Over UDP the INVITE is sent again after T1, 2·T1,
4·T1 ... (Timer A) until an answer comes, and given up 64·T1 after the first send with none
(Timer B: SipError); over TCP and TLS it is sent once. Its final answer is ACKed: a 2xx end to
end (a new branch, the INVITE's CSeq number: §13.2.2.4), a refusal hop by hop (the INVITE's
branch, Request-URI and Route, the answer's To: §17.1.1.3). Each retransmission of the final
answer that comes within 64·T1 gets the same ACK again (Timer D; for a 2xx, RFC 6026 §8.4).

The endpoint hands every answer to the INVITE's branch to `received` (`SipEndpoint.listen`):
a provisional one stops Timer A, each final one is ACKed."""

from __future__ import annotations

import asyncio
import contextlib

from voice.transports.sip.dialog import SipDialog
from voice.transports.sip.endpoint import T1, SipEndpoint, SipError
from voice.transports.sip.message import SipMessage
from voice.transports.sip.uac import hop_ack


class Reinvite:
    """One re-INVITE in `dialog`, from its first send to the last ACK of its final answer."""

    def __init__(
        self, endpoint: SipEndpoint, dialog: SipDialog, invite: SipMessage, *, t1: float = T1
    ) -> None:
        self.endpoint, self.dialog, self.invite, self.t1 = endpoint, dialog, invite, t1
        self.branch = invite.branch or ""
        self.sent = 0  # the INVITE's sends, retransmissions included
        self.acks = 0  # ACKs sent, one per final answer (retransmissions included)
        self._answered = asyncio.Event()  # any answer: Timer A stops
        self._finished = asyncio.Event()  # the final answer (or the endpoint closed)
        self._final: SipMessage | None = None
        self._ack: SipMessage | None = None
        self._failure: SipError | None = None

    async def final(self) -> SipMessage:
        """Send the INVITE; its final answer, ACKed. SipError if none comes (Timer B, or 64·T1
        after a provisional answer) or the endpoint closes."""
        loop = asyncio.get_running_loop()
        self.endpoint.listen(self.branch, self.received, self.closed)
        try:
            await self._send_until_answered(loop)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._finished.wait(), 64 * self.t1)
        except BaseException:
            self._forget()
            raise
        if self._failure is not None or self._final is None:
            self._forget()
            raise self._failure or SipError("INVITE: a provisional answer, then nothing")
        reliable = self.dialog.peer.transport != "UDP"  # no final answer comes twice
        loop.call_later(0 if reliable else 64 * self.t1, self._forget)
        return self._final

    async def _send_until_answered(self, loop: asyncio.AbstractEventLoop) -> None:
        resend = self.dialog.peer.transport == "UDP"
        deadline = loop.time() + 64 * self.t1
        interval = self.t1
        self._send()
        while not self._answered.is_set():
            left = deadline - loop.time()
            if left <= 0:
                peer = self.dialog.peer.address
                raise SipError(f"INVITE: no answer from {peer} after {self.sent} sends")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._answered.wait(), min(interval, left))
            if resend and not self._answered.is_set() and loop.time() < deadline:
                self._send()
                interval *= 2  # Timer A doubles without a cap (§17.1.1.2)

    def _send(self) -> None:
        self.endpoint.send(self.invite, self.dialog.peer)
        self.sent += 1

    def received(self, response: SipMessage) -> None:
        """An answer to the INVITE: a provisional one stops Timer A; a final one (each time it
        comes) is ACKed."""
        self._answered.set()
        if (response.status or 0) < 200:
            return
        if self._final is None:
            self._final, self._ack = response, self._ack_for(response)
            self._finished.set()
        if self._ack is not None:
            self.endpoint.send(self._ack, self.dialog.peer)
            self.acks += 1

    def closed(self) -> None:
        """The endpoint closed: no answer will come."""
        self._failure = SipError("INVITE: endpoint closed")
        self._answered.set()
        self._finished.set()

    def _ack_for(self, response: SipMessage) -> SipMessage:
        number = self.invite.cseq[0]
        if 200 <= (response.status or 0) < 300:
            return self.dialog.request("ACK", cseq=number)
        return hop_ack(self.invite, response)

    def _forget(self) -> None:
        self.endpoint.forget(self.branch)
