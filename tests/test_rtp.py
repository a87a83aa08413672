"""SIP media: RTP packets (RFC 3550), G.711 both laws, telephone-events (RFC 4733), the jitter
buffer, and `RtpSession` over real UDP sockets on loopback (symmetric RTP, RFC 4961)."""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import warnings
from collections.abc import Iterator

import numpy as np
import pytest

from tests.support.rtp_inbox import Inbox
from voice.audio import PCM, alaw_decode, alaw_encode
from voice.transports.sip.jitter import JitterBuffer
from voice.transports.sip.rtp import (
    G711,
    DtmfDetector,
    RtpError,
    RtpPacket,
    RtpSession,
    open_rtp_session,
    parse_rtp,
    parse_telephone_event,
)

LOOPBACK = "127.0.0.1"
DTMF_PT = 101
WAIT_S = 5.0

# -- G.711 A-law ------------------------------------------------------------------------------


def test_alaw_known_values() -> None:
    assert alaw_encode(np.array([0], dtype=np.int16)) == b"\xd5"
    assert alaw_encode(np.array([-1], dtype=np.int16)) == b"\x55"
    assert alaw_encode(np.array([32767, -32768], dtype=np.int16)) == b"\xaa\x2a"
    assert alaw_decode(b"\xd5\x55\xaa\x2a").tolist() == [8, -8, 32256, -32256]


def test_alaw_round_trip_error_is_within_half_a_step() -> None:
    pcm = np.arange(-32768, 32768, dtype=np.int16)
    error = np.abs(alaw_decode(alaw_encode(pcm)).astype(np.int32) - pcm)
    magnitude = np.abs(pcm.astype(np.int32))
    # Steps of 16 up to 512, then 1/16 of the value: half a step is at most 8, or 1/32 of it.
    assert np.all(error <= np.maximum(8, (magnitude >> 5) + 1))
    assert np.all(error[magnitude < 512] <= 8)


def test_alaw_agrees_with_audioop() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        audioop = pytest.importorskip("audioop")
    pcm = np.arange(-32768, 32768, dtype=np.int16)
    assert alaw_encode(pcm) == audioop.lin2alaw(pcm.tobytes(), 2)
    every = bytes(range(256))
    expected = np.frombuffer(audioop.alaw2lin(every, 2), dtype=np.int16)
    assert np.array_equal(alaw_decode(every), expected)


@pytest.mark.parametrize(
    ("name", "payload_type", "silence"), [("PCMU", 0, 0xFF), ("PCMA", 8, 0xD5)]
)
def test_g711_codecs(name: str, payload_type: int, silence: int) -> None:
    codec = G711(name)
    assert codec.payload_type == payload_type
    assert codec.silence(160) == bytes([silence]) * 160
    assert np.all(np.abs(codec.decode(codec.silence(160))) <= 8)
    tone = (8000 * np.sin(np.arange(160) * 2 * np.pi * 440 / 8000)).astype(np.int16)
    payload = codec.encode(tone)
    assert len(payload) == 160
    decoded = codec.decode(payload)
    assert decoded.dtype == np.int16
    assert np.max(np.abs(decoded.astype(np.int32) - tone)) <= 8000 // 16


def test_g711_rejects_other_codecs() -> None:
    with pytest.raises(ValueError):
        G711("opus")


# -- RTP packets ------------------------------------------------------------------------------


def test_packet_round_trip() -> None:
    packet = RtpPacket(0, 65535, 0xFFFFFFFF, 0x12345678, marker=True, payload=b"\xff" * 160)
    data = packet.to_bytes()
    assert data[:2] == b"\x80\x80"  # version 2, no P/X/CC; marker, payload type 0
    assert len(data) == 12 + 160
    assert parse_rtp(data) == packet
    assert parse_rtp(RtpPacket(8, 1, 2, 3).to_bytes()) == RtpPacket(8, 1, 2, 3)


def test_packet_fields_are_checked() -> None:
    for fields in [(128, 0, 0, 0), (0, 1 << 16, 0, 0), (0, 0, -1, 0), (0, 0, 0, 1 << 32)]:
        with pytest.raises(ValueError):
            RtpPacket(*fields)


