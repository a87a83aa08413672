"""A scripted SIP caller: a minimal user agent client built from Hotline's own SIP, SDP and RTP
modules, used by `hotline bench --transport sip` and the tests.

It sends an INVITE with an SDP offer (PCMU, PCMA, telephone-event/8000) over UDP (retransmitted,
timer A) or TCP, ACKs the answer, then speaks its utterances as 20 ms G.711 RTP frames on the
absolute clock (silence between them, as a phone does) through `voice.devtools.turns.converse`,
presses keys as RFC 4733 events (3 updates, 3 end packets), and ends with BYE, or answers the
server's BYE. Reply audio is heard as its RTP arrives (there is no playout buffer, so a real
phone's own jitter buffer comes on top): voice-to-voice latency runs from the end of the
caller's last audible frame sent to the first audible reply frame received.

SIP gives the caller no handle on the server's id of the call: the server lists it (`GET
/calls`, `GET /calls/ended`) with the From user as `caller`, unique by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import ssl
import struct
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.transport import PCM
from voice.audio import rms
from voice.devtools.microphone import Microphone
from voice.devtools.sip_leg import DTMF_PAYLOAD_TYPE, SipLeg, SipTransport, hostport, offer_sdp
from voice.devtools.turns import AUDIBLE_RMS, CallResult, Ear, FrameTest, converse
from voice.devtools.turns import barge_in_stop_ms as stop_ms
from voice.transports.sip.message import (
    SipParseError,
)
from voice.transports.sip.rtp import DTMF_DIGITS, G711, RtpPacket, RtpSession
from voice.transports.sip.sdp import SdpError, choose, parse_sdp

log = logging.getLogger(__name__)

WIRE_RATE = 8000
WIRE_FRAME = 160  # 20 ms at 8 kHz
FRAME_S = WIRE_FRAME / WIRE_RATE
DTMF_VOLUME = 10  # -dBm0
KEY_TICKS = ((False, 160), (False, 320), (False, 480), (True, 480), (True, 480), (True, 480))


@dataclass
class SipCallResult(CallResult):
    """What the caller heard, and how the SIP side went."""

    sip_call_id: str = ""
    caller: str = ""  # the From user
    status: int | None = None  # the INVITE's final status
    rejected: str | None = None  # why there was no call: "486 Busy Here", "no answer", ...
    provisional: list[int] = field(default_factory=list)  # 100, 180, ...
    codec: str | None = None
    server_hung_up: bool = False  # the server sent BYE first
    bye_status: int | None = None  # the answer to our BYE
    referred_to: str | None = None  # where the server's REFER asked us to transfer the call
    packets_sent: int = 0
    packets_received: int = 0


class CallerRtp(RtpSession):
    """The caller's RTP session, which can also send RFC 4733 telephone-events (they share the
    audio's sequence numbers; the audio's timestamp then skips the event's ticks)."""

    def send_event(self, digit: str, duration: int, *, end: bool, first: bool) -> None:
        remote, kind = self.remote, self.dtmf_payload_type
        if self._closed or self._transport is None or remote is None or kind is None:
            return
        flags = (0x80 if end else 0) | DTMF_VOLUME
        payload = struct.pack("!BBH", DTMF_DIGITS.index(digit), flags, duration)
        packet = RtpPacket(kind, self._sequence, self._timestamp, self.ssrc, first, payload)
        self._sequence = (self._sequence + 1) % (1 << 16)
        self._transport.sendto(packet.to_bytes(), remote)
        self.packets_out += 1

    def skip(self, samples: int) -> None:
        self._timestamp = (self._timestamp + samples) % (1 << 32)


async def open_caller_rtp(
    host: str, on_audio: Callable[[PCM, float], None], codec: str = "PCMU"
) -> CallerRtp:
    """A `CallerRtp` bound to any free UDP port on `host` (its remote is set once answered)."""
    session = CallerRtp(G711(codec), DTMF_PAYLOAD_TYPE, on_audio, lambda key, at: None, remote=None)
    loop = asyncio.get_running_loop()
    await loop.create_datagram_endpoint(lambda: session, local_addr=(host, 0))
    return session


