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
from voice.server.routes.sip_calls import WARN_EVERY_S, InCall, SipCall
from voice.server.settings import SipSettings
from voice.throttle import LogThrottle
from voice.transports.sip.dialog import (
    InviteTransaction,
    SipDialog,
    called_user,
    header_user,
)
from voice.transports.sip.digest import DigestAuth
from voice.transports.sip.endpoint import Peer, SipEndpoint
from voice.transports.sip.media import SipMedia
from voice.transports.sip.message import (
    SipMessage,
    parse_name_addr,
)
from voice.transports.sip.rtp import G711, RtpSession, open_rtp_session
from voice.transports.sip.sdp import SdpError, answer, choose, parse_sdp
from voice.transports.sip.timers import IntervalTooSmall, SessionTimer

log = logging.getLogger(__name__)

_BUSY = {"capacity", "worker_full", "cluster_full"}


class SipService(InCall):
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
        call.dialog.acked.set()

    async def on_request(self, request: SipMessage, peer: Peer) -> None:
        method = request.method or ""
        if method == "ACK":
            self._ack(request, peer)
            return
        if not self._let_in(request, peer):
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
        else:
            self._reply(request, peer, 405, "Method Not Allowed")

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
        started. A CANCEL can stop it at every await; then nothing of it is kept."""
        request, peer = invite.invite, invite.peer
        self._reply(request, peer, 100, "Trying")
        try:
            remote = parse_sdp(request.body)
            codec, dtmf = choose(remote, self.settings.codecs)
        except SdpError as exc:
            log.warning("sip: INVITE from %s refused: %s", peer.host, exc)
            self._reply(
                request,
                peer,
                exc.status,
                exc.reason,
                [("Warning", f'399 hotline "{exc}"')],
            )
            return
        try:
            timer = SessionTimer.asked(request, self.settings.min_session_expires_s)
        except IntervalTooSmall as small:
            headers = [("Min-SE", str(small.minimum))]
            self._reply(request, peer, 422, "Session Interval Too Small", headers)
            return
        caller, callee = header_user(request.header("From")), called_user(request)
        try:
            call_id = await self.board.admit("sip", caller=caller, callee=callee)
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
            return
        if invite.cancelled.is_set():  # while admission was asked for
            self._let_go(invite, call_id)
            return
        try:
            rtp = await open_rtp_session(
                self.host,
                self.settings.rtp_ports,
                codec=G711(codec.name),
                dtmf_payload_type=dtmf.payload_type if dtmf else None,
                on_audio=lambda pcm, at: self._audio(request.call_id, pcm, at),
                on_dtmf=lambda digit, at: self._key(request.call_id, digit, at),
                remote=(remote.address, remote.port),
                signalling_host=peer.host,  # behind NAT, media comes from where the INVITE did
            )
        except OSError as exc:
            log.error("sip: no RTP port free: %s", exc)
            self.board.release(call_id)
            self._reply(request, peer, 503, "Service Unavailable", [("Retry-After", "5")])
            return
        if invite.cancelled.is_set():  # while the RTP port was opened
            self._let_go(invite, call_id, rtp)
            return
        sent_by = self.sent_by(peer.transport)
        contact = self.contact(peer.transport)
        dialog = SipDialog(request, peer, invite.local_tag, sent_by, contact)
        call = SipCall(dialog, rtp, call_id)
        self.calls[request.call_id] = call
        if self.settings.answer_after_ms:
            self._reply(request, peer, 180, "Ringing", to_tag=dialog.local_tag)
            with contextlib.suppress(TimeoutError):
                ring_s = self.settings.answer_after_ms / 1e3
                await asyncio.wait_for(invite.cancelled.wait(), ring_s)
            if invite.cancelled.is_set():
                self._let_go(invite, call_id, rtp, call)
                return
        sdp = answer(
            remote,
            address=self.public,
            port=rtp.local_port,
            codec=codec,
            dtmf=dtmf,
            session_id=call.session_id,
            version=call.version,
        )
        call.timer = timer
        headers = timer.headers() if timer is not None else []
        ok = self._reply(
            request, peer, 200, "OK", headers, to_tag=dialog.local_tag, body=sdp.encode()
        )
        call.media = SipMedia(
            call_id,
            rtp,
            on_close=lambda: self._ended(call),
            idle_timeout_s=self.settings.media_timeout_s,
        )
        call.media.held = remote.on_hold
        self.board.start(call_id, call.media, "sip", caller=caller, callee=callee)
        log.info(
            "sip: call %s from %s over %s (%s to %s, %s)",
            call_id,
            peer.host,
            peer.transport,
            caller,
            callee,
            codec.name,
        )
        if timer is not None:
            self._spawn(self._watch_session(call, timer))
        if not await dialog.resend_until_acked(self.endpoint, ok):
            log.warning("sip: call %s: no ACK for our answer; hanging up", call_id)
            call.media.hang_up("no ACK")

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