def _raw(
    *,
    csrcs: int = 0,
    extension: bytes | None = None,
    padding: int = 0,
    payload: bytes = b"audio",
    payload_type: int = 0,
) -> bytes:
    first = 0x80 | (0x20 if padding else 0) | (0x10 if extension is not None else 0) | csrcs
    data = struct.pack("!BBHII", first, payload_type, 7, 160, 0xCAFE)
    data += b"".join(struct.pack("!I", 1000 + n) for n in range(csrcs))
    if extension is not None:
        data += struct.pack("!HH", 0xBEDE, len(extension) // 4) + extension
    data += payload
    if padding:
        data += b"\0" * (padding - 1) + bytes([padding])
    return data


def test_parse_skips_csrcs_extension_and_padding() -> None:
    expected = RtpPacket(0, 7, 160, 0xCAFE, payload=b"audio")
    assert parse_rtp(_raw(csrcs=3)) == expected
    assert parse_rtp(_raw(extension=b"\x10\x20\x30\x40" * 2)) == expected
    assert parse_rtp(_raw(extension=b"")) == expected
    assert parse_rtp(_raw(padding=4)) == expected
    assert parse_rtp(_raw(padding=1)) == expected
    assert parse_rtp(_raw(csrcs=15, extension=b"\0" * 4, padding=255)) == expected
    assert parse_rtp(_raw(padding=3, payload=b"")).payload == b""


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x80\x00\x00\x01",
        b"\x80" + b"\0" * 10,  # 11 bytes
        b"\x40" + b"\0" * 11,  # version 1
        b"\x00" + b"\0" * 11,  # version 0 (STUN, say)
        _raw(csrcs=2, payload=b"")[:-1],  # CSRC list cut short
        _raw(extension=b"")[:14],  # extension header cut short
        _raw(extension=b"\0" * 8, payload=b"")[:-1],  # extension longer than the packet
        _raw(padding=4)[:-1] + b"\x00",  # padding count of 0
        _raw(padding=4, payload=b"")[:-1] + b"\x40",  # more padding than payload
        _raw(payload_type=72),
        _raw(payload_type=76),
        bytes([0x81, 0xC9]) + b"\0" * 30,  # an RTCP receiver report (201) on the RTP port
    ],
)
def test_parse_rejects_hostile_packets(data: bytes) -> None:
    with pytest.raises(RtpError):
        parse_rtp(data)


def test_parse_random_bytes_raises_only_rtp_error() -> None:
    rng = random.Random(3550)
    for _ in range(20_000):
        data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(40)))
        if rng.random() < 0.5 and data:
            data = bytes([0x80 | (data[0] & 0x3F)]) + data[1:]  # version 2: get further
        try:
            packet = parse_rtp(data)
        except RtpError:
            continue
        assert len(packet.payload) <= len(data) - 12


# -- telephone-events (DTMF) ----------------------------------------------------------------


def _event(event: int, *, end: bool = False, duration: int = 160, volume: int = 10) -> bytes:
    return struct.pack("!BBH", event, (0x80 if end else 0) | volume, duration)


def test_parse_telephone_event() -> None:
    event = parse_telephone_event(bytes([5, 0x8A, 0x03, 0x20]))
    assert (event.event, event.end, event.volume, event.duration) == (5, True, 10, 800)
    assert event.digit == "5"
    digits = [parse_telephone_event(_event(code)).digit for code in range(17)]
    assert digits == [*"0123456789*#ABCD", None]
    with pytest.raises(RtpError):
        parse_telephone_event(b"\x05\x8a\x03")


def _press(
    detector: DtmfDetector, event: int, timestamp: int, sequence: int, ssrc: int = 1
) -> list[str | None]:
    """A key as a real phone sends it: 3 start packets (the first marked), 3 end packets."""
    keys = []
    for n in range(6):
        payload = _event(event, end=n >= 3, duration=160 * min(n + 1, 4))
        packet = RtpPacket(DTMF_PT, sequence + n, timestamp, ssrc, n == 0, payload)
        keys.append(detector.push(packet))
    return keys


def test_dtmf_detector_reports_each_press_once() -> None:
    detector = DtmfDetector()
    assert _press(detector, 5, timestamp=1000, sequence=10) == ["5", None, None, None, None, None]
    assert _press(detector, 5, timestamp=3000, sequence=20) == ["5", None, None, None, None, None]
    assert _press(detector, 11, timestamp=5000, sequence=30)[0] == "#"
    # A late copy of an earlier event's end packet is no new press.
    assert detector.push(RtpPacket(DTMF_PT, 25, 3000, 1, payload=_event(5, end=True))) is None
    assert detector.push(RtpPacket(DTMF_PT, 40, 7000, 1, payload=b"\x05")) is None  # malformed
    assert detector.push(RtpPacket(DTMF_PT, 41, 7000, 1, payload=_event(16))) is None  # flash


def test_dtmf_long_event_segments_are_one_press() -> None:
    """RFC 4733 §2.5.1.3: past 0xFFFF ticks the event goes on in a new segment."""
    detector = DtmfDetector()
    first = RtpPacket(DTMF_PT, 1, 0xFFFF0000, 1, True, _event(1, duration=0xFFFF))
    assert detector.push(first) == "1"
    segment = RtpPacket(DTMF_PT, 2, (0xFFFF0000 + 0xFFFF) % (1 << 32), 1, False, _event(1))
    assert detector.push(segment) is None


# -- jitter buffer ----------------------------------------------------------------------------