class SipPhone:
    """The handset: microphone and keypad on a 20 ms clock sending RTP, an ear on what comes
    back. Implements `voice.devtools.turns.Line`."""

    def __init__(self) -> None:
        self.ear = Ear(WIRE_RATE)
        self.rtp: CallerRtp | None = None
        self.hung_up = asyncio.Event()
        self.mic = Microphone(WIRE_RATE)
        self._key: tuple[str, asyncio.Future[None] | None, list[tuple[bool, int]]] | None = None

    def say(self, pcm: PCM) -> asyncio.Future[list[float]]:
        """Queue an utterance (16 kHz); the future gives the time each 20 ms frame was sent."""
        return self.mic.say(pcm)

    def press(self, digits: str) -> asyncio.Future[None]:
        """Queue key presses; the future is done once every packet of the last one went."""
        for digit in digits:
            if digit not in DTMF_DIGITS:
                raise ValueError(f"not a DTMF key: {digit!r}")
        return self.mic.press(digits)

    async def hear(self, predicate: FrameTest, within_s: float) -> float | None:
        """Wait for `predicate` over the frames heard; None on timeout or hang-up."""
        return await self.ear.wait_or_hang_up(predicate, within_s, self.hung_up)

    def heard(self, pcm8k: PCM, at: float) -> None:
        """The RTP session's audio callback: one 20 ms frame received at `at`."""
        self.ear.record(at, rms(pcm8k) > AUDIBLE_RMS, pcm8k)

    async def run(self) -> None:
        """Send one frame (or telephone-event packet) every 20 ms of the absolute clock."""
        start, tick = time.monotonic(), 0
        while True:
            delay = start + tick * FRAME_S - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            self._tick(time.monotonic())
            tick += 1

    def _tick(self, now: float) -> None:
        rtp = self.rtp
        if rtp is None:
            return
        if self._key is None and not self.mic.speaking and (pressed := self.mic.next_key()):
            digit, done = pressed
            self._key = (digit, done, list(KEY_TICKS))
        if self._key is not None:
            digit, done, ticks = self._key
            end, duration = ticks.pop(0)
            rtp.send_event(digit, duration, end=end, first=len(ticks) == len(KEY_TICKS) - 1)
            if not ticks:
                rtp.skip(len(KEY_TICKS) * WIRE_FRAME)
                self._key = None
                if done is not None and not done.done():
                    done.set_result(None)
            return
        rtp.send_frame(self.mic.next_frame(now))


def _local_address(address: str, port: int) -> str:
    """This machine's address on the route to `address` (what the server can send to)."""
    with socket.socket(
        socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_DGRAM
    ) as s:
        s.connect((address, port))
        return str(s.getsockname()[0])


class SipLine:
    """One SIP call, the caller's end: the phone to speak on once answered (`result.rejected`
    says why not), and the dialog to hang up."""

    def __init__(self, phone: SipPhone, leg: SipLeg | None, result: SipCallResult) -> None:
        self.phone, self.leg, self.result = phone, leg, result

    async def talk(self, conversation: Coroutine[Any, Any, None]) -> None:
        """Run `conversation` until it ends or the server hangs up; then BYE, if the server
        did not hang up first (also when `conversation` failed: its error is raised after)."""
        if self.leg is None or self.result.rejected is not None:
            conversation.close()
            return
        try:
            self.result.server_hung_up = await _talk(self.phone, conversation)
        except Exception:
            with contextlib.suppress(OSError, SipParseError):
                self.result.bye_status = await self.leg.bye()
            raise
        if not self.result.server_hung_up:
            self.result.bye_status = await self.leg.bye()


@contextlib.asynccontextmanager
async def open_sip_call(
    host: str,
    port: int,
    *,
    number: str = "+15551230000",
    caller: str | None = None,
    transport: SipTransport = "udp",
    local_host: str | None = None,
    codecs: Sequence[str] = ("PCMU", "PCMA"),
    tls: ssl.SSLContext | None = None,
    accept_refer: bool = False,
) -> AsyncIterator[SipLine]:
    """Call `number` at the SIP server `host:port` (INVITE, ACK); the line, until the block
    ends. `caller` is the From user (default: a unique `bench-<hex>`); `local_host` the address
    for SIP and RTP (default: this machine's on the route to `host`). Failures come back in
    `result.rejected` (a non-2xx final status, no answer, an unusable SDP answer, a socket
    error while talking), not raised. `tls` checks the server's certificate on a "tls" call
    (default: the system's trusted CAs). With `accept_refer` a transfer (REFER) is accepted and
    reported done, its target kept in `result.referred_to`; else it is refused (501)."""
    caller = caller or f"bench-{secrets.token_hex(4)}"
    result = SipCallResult("", [], np.zeros(0, dtype=np.int16), caller=caller)
    phone = SipPhone()
    target = f"sip:{number}@{hostport(host, port)}" + (
        f";transport={transport}" if transport != "udp" else ""
    )
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        address = (str(infos[0][4][0]), int(infos[0][4][1]))
        local_host = local_host or _local_address(*address)
        leg = SipLeg(transport, address, target, tls, accept_refer)
        phone.hung_up = leg.hung_up
        await leg.open(local_host, caller)
    except OSError as exc:
        result.rejected = f"unreachable: {exc!r}"
        yield SipLine(phone, None, result)
        return
    rtp: CallerRtp | None = None
    try:
        result.call_id = result.sip_call_id = leg.call_id
        rtp = await open_caller_rtp(local_host, phone.heard, codecs[0])
        await _invite(leg, rtp, phone, result, local_host, codecs)
        yield SipLine(phone, leg, result)
    except (OSError, SipParseError) as exc:
        log.warning("sip call %s failed: %r", result.sip_call_id, exc)
        result.rejected = result.rejected or f"failed: {exc!r}"
    finally:
        if rtp is not None:
            rtp.close()
            result.packets_sent, result.packets_received = rtp.packets_out, rtp.packets_in
        leg.close()
        result.reply_audio = phone.ear.audio()
        result.referred_to = leg.referred_to


