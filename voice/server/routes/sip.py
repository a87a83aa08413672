"""Where SIP calls come in: INVITEs from an allowed trunk or PBX become calls of the switchboard
(the same cluster-wide admission as every call; the called number picks the agent), each with
its dialog and its RTP. Handles OPTIONS keep-alives, CANCEL before the answer, BYE from either
side and re-INVITEs (hold and unhold). Unknown sources get 403, a full cluster 486 or 503.
Requests inside a call (and a CANCEL) are let in from the call's peer (the host its INVITE came
from: the PBX, or the proxy that record-routes) and otherwise on the same terms as an INVITE."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import ssl

from voice.server.call_records import CallsFull
from voice.server.calls import Switchboard
from voice.server.routes.sip_answer import Offered, read_offer, refusal_headers
from voice.server.routes.sip_calls import WARN_EVERY_S, SipCall
from voice.server.routes.sip_start import Answering
from voice.server.settings import SipSettings
from voice.throttle import LogThrottle
from voice.transports.sip.body import BodyError
from voice.transports.sip.checks import refusal
from voice.transports.sip.dialog import (
    InviteTransaction,
    SipDialog,
    called_user,
    header_user,
)
from voice.transports.sip.digest import DigestAuth
from voice.transports.sip.endpoint import Peer, SipEndpoint
from voice.transports.sip.message import (
    SipMessage,
    parse_name_addr,
)
from voice.transports.sip.rtp import G711, RtpSession, open_rtp_session
from voice.transports.sip.sdp import SdpError
from voice.transports.sip.timers import IntervalTooSmall, SessionTimer

log = logging.getLogger(__name__)

_BUSY = {"capacity", "worker_full", "cluster_full"}


class SipService(Answering):
    """The SIP side of one worker: an endpoint on `settings.sip` and the calls it carries."""

    def __init__(self, board: Switchboard, settings: SipSettings, default_host: str) -> None:
        self.board = board
        self.settings = settings
        self.host = settings.host or default_host
        tls = None
        if settings.tls_cert_file and settings.tls_key_file:
            tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            tls.minimum_version = ssl.TLSVersion.TLSv1_2
            tls.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
        self.endpoint = SipEndpoint(
            self.host,
            settings.port,
            self.on_request,
            tls=tls,
            tls_port=settings.tls_port,
            trusted=self.allowed,  # reads self._allowed, set below, only when a message comes
            limits=settings.limits,
        )
        self.calls: dict[str, SipCall] = {}  # by SIP Call-ID
        self.invites: dict[str, InviteTransaction] = {}  # INVITEs being answered, by Call-ID
        self.warnings = LogThrottle(every_s=WARN_EVERY_S)
        self._allowed = [ipaddress.ip_network(a, strict=False) for a in settings.allow]
        users = {name: secret.get_secret_value() for name, secret in settings.users.items()}
        self.digest = DigestAuth(users, settings.realm) if users else None
        self._tasks: set[asyncio.Task[object]] = set()

    @property
    def public(self) -> str:
        return self.settings.public_address or self.host

    def sent_by(self, transport: str) -> str:
        """Our host:port for Via headers and Contact, on `transport`'s port."""
        port = self.endpoint.tls_port if transport == "TLS" else self.endpoint.port
        return f"{self.public}:{port}"

    def contact(self, transport: str) -> str:
        return f"sip:hotline@{self.sent_by(transport)};transport={transport.lower()}"

    async def start(self) -> None:
        await self.endpoint.start()

    async def close(self) -> None:
        await self.endpoint.close()

    def allowed(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self._allowed)

    def _authenticated(self, request: SipMessage, peer: Peer) -> bool:
        """A source off the allow-list: challenged (if users are set) or refused; True once it
        proved a user."""
        method = request.method or ""
        if self.digest is None:
            log.warning("sip: %s from %s refused: not an allowed source", method, peer.host)
            self._reply(request, peer, 403, "Forbidden")
            return False
        verdict = self.digest.check(request, peer.host)
        if verdict.user is not None:
            self.endpoint.vouch(peer.host)
            return True
        if request.header("Authorization") and not verdict.stale:
            log.warning(
                "sip: %s from %s refused: wrong credentials (%s)", method, peer.host, verdict.reason
            )
            self._reply(request, peer, 403, "Forbidden")
            return False
        if verdict.stale:  # a right answer to an old or used nonce: a new one, no password asked
            level = logging.INFO if verdict.reason == "nonce expired" else logging.WARNING
            log.log(
                level, "sip: %s from %s challenged again: %s", method, peer.host, verdict.reason
            )
        challenge = self.digest.challenge(peer.host, stale=verdict.stale)
        self._reply(request, peer, 401, "Unauthorized", [("WWW-Authenticate", challenge)])
        return False

    # -- requests ----------------------------------------------------------------------------

    def _from_peer(self, request: SipMessage, peer: Peer) -> bool:
        """Whether `request` comes from the host of the call (or of the INVITE being answered)
        its Call-ID names: the caller's side, or the proxy in front of it."""
        pending = self.invites.get(request.call_id)
        call = self.calls.get(request.call_id)
        return (pending is not None and peer.host == pending.peer.host) or (
            call is not None and peer.host == call.dialog.peer.host
        )

    def _let_in(self, request: SipMessage, peer: Peer) -> bool:
        """The call's peer, an allowed source, or (answering a challenge) a proven user. A
        CANCEL cannot be challenged (RFC 3261 §22.1): from anyone else it gets 403."""
        if self._from_peer(request, peer) or self.allowed(peer.host):
            return True
        if request.method == "CANCEL":
            self.warnings.warn(
                log,
                "cancel-stranger",
                "sip: CANCEL from %s refused: neither the INVITE's source nor allowed",
                peer.host,
            )
            self._reply(request, peer, 403, "Forbidden")
            return False
        return self._authenticated(request, peer)

    def _ack(self, request: SipMessage, peer: Peer) -> None:
        """The ACK of our 200 ends its retransmissions; ACKs of refusals need nothing."""
        call = self.calls.get(request.call_id)
        if call is None or not call.dialog.matches(request):
            return
        if not self._from_peer(request, peer) and not self.allowed(peer.host):
            self.warnings.warn(
                log, "ack", "sip: ACK from %s dropped: not the call's peer", peer.host
            )
            return
        call.dialog.acknowledged(request)

    async def on_request(self, request: SipMessage, peer: Peer) -> None:
        method = request.method or ""
        if method == "ACK":
            self._ack(request, peer)
            return
        if not self._let_in(request, peer):
            return
        if (refused := refusal(request)) is not None:  # RFC 3261 §8.2.2, after the way in
            line = "sip: %s from %s refused (%d): %s"
            args = (method, peer.host, refused.status, refused.why)
            self.warnings.warn(log, f"refused {refused.status}", line, *args)
            self._reply(request, peer, refused.status, refused.reason, list(refused.headers))
            return
        if method == "OPTIONS":
            if self.board.draining:  # a dispatcher's health probe: send no new calls here
                self._reply(request, peer, 503, "Service Unavailable", [("Retry-After", "60")])
            else:
                self._reply(request, peer, 200, "OK", [("Accept", "application/sdp")])
        elif method == "INVITE":
            await self._invite(request, peer)
        elif method == "BYE":
            self._bye(request, peer)
        elif method == "CANCEL":
            self._cancel(request, peer)
        elif method == "NOTIFY":
            self._notify(request, peer)
        elif method == "UPDATE":
            self._update(request, peer)
        elif method == "REGISTER":  # a PBX that registers its trunk: welcome (nothing is bound)
            expires = request.header("Expires") or "3600"
            contacts = [("Contact", c) for c in request.header_values("Contact")]
            self._reply(request, peer, 200, "OK", [*contacts, ("Expires", expires)])
        else:  # a method we do not know (RFC 3261 §8.2.1); Allow lists the ones we do
            self._reply(request, peer, 501, "Not Implemented")

    # -- INVITE ------------------------------------------------------------------------------

    async def _invite(self, request: SipMessage, peer: Peer) -> None:
        to_tag = parse_name_addr(request.header("To") or "").tag
        if to_tag is not None:
            call = self._find(request)
            if call is None:
                self._reply(request, peer, 481, "Call/Transaction Does Not Exist")
            else:
                self._reinvite(call, request, peer)
            return
        if self._merged(request, peer):
            return
        # Registered before the first await: a CANCEL right behind the INVITE finds it.
        invite = self.invites[request.call_id] = InviteTransaction(request, peer)
        try:
            await self._new_call(invite)
        finally:
            if self.invites.get(request.call_id) is invite:
                del self.invites[request.call_id]

    def _merged(self, request: SipMessage, peer: Peer) -> bool:
        """A new INVITE for a Call-ID already being answered or in a call: its retransmission
        (ignored: the endpoint answers those), or another request (482, a merged request,
        RFC 3261 §8.2.2.2): one Call-ID is one call."""
        pending = self.invites.get(request.call_id)
        call = self.calls.get(request.call_id)
        if pending is None and call is None:
            return False
        if pending is not None and pending.retransmission(request, peer):
            return True
        if call is not None and call.dialog.retransmission(request, peer):
            return True
        self.warnings.warn(
            log, "merged", "sip: INVITE from %s refused: its Call-ID is in use (482)", peer.host
        )
        self._reply(request, peer, 482, "Loop Detected")
        return True

    async def _new_call(self, invite: InviteTransaction) -> None:
        """Answer a new INVITE: admitted, its RTP opened, rung (if so set), answered, the call
        started. A CANCEL can stop it at every await; then nothing of it is kept. Without an
        offer (RFC 3261 §13.2.1) the 200 carries ours and the call starts on the ACK's answer."""
        request, peer = invite.invite, invite.peer
        self._reply(request, peer, 100, "Trying")
        offered = self._offered(request, peer)
        if offered is None:
            return
        allowed, timer = self._asked_timer(request, peer)
        if not allowed:
            return
        caller, callee = header_user(request.header("From")), called_user(request)
        call_id = await self._admit(request, peer, caller, callee)
        if call_id is None:
            return
        if invite.cancelled.is_set():  # while admission was asked for
            self._let_go(invite, call_id)
            return
        rtp = await self._open_rtp(invite, offered, call_id)
        if rtp is None:
            return
        sent_by = self.sent_by(peer.transport)
        contact = self.contact(peer.transport)
        dialog = SipDialog(request, peer, invite.local_tag, sent_by, contact)
        call = SipCall(dialog, rtp, call_id)
        self.calls[request.call_id] = call
        if not await self._rung(invite, call):
            return
        call.timer = timer
        headers = timer.headers() if timer is not None else []
        body = self._first_sdp(call, offered).encode()
        ok = self._reply(request, peer, 200, "OK", headers, to_tag=dialog.local_tag, body=body)
        if offered.remote is None:
            await self._late_answer(call, ok, caller, callee)
            return
        self._start(call, offered.remote, caller, callee)
        if not await dialog.resend_until_acked(self.endpoint, ok):
            log.warning("sip: call %s: no ACK for our answer; hanging up", call_id)
            if call.media is not None:
                call.media.hang_up("no ACK")

    def _offered(self, request: SipMessage, peer: Peer) -> Offered | None:
        """The INVITE's offer (or a late offer); None once refused (400, 415 or 488)."""
        try:
            return read_offer(request, self.settings.codecs)
        except (SdpError, BodyError) as exc:
            log.warning("sip: INVITE from %s refused: %s", peer.host, exc)
            self._reply(request, peer, exc.status, exc.reason, refusal_headers(exc))
            return None

    def _asked_timer(self, request: SipMessage, peer: Peer) -> tuple[bool, SessionTimer | None]:
        """The session timer the INVITE asks for (None: none); (False, None) once refused with
        422."""
        try:
            return True, SessionTimer.asked(request, self.settings.min_session_expires_s)
        except IntervalTooSmall as small:
            headers = [("Min-SE", str(small.minimum))]
            self._reply(request, peer, 422, "Session Interval Too Small", headers)
            return False, None

    async def _admit(
        self, request: SipMessage, peer: Peer, caller: str | None, callee: str | None
    ) -> str | None:
        """The switchboard's admission of the call; None once refused (486 or 503)."""
        try:
            return await self.board.admit("sip", caller=caller, callee=callee)
        except CallsFull as full:
            busy = full.reason in _BUSY
            log.warning("sip: INVITE from %s refused: %s", peer.host, full.reason)
            headers = [] if busy else [("Retry-After", "5")]
            self._reply(
                request,
                peer,
                486 if busy else 503,
                "Busy Here" if busy else "Service Unavailable",
                headers,
            )
            return None

    async def _open_rtp(
        self, invite: InviteTransaction, offered: Offered, call_id: str
    ) -> RtpSession | None:
        """The call's RTP port (towards the offer's address; a late offer's: none yet, so
        nothing is sent before the answer); None if none is free (503) or it was cancelled."""
        request, peer = invite.invite, invite.peer
        remote = offered.remote
        try:
            rtp = await open_rtp_session(
                self.host,
                self.settings.rtp_ports,
                codec=G711(offered.codec.name),
                dtmf_payload_type=offered.dtmf.payload_type if offered.dtmf else None,
                on_audio=lambda pcm, at: self._audio(request.call_id, pcm, at),
                on_dtmf=lambda digit, at: self._key(request.call_id, digit, at),
                remote=(remote.address, remote.port) if remote is not None else None,
                signalling_host=peer.host,  # behind NAT, media comes from where the INVITE did
            )
        except OSError as exc:
            log.error("sip: no RTP port free: %s", exc)
            self.board.release(call_id)
            self._reply(request, peer, 503, "Service Unavailable", [("Retry-After", "5")])
            return None
        if invite.cancelled.is_set():  # while the RTP port was opened
            self._let_go(invite, call_id, rtp)
            return None
        return rtp

    async def _rung(self, invite: InviteTransaction, call: SipCall) -> bool:
        """180 and the ring time (if set); False if a CANCEL came meanwhile."""
        if not self.settings.answer_after_ms:
            return True
        request, peer = invite.invite, invite.peer
        self._reply(request, peer, 180, "Ringing", to_tag=call.dialog.local_tag)
        with contextlib.suppress(TimeoutError):
            ring_s = self.settings.answer_after_ms / 1e3
            await asyncio.wait_for(invite.cancelled.wait(), ring_s)
        if invite.cancelled.is_set():
            self._let_go(invite, call.call_id, call.rtp, call)
            return False
        return True

    def _let_go(
        self,
        invite: InviteTransaction,
        call_id: str,
        rtp: RtpSession | None = None,
        call: SipCall | None = None,
    ) -> None:
        """A cancelled INVITE (its 487 is sent): its admission, RTP port and call let go."""
        if rtp is not None:
            rtp.close()
        if call is not None and self.calls.get(invite.invite.call_id) is call:
            del self.calls[invite.invite.call_id]
        self.board.release(call_id)
        log.info("sip: call %s cancelled before the answer", call_id)

    # -- media callbacks ---------------------------------------------------------------------

    def _audio(self, sip_call_id: str, pcm: object, at: float) -> None:
        call = self.calls.get(sip_call_id)
        if call is not None and call.media is not None:
            call.media.audio_in(pcm, at)  # type: ignore[arg-type]

    def _key(self, sip_call_id: str, digit: str, at: float) -> None:
        call = self.calls.get(sip_call_id)
        if call is not None and call.media is not None:
            call.media.key_in(digit, at)