def _frames(buffer: JitterBuffer, sequences: list[int]) -> list[int | None]:
    """Push packets whose payload names their sequence number; the frames out, as numbers."""
    out: list[int | None] = []
    for sequence in sequences:
        frames = buffer.push(sequence, str(sequence).encode())
        out += [None if frame is None else int(frame) for frame in frames]
    return out


def test_jitter_in_order_passes_straight_through() -> None:
    buffer = JitterBuffer(depth=3)
    for sequence in range(100, 110):
        assert buffer.push(sequence, b"x") == [b"x"]
    assert buffer.lost == buffer.late == 0


def test_jitter_reorders_within_depth() -> None:
    buffer = JitterBuffer(depth=3)
    assert _frames(buffer, [0, 2, 3, 1, 4, 6, 5]) == [0, 1, 2, 3, 4, 5, 6]
    assert buffer.lost == 0


def test_jitter_gives_up_on_a_lost_packet_after_depth_more() -> None:
    buffer = JitterBuffer(depth=3)
    assert _frames(buffer, [0, 2, 3]) == [0]
    assert _frames(buffer, [4]) == [None, 2, 3, 4]
    assert buffer.lost == 1
    assert _frames(buffer, [8, 9, 10]) == [None, None, None, 8, 9, 10]  # a burst of 3 lost
    assert buffer.lost == 4


def test_jitter_drops_late_and_duplicate_packets() -> None:
    buffer = JitterBuffer(depth=3)
    assert _frames(buffer, [0, 2, 3, 4]) == [0, None, 2, 3, 4]
    assert _frames(buffer, [1]) == []  # too late: already played as lost
    assert _frames(buffer, [3]) == []
    assert buffer.late == 2
    assert _frames(buffer, [6, 6]) == []
    assert buffer.duplicates == 1


def test_jitter_wraps_around_at_65535() -> None:
    buffer = JitterBuffer(depth=3)
    assert _frames(buffer, [65534, 0, 65535, 1]) == [65534, 65535, 0, 1]
    assert _frames(buffer, [3, 4, 5]) == [None, 3, 4, 5]
    assert _frames(buffer, [65535]) == []
    assert (buffer.lost, buffer.late) == (1, 1)


def test_jitter_resynchronises_on_a_sender_restart() -> None:
    buffer = JitterBuffer(depth=3)
    assert _frames(buffer, [1000, 1001, 1003]) == [1000, 1001]
    assert _frames(buffer, [20_000, 20_001]) == [1003, 20_000, 20_001]  # held frame flushed
    assert _frames(buffer, [5, 6]) == [5, 6]  # backwards, too
    assert buffer.lost == 0
    assert buffer.resyncs == 2


# -- RtpSession over loopback UDP -------------------------------------------------------------


async def _session(inbox: Inbox, remote: tuple[str, int] | None, codec: str = "PCMU") -> RtpSession:
    return await open_rtp_session(
        LOOPBACK,
        (20_000, 40_000),
        codec=G711(codec),
        dtmf_payload_type=DTMF_PT,
        on_audio=inbox.on_audio,
        on_dtmf=inbox.on_dtmf,
        remote=remote,
    )


@pytest.fixture
def far_ends() -> Iterator[list[socket.socket]]:
    """Three raw UDP sockets on loopback: stand-ins for a phone, its NAT, and a stranger."""
    sockets = []
    for _ in range(3):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((LOOPBACK, 0))
        sock.setblocking(False)
        sockets.append(sock)
    yield sockets
    for sock in sockets:
        sock.close()


def _address(sock: socket.socket) -> tuple[str, int]:
    host, port = sock.getsockname()
    return str(host), int(port)


async def _receive(sock: socket.socket) -> RtpPacket:
    async with asyncio.timeout(WAIT_S):
        data, _ = await asyncio.get_running_loop().sock_recvfrom(sock, 2048)
    return parse_rtp(data)


def _tone(step: int) -> PCM:
    return np.full(160, step * 1000, dtype=np.int16)


@pytest.mark.parametrize("codec", ["PCMU", "PCMA"])
async def test_sessions_exchange_frames_in_order(codec: str) -> None:
    inbox_a, inbox_b = Inbox(), Inbox()
    a = await _session(inbox_a, None, codec)
    b = await _session(inbox_b, (LOOPBACK, a.local_port), codec)
    a.remote = (LOOPBACK, b.local_port)
    try:
        assert a.local_port % 2 == 0 and b.local_port % 2 == 0
        sent = [_tone(step) for step in range(-8, 9)]
        for n, frame in enumerate(sent):
            b.send_frame(frame, marker=n == 0)
        received = await inbox_a.frames(len(sent))
        assert len(received) == len(sent)
        for frame, got in zip(sent, received, strict=True):
            assert np.array_equal(got, a.codec.decode(a.codec.encode(frame)))
        assert (a.packets_in, a.packets_lost, a.late_dropped) == (len(sent), 0, 0)
        a.send_frame(_tone(1))
        assert len(await inbox_b.frames(1)) == 1
    finally:
        a.close()
        b.close()
    b.send_frame(_tone(1))  # closed: dropped silently


