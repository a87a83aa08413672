"""Starting a SIP call once its INVITE is admitted and its RTP port open (`SipService`'s
half, voice/server/routes/sip.py): the 200's SDP (our answer, or our offer for a late offer,
RFC 3261 §13.2.1), a late offer's answer taken from the ACK, the media and the conversation
started, and a call that never got going let go with BYE."""

from __future__ import annotations

import logging

from pipeline.answering.screening import Screening
from voice.server.call_records import Call
from voice.server.calls import Switchboard
from voice.server.routes.sip_answer import Offered, apply_answer, read_answer
from voice.server.routes.sip_calls import InCall, SipCall
from voice.transports.sip.body import BodyError
from voice.transports.sip.media import SipMedia
from voice.transports.sip.message import SipMessage
from voice.transports.sip.sdp import RemoteMedia, SdpError, answer, offer

log = logging.getLogger("voice.server.routes.sip")

# A placed call's (agent, metadata) and its answering-machine detection, if any.
Placed = tuple[tuple[str, dict[str, object]], Screening | None]


class Answering(InCall):
    """The answering half of `SipService`."""

    board: Switchboard

    def _first_sdp(self, call: SipCall, offered: Offered) -> str:
        """The 200's SDP: our answer to the offer, or (a late offer) our offer."""
        if offered.remote is None:
            return offer(
                address=self.public,
                port=call.rtp.local_port,
                codecs=self.settings.codecs,
                session_id=call.session_id,
                version=call.version,
            )
        return answer(
            offered.remote,
            address=self.public,
            port=call.rtp.local_port,
            codec=offered.codec,
            dtmf=offered.dtmf,
            session_id=call.session_id,
            version=call.version,
        )

    async def _late_answer(
        self, call: SipCall, ok: SipMessage, caller: str | None, callee: str | None
    ) -> None:
        """A late offer's 200 sent: resent until the ACK, whose answer starts the call; no ACK,
        none in it or one we cannot use: BYE (RFC 3261 §13.2.1, §13.3.1.4) and a log line."""
        if not await call.dialog.resend_until_acked(self.endpoint, ok):
            self._abandon(call, "no ACK for our offer")
            return
        try:
            remote, codec, dtmf = read_answer(call.dialog.ack, self.settings.codecs)
        except (SdpError, BodyError) as exc:
            self._abandon(call, str(exc))
            return
        if self.calls.get(call.dialog.call_id) is not call:  # a BYE before the ACK
            self._abandon(call, "the caller hung up before its ACK")
            return
        apply_answer(call, remote, codec, dtmf)
        self._start(call, remote, caller, callee)

    def _start(
        self,
        call: SipCall,
        remote: RemoteMedia,
        caller: str | None,
        callee: str | None,
        *,
        placed: Placed | None = None,
    ) -> Call:
        """The call's media and conversation, once offer and answer are known. `placed`: a
        call we placed (voice/outbound/sip.py): its agent and metadata, and who answered."""
        peer, call_id = call.dialog.peer, call.call_id
        call.media = SipMedia(
            call_id,
            call.rtp,
            on_close=lambda: self._ended(call),
            idle_timeout_s=self.settings.media_timeout_s,
        )
        call.media.held = remote.on_hold
        outbound, answering = placed if placed is not None else (None, None)
        started = self.board.start(
            call_id,
            call.media,
            "sip",
            caller=caller,
            callee=callee,
            outbound=outbound,
            answering=answering,
        )
        log.info(
            "sip: call %s %s %s over %s (%s to %s, %s)",
            call_id,
            "from" if placed is None else "to",
            peer.host,
            peer.transport,
            caller,
            callee,
            call.rtp.codec.name,
        )
        if call.timer is not None:
            self._spawn(self._watch_session(call, call.timer))
        return started

    def _abandon(self, call: SipCall, reason: str) -> None:
        """A late offer's call that never started: BYE, its RTP port and admission let go."""
        log.warning("sip: call %s: %s; hanging up (BYE)", call.call_id, reason)
        call.rtp.close()
        if self.calls.get(call.dialog.call_id) is call:
            del self.calls[call.dialog.call_id]
        self.board.release(call.call_id)
        if not call.bye_received and not call.dialog.ended:
            call.dialog.ended = True
            self._spawn(self._send_bye(call))
