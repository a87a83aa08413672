"""Late offers (RFC 3261 §13.2.1: an INVITE without SDP; our offer in the 200, the caller's
answer in its ACK), offerless re-INVITEs (§14.2) and a codec change mid-call, against the
shared `hotline serve` (tests/support/sip_server.py). The late-offer call comes from a real SIP
stack, PJSIP (tests/support/pjsip_caller.py); the rest from the scripted caller's SIP and RTP
(voice.devtools): real UDP both ways, the caller's RTP taking only the payload type it chose."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.support.pjsip_caller import PjsipCaller, body, recorded
from tests.support.poll import until
from tests.support.rtp_inbox import Inbox
from tests.support.server import logged
from tests.support.sip_server import NUMBER, SipServer
from tests.support.speech import concat, piper, silence
from tests.test_sip_rtp_latch import first_turns
from voice.audio import write_wav
from voice.devtools.sip_caller import CallerRtp, open_caller_rtp
from voice.devtools.sip_leg import SipLeg, offer_sdp
from voice.transports.sip.message import SipMessage, parse_name_addr
from voice.transports.sip.sdp import RemoteMedia, parse_sdp

pytestmark = pytest.mark.slow
CALLER = "127.0.0.1"


@contextlib.asynccontextmanager
async def leg_to(server: SipServer, name: str) -> AsyncIterator[SipLeg]:
    leg = SipLeg("udp", (CALLER, server.port), f"sip:{NUMBER}@{CALLER}:{server.port}")
    await leg.open(CALLER, name)
    try:
        yield leg
    finally:
        leg.close()


async def invite_without_offer(leg: SipLeg) -> SipMessage:
    """A late-offer INVITE: no body. Its 200 (not yet ACKed) sets up the dialog."""
    final = await leg.transact(leg.request("INVITE", leg.target, 1))
    assert final is not None and final.status == 200, final
    leg.remote_party = final.header("To") or leg.remote_party
    leg.target = parse_name_addr(final.header_values("Contact")[0]).uri
    return final


def ack(leg: SipLeg, sdp: str | None, cseq: int = 1) -> None:
    """The ACK of our 2xx (answer in `sdp`), sent again if the 2xx comes again."""
    message = leg.request("ACK", leg.target, cseq)
    if sdp is not None:
        message.headers.append(("Content-Type", "application/sdp"))
        message.body = sdp.encode()
    leg._ack = message  # (SipLeg resends it for a retransmitted 2xx of CSeq 1)
    leg.send(message)


def version(sdp: bytes) -> int:
    origin = next(line for line in sdp.decode().splitlines() if line.startswith("o="))
    return int(origin.split()[2])


def offered_names(media: RemoteMedia) -> list[str]:
    return [codec.name for codec in media.codecs]


async def heard_voice(inbox: Inbox, after: int = 0) -> None:
    """Frames of the greeting (not only silence) reached the caller."""
    await until(
        lambda: any(np.abs(f).max(initial=0) > 500 for f in inbox.audio[after:]),
        "the greeting's audio at the caller",
        20.0,
        0.02,
    )


async def sip_calls(server: SipServer) -> set[str]:
    async with httpx.AsyncClient() as client:
        listed = (await client.get(f"{server.server.url}/calls")).json()["calls"]
    return {str(c["call_id"]) for c in listed if c["transport"] == "sip"}


@pytest.mark.skipif(
    importlib.util.find_spec("pjsua2") is None,
    reason="pjsua2-python missing (the dev extra installs it on x86-64 Linux)",
)
async def test_pjsip_calls_with_a_late_offer_and_has_audio_both_ways(
    sip_server: SipServer, tmp_path: Path
) -> None:
    """PJSIP (pjsua2, its flag PJSUA_CALL_NO_SDP_OFFER) sends an INVITE without SDP: our offer
    goes in the 200, its answer (PCMA only) in the ACK, and the call has audio both ways."""
    play, record = tmp_path / "caller.wav", tmp_path / "heard.wav"
    # silent while the greeting plays (a caller who waits for it), then the question
    write_wav(play, concat(silence(4000), piper("Do you sell roses?"), silence(8000)), 16_000)
    known = await sip_calls(sip_server)
    caller = PjsipCaller(f"sip:{NUMBER}@{CALLER}:{sip_server.port}", play, record)
    await caller.start()
    try:

        async def new_call() -> str | None:
            return next(iter((await sip_calls(sip_server)) - known), None)

        call_id: str = await until(new_call, "the PJSIP call at the server", 20.0, 0.1)
        turns = await first_turns(sip_server.server, call_id)
    except BaseException:
        caller.kill()
        raise
    call = await caller.hang_up()
    assert call.confirmed and call.media, call
    invite = call.message("TX", "INVITE")
    assert body(invite) == "", invite  # a late offer
    ours = parse_sdp(body(call.message("RX", "SIP/2.0 200")).encode())
    assert offered_names(ours) == ["PCMU", "PCMA", "telephone-event"]
    answer = parse_sdp(body(call.message("TX", "ACK")).encode())
    assert offered_names(answer) == ["PCMA", "telephone-event"]
    said = " ".join(turn["caller_text"].lower() for turn in turns)
    assert "roses" in said, said  # the server heard PJSIP's PCMA
    heard = recorded(record)
    loud = np.abs(heard.astype(np.int32)) > 1000
    assert loud[: 16_000 * 4].mean() > 0.05, "the greeting's audio at PJSIP"


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (None, "the ACK carried no SDP answer to our offer"),
        (
            "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
            "m=audio 4000 RTP/AVP 9\r\na=rtpmap:9 G722/8000\r\n",
            "the answer picked no codec we offered",
        ),
    ],
    ids=["no-answer", "no-common-codec"],
)
async def test_an_ack_without_a_usable_answer_ends_the_call_with_bye(
    sip_server: SipServer, answer: str | None, why: str
) -> None:
    server = sip_server.server
    async with leg_to(sip_server, "late-no-answer") as leg:
        mark = server.log_mark()
        await invite_without_offer(leg)
        ack(leg, answer)
        await asyncio.wait_for(leg.hung_up.wait(), 10.0)
        await logged(server, why, "hanging up (BYE)", since=mark)


async def answered_call(leg: SipLeg, rtp: CallerRtp, inbox: Inbox) -> RemoteMedia:
    """A call with an offer (PCMU) whose greeting is heard at `rtp`: the server's media."""
    ok = await leg.invite(offer_sdp(CALLER, rtp.local_port, ["PCMU"]), [])
    assert ok is not None and ok.status == 200, ok
    media = parse_sdp(ok.body)
    rtp.remote = (media.address, media.port)
    await heard_voice(inbox)
    return media


