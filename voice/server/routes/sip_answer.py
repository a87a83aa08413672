"""Offer and answer for SIP calls, both ways round (RFC 3264): an INVITE's offer answered in our
200, or (a late offer, RFC 3261 §13.2.1: CUCM trunks, many SBCs and third-party call control
send INVITEs without SDP) our offer in the 200 and the caller's answer in its ACK; the same for
an offerless re-INVITE in a call (§14.2: a fresh offer, version+1, the ACK's answer applied).
Until a late offer's answer is known no RTP goes to the caller; an ACK without an answer, or
with one we cannot use, ends the call with BYE. The body may be multipart (body.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from voice.transports.sip.body import BodyError, session_body
from voice.transports.sip.endpoint import Peer
from voice.transports.sip.message import SipMessage
from voice.transports.sip.rtp import G711, RtpSession
from voice.transports.sip.sdp import (
    Codec,
    RemoteMedia,
    SdpError,
    answered,
    choose,
    our_codecs,
    parse_sdp,
)
from voice.transports.sip.sdp import offer as sdp_offer

if TYPE_CHECKING:
    from voice.server.routes.sip_calls import InCall, SipCall

log = logging.getLogger("voice.server.routes.sip")


@dataclass(frozen=True)
class Offered:
    """What an INVITE brought: the caller's offer and our choice from it, or (`remote` None:
    a late offer) the codec we start with until the answer picks one."""

    remote: RemoteMedia | None
    codec: Codec
    dtmf: Codec | None


def sdp_of(message: SipMessage) -> bytes:
    """The SDP in a request's body (b"" if none); BodyError if we cannot read the body."""
    return session_body(
        message.body, message.header("Content-Type"), message.header("Content-Encoding")
    )


def read_offer(request: SipMessage, codecs: Sequence[str]) -> Offered:
    """An INVITE's offer and the codec chosen from it, or a late offer. SdpError, BodyError."""
    sdp = sdp_of(request)
    if not sdp:
        audio, events = our_codecs(codecs)
        return Offered(None, audio[0], events)
    remote = parse_sdp(sdp)
    codec, dtmf = choose(remote, codecs)
    return Offered(remote, codec, dtmf)


def read_answer(
    ack: SipMessage | None, codecs: Sequence[str]
) -> tuple[RemoteMedia, Codec, Codec | None]:
    """The answer an ACK carries to our offer: SdpError if none or not one we can use."""
    sdp = sdp_of(ack) if ack is not None else b""
    if not sdp:
        raise SdpError("the ACK carried no SDP answer to our offer", 488)
    remote = parse_sdp(sdp)
    codec, dtmf = answered(remote, codecs)
    return remote, codec, dtmf


def refusal_headers(exc: SdpError | BodyError) -> list[tuple[str, str]]:
    if isinstance(exc, BodyError):
        return exc.headers()
    return [("Warning", f'399 hotline "{exc}"')]


def use_codec(rtp: RtpSession, codec: Codec, dtmf: Codec | None) -> None:
    """Send and decode with `codec` from now on (a re-INVITE or an answer changed it:
    RFC 3264 §8.3.2); packets of the old payload type are dropped from then on."""
    if rtp.codec.name != codec.name.upper():
        rtp.codec = G711(codec.name.upper())
    rtp.dtmf_payload_type = dtmf.payload_type if dtmf is not None else None


def preferring(current: str, codecs: Sequence[str]) -> list[str]:
    """`codecs` with the call's `current` codec first (a re-offer keeps it if it can)."""
    return [current, *(name for name in codecs if name != current)]


def apply_answer(call: SipCall, remote: RemoteMedia, codec: Codec, dtmf: Codec | None) -> None:
    """Use what an answer (or a re-INVITE's offer) says: codec, address, hold."""
    use_codec(call.rtp, codec, dtmf)
    if call.media is not None:
        call.media.held = remote.on_hold
    if not remote.on_hold:
        call.rtp.remote = (remote.address, remote.port)


# -- an offerless re-INVITE (RFC 3261 §14.2) ----------------------------------------------------


def reoffer(service: InCall, call: SipCall, request: SipMessage, peer: Peer) -> None:
    """Answer an offerless re-INVITE with a fresh offer (version+1, RFC 3264 §8); its ACK's
    answer is applied when it comes. One at a time: 491 while an earlier one waits (§14.1)."""
    dialog = call.dialog
    if dialog.reoffer_cseq is not None and not dialog.reacked.is_set():
        service._reply(request, peer, 491, "Request Pending")
        return
    if call.timer is not None:
        call.timer.refresh()
    call.version += 1
    codecs = preferring(call.rtp.codec.name, service.settings.codecs)
    body = sdp_offer(
        address=service.public,
        port=call.rtp.local_port,
        codecs=codecs,
        session_id=call.session_id,
        version=call.version,
    )
    dialog.reoffer_cseq, dialog.reacked = request.cseq[0], asyncio.Event()
    headers = call.timer.headers() if call.timer is not None else []
    ok = service._reply(
        request, peer, 200, "OK", headers, to_tag=dialog.local_tag, body=body.encode()
    )
    service._spawn(_reanswered(service, call, ok, codecs))


async def _reanswered(service: InCall, call: SipCall, ok: SipMessage, codecs: list[str]) -> None:
    dialog = call.dialog
    if not await dialog.resend_until_acked(service.endpoint, ok, dialog.reacked):
        log.warning("sip: call %s: no ACK for our re-offer; hanging up", call.call_id)
        if call.media is not None:
            call.media.hang_up("no ACK")
        return
    try:
        remote, codec, dtmf = read_answer(dialog.ack, codecs)
    except (SdpError, BodyError) as exc:
        log.warning("sip: call %s: re-INVITE's ACK: %s; hanging up", call.call_id, exc)
        if call.media is not None:
            call.media.hang_up("no usable answer")
        return
    apply_answer(call, remote, codec, dtmf)
    state = "on hold" if remote.on_hold else "resumed"
    log.info("sip: call %s %s (answer in the ACK, %s)", call.call_id, state, codec.name)
