"""Placing a SIP call from this worker's SIP endpoint (`SipService`, voice/server/routes/sip.py),
for `POST /calls/outbound` (voice/outbound/sip.py): the trunk's name resolved (the event loop's
resolver, never blocking it), an RTP port and our offer, the INVITE run by its user agent client
(`voice.transports.sip.outbound.Placing`), early media once a provisional answer brings SDP,
and on the answer the start every SIP call gets (`Answering._start`): the dialog joins the
service's calls, so BYE from either side, re-INVITEs, REFER and the calls API work on it as on a
call that came in."""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from voice.server.call_records import Call
from voice.server.routes.sip_answer import apply_answer, read_answer, use_codec
from voice.server.routes.sip_calls import ALLOW, SipCall
from voice.server.routes.sip_start import Placed
from voice.transports.sip.body import BodyError
from voice.transports.sip.early import EarlyMedia
from voice.transports.sip.endpoint import Peer
from voice.transports.sip.message import SipMessage, new_call_id
from voice.transports.sip.outbound import Outcome, Placement, Placing
from voice.transports.sip.rtp import G711, RtpSession, open_rtp_session
from voice.transports.sip.sdp import DTMF_PAYLOAD_TYPE, SdpError, offer
from voice.transports.sip.trunk import SipTrunk

if TYPE_CHECKING:
    from voice.server.routes.sip import SipService

log = logging.getLogger("voice.server.routes.sip")


@dataclass(eq=False)
class Ringing:
    """A call being placed: what to ring, and (as it goes) what became of it."""

    call_id: str  # ours (the switchboard's)
    trunk: SipTrunk
    to: str  # a number or a SIP URI
    caller: str | None  # our caller id (None: the trunk's)
    ring_timeout_s: float
    placed: Placed  # (agent, metadata) and answering-machine detection
    hung_up: str | None = None  # why we gave up before the answer
    placing: Placing | None = None  # once its INVITE is on its way
    started_at: float = field(default_factory=time.monotonic)  # admitted
    invited_at: float | None = None  # its first INVITE sent (the post-dial delay's start)
    progress_at: float | None = None  # its first provisional answer past 100 (ringing)
    answered_at: float | None = None
    early_media: EarlyMedia | None = None
    call: Call | None = None  # the switchboard's, once answered

    def hang_up(self, why: str) -> None:
        """Give up before the answer: a CANCEL once the INVITE is out and being answered."""
        if self.hung_up is None:
            self.hung_up = why
            if self.placing is not None:
                self.placing.hang_up(why)

    def ms_since_invite(self, at: float | None) -> int | None:
        if at is None or self.invited_at is None:
            return None
        return round(1000 * (at - self.invited_at))


