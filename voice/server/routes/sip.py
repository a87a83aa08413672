"""Where SIP calls come in: INVITEs from an allowed trunk or PBX become calls of the switchboard
(the same cluster-wide admission as every call; the called number picks the agent), each with
its dialog and its RTP. Handles OPTIONS keep-alives, CANCEL before the answer, BYE from either
side and re-INVITEs (hold and unhold). Unknown sources get 403, a full cluster 486 or 503."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import random
import ssl
from dataclasses import dataclass, field

from pipeline.tools import Transfer
from voice.agents.transfer import CallControlError
from voice.server.call_records import CallsFull
from voice.server.calls import Switchboard
from voice.server.settings import SipSettings
from voice.transports.sip.dialog import SipDialog, called_user, header_user
from voice.transports.sip.digest import DigestAuth
from voice.transports.sip.endpoint import Peer, SipEndpoint, SipError
from voice.transports.sip.media import SipMedia
from voice.transports.sip.message import (
    SipMessage,
    new_tag,
    parse_name_addr,
    response_to,
)
from voice.transports.sip.refer import Refer, ReferFailed, refer_target
from voice.transports.sip.rtp import G711, RtpSession, open_rtp_session
from voice.transports.sip.sdp import SdpError, answer, choose, parse_sdp

log = logging.getLogger(__name__)

ALLOW = "INVITE, ACK, BYE, CANCEL, OPTIONS, NOTIFY, REGISTER"
_BUSY = {"capacity", "worker_full", "cluster_full"}


@dataclass
class SipCall:
    """A SIP call from its INVITE to its end."""

    dialog: SipDialog
    rtp: RtpSession
    call_id: str  # ours (the switchboard's), not the SIP Call-ID
    media: SipMedia | None = None
    answered: bool = False
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    bye_received: bool = False
    session_id: int = field(default_factory=lambda: random.randrange(1, 2**31))
    version: int = 1
    refer: Refer | None = None  # a transfer we asked for


class SipService:
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
            self.host, settings.port, self.on_request, tls=tls, tls_port=settings.tls_port
        )
        self.calls: dict[str, SipCall] = {}  # by SIP Call-ID
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
        user = self.digest.check(request)
        if user is not None:
            return True
        if request.header("Authorization"):
            log.warning("sip: %s from %s refused: wrong credentials", method, peer.host)
            self._reply(request, peer, 403, "Forbidden")
        else:
            self._reply(
                request, peer, 401, "Unauthorized", [("WWW-Authenticate", self.digest.challenge())]
            )
        return False

    # -- requests ----------------------------------------------------------------------------

    async def on_request(self, request: SipMessage, peer: Peer) -> None:
        method = request.method or ""
        if method == "ACK":
            call = self.calls.get(request.call_id)
            if call is not None:
                call.dialog.acked.set()
            return
        known = request.call_id in self.calls  # inside a call its INVITE was let in for
        if not known and not self.allowed(peer.host) and not self._authenticated(request, peer):
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
        elif method == "REGISTER":  # a PBX that registers its trunk: welcome (nothing is bound)
            expires = request.header("Expires") or "3600"
            contacts = [("Contact", c) for c in request.header_values("Contact")]
            self._reply(request, peer, 200, "OK", [*contacts, ("Expires", expires)])
        else:
            self._reply(request, peer, 405, "Method Not Allowed")

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
        extra = [("Allow", ALLOW), ("User-Agent", "Hotline"), *(headers or [])]
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
        self.endpoint.send(response, peer)
        return response

    def _find(self, request: SipMessage) -> SipCall | None:
        call = self.calls.get(request.call_id)
        return call if call is not None and call.dialog.matches(request) else None

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
        if request.call_id in self.calls:
            return  # a retransmission still being handled
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
                "Not Acceptable Here",
                [("Warning", f'399 hotline "{exc}"')],
            )
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
        try:
            rtp = await open_rtp_session(
                self.host,
                self.settings.rtp_ports,
                codec=G711(codec.name),
                dtmf_payload_type=dtmf.payload_type if dtmf else None,
                on_audio=lambda pcm, at: self._audio(request.call_id, pcm, at),
                on_dtmf=lambda digit, at: self._key(request.call_id, digit, at),
                remote=(remote.address, remote.port),
            )
        except OSError as exc:
            log.error("sip: no RTP port free: %s", exc)
            self.board.release(call_id)
            self._reply(request, peer, 503, "Service Unavailable", [("Retry-After", "5")])
            return
        sent_by = self.sent_by(peer.transport)
        dialog = SipDialog(request, peer, new_tag(), sent_by, self.contact(peer.transport))
        call = SipCall(dialog, rtp, call_id)
        self.calls[request.call_id] = call
        if self.settings.answer_after_ms:
            self._reply(request, peer, 180, "Ringing", to_tag=dialog.local_tag)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(call.cancelled.wait(), self.settings.answer_after_ms / 1e3)
            if call.cancelled.is_set():
                rtp.close()
                self.board.release(call_id)
                self.calls.pop(request.call_id, None)
                log.info("sip: call %s cancelled before the answer", call_id)
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
        ok = self._reply(request, peer, 200, "OK", to_tag=dialog.local_tag, body=sdp.encode())
        call.answered = True
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
        if not await dialog.resend_until_acked(self.endpoint, ok):
            log.warning("sip: call %s: no ACK for our answer; hanging up", call_id)
            call.media.hang_up("no ACK")

    def _reinvite(self, call: SipCall, request: SipMessage, peer: Peer) -> None:
        """Hold, unhold or a media move: the new offer is answered and applied."""
        try:
            remote = parse_sdp(request.body)
            codec, dtmf = choose(remote, [call.rtp.codec.name])
        except SdpError as exc:
            self._reply(request, peer, exc.status, "Not Acceptable Here")
            return
        if call.media is not None:
            call.media.held = remote.on_hold
        if not remote.on_hold:
            call.rtp.remote = (remote.address, remote.port)
        call.version += 1
        sdp = answer(
            remote,
            address=self.public,
            port=call.rtp.local_port,
            codec=codec,
            dtmf=dtmf,
            session_id=call.session_id,
            version=call.version,
        )
        self._reply(request, peer, 200, "OK", to_tag=call.dialog.local_tag, body=sdp.encode())
        log.info("sip: call %s %s", call.call_id, "on hold" if remote.on_hold else "resumed")

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
        call = self.calls.get(request.call_id)
        if call is None or call.answered:
            self._reply(
                request,
                peer,
                481 if call is None else 200,
                "OK" if call else "Call/Transaction Does Not Exist",
            )
            return
        self._reply(request, peer, 200, "OK")
        self._reply(
            call.dialog.invite,
            call.dialog.peer,
            487,
            "Request Terminated",
            to_tag=call.dialog.local_tag,
        )
        call.cancelled.set()

    def _ended(self, call: SipCall) -> None:
        """The conversation is over: unless the caller said BYE, we do."""
        self.calls.pop(call.dialog.call_id, None)
        if not call.bye_received and not call.dialog.ended:
            call.dialog.ended = True
            task = asyncio.create_task(self._send_bye(call))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send_bye(self, call: SipCall) -> None:
        bye = call.dialog.request("BYE")
        try:
            response = await self.endpoint.request(bye, call.dialog.peer)
            log.info("sip: call %s: BYE answered %s", call.call_id, response.status)
        except SipError as exc:
            log.warning("sip: call %s: BYE: %s", call.call_id, exc)

    # -- media callbacks ---------------------------------------------------------------------

    def _audio(self, sip_call_id: str, pcm: object, at: float) -> None:
        call = self.calls.get(sip_call_id)
        if call is not None and call.media is not None:
            call.media.audio_in(pcm, at)  # type: ignore[arg-type]

    def _key(self, sip_call_id: str, digit: str, at: float) -> None:
        call = self.calls.get(sip_call_id)
        if call is not None and call.media is not None:
            call.media.key_in(digit, at)
