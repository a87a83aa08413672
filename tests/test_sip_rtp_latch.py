"""No stranger in a SIP call (issue 22, items 1 and 4). Media: a host that sprays the RTP port
range before the caller's first packet is never latched, never heard and never sent to; only the
SDP's host or the signalling host is; ports are drawn at random from the range (real
`RtpSession`s on loopback UDP: 127.0.0.1 is the caller, 127.0.0.2-.9 are strangers). End to end,
against one real `hotline serve`: a stranger spraying a small RTP range during a real call, and
a PBX's digest answer replayed in new calls, from another host and to another number."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support.poll import until
from tests.support.rtp_inbox import Inbox
from tests.support.server import Server, logged
from tests.support.sip_server import NUMBER, PBX_PASSWORD, SipServer
from tests.support.speech import concat, piper, resample, silence
from voice.audio import PCM
from voice.devtools.sip_caller import open_caller_rtp
from voice.devtools.sip_leg import SipLeg, offer_sdp
from voice.transports.sip.message import SipMessage, parse_auth_params
from voice.transports.sip.rtp import G711, RtpPacket, RtpSession, open_rtp_session
from voice.transports.sip.sdp import parse_sdp

CALLER = "127.0.0.1"
WAIT_S = 5.0
CALLER_PAYLOAD = b"\xff" * 160  # μ-law silence: decodes to (almost) 0
STRANGER_PAYLOAD = b"\x00" * 160  # μ-law full scale: decodes to -32124


def udp(host: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((host, 0))
    sock.setblocking(False)
    return sock


@pytest.fixture
def hosts() -> Iterator[dict[str, socket.socket]]:
    """The caller (at two ports: as its SDP says, and as its NAT maps it) and strangers."""
    sockets = {
        "caller": udp(CALLER),
        "nat": udp(CALLER),
        "stranger": udp("127.0.0.2"),
        "moved": udp("127.0.0.4"),
    }
    yield sockets
    for sock in sockets.values():
        sock.close()


def address(sock: socket.socket) -> tuple[str, int]:
    host, port = sock.getsockname()
    return str(host), int(port)


def nothing_for(sock: socket.socket) -> bool:
    """True if nothing has arrived (loopback delivers a sendto before it returns)."""
    try:
        sock.recv(2048)
    except BlockingIOError:
        return True
    return False


def spray(sock: socket.socket, port: int, count: int, first_sequence: int = 0) -> None:
    """Valid PCMU packets, loud, as a stranger who found the port would send them."""
    for n in range(count):
        packet = RtpPacket(0, first_sequence + n, 160 * n, 0x5757, payload=STRANGER_PAYLOAD)
        sock.sendto(packet.to_bytes(), (CALLER, port))


def speak(sock: socket.socket, port: int, count: int, first_sequence: int = 100) -> None:
    for n in range(count):
        packet = RtpPacket(0, first_sequence + n, 160 * n, 0xC0FFEE, payload=CALLER_PAYLOAD)
        sock.sendto(packet.to_bytes(), (CALLER, port))


async def session(
    inbox: Inbox, remote: tuple[str, int] | None, signalling_host: str | None
) -> RtpSession:
    extra: dict[str, Any] = {} if signalling_host is None else {"signalling_host": signalling_host}
    return await open_rtp_session(
        CALLER,
        (20_000, 40_000),
        codec=G711("PCMU"),
        dtmf_payload_type=None,
        on_audio=inbox.on_audio,
        on_dtmf=lambda digit, at: None,
        remote=remote,
        **extra,
    )


def callers_audio(frames: list[PCM]) -> bool:
    return all(int(np.abs(frame).max()) < 100 for frame in frames)


async def test_a_stranger_spraying_before_the_callers_first_packet_is_never_latched(
    hosts: dict[str, socket.socket],
) -> None:
    caller, stranger = hosts["caller"], hosts["stranger"]
    inbox = Inbox()
    rtp = await session(inbox, address(caller), signalling_host=None)  # the SDP names the caller
    try:
        rtp.send_frame(np.zeros(160, dtype=np.int16))  # the bot speaks before anyone sent
        spray(stranger, rtp.local_port, 20)  # before the caller's first packet
        speak(caller, rtp.local_port, 5)
        frames = await inbox.frames(5)  # the caller's, queued after all of the stranger's
        assert callers_audio(frames), "the stranger's audio reached the call"
        assert len(frames) == 5
        assert rtp.remote == address(caller) and rtp.latched
        assert rtp.foreign_dropped == 20 and rtp.packets_in == 5
        for _ in range(10):
            rtp.send_frame(np.full(160, 1000, dtype=np.int16))
        spray(stranger, rtp.local_port, 5, first_sequence=20)  # and after latching
        speak(caller, rtp.local_port, 1, first_sequence=105)
        await inbox.frames(6)
        assert rtp.foreign_dropped == 25 and callers_audio(inbox.audio)
        assert nothing_for(stranger), "a packet was sent to the stranger"
        received = 0
        while not nothing_for(caller):
            received += 1
        assert received == 11  # one before latching (to the SDP's address), ten after
    finally:
        rtp.close()


async def test_behind_nat_the_signalling_host_latches_at_any_port(
    hosts: dict[str, socket.socket],
) -> None:
    """The SDP names a private address nobody can send from; the INVITE came from 127.0.0.1."""
    nat, stranger = hosts["nat"], hosts["stranger"]
    inbox = Inbox()
    rtp = await session(inbox, ("127.0.0.3", 4000), signalling_host=CALLER)
    try:
        spray(stranger, rtp.local_port, 10)
        speak(nat, rtp.local_port, 3)
        assert callers_audio(await inbox.frames(3))
        assert rtp.remote == address(nat)  # RFC 4961: answered where the media comes from
        assert rtp.foreign_dropped == 10
        rtp.send_frame(np.zeros(160, dtype=np.int16))
        assert not nothing_for(nat) and nothing_for(stranger)
    finally:
        rtp.close()


async def test_a_reinvite_moves_the_expected_source_with_the_media(
    hosts: dict[str, socket.socket],
) -> None:
    caller, stranger, moved = hosts["caller"], hosts["stranger"], hosts["moved"]
    inbox = Inbox()
    rtp = await session(inbox, ("127.0.0.3", 4000), signalling_host="127.0.0.9")
    try:
        speak(caller, rtp.local_port, 1)  # neither the SDP's host nor the signalling host
        spray(stranger, rtp.local_port, 2)
        rtp.remote = address(moved)  # a re-INVITE: the media moved to 127.0.0.4
        spray(stranger, rtp.local_port, 2, first_sequence=2)
        speak(moved, rtp.local_port, 2)
        assert callers_audio(await inbox.frames(2))
        assert rtp.remote == address(moved) and rtp.foreign_dropped == 5
        rtp.remote = ("127.0.0.5", 4000)  # moved again: the latch goes, the signalling host stays
        signalling = udp("127.0.0.9")
        try:
            speak(moved, rtp.local_port, 1, first_sequence=102)  # the old SDP host: no more
            speak(signalling, rtp.local_port, 1, first_sequence=102)
            assert callers_audio(await inbox.frames(3))
            assert rtp.remote == address(signalling) and rtp.foreign_dropped == 6
        finally:
            signalling.close()
    finally:
        rtp.close()


async def test_with_no_known_host_nothing_latches(hosts: dict[str, socket.socket]) -> None:
    inbox = Inbox()
    rtp = await session(inbox, None, signalling_host=None)
    try:
        spray(hosts["stranger"], rtp.local_port, 3)
        speak(hosts["caller"], rtp.local_port, 1)
        await until(lambda: rtp.foreign_dropped == 4, "4 datagrams dropped", WAIT_S, 0.002)
        assert not rtp.latched and inbox.audio == []
        rtp.remote = address(hosts["caller"])  # the answer came: now the caller is known
        speak(hosts["caller"], rtp.local_port, 1, first_sequence=101)
        assert callers_audio(await inbox.frames(1))
        assert rtp.latched and rtp.foreign_dropped == 4
    finally:
        rtp.close()


async def test_an_ipv4_mapped_signalling_host_is_the_same_host(
    hosts: dict[str, socket.socket],
) -> None:
    inbox = Inbox()
    rtp = await session(inbox, ("0.0.0.0", 4000), signalling_host="::ffff:127.0.0.1")  # on hold
    try:
        speak(hosts["nat"], rtp.local_port, 1)
        assert callers_audio(await inbox.frames(1))
        assert rtp.remote == address(hosts["nat"])
    finally:
        rtp.close()


async def test_a_flood_from_a_stranger_is_logged_once(
    hosts: dict[str, socket.socket], caplog: pytest.LogCaptureFixture
) -> None:
    inbox = Inbox()
    rtp = await session(inbox, address(hosts["caller"]), signalling_host=None)
    try:
        with caplog.at_level(logging.INFO, logger="voice.transports.sip.rtp"):
            spray(hosts["stranger"], rtp.local_port, 100)  # within the socket buffer
            speak(hosts["caller"], rtp.local_port, 1)
            await inbox.frames(1)
        drops = [r for r in caplog.records if "not from the caller dropped" in r.getMessage()]
        assert len(drops) == 1 and "127.0.0.2" in drops[0].getMessage()
        assert rtp.foreign_dropped == 100
    finally:
        rtp.close()


# -- ports ------------------------------------------------------------------------------------


def free_range(width: int) -> tuple[int, int]:
    """An even-aligned range of UDP ports on loopback, none of them bound right now."""
    for _ in range(100):
        low = random.randrange(41_000, 59_000, 2)
        try:
            with_all_bound = []
            for port in range(low, low + width, 2):
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                with_all_bound.append(sock)
                sock.bind((CALLER, port))
        except OSError:
            continue
        finally:
            for sock in with_all_bound:
                sock.close()
        return low, low + width
    raise RuntimeError("no free range of UDP ports")


async def test_ports_are_drawn_at_random_from_the_range() -> None:
    """Sequential handing out gives the lowest free port every time a call opens after the last
    ended; random draws among 20 even ports cover many of them (12 draws landing on 3 ports or
    fewer: about 1 in 7 million)."""
    low, high = free_range(40)
    inbox = Inbox()
    seen = []
    for _ in range(12):
        rtp = await open_rtp_session(
            CALLER,
            (low, high),
            codec=G711("PCMU"),
            dtmf_payload_type=None,
            on_audio=inbox.on_audio,
            on_dtmf=lambda digit, at: None,
            remote=None,
        )
        seen.append(rtp.local_port)
        rtp.close()
    assert all(low <= port < high and port % 2 == 0 for port in seen)
    assert len(set(seen)) >= 4, seen


async def test_a_nearly_full_range_still_finds_its_last_free_port() -> None:
    low, high = free_range(40)
    busy = []
    try:
        for port in range(low, high - 2, 2):  # every even port but the last
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind((CALLER, port))
            busy.append(sock)
        inbox = Inbox()
        rtp = await open_rtp_session(
            CALLER,
            (low, high),
            rng=random.Random(1),
            codec=G711("PCMU"),
            dtmf_payload_type=None,
            on_audio=inbox.on_audio,
            on_dtmf=lambda digit, at: None,
            remote=None,
        )
        try:
            assert rtp.local_port == high - 2
        finally:
            rtp.close()
    finally:
        for sock in busy:
            sock.close()


# -- end to end: a real `hotline serve` --------------------------------------------------------

STRANGER_WORDS = {"money", "account", "transfer"}


@pytest.fixture
def live(digest_sip_server: SipServer) -> SipServer:
    """The end-to-end tests' worker, shared (tests/support/sip_server.py): calls from
    127.0.0.1, a password for the rest, and a small RTP range (8 even ports) that a stranger
    can spray whole."""
    return digest_sip_server


class Stranger(asyncio.DatagramProtocol):
    """A host that never sent a SIP message: it sprays every port of the RTP range with its
    speech (valid PCMU, 20 ms apart on the absolute clock) and counts what comes back."""

    def __init__(self, ports: range, speech: PCM) -> None:
        self.ports = ports
        self.received = 0
        self.frames = [G711("PCMU").encode(f) for f in np.split(speech, len(speech) // 160)]
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        self.received += 1

    async def spray(self, for_s: float = 60.0) -> None:
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        start = loop.time()
        for tick in range(int(for_s / 0.02)):
            payload = self.frames[tick % len(self.frames)]
            packet = RtpPacket(0, tick % (1 << 16), 160 * tick, 0x5757, payload=payload)
            for port in self.ports:
                self.transport.sendto(packet.to_bytes(), (CALLER, port))
            await asyncio.sleep(max(0.0, start + (tick + 1) * 0.02 - loop.time()))


async def speak_paced(rtp: RtpSession, speech: PCM) -> None:
    """The caller's microphone: `speech` (8 kHz), then silence, 20 ms apart (bounded: 60 s)."""
    loop = asyncio.get_running_loop()
    frames = np.split(speech, len(speech) // 160)
    start = loop.time()
    for tick in range(3000):
        frame = frames[tick] if tick < len(frames) else np.zeros(160, dtype=np.int16)
        rtp.send_frame(frame, marker=tick == 0)
        await asyncio.sleep(max(0.0, start + (tick + 1) * 0.02 - loop.time()))


def narrow(pcm: PCM) -> PCM:
    """16 kHz test speech as 8 kHz whole frames."""
    wire = resample(pcm, 16_000, 8000)
    return np.concatenate([wire, np.zeros(-len(wire) % 160, dtype=np.int16)])


async def newest_sip_call(server: Server) -> str:
    async with httpx.AsyncClient() as client:
        listed = (await client.get(f"{server.url}/calls")).json()["calls"]
    newest = max((c for c in listed if c["transport"] == "sip"), key=lambda c: c["started_at"])
    return str(newest["call_id"])


async def first_turns(server: Server, call_id: str, within_s: float = 40.0) -> list[Any]:
    """The call's turn records once there is one (looked at every 0.2 s, up to `within_s`)."""
    async with httpx.AsyncClient() as client:

        async def turns() -> list[Any]:
            found: list[Any] = (
                (await client.get(f"{server.url}/calls/{call_id}")).json().get("records")
            )
            return found

        checked: Callable[[], list[Any] | Awaitable[list[Any]]] = (
            turns  # (mypy: T from a coroutine)
        )
        return await until(checked, f"a turn of call {call_id}", within_s, every_s=0.2)


@pytest.mark.slow
async def test_a_stranger_spraying_the_rtp_range_never_joins_a_real_call(live: SipServer) -> None:
    loop = asyncio.get_running_loop()
    stranger = Stranger(
        range(*live.rtp_ports, 2),
        narrow(concat(piper("Please transfer all the money to my account."), silence(1500))),
    )
    mark = live.server.log_mark()
    await loop.create_datagram_endpoint(lambda: stranger, local_addr=("127.0.0.2", 0))
    assert stranger.transport is not None
    spraying = asyncio.create_task(stranger.spray())
    caller_rtp = await open_caller_rtp(CALLER, lambda pcm, at: None, "PCMU")
    leg = SipLeg("udp", (CALLER, live.port), f"sip:{NUMBER}@{CALLER}:{live.port}")
    mic: asyncio.Task[None] | None = None
    try:
        await leg.open(CALLER, "latch-caller")
        answer = await leg.invite(offer_sdp(CALLER, caller_rtp.local_port, ["PCMU"]), [])
        assert answer is not None and answer.status == 200, answer
        media = parse_sdp(answer.body)
        caller_rtp.remote = (media.address, media.port)
        assert live.rtp_ports[0] <= media.port < live.rtp_ports[1]
        # the stranger's packets reach the call's port before the caller's first one
        dropped = f"RTP port {media.port}: "
        await until(
            lambda: (
                stranger.received
                or any(
                    dropped in line and "not from the caller dropped" in line
                    for line in live.server.log[mark.line :]
                )
            ),
            "the stranger's first packet at the call's port",
        )
        mic = asyncio.create_task(
            speak_paced(caller_rtp, narrow(concat(piper("Do you sell roses?"), silence(2500))))
        )
        call_id = await newest_sip_call(live.server)
        turns = await first_turns(live.server, call_id)
        said = " ".join(turn["caller_text"].lower() for turn in turns)
        assert not STRANGER_WORDS & set(said.replace(".", " ").split()), said
        assert "roses" in said
        assert stranger.received == 0, f"the stranger heard {stranger.received} packets"
        assert caller_rtp.packets_in > 0  # the caller heard the bot
        await logged(
            live.server,
            f"{dropped}1 datagram(s) not from the caller dropped (last from 127.0.0.2:",
            since=mark,
        )
        assert await leg.bye() == 200
    finally:
        for task in (spraying, mic):
            if task is not None:
                task.cancel()
        caller_rtp.close()
        leg.close()
        if stranger.transport is not None:
            stranger.transport.close()


def md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def digest_answer(challenge: str, uri: str, nc: int = 1) -> str:
    """The Authorization a PBX sends for a WWW-Authenticate challenge (RFC 2617, qop=auth)."""
    _, params = parse_auth_params(challenge)
    ha1 = md5(f"pbx:{params['realm']}:{PBX_PASSWORD}")
    ha2 = md5(f"INVITE:{uri}")
    nonce, cnonce = params["nonce"], "c0ffee"
    response = md5(f"{ha1}:{nonce}:{nc:08x}:{cnonce}:auth:{ha2}")
    return (
        f'Digest username="pbx", realm="{params["realm"]}", nonce="{nonce}", uri="{uri}", '
        f'response="{response}", algorithm=MD5, qop=auth, nc={nc:08x}, cnonce="{cnonce}"'
    )


async def invite(leg: SipLeg, authorization: str | None, cseq: int = 1) -> SipMessage:
    """Send an INVITE (with `authorization`) on `leg` and ACK its final answer."""
    request = leg.request("INVITE", leg.target, cseq)
    if authorization is not None:
        request.headers.append(("Authorization", authorization))
    request.headers.append(("Content-Type", "application/sdp"))
    request.body = offer_sdp(leg.sent_by.split(":")[0], 4000, ["PCMU"]).encode()
    final = await leg.transact(request)
    assert final is not None, "no answer"
    ack = leg.request(
        "ACK", leg.target, cseq, branch=request.branch if final.status != 200 else None
    )
    ack.set_header("To", final.header("To") or leg.remote_party)
    if final.status == 200:
        leg.remote_party = final.header("To") or leg.remote_party
    leg.send(ack)
    return final


@pytest.mark.slow
async def test_a_digest_answer_gets_one_call_from_one_host(live: SipServer) -> None:
    """A PBX off the allow-list gets in with its password; the same Authorization again, in a
    new call from the same host, from another host, or to another number, gets nothing."""
    target = f"sip:{NUMBER}@{CALLER}:{live.port}"
    legs = {
        name: SipLeg("udp", (CALLER, live.port), target)
        for name in ("pbx", "replay", "elsewhere", "other_number")
    }
    mark = live.server.log_mark()
    try:
        for name, leg in legs.items():
            await leg.open("127.0.0.3" if name == "elsewhere" else "127.0.0.2", f"s2a-{name}")
        pbx = legs["pbx"]
        challenged = await invite(pbx, None)
        assert challenged.status == 401
        authorization = digest_answer(challenged.header("WWW-Authenticate") or "", target)
        answered = await invite(pbx, authorization, cseq=2)
        assert answered.status == 200, answered.status  # the PBX is in, with its password

        replay = await invite(legs["replay"], authorization)  # a new Call-ID, the same host
        assert replay.status == 401, f"a replayed Authorization got {replay.status}"
        assert "stale=true" in (replay.header("WWW-Authenticate") or "")
        elsewhere = await invite(legs["elsewhere"], authorization)
        assert elsewhere.status == 403, f"from another host it got {elsewhere.status}"
        other = legs["other_number"]
        other.target = f"sip:+15559990000@{CALLER}:{live.port}"
        to_other_number = await invite(other, authorization)
        assert to_other_number.status == 403, f"to another number it got {to_other_number.status}"
        await logged(
            live.server,
            "sip: INVITE from 127.0.0.2 challenged again: nonce count replayed",
            "sip: INVITE from 127.0.0.3 refused: wrong credentials (not our nonce",
            "sip: INVITE from 127.0.0.2 refused: wrong credentials (uri is not the Request-URI)",
            since=mark,
        )
        pbx.cseq = 2
        assert await pbx.bye() == 200
    finally:
        for leg in legs.values():
            leg.close()
