"""Inside an answered SIP call: re-INVITE and UPDATE (hold, unhold, media moves, session
refreshes), REFER for transfers and its NOTIFYs, CANCEL and BYE from the caller, our BYE when
the conversation ends. `SipService` (voice/server/routes/sip.py) is the door calls come in by;
this is what it does with them once in."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from pipeline.tools import Transfer
from voice.agents.transfer import CallControlError
from voice.server.routes.sip_answer import apply_answer, preferring, read_answer, reoffer, sdp_of
from voice.server.settings import SipSettings
from voice.throttle import LogThrottle
from voice.transports.sip.body import BodyError
from voice.transports.sip.dialog import InviteTransaction, SipDialog, same_transaction
from voice.transports.sip.endpoint import Peer, SipEndpoint, SipError
from voice.transports.sip.media import SipMedia
from voice.transports.sip.message import (
    SipMessage,
    response_to,
)
from voice.transports.sip.refer import Refer, ReferFailed, refer_target
from voice.transports.sip.reinvite import Reinvite
from voice.transports.sip.rtp import RtpSession
from voice.transports.sip.sdp import SdpError, answer, choose, parse_sdp
from voice.transports.sip.timers import SessionTimer

log = logging.getLogger("voice.server.routes.sip")

ALLOW = "INVITE, ACK, BYE, CANCEL, OPTIONS, NOTIFY, REGISTER, UPDATE"
WARN_EVERY_S = 10.0  # a refusal a flood could repeat is logged at most this often (per kind)
GLARE_WAIT_S = (2.1, 4.0)  # a re-INVITE of ours answered 491 is tried again after (§14.1)


@dataclass
class SipCall:
    """A SIP call from its INVITE to its end."""

    dialog: SipDialog
    rtp: RtpSession
    call_id: str  # ours (the switchboard's), not the SIP Call-ID
    media: SipMedia | None = None
    bye_received: bool = False
    session_id: int = field(default_factory=lambda: random.randrange(1, 2**31))
    version: int = 1
    refer: Refer | None = None  # a transfer we asked for
    timer: SessionTimer | None = None  # session timer, when the caller asked for one
    local_sdp: bytes = b""  # the SDP of our last 2xx (what a refresh re-INVITE offers again)
    reinviting: bool = False  # our re-INVITE awaits its answer: the caller's gets 491 (§14.2)


class InCall:
    """The in-call half of `SipService`."""

    endpoint: SipEndpoint
    calls: dict[str, SipCall]  # by SIP Call-ID
    invites: dict[str, InviteTransaction]  # INVITEs being answered, by SIP Call-ID
    warnings: LogThrottle  # refusals a flood could repeat
    settings: SipSettings  # (sipB: the codecs a re-INVITE may switch to)
    _tasks: set[asyncio.Task[object]]

    @property
    def public(self) -> str:
        raise NotImplementedError

    def contact(self, transport: str) -> str:
        raise NotImplementedError

    def _reply(
        self,
        request: SipMessage,
        peer: Peer,
        status: int,
        reason: str,
        headers: list[tuple[str, str]] | None = None,
        *,
        to_tag: str | None = None,
        body: bytes = b"",
    ) -> SipMessage:
        extra = [("Allow", ALLOW), ("Supported", "timer"), ("User-Agent", "Hotline")]
        extra.extend(headers or [])
        if 100 < status < 300 and request.method == "INVITE":
            # Dialog-creating answers: proxies that record-route stay in the path (§12.1.1).
            extra.extend(("Record-Route", r) for r in request.header_values("Record-Route"))
            extra.append(("Contact", f"<{self.contact(peer.transport)}>"))
        response = response_to(
            request,
            status,
            reason,
            to_tag=to_tag,
            headers=extra,
            body=body,
            content_type="application/sdp" if body else None,
        )
        call = self.calls.get(request.call_id)
        if body and 200 <= status < 300 and call is not None:
            call.local_sdp = body
        if status >= 200 and request.method == "INVITE":
            pending = self.invites.get(request.call_id)
            if pending is not None and pending.invite is request:
                if pending.final:
                    return response  # one final answer per INVITE: a CANCEL's 487 came first
                pending.final = True  # a CANCEL from now on changes nothing
        self.endpoint.send(response, peer)
        return response

    def _find(self, request: SipMessage) -> SipCall | None:
        call = self.calls.get(request.call_id)
        return call if call is not None and call.dialog.matches(request) else None

    async def _watch_session(self, call: SipCall, timer: SessionTimer) -> None:
        """The caller refreshes: end the call when the interval passes without. We refresh
        (`refresher=uas`): an UPDATE or re-INVITE every third of the interval; a 408 or 481 or
        no answer ends the call with BYE (RFC 4028 §10)."""
        if timer.ours:
            reason = await self._refresh_session(call, timer)
        else:
            await timer.expired()
            reason = "session expired (no refresh)"
        if call.media is not None and call.dialog.call_id in self.calls:
            log.warning("sip: call %s: %s", call.call_id, reason)
            call.media.hang_up("session expired")

    async def _refresh_session(self, call: SipCall, timer: SessionTimer) -> str:
        """Refresh by UPDATE without a body, or by re-INVITE when the caller does not allow
        UPDATE (RFC 4028 §7.4), until a refresh fails; why it did. A 491 to our re-INVITE is
        tried again once, after 2.1-4 s (RFC 3261 §14.1)."""
        while call.dialog.call_id in self.calls:
            await asyncio.sleep(timer.refresh_due())  # a schedule, not a synchronisation
            if call.dialog.call_id not in self.calls:
                break
            try:
                status = await self._refresh_once(call, timer)
                if status == 491 and call.dialog.call_id in self.calls:
                    await asyncio.sleep(random.uniform(*GLARE_WAIT_S))  # a schedule too
                    status = await self._refresh_once(call, timer)
            except SipError as exc:
                return f"session refresh failed: {exc}"
            if status in (408, 481):
                return f"session refresh answered {status}"
            if not 200 <= status < 300:
                await timer.expired()  # other refusals: the session lasts out its interval
                return f"session expired (refresh answered {status})"
            timer.refresh()
        return "call over"

    async def _refresh_once(self, call: SipCall, timer: SessionTimer) -> int:
        """One refresh request and its final status; SipError if none comes."""
        if timer.update:
            update = call.dialog.request("UPDATE", timer.refresh_headers())
            return (await self.endpoint.request(update, call.dialog.peer)).status or 0
        invite = call.dialog.request("INVITE", timer.refresh_headers())
        invite.add_header("Content-Type", "application/sdp")
        invite.body = call.local_sdp
        call.reinviting = True
        try:
            answer = await Reinvite(self.endpoint, call.dialog, invite).final()
        finally:
            call.reinviting = False
        status = answer.status or 0
        if 200 <= status < 300:
            self._answered_refresh(call, answer)
        return status

    def _answered_refresh(self, call: SipCall, answer: SipMessage) -> None:
        """The 2xx to our re-INVITE carries the caller's answer: the same media, or a move
        (another address, port or codec), applied as a caller's re-INVITE is."""
        try:
            codecs = preferring(call.rtp.codec.name, self.settings.codecs)
            remote, codec, dtmf = read_answer(answer, codecs)
        except (SdpError, BodyError) as exc:
            log.warning("sip: call %s: refresh answer not used: %s", call.call_id, exc)
            return
        apply_answer(call, remote, codec, dtmf)

    def _update(self, request: SipMessage, peer: Peer) -> None:
        """UPDATE: a session refresh (RFC 4028), or a new offer like a re-INVITE's."""
        call = self._find(request)
        if call is None:
            self._reply(request, peer, 481, "Call/Transaction Does Not Exist")
        elif request.body:
            self._reinvite(call, request, peer)
        else:
            if call.timer is not None:
                call.timer.refresh()
            headers = call.timer.headers() if call.timer is not None else []
            self._reply(request, peer, 200, "OK", headers, to_tag=call.dialog.local_tag)

    def _reinvite(self, call: SipCall, request: SipMessage, peer: Peer) -> None:
        """Hold, unhold, a media move or a codec change (to any codec we have, RFC 3264 §8.3.2):
        the new offer is answered and applied. Without an offer (RFC 3261 §14.2) we offer.
        While our own re-INVITE waits for its answer: 491 (§14.2)."""
        if call.reinviting:
            self._reply(request, peer, 491, "Request Pending")
            return
        try:
            sdp = sdp_of(request)
        except BodyError as bad:
            log.warning("sip: call %s: %s refused: %s", call.call_id, request.method, bad)
            self._reply(request, peer, bad.status, bad.reason, bad.headers())
            return
        if not sdp and request.method == "INVITE":
            reoffer(self, call, request, peer)
            return
        try:
            remote = parse_sdp(sdp)
            codec, dtmf = choose(remote, preferring(call.rtp.codec.name, self.settings.codecs))
        except SdpError as exc:
            self._reply(request, peer, exc.status, exc.reason)
            return
        if call.timer is not None:
            call.timer.refresh()
        apply_answer(call, remote, codec, dtmf)
        call.version += 1
        sdp_text = answer(
            remote,
            address=self.public,
            port=call.rtp.local_port,
            codec=codec,
            dtmf=dtmf,
            session_id=call.session_id,
            version=call.version,
        )
        headers = call.timer.headers() if call.timer is not None else []
        body = sdp_text.encode()
        self._reply(request, peer, 200, "OK", headers, to_tag=call.dialog.local_tag, body=body)
        state = "on hold" if remote.on_hold else "resumed"
        log.info("sip: call %s %s (%s)", call.call_id, state, codec.name)

    # -- transfer (REFER, RFC 3515) ----------------------------------------------------------

    def supports(self, transport: str) -> bool:
        return transport == "sip"

    async def transfer(self, transport: str, call_id: str, action: Transfer) -> str:
        """Blind transfer: REFER the caller to `action.target`; the final status its NOTIFYs
        report ("SIP/2.0 200 OK"). CallControlError if the REFER is refused or unanswered, or
        the caller's side reports that the transfer failed."""
        call = next((c for c in self.calls.values() if c.call_id == call_id), None)
        if call is None:
            raise CallControlError(f"no SIP call {call_id}", provider="sip")
        target = refer_target(action.target, call.dialog.peer.host)
        call.refer = Refer(self.endpoint, call.dialog)
        try:
            outcome = await call.refer.send(target)
        except ReferFailed as exc:
            raise CallControlError(str(exc), provider="sip", status=exc.status) from exc
        log.info("sip: call %s: REFER to %s: %s", call_id, target, outcome)
        return outcome

    def _notify(self, request: SipMessage, peer: Peer) -> None:
        call = self._find(request)
        if call is None:
            self._reply(request, peer, 481, "Call/Transaction Does Not Exist")
            return
        self._reply(request, peer, 200, "OK")
        if call.refer is not None:
            call.refer.notified(request)

    # -- the end -----------------------------------------------------------------------------

    def _bye(self, request: SipMessage, peer: Peer) -> None:
        call = self._find(request)
        if call is None:
            self._reply(request, peer, 481, "Call/Transaction Does Not Exist")
            return
        self._reply(request, peer, 200, "OK")
        call.bye_received = True
        if call.media is not None:
            call.media.hang_up("caller hung up (BYE)")

    def _cancel(self, request: SipMessage, peer: Peer) -> None:
        """CANCEL (RFC 3261 §9.2) of the INVITE whose transaction it matches (top Via branch
        and sent-by, Call-ID): before the INVITE's final answer, 200 and the INVITE 487 (the
        call never starts: `_invite` sees `cancelled` and lets everything go); after it, 200
        and no effect. A CANCEL that matches no INVITE gets 481."""
        pending = self.invites.get(request.call_id)
        if pending is not None and same_transaction(pending.invite, request):
            self._reply(request, peer, 200, "OK")
            if not pending.final:
                pending.cancelled.set()
                invite = pending.invite
                self._reply(
                    invite, pending.peer, 487, "Request Terminated", to_tag=pending.local_tag
                )
            return
        call = self.calls.get(request.call_id)
        if call is not None and same_transaction(call.dialog.invite, request):
            self._reply(request, peer, 200, "OK")  # answered already: too late to cancel
            return
        self.warnings.warn(log, "cancel", "sip: CANCEL from %s matches no INVITE: 481", peer.host)
        self._reply(request, peer, 481, "Call/Transaction Does Not Exist")

    def _ended(self, call: SipCall) -> None:
        """The conversation is over: unless the caller said BYE, we do."""
        self.calls.pop(call.dialog.call_id, None)
        if not call.bye_received and not call.dialog.ended:
            call.dialog.ended = True
            self._spawn(self._send_bye(call))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_bye(self, call: SipCall) -> None:
        bye = call.dialog.request("BYE")
        try:
            response = await self.endpoint.request(bye, call.dialog.peer)
            log.info("sip: call %s: BYE answered %s", call.call_id, response.status)
        except SipError as exc:
            log.warning("sip: call %s: BYE: %s", call.call_id, exc)