async def test_an_offerless_reinvite_gets_a_fresh_offer_and_the_acks_answer_is_used(
    sip_server: SipServer,
) -> None:
    first, second = Inbox(), Inbox()
    old = await open_caller_rtp(CALLER, first.on_audio, "PCMU")
    new = await open_caller_rtp(CALLER, second.on_audio, "PCMA")
    try:
        async with leg_to(sip_server, "reoffer-caller") as leg:
            media = await answered_call(leg, old, first)
            leg.cseq += 1
            ok = await leg.transact(leg.request("INVITE", leg.target, leg.cseq))
            assert ok is not None and ok.status == 200, ok
            offer = parse_sdp(ok.body)
            assert offered_names(offer) == ["PCMU", "PCMA", "telephone-event"]
            assert version(ok.body) == 2 and offer.port == media.port
            new.remote = (offer.address, offer.port)
            # the answer: another port and PCMA; the server sends there, in PCMA, from now on
            ack(leg, offer_sdp(CALLER, new.local_port, ["PCMA"]), cseq=leg.cseq)
            await until(lambda: new.packets_in > 0, "RTP in PCMA at the answer's port", 5.0)
            assert await leg.bye() == 200
    finally:
        old.close()
        new.close()


async def test_a_reinvite_may_change_the_codec(sip_server: SipServer) -> None:
    first, second = Inbox(), Inbox()
    old = await open_caller_rtp(CALLER, first.on_audio, "PCMU")
    new = await open_caller_rtp(CALLER, second.on_audio, "PCMA")
    try:
        async with leg_to(sip_server, "codec-caller") as leg:
            await answered_call(leg, old, first)
            leg.cseq += 1
            reinvite = leg.request("INVITE", leg.target, leg.cseq)
            reinvite.headers.append(("Content-Type", "application/sdp"))
            reinvite.body = offer_sdp(CALLER, new.local_port, ["PCMA"]).encode()
            ok = await leg.transact(reinvite)
            assert ok is not None and ok.status == 200, ok  # was 488: PCMU only
            answer = parse_sdp(ok.body)
            assert offered_names(answer) == ["PCMA", "telephone-event"]
            ack(leg, None, cseq=leg.cseq)
            new.remote = (answer.address, answer.port)
            await until(lambda: new.packets_in > 0, "RTP in PCMA after the switch", 5.0)
            assert await leg.bye() == 200
    finally:
        old.close()
        new.close()
