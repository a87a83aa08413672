"""RTP media for SIP calls: packets (RFC 3550), G.711 (RFC 3551), DTMF as telephone-events
(RFC 4733), and one call's UDP endpoint with symmetric RTP (RFC 4961), all on the event loop.

RTCP is not implemented: packets arriving on the RTP port (RFC 5761 multiplexing) are ignored.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from voice.audio import PCM, alaw_decode, alaw_encode, mulaw_decode, mulaw_encode
from voice.transports.sip.jitter import JitterBuffer
from voice.transports.sip.rtp_ports import bind_rtp_socket, host_forms

log = logging.getLogger(__name__)

RTP_VERSION = 2
HEADER = struct.Struct("!BBHII")  # RFC 3550 §5.1: V/P/X/CC, M/PT, sequence, timestamp, SSRC
RTCP_PAYLOAD_TYPES = range(72, 77)  # RFC 5761 §4: RTCP SR/RR/SDES/BYE/APP seen as RTP
DTMF_DIGITS = "0123456789*#ABCD"  # RFC 4733 §3.2: events 0-15


class RtpError(ValueError):
    """A datagram that is not a usable RTP packet."""


@dataclass(frozen=True)
class RtpPacket:
    """One RTP packet (RFC 3550 §5.1); CSRCs, header extension and padding are not kept."""

    payload_type: int
    sequence: int
    timestamp: int
    ssrc: int
    marker: bool = False
    payload: bytes = b""

    def __post_init__(self) -> None:
        if not 0 <= self.payload_type < 128:
            raise ValueError(f"payload type {self.payload_type} is not 7 bits")
        if not 0 <= self.sequence < 1 << 16:
            raise ValueError(f"sequence {self.sequence} is not 16 bits")
        if not 0 <= self.timestamp < 1 << 32 or not 0 <= self.ssrc < 1 << 32:
            raise ValueError("timestamp and SSRC are 32 bits")

    def to_bytes(self) -> bytes:
        """Version 2, no padding, extension or CSRC."""
        second = (0x80 if self.marker else 0) | self.payload_type
        header = HEADER.pack(RTP_VERSION << 6, second, self.sequence, self.timestamp, self.ssrc)
        return header + self.payload


def parse_rtp(data: bytes) -> RtpPacket:
    """Parse one datagram (RFC 3550 §5.1, §5.3.1); RtpError if it is not RTP for us."""
    if len(data) < HEADER.size:
        raise RtpError(f"{len(data)} bytes: shorter than an RTP header")
    first, second, sequence, timestamp, ssrc = HEADER.unpack_from(data)
    if first >> 6 != RTP_VERSION:
        raise RtpError(f"RTP version {first >> 6}")
    payload_type = second & 0x7F
    if payload_type in RTCP_PAYLOAD_TYPES:
        raise RtpError("an RTCP packet")
    start = HEADER.size + 4 * (first & 0x0F)  # CSRC list
    if first & 0x10:  # header extension: 16-bit profile, 16-bit length in 32-bit words
        if start + 4 > len(data):
            raise RtpError("header extension past the end")
        (words,) = struct.unpack_from("!H", data, start + 2)
        start += 4 + 4 * words
    if start > len(data):
        raise RtpError("CSRC list or header extension past the end")
    end = len(data)
    if first & 0x20:  # padding: its last byte counts the padding bytes, itself included
        padding = data[-1]
        if padding == 0 or start + padding > end:
            raise RtpError(f"padding of {padding} bytes")
        end -= padding
    return RtpPacket(payload_type, sequence, timestamp, ssrc, bool(second & 0x80), data[start:end])


@dataclass(frozen=True)
class TelephoneEvent:
    """An RFC 4733 §2.3 event payload: event code, end bit, volume (-dBm0), duration (ticks)."""

    event: int
    end: bool
    volume: int
    duration: int

    @property
    def digit(self) -> str | None:
        """The DTMF key for events 0-15 (§3.2), None for other events."""
        return DTMF_DIGITS[self.event] if self.event < len(DTMF_DIGITS) else None


def parse_telephone_event(payload: bytes) -> TelephoneEvent:
    """The first event of a telephone-event payload (RFC 4733 §2.3); RtpError if short."""
    if len(payload) < 4:
        raise RtpError(f"telephone-event payload of {len(payload)} bytes")
    event, flags, duration = struct.unpack_from("!BBH", payload)
    return TelephoneEvent(event, bool(flags & 0x80), flags & 0x3F, duration)


class DtmfDetector:
    """Turns a stream of RFC 4733 packets into key presses: one per event (by RTP timestamp),
    reported once at its first packet (don't wait for the end; end packets are sent 3 times
    and must not repeat the key; a new key = a new timestamp).

    A long event's next segment (§2.5.1.3: same event, timestamp = the last one + its duration)
    continues the key rather than pressing it again.
    """

    def __init__(self, remember: int = 16) -> None:
        self._seen: deque[tuple[int, int]] = deque(maxlen=remember)  # (SSRC, timestamp)
        self._last: tuple[RtpPacket, TelephoneEvent] | None = None

    def push(self, packet: RtpPacket) -> str | None:
        """The key pressed if this packet starts a new event, else None."""
        try:
            event = parse_telephone_event(packet.payload)
        except RtpError:
            return None
        key = (packet.ssrc, packet.timestamp)
        previous, self._last = self._last, (packet, event)
        if key in self._seen:
            return None
        self._seen.append(key)
        if previous is not None:
            last_packet, last_event = previous
            if (
                last_packet.ssrc == packet.ssrc
                and last_event.event == event.event
                and (last_packet.timestamp + last_event.duration) % (1 << 32) == packet.timestamp
            ):
                return None  # the next segment of a long event
        return event.digit


class G711:
    """The G.711 codec of one call (RFC 3551 §4.5.14): "PCMU" (μ-law, payload type 0) or
    "PCMA" (A-law, payload type 8), 8 kHz."""

    clock_rate = 8000

    def __init__(self, name: str) -> None:
        if name == "PCMU":
            self.payload_type = 0
            self._encode, self._decode, self._silence = mulaw_encode, mulaw_decode, 0xFF
        elif name == "PCMA":
            self.payload_type = 8
            self._encode, self._decode, self._silence = alaw_encode, alaw_decode, 0xD5
        else:
            raise ValueError(f"not a G.711 codec: {name!r}")
        self.name = name

    def encode(self, pcm8k: PCM) -> bytes:
        return self._encode(pcm8k)

    def decode(self, payload: bytes) -> PCM:
        return self._decode(payload)

    def silence(self, samples: int) -> bytes:
        return bytes([self._silence]) * samples


class RtpSession(asyncio.DatagramProtocol):
    """One call's RTP over UDP. Packets go to the SDP's address until the caller's first valid
    packet (right payload type / telephone-event, any SSRC); then to where it came from
    ("latching": symmetric RTP for NAT, RFC 4961). RTCP not implemented (ignored).

    Only the caller latches: a packet from the SDP's connection host or (behind NAT) the host
    the signalling came from (`signalling_host`), at any port. Anything else (before latching;
    after it, anything not from the latched address) is dropped, counted in `foreign_dropped`
    and logged at most once per `FOREIGN_LOG_S`: a host spraying the port range is never heard
    nor sent to. Setting `remote` (a re-INVITE moved the media) forgets the latch and moves the
    SDP host with it; the signalling host stays. Telephone-events share the audio's sequence
    numbers (RFC 4733 §2.1): they pass the jitter buffer as empty frames (not lost audio).
    """

    FOREIGN_LOG_S = 30.0

    def __init__(
        self,
        codec: G711,
        dtmf_payload_type: int | None,
        on_audio: Callable[[PCM, float], None],
        on_dtmf: Callable[[str, float], None],
        *,
        remote: tuple[str, int] | None,
        signalling_host: str | None = None,
        jitter_frames: int = 3,
        frame_samples: int = 160,
    ) -> None:
        self.codec = codec
        self.dtmf_payload_type = dtmf_payload_type
        self.on_audio = on_audio
        self.on_dtmf = on_dtmf
        self.frame_samples = frame_samples
        self._signalled = remote  # where the SDP says to send
        self._latched: tuple[str, int] | None = None  # where packets really come from
        self._signalling_host = signalling_host
        self._callers = host_forms(remote[0] if remote else None, signalling_host)
        self._foreign_logged_at: float | None = None
        self._foreign_since_log = 0
        self._jitter = JitterBuffer(jitter_frames)
        self._dtmf = DtmfDetector()
        self._remote_ssrc: int | None = None
        self._transport: asyncio.DatagramTransport | None = None
        self._closed = False
        # RFC 3550 §5.1: random SSRC, initial sequence number and timestamp.
        self.ssrc = secrets.randbits(32)
        self._sequence = secrets.randbits(16)
        self._timestamp = secrets.randbits(32)
        self.packets_in = 0  # valid packets from the remote (audio and telephone-events)
        self.packets_out = 0
        self.foreign_dropped = 0  # datagrams not from the caller's host (or latched address)
        self.invalid_dropped = 0  # not RTP, RTCP, or a payload type not negotiated

    # -- addresses -----------------------------------------------------------------------------

    @property
    def local_port(self) -> int:
        if self._transport is None:
            raise RuntimeError("the RTP session is not bound")
        port: int = self._transport.get_extra_info("sockname")[1]
        return port

    @property
    def remote(self) -> tuple[str, int] | None:
        """Where packets go: the latched source, else the SDP's address."""
        return self._latched or self._signalled

    @remote.setter
    def remote(self, address: tuple[str, int] | None) -> None:
        if address != self._signalled:
            self._signalled = address
            self._latched = None
            self._callers = host_forms(address[0] if address else None, self._signalling_host)

    @property
    def latched(self) -> bool:
        return self._latched is not None

    @property
    def packets_lost(self) -> int:
        return self._jitter.lost

    @property
    def late_dropped(self) -> int:
        return self._jitter.late

    # -- asyncio.DatagramProtocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.DatagramTransport) -> None:  # type: ignore[override]
        self._transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True

    def error_received(self, exc: Exception) -> None:
        # ICMP port unreachable and the like, from an earlier send: the far end may not listen yet.
        log.debug("RTP port %s: %s", self._port_or_none(), exc)

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        if self._closed:
            return
        source = (str(addr[0]), int(addr[1]))
        latched = self._latched
        if source != latched and (latched is not None or source[0] not in self._callers):
            self._foreign(source)  # before parsing: a stranger's flood costs a set lookup
            return
        try:
            packet = parse_rtp(data)
        except RtpError:
            self.invalid_dropped += 1
            return
        is_dtmf = self.dtmf_payload_type is not None and (
            packet.payload_type == self.dtmf_payload_type
        )
        if packet.payload_type != self.codec.payload_type and not is_dtmf:
            self.invalid_dropped += 1
            return
        if latched is None:
            self._latch(source)
        self.packets_in += 1
        now = time.monotonic()
        if self._remote_ssrc != packet.ssrc:
            if self._remote_ssrc is not None:  # a new source (RFC 3550 §8): new sequence space
                self._play(self._jitter.flush(), now)
            self._remote_ssrc = packet.ssrc
        if is_dtmf:
            digit = self._dtmf.push(packet)
            if digit is not None:
                self._call(self.on_dtmf, digit, now)
        self._play(self._jitter.push(packet.sequence, b"" if is_dtmf else packet.payload), now)

    def _latch(self, source: tuple[str, int]) -> None:
        self._latched = source
        if source != self._signalled:
            log.info(
                "RTP port %s: media comes from %s:%s, not the SDP's %s: sending there",
                self._port_or_none(),
                *source,
                self._signalled,
            )

    def _foreign(self, source: tuple[str, int]) -> None:
        """Drop a datagram not from the caller: counted, logged at most once per FOREIGN_LOG_S."""
        self.foreign_dropped += 1
        self._foreign_since_log += 1
        now = time.monotonic()
        if self._foreign_logged_at is None or now - self._foreign_logged_at >= self.FOREIGN_LOG_S:
            latched = self._latched
            taken = f"{latched[0]}:{latched[1]}" if latched else " or ".join(sorted(self._named()))
            log.warning(
                "RTP port %s: %d datagram(s) not from the caller dropped (last from %s:%s; "
                "media is taken only from %s)",
                self._port_or_none(),
                self._foreign_since_log,
                *source,
                taken,
            )
            self._foreign_logged_at, self._foreign_since_log = now, 0

    def _named(self) -> set[str]:
        """The hosts the caller's media may come from (for the log): SDP and signalling."""
        hosts = {self._signalling_host, self._signalled[0] if self._signalled else None}
        return {host for host in hosts if host} or {"nowhere (no address known)"}

    def _play(self, frames: list[bytes | None], now: float) -> None:
        for frame in frames:
            if frame is None:
                self._call(self.on_audio, np.zeros(self.frame_samples, dtype=np.int16), now)
            elif frame:
                self._call(self.on_audio, self.codec.decode(frame), now)

    def _call(self, callback: Callable[[Any, float], None], value: object, now: float) -> None:
        try:
            callback(value, now)
        except Exception:
            log.exception("RTP port %s: callback failed", self._port_or_none())

    def _port_or_none(self) -> int | None:
        return None if self._transport is None else self.local_port

    # -- sending -------------------------------------------------------------------------------

    def send_frame(self, pcm8k: PCM, *, marker: bool = False) -> None:
        """Send one frame (20 ms at 8 kHz, usually): `marker` starts a talkspurt (RFC 3551 §4.1).
        Dropped silently without a remote address or once closed."""
        remote = self.remote
        if self._closed or self._transport is None or remote is None or pcm8k.size == 0:
            return
        packet = RtpPacket(
            self.codec.payload_type,
            self._sequence,
            self._timestamp,
            self.ssrc,
            marker,
            self.codec.encode(pcm8k),
        )
        self._sequence = (self._sequence + 1) % (1 << 16)
        self._timestamp = (self._timestamp + int(pcm8k.size)) % (1 << 32)
        self._transport.sendto(packet.to_bytes(), remote)
        self.packets_out += 1

    def close(self) -> None:
        self._closed = True
        if self._transport is not None:
            self._transport.close()


async def open_rtp_session(
    host: str,
    port_range: tuple[int, int],
    *,
    rng: random.Random | None = None,
    **session_kwargs: Any,
) -> RtpSession:
    """Bind a UDP socket on `host` to a random free even port in [low, high) (RFC 3550 §11: RTP
    on an even port; `rng` for tests) and return its session; OSError if none is free."""
    loop = asyncio.get_running_loop()
    session = RtpSession(**session_kwargs)  # first: a bad argument must not leak a socket
    sock = bind_rtp_socket(host, port_range, rng)
    try:
        sock.setblocking(False)
        await loop.create_datagram_endpoint(lambda: session, sock=sock)
    except BaseException:
        sock.close()
        raise
    return session