async def _invite(
    leg: SipLeg,
    rtp: CallerRtp,
    phone: SipPhone,
    result: SipCallResult,
    local_host: str,
    codecs: Sequence[str],
) -> None:
    """INVITE with our offer; on a usable answer the phone's RTP goes to the server's media,
    else `result.rejected` says why (and an answered call is hung up)."""
    offer = offer_sdp(local_host, rtp.local_port, codecs)
    final = await leg.invite(offer, result.provisional)
    result.status = final.status if final is not None else None
    if final is None or (final.status or 0) >= 300:
        result.rejected = f"{final.status} {final.reason}" if final else "no answer"
        return
    try:
        remote = parse_sdp(final.body)
        codec, events = choose(remote, codecs)
    except SdpError as exc:
        result.rejected = f"unusable SDP answer: {exc}"
        result.bye_status = await leg.bye()
        return
    result.codec = codec.name
    rtp.codec = G711(codec.name)
    rtp.dtmf_payload_type = events.payload_type if events else None
    rtp.remote = (remote.address, remote.port)
    phone.rtp = rtp


async def place_sip_call(
    host: str,
    port: int,
    utterances: Sequence[PCM],
    *,
    number: str = "+15551230000",
    caller: str | None = None,
    transport: SipTransport = "udp",
    barge_in_after_ms: float | None = None,
    dtmf: str = "",
    reply_timeout_s: float = 30.0,
    quiet_s: float = 0.8,
    local_host: str | None = None,
    codecs: Sequence[str] = ("PCMU", "PCMA"),
    tls: ssl.SSLContext | None = None,
    opening_wait_s: float | None = None,
) -> SipCallResult:
    """Call `number` at the SIP server `host:port` (`open_sip_call`) and speak `utterances`
    (16 kHz), one turn each (`converse`'s turn-taking, `barge_in_after_ms`, `dtmf` and
    `opening_wait_s`), then hang up.

    `call_id` is the SIP Call-ID (the server's own id is listed by `GET /calls` with `caller`).
    """
    async with open_sip_call(
        host,
        port,
        number=number,
        caller=caller,
        transport=transport,
        local_host=local_host,
        codecs=codecs,
        tls=tls,
    ) as line:
        script = converse(
            line.phone,
            utterances,
            line.result.turns,
            barge_in_after_ms=barge_in_after_ms,
            dtmf=dtmf,
            reply_timeout_s=reply_timeout_s,
            quiet_s=quiet_s,
            opening_wait_s=opening_wait_s,
        )
        await line.talk(script)
    if barge_in_after_ms is not None:
        line.result.barge_in_stop_ms = stop_ms(line.result.turns)
    return line.result


async def _talk(phone: SipPhone, conversation: Coroutine[Any, Any, None]) -> bool:
    """Run the phone's clock and the caller's `conversation` until it ends or the server hangs
    up; True if the server hung up first."""
    clock = asyncio.create_task(phone.run())
    script = asyncio.create_task(conversation)
    ended = asyncio.create_task(phone.hung_up.wait())
    try:
        await asyncio.wait({script, ended, clock}, return_when=asyncio.FIRST_COMPLETED)
        for part in (script, clock):
            if part.done():
                part.result()  # a failure in the script or the phone is raised, not hidden
        return not script.done()
    finally:
        for task in (script, ended, clock):
            task.cancel()
        await asyncio.gather(script, ended, clock, return_exceptions=True)