async def test_dtmf_arrives_once_and_takes_no_audio_slot(far_ends: list[socket.socket]) -> None:
    phone = far_ends[0]
    inbox = Inbox()
    session = await _session(inbox, _address(phone))
    target = (LOOPBACK, session.local_port)
    try:
        phone.sendto(RtpPacket(0, 100, 0, 7, payload=b"\xff" * 160).to_bytes(), target)
        for n in range(6):  # '7': 3 start packets, then the end packet 3 times
            payload = _event(7, end=n >= 3, duration=160 * min(n + 1, 4))
            phone.sendto(RtpPacket(DTMF_PT, 101 + n, 160, 7, n == 0, payload).to_bytes(), target)
        phone.sendto(b"not RTP at all", target)
        phone.sendto(RtpPacket(0, 107, 1120, 7, payload=b"\xff" * 160).to_bytes(), target)
        await inbox.frames(2)  # the audio after the key: every earlier datagram was handled
        assert inbox.digits == ["7"]
        assert len(inbox.audio) == 2  # the event packets are neither audio nor lost audio
        assert (session.packets_lost, session.invalid_dropped) == (0, 1)
    finally:
        session.close()


async def test_lost_packet_becomes_a_frame_of_silence(far_ends: list[socket.socket]) -> None:
    phone = far_ends[0]
    inbox = Inbox()
    session = await _session(inbox, _address(phone))
    try:
        for sequence in [0, 2, 3, 4]:
            packet = RtpPacket(0, sequence, sequence * 160, 9, payload=b"\x80" * 160)
            phone.sendto(packet.to_bytes(), (LOOPBACK, session.local_port))
        frames = await inbox.frames(5)
        assert [int(np.abs(frame).max()) for frame in frames] == [32124, 0, 32124, 32124, 32124]
        assert session.packets_lost == 1
    finally:
        session.close()


async def test_symmetric_rtp_latches_to_the_real_source(far_ends: list[socket.socket]) -> None:
    signalled, nat, stranger = far_ends
    inbox = Inbox()
    session = await _session(inbox, _address(signalled))
    target = (LOOPBACK, session.local_port)
    try:
        session.send_frame(_tone(1))
        assert (await _receive(signalled)).payload_type == 0  # to the SDP's address at first
        assert not session.latched

        nat.sendto(RtpPacket(0, 500, 0, 42, payload=b"\xff" * 160).to_bytes(), target)
        await inbox.frames(1)
        assert session.remote == _address(nat)
        session.send_frame(_tone(2), marker=True)
        packet = await _receive(nat)
        assert packet.marker and packet.ssrc == session.ssrc

        stranger.sendto(RtpPacket(0, 501, 160, 42, payload=b"\x00" * 160).to_bytes(), target)
        nat.sendto(RtpPacket(0, 501, 160, 42, payload=b"\xff" * 160).to_bytes(), target)
        await inbox.frames(2)
        assert session.foreign_dropped == 1
        assert session.remote == _address(nat)

        session.remote = _address(stranger)  # a re-INVITE moved the media: latch again
        assert not session.latched
        stranger.sendto(RtpPacket(0, 502, 320, 42, payload=b"\xff" * 160).to_bytes(), target)
        await inbox.frames(3)
        session.send_frame(_tone(3))
        assert (await _receive(stranger)).sequence == (packet.sequence + 1) % (1 << 16)
    finally:
        session.close()


async def test_open_rtp_session_picks_a_free_even_port() -> None:
    busy = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        while True:  # an even port someone else holds
            busy.bind((LOOPBACK, 0))
            port = int(busy.getsockname()[1])
            if port % 2 == 0 and port < 65000:
                break
            busy.close()
            busy = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        inbox = Inbox()
        session = await open_rtp_session(
            LOOPBACK,
            (port - 1, port + 40),
            codec=G711("PCMA"),
            dtmf_payload_type=None,
            on_audio=inbox.on_audio,
            on_dtmf=inbox.on_dtmf,
            remote=None,
        )
        try:
            assert session.local_port % 2 == 0
            assert port < session.local_port < port + 40
            session.send_frame(_tone(1))  # no remote yet: dropped silently
        finally:
            session.close()
        with pytest.raises(OSError):
            await open_rtp_session(
                LOOPBACK,
                (port, port + 1),
                codec=G711("PCMU"),
                dtmf_payload_type=None,
                on_audio=inbox.on_audio,
                on_dtmf=inbox.on_dtmf,
                remote=None,
            )
    finally:
        busy.close()