class SipDialing:
    """Places calls from `service`'s endpoint."""

    def __init__(self, service: SipService) -> None:
        self.service = service

    async def ring(self, ringing: Ringing) -> Outcome:
        """Ring the callee until the call is answered (and started) or fails."""
        peer = await self._resolve(ringing.trunk)
        if isinstance(peer, str):
            return Outcome("unreachable", reason=peer)
        sip_call_id = new_call_id(self.service.public)
        try:
            rtp = await self._open_rtp(sip_call_id, ringing, peer)
        except OSError as exc:
            log.error("sip: call %s: no RTP port free: %s", ringing.call_id, exc)
            return Outcome("failed", reason="no RTP port free")
        try:
            outcome = await self._invite(ringing, peer, sip_call_id, rtp)
        except BaseException:
            rtp.close()
            raise
        if outcome.cause != "answered":
            rtp.close()
        return outcome

    async def _resolve(self, trunk: SipTrunk) -> Peer | str:
        """The trunk's address (UDP), or why it has none."""
        host, port = trunk.address
        family = socket.AF_INET6 if ":" in self.service.host else socket.AF_INET
        try:
            found = await asyncio.get_running_loop().getaddrinfo(
                host, port, family=family, type=socket.SOCK_DGRAM
            )
        except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError
            return f"cannot resolve {host}: {exc}"
        if not found:
            return f"cannot resolve {host}: no address"
        address = found[0][4]
        return Peer("UDP", (str(address[0]), int(address[1])))

    async def _open_rtp(self, sip_call_id: str, ringing: Ringing, peer: Peer) -> RtpSession:
        """The call's RTP port: before the answer its audio is early media's, then the call's."""
        service = self.service

        def audio(pcm: object, at: float) -> None:
            if sip_call_id in service.calls:
                service._audio(sip_call_id, pcm, at)
            elif ringing.early_media is not None:
                ringing.early_media.heard(pcm, at)  # type: ignore[arg-type]

        rtp = await open_rtp_session(
            service.host,
            service.settings.rtp_ports,
            codec=G711(service.settings.codecs[0]),
            dtmf_payload_type=DTMF_PAYLOAD_TYPE,
            on_audio=audio,
            on_dtmf=lambda digit, at: service._key(sip_call_id, digit, at),
            remote=None,  # nothing is sent before an answer (or a 183) says where
            signalling_host=peer.host,
        )
        ringing.early_media = EarlyMedia(rtp)
        return rtp

    async def _invite(
        self, ringing: Ringing, peer: Peer, sip_call_id: str, rtp: RtpSession
    ) -> Outcome:
        """Our INVITE, from the first send to the call's start (or its failure)."""
        if ringing.hung_up is not None:  # while the trunk was resolved or RTP opened
            return Outcome("cancelled", reason="hung up before the INVITE went")
        service = self.service
        session_id = random.randrange(1, 2**31)  # the call's, for its later offers (RFC 3264 §8)
        body = offer(
            address=service.public,
            port=rtp.local_port,
            codecs=service.settings.codecs,
            session_id=session_id,
            version=1,
        ).encode()
        placement = Placement(
            ringing.trunk,
            peer,
            ringing.to,
            ringing.caller,
            service.sent_by(peer.transport),
            service.contact(peer.transport),
            body,
            ALLOW,
            ringing.ring_timeout_s,
            sip_call_id,
        )
        placing = Placing(
            service.endpoint, placement, on_progress=lambda r: self._progress(ringing, rtp, r)
        )
        ringing.placing = placing
        ringing.invited_at = time.monotonic()
        try:
            outcome = await placing.run()
        finally:
            if ringing.early_media is not None:
                await ringing.early_media.stop()
        if outcome.cause == "answered" and ringing.hung_up is not None and outcome.dialog:
            placing.bye(outcome.dialog)  # hung up while early media stopped: too late to CANCEL
            return Outcome("cancelled", outcome.status, f"{outcome.reason}, as we hung up: BYE")
        if outcome.cause != "answered":
            return outcome
        ringing.answered_at = time.monotonic()
        assert outcome.dialog is not None  # answered: the 2xx made it
        call = SipCall(outcome.dialog, rtp, ringing.call_id, session_id=session_id, local_sdp=body)
        return self._answered(ringing, placing, outcome, call)

    def _progress(self, ringing: Ringing, rtp: RtpSession, response: SipMessage) -> None:
        """A provisional answer: ringing; with SDP (a 183), early media from now on."""
        if ringing.progress_at is None:
            ringing.progress_at = time.monotonic()
        if not response.body or ringing.early_media is None:
            return
        try:
            remote, codec, dtmf = read_answer(response, self.service.settings.codecs)
        except (SdpError, BodyError) as exc:
            log.warning(
                "sip: call %s: %s's SDP not used: %s", ringing.call_id, response.status, exc
            )
            return
        use_codec(rtp, codec, dtmf)
        if not remote.on_hold:
            ringing.early_media.start((remote.address, remote.port))
            log.info("sip: call %s: early media (%d)", ringing.call_id, response.status or 0)

    def _answered(
        self, ringing: Ringing, placing: Placing, outcome: Outcome, call: SipCall
    ) -> Outcome:
        """The 2xx's answer applied, the call joined to the service's and started; a 2xx whose
        SDP we cannot use is sent BYE (RFC 3261 §13.2.1: it still made a dialog)."""
        dialog, ok = call.dialog, outcome.answer
        assert ok is not None
        try:
            remote, codec, dtmf = read_answer(ok, self.service.settings.codecs)
        except (SdpError, BodyError) as exc:
            log.warning("sip: call %s: no usable SDP answer: %s", ringing.call_id, exc)
            placing.bye(dialog)
            return Outcome("failed", outcome.status, f"no usable SDP answer in the {ok.status}")
        self.service.calls[dialog.call_id] = call
        apply_answer(call, remote, codec, dtmf)
        ringing.call = self.service._start(
            call, remote, ringing.caller, ringing.to, placed=ringing.placed
        )
        return outcome
