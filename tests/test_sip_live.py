"""Direct SIP against a real softphone: Debian's baresip dials a real `hotline serve` (SIP over
UDP, RTP with G.711), speaks a WAV file, records what it hears, presses keys, puts the call on
hold and hangs up; raw UDP probes send what no softphone would. The server's call records and
log say what happened on its side."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from pipeline.transport import SAMPLE_RATE
from tests.support.baresip import Baresip, baresip_installed
from tests.support.poll import PollTimeout, until
from tests.support.recordings import channels
from tests.support.server import Server, logged
from tests.support.sip_server import GREETING, NUMBER, PBX_PASSWORD, SipServer
from tests.support.speech import concat, heard, piper, silence, words
from voice.audio import read_wav

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not baresip_installed(), reason="baresip missing (make test installs it)"),
]


async def detail(server: Server, call_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as client:
        found: dict[str, Any] = (await client.get(f"{server.url}/calls/{call_id}")).json()
        return found


async def call_where(
    server: Server, call_id: str, check: Callable[[dict[str, Any]], object], within_s: float = 30.0
) -> dict[str, Any]:
    """The call's detail once `check(detail)` holds; fails with the last detail seen."""
    last: dict[str, Any] = {}

    async def look() -> bool:
        nonlocal last
        last = await detail(server, call_id)
        return bool(check(last))

    checked: Callable[[], bool | Awaitable[bool]] = look  # (mypy infers no T from a coroutine)
    try:
        await until(checked, f"call {call_id}", within_s, every_s=0.2)
    except PollTimeout as timeout:
        raise AssertionError(f"{timeout}; its last detail: {last}") from None
    return last


async def dial(server: Server, port: int, caller: Baresip) -> str:
    """Dial the server from `caller`; the server's id of the call, once it is up."""
    caller.start()
    await caller.command("dial", f"sip:{NUMBER}@127.0.0.1:{port}")
    await caller.wait_logged("Call established")
    async with httpx.AsyncClient() as client:
        listed = (await client.get(f"{server.url}/calls")).json()["calls"]
    newest = max((c for c in listed if c["transport"] == "sip"), key=lambda c: c["started_at"])
    return str(newest["call_id"])


async def test_a_call_hears_the_greeting_gets_an_answer_and_ends_with_the_callers_bye(
    sip_server: SipServer, tmp_path: Path
) -> None:
    server, port = sip_server.server, sip_server.port
    # baresip hangs up when its audio file ends: long enough for the test to hang up first
    speech = concat(silence(4000), piper("I would like to book a table for two."), silence(30_000))
    caller = Baresip(tmp_path / "baresip", speech)
    try:
        call_id = await dial(server, port, caller)
        call = await call_where(server, call_id, lambda d: d.get("records"))
        assert call["transport"] == "sip"
        assert (call["caller"], call["callee"]) == ("caller", NUMBER)
        greeted = {"role": "assistant", "content": GREETING, "source": "announcement"}
        assert call["history"][0] == greeted
        [turn] = call["records"]
        assert "table" in turn["caller_text"].lower()
        assert "table" in turn["reply_text"].lower()  # the simulator says what it heard
        mark = server.log_mark()
        await caller.command("hangup")
        await caller.wait_logged("terminated (duration")
        await logged(server, f"call {call_id}: hang-up (caller hung up (BYE))", since=mark)
        ended = await call_where(server, call_id, lambda d: d["state"] == "ended")
        assert ended["end_reason"] == "caller hung up (BYE)"
    finally:
        caller.stop()
    # what the softphone heard: the greeting, then the reply (8 kHz G.711)
    heard_path = caller.heard()
    assert heard_path is not None
    received = read_wav(heard_path, rate=SAMPLE_RATE)
    assert {"garden", "calling", "thank"} & words(heard(received[: 4 * SAMPLE_RATE]))
    assert {"table", "book"} & words(heard(received[4 * SAMPLE_RATE :]))
    # recorded like every call: the caller on the left, what the softphone heard on the right
    recorded = await call_where(server, call_id, lambda d: d.get("recording"))
    async with httpx.AsyncClient() as client:
        ogg = (await client.get(server.url + recorded["recording"]["url"])).content
    left, right = channels(ogg)
    assert {"table", "book"} & words(heard(left))
    assert {"garden", "calling", "thank"} & words(heard(right))


async def test_keys_reach_the_call_and_a_hang_up_from_the_server_sends_bye(
    sip_server: SipServer, tmp_path: Path
) -> None:
    server, port = sip_server.server, sip_server.port
    caller = Baresip(tmp_path / "baresip", silence(20_000))
    try:
        call_id = await dial(server, port, caller)
        mark = server.log_mark()
        await caller.command("sndcode", "7")
        await logged(server, f"call {call_id}: DTMF 7", since=mark)
        mark = server.log_mark()
        await caller.command("hold")
        await logged(server, f"sip: call {call_id} on hold", since=mark)
        mark = server.log_mark()
        await caller.command("resume")
        await logged(server, f"sip: call {call_id} resumed", since=mark)
        mark = server.log_mark()
        async with httpx.AsyncClient() as client:
            hung_up = await client.post(f"{server.url}/calls/{call_id}/hangup")
        assert hung_up.status_code == 200
        await caller.wait_logged("session closed")  # baresip got our BYE
        await logged(server, f"sip: call {call_id}: BYE answered 200", since=mark)
    finally:
        caller.stop()


async def test_a_transfer_refers_the_caller_to_a_person(
    sip_server: SipServer, tmp_path: Path
) -> None:
    """The console's (or the agent's) transfer on a SIP call: a REFER to the caller's side,
    which calls the person (a second baresip that answers at once) and says how it went."""
    server, port = sip_server.server, sip_server.port
    caller = Baresip(tmp_path / "caller", silence(30_000))
    desk = Baresip(tmp_path / "desk", silence(30_000), user="desk", answer=True)
    try:
        desk.start()
        call_id = await dial(server, port, caller)
        target = f"sip:desk@127.0.0.1:{desk.sip_port}"
        mark = server.log_mark()
        async with httpx.AsyncClient() as client:
            asked = await client.post(
                f"{server.url}/calls/{call_id}/transfer", json={"target": target}
            )
        assert asked.status_code == 200, asked.text
        await desk.wait_logged("Call established", within_s=30)  # the caller reached the desk
        ended = await call_where(server, call_id, lambda d: d["state"] == "ended", within_s=40)
    finally:
        caller.stop()
        desk.stop()
    assert ended["transfer"]["to"] == target
    assert ended["transfer"]["outcome"] == "SIP/2.0 200 OK"
    # then the bot leaves: its own BYE ends the call (the caller's side waits for it)
    assert ended["end_reason"] == f"transferred to {target}"
    await logged(
        server,
        f"sip: call {call_id}: REFER to {target}: SIP/2.0 200 OK",
        f"sip: call {call_id}: BYE answered 200",
        since=mark,
    )


WIRE_FRAME = 160  # 20 ms of G.711 at 8 kHz, as baresip's dump holds it
# How far the caller's count of reply audio may stand from the position the history was cut at:
# the count misses the end of a cut that fell in a pause (up to piper's ~0.25 s between
# pieces) and piper's lengths vary by a few per cent from one synthesis to the next. The cut
# falls about 2 s into the reply's first sentence (3.4 s: "You said: Hello, ..."), so a history
# cut at the sentence's end or the one after, or before it began, is over a second away.
HEARD_TOLERANCE_S = 0.45


def reply_frames_heard(dump: Path, after_s: float, before_s: float) -> int:
    """How many 20 ms frames of reply audio the caller received between `after_s` and
    `before_s` of its recording: frames with anything but the line's idle value in them (the
    server sends digital silence whenever no reply is playing: one μ-law code, which baresip
    decodes to one constant sample value, the commonest in the recording)."""
    audio = read_wav(dump, rate=8000)
    idle = int(np.bincount(audio.astype(np.int64) + 32768).argmax()) - 32768
    part = audio[int(after_s * 8000) : int(before_s * 8000)]
    assert len(part) >= (before_s - after_s) * 8000 - WIRE_FRAME, "the recording ends early"
    frames = part[: len(part) // WIRE_FRAME * WIRE_FRAME].reshape(-1, WIRE_FRAME)
    return int(np.count_nonzero((frames != idle).any(axis=1)))


def claimed_span_s(generated: str, history: str) -> tuple[float, float]:
    """Where, in seconds of reply audio, the playback must have stopped for the history to be
    `history`: the sentences before the cut in full, and of the sentence cut into the share
    of its audio that the share of its words kept stands for (one more word is not kept).
    Sentence lengths are piper's own for each sentence, synthesized here."""
    said = history.removesuffix("—").split()
    spoken = generated.split()
    assert spoken[: len(said)] == said, f"the history {history!r} is not what was said first"
    done_s = 0.0
    for sentence in re.split(r"(?<=[.!?])\s+", generated.strip()):
        words_in = len(sentence.split())
        length_s = len(piper(sentence)) / SAMPLE_RATE
        if len(said) < words_in:
            return (
                done_s + length_s * len(said) / words_in,
                done_s + length_s * (len(said) + 1) / words_in,
            )
        said = said[words_in:]
        done_s += length_s
    return done_s, float("inf")  # all of it


async def test_barge_in_stops_the_reply_and_the_history_holds_what_the_caller_heard(
    sip_server: SipServer, tmp_path: Path
) -> None:
    """The history of an interrupted reply is what the softphone received: the reply audio
    in baresip's recording, counted in 20 ms frames, stands where the history says the reply
    was cut (a history cut a sentence late or early is a second or more away)."""
    server, port = sip_server.server, sip_server.port
    first = piper("Hello, I have a question about my delivery.")
    again = piper("Sorry, wait, I have something else.")
    # the second sentence starts 5 s after the first ends: while the reply is playing (it
    # began 0.6 s after the first on an idle machine, 3.4 s on a loaded one, and plays for 8 s);
    # the caller hangs up 8 s after it (baresip ends the call when its audio file ends)
    gap_ms = 5000
    speech = concat(silence(4000), first, silence(gap_ms), again, silence(8000))
    caller = Baresip(tmp_path / "baresip", speech)
    try:
        mark = server.log_mark()
        call_id = await dial(server, port, caller)
        call = await call_where(server, call_id, lambda d: d["state"] == "ended")
        await logged(server, f"call {call_id}: hang-up (caller hung up (BYE))", since=mark)
    finally:
        caller.stop()
    assert len(call["records"]) == 2, call["records"]
    cut = call["records"][0]
    assert cut["interrupted"] is True
    assert len(cut["reply_text"]) < len(cut["generated_text"])
    heard = {"role": "assistant", "content": cut["reply_text"], "source": "bot"}
    assert call["history"][2] == heard
    assert "something" in call["records"][1]["caller_text"].lower()
    # The caller's side: the first reply plays after the first sentence and is cut while the
    # second is spoken; the second reply cannot start before the second sentence has ended.
    dump = caller.heard()
    assert dump is not None
    first_end_s = (4000 + len(first) * 1000 // SAMPLE_RATE) / 1000
    again_end_s = first_end_s + gap_ms / 1000 + len(again) / SAMPLE_RATE
    heard_s = reply_frames_heard(dump, first_end_s, again_end_s - 0.3) * WIRE_FRAME / 8000
    low_s, high_s = claimed_span_s(cut["generated_text"], cut["reply_text"])
    print(f"\nthe caller heard {heard_s:.2f} s of the reply; the history {cut['reply_text']!r}")
    print(f"says {low_s:.2f}-{high_s:.2f} s of {cut['generated_text']!r}")
    assert low_s - HEARD_TOLERANCE_S <= heard_s <= high_s + HEARD_TOLERANCE_S, (
        f"the caller heard {heard_s:.2f} s of the reply, but its history "
        f"{cut['reply_text']!r} stands for {low_s:.2f}-{high_s:.2f} s "
        f"of {cut['generated_text']!r}"
    )


async def test_an_unlisted_source_is_refused(sip_server: SipServer, tmp_path: Path) -> None:
    server, port = sip_server.server, sip_server.port
    stranger = Baresip(tmp_path / "baresip", silence(1000), local_ip="127.0.0.2")
    try:
        stranger.start()
        mark = server.log_mark()
        await stranger.command("dial", f"sip:{NUMBER}@127.0.0.1:{port}")
        await stranger.wait_logged("403 Forbidden")
        await logged(
            server, "sip: INVITE from 127.0.0.2 refused: not an allowed source", since=mark
        )
    finally:
        stranger.stop()


def udp_exchange(port: int, message: bytes, source: str = "127.0.0.1") -> bytes | None:
    """Send one datagram to the server's SIP port; its answer (None within 2 s)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((source, 0))
        sock.settimeout(2.0)
        sock.sendto(message, ("127.0.0.1", port))
        try:
            return sock.recv(65535)
        except TimeoutError:
            return None


def unanswered_then_ping(port: int, garbage: bytes, branch: str) -> bytes:
    """Send `garbage`, then an OPTIONS, from one socket: the first datagram that comes back.
    It is the OPTIONS' answer when the garbage got none (the server reads a socket's datagrams
    in order, and drops a malformed one as it parses it), with no 2 s wait for nothing."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(5.0)
        sock.sendto(garbage, ("127.0.0.1", port))
        sock.sendto(options(port, branch), ("127.0.0.1", port))
        return sock.recv(65535)


def until_final(port: int, message: bytes) -> list[str]:
    """Send a request; every response up to its final one (status 200 or more), in full."""
    seen: list[str] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(5.0)
        sock.sendto(message, ("127.0.0.1", port))
        deadline = time.monotonic() + 10
        while not seen or int(seen[-1].split(" ", 2)[1]) < 200:
            try:
                seen.append(sock.recv(65535).decode())
            except TimeoutError:
                raise AssertionError(f"no final response; the responses: {seen}") from None
            assert time.monotonic() < deadline, f"no final response; the responses: {seen}"
        return seen


def status_line(response: str) -> str:
    return response.split("\r\n", 1)[0]


def header(response: str, name: str) -> str | None:
    for line in response.split("\r\n\r\n", 1)[0].split("\r\n")[1:]:
        key, _, value = line.partition(":")
        if key.strip().lower() == name.lower():
            return value.strip()
    return None


def options(port: int, branch: str) -> bytes:
    return (
        f"OPTIONS sip:hotline@127.0.0.1:{port} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 127.0.0.1:5999;branch=z9hG4bK{branch};rport\r\n"
        "Max-Forwards: 70\r\nFrom: <sip:pbx@127.0.0.1>;tag=a1\r\n"
        f"To: <sip:hotline@127.0.0.1>\r\nCall-ID: {branch}@pbx\r\nCSeq: 1 OPTIONS\r\n"
        "Content-Length: 0\r\n\r\n"
    ).encode()


async def test_options_keepalives_and_malformed_messages(sip_server: SipServer) -> None:
    server, port = sip_server.server, sip_server.port
    answer = await asyncio.to_thread(udp_exchange, port, options(port, "ping1"))
    assert answer is not None and answer.startswith(b"SIP/2.0 200 OK")
    assert b"Allow: INVITE, ACK, BYE, CANCEL, OPTIONS" in answer
    garbage = [b"\x00\xff" * 40, b"INVITE sip:x SIP/2.0\r\n\r\n", b"SIP/2.0 999\r\n", b"A" * 9000]
    for n, message in enumerate(garbage):
        mark = server.log_mark()
        first = await asyncio.to_thread(unanswered_then_ping, port, message, f"after{n}")
        assert first.startswith(b"SIP/2.0 200 OK"), first[:200]  # nothing for the garbage
        assert f"Call-ID: after{n}@pbx".encode() in first
        # logged for the first 5 in a process (then every 100th): no other test sends garbage
        await logged(server, "sip: malformed message #", since=mark)
    # an INVITE whose SDP offers nothing we speak: 488, and the endpoint still answers
    invite = (
        f"INVITE sip:{NUMBER}@127.0.0.1:{port} SIP/2.0\r\n"
        "Via: SIP/2.0/UDP 127.0.0.1:5999;branch=z9hG4bKinv1;rport\r\nMax-Forwards: 70\r\n"
        "From: <sip:pbx@127.0.0.1>;tag=b2\r\nTo: <sip:hotline@127.0.0.1>\r\n"
        "Call-ID: inv1@pbx\r\nCSeq: 1 INVITE\r\nContact: <sip:pbx@127.0.0.1:5999>\r\n"
        "Content-Type: application/sdp\r\n\r\n"
        "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
        "m=audio 4000 RTP/AVP 9\r\na=rtpmap:9 G722/8000\r\n"
    ).encode()
    mark = server.log_mark()
    responses = await asyncio.to_thread(until_final, port, invite)
    assert [status_line(r) for r in responses] == [
        "SIP/2.0 100 Trying",
        "SIP/2.0 488 Not Acceptable Here",
    ]
    warning = header(responses[-1], "Warning")
    assert warning is not None and warning.startswith('399 hotline "no common codec'), warning
    await logged(server, "sip: INVITE from 127.0.0.1 refused: no common codec", since=mark)
    # an SDP that does not parse: 400 Bad Request (not 400 "Not Acceptable Here")
    broken = invite.replace(b"inv1", b"inv2").replace(b"m=audio 4000 RTP/AVP 9", b"m=audio x")
    responses = await asyncio.to_thread(until_final, port, broken)
    assert [status_line(r) for r in responses] == ["SIP/2.0 100 Trying", "SIP/2.0 400 Bad Request"]
    again = await asyncio.to_thread(udp_exchange, port, options(port, "ping2"))
    assert again is not None and again.startswith(b"SIP/2.0 200 OK")


def invite(port: int, call: str, media: str = "m=audio 4000 RTP/AVP 0\r\n") -> bytes:
    return (
        f"INVITE sip:{NUMBER}@127.0.0.1:{port} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 127.0.0.1:5999;branch=z9hG4bK{call};rport\r\nMax-Forwards: 70\r\n"
        f"From: <sip:pbx@127.0.0.1>;tag=b2\r\nTo: <sip:{NUMBER}@127.0.0.1>\r\n"
        f"Call-ID: {call}@pbx\r\nCSeq: 1 INVITE\r\nContact: <sip:pbx@127.0.0.1:5999>\r\n"
        "Content-Type: application/sdp\r\n\r\n"
        "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n" + media
    ).encode()


def cancel(port: int, call: str) -> bytes:
    return (
        f"CANCEL sip:{NUMBER}@127.0.0.1:{port} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 127.0.0.1:5999;branch=z9hG4bK{call};rport\r\nMax-Forwards: 70\r\n"
        f"From: <sip:pbx@127.0.0.1>;tag=b2\r\nTo: <sip:{NUMBER}@127.0.0.1>\r\n"
        f"Call-ID: {call}@pbx\r\nCSeq: 1 CANCEL\r\nContent-Length: 0\r\n\r\n"
    ).encode()


def statuses(sock: socket.socket, until: int) -> list[str]:
    """The status lines the socket receives, up to the first with code `until`."""
    seen: list[str] = []
    while not any(line.startswith(f"SIP/2.0 {until}") for line in seen):
        try:
            seen.append(sock.recv(65535).split(b"\r\n", 1)[0].decode())
        except TimeoutError:
            raise AssertionError(f"no {until} within the socket's timeout; got {seen}") from None
    return seen


def cancel_before_answer(port: int) -> tuple[list[str], list[str]]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(5.0)
        sock.sendto(invite(port, "cancel1"), ("127.0.0.1", port))
        ringing = statuses(sock, 180)
        sock.sendto(cancel(port, "cancel1"), ("127.0.0.1", port))
        return ringing, statuses(sock, 487)


async def test_cancel_before_the_answer(sip_server: SipServer) -> None:
    server, port = sip_server.server, sip_server.port
    mark = server.log_mark()
    ringing, after = await asyncio.to_thread(cancel_before_answer, port)
    assert ringing == ["SIP/2.0 100 Trying", "SIP/2.0 180 Ringing"]
    assert "SIP/2.0 200 OK" in after  # the CANCEL's answer
    assert after[-1] == "SIP/2.0 487 Request Terminated"  # the INVITE's
    await logged(server, "cancelled before the answer", since=mark)


async def test_a_pbx_elsewhere_gets_in_with_its_password(
    digest_sip_server: SipServer, tmp_path: Path
) -> None:
    server, port = digest_sip_server.server, digest_sip_server.port
    pbx = Baresip(tmp_path / "pbx", silence(5000), local_ip="127.0.0.2", auth=("pbx", PBX_PASSWORD))
    try:
        await dial(server, port, pbx)  # challenged (401), answered, let in
    finally:
        pbx.stop()
    wrong = Baresip(tmp_path / "wrong", silence(5000), local_ip="127.0.0.2", auth=("pbx", "guess"))
    try:
        wrong.start()
        mark = server.log_mark()
        await wrong.command("dial", f"sip:{NUMBER}@127.0.0.1:{port}")
        await wrong.wait_logged("403 Forbidden")
        await logged(server, "sip: INVITE from 127.0.0.2 refused: wrong credentials", since=mark)
    finally:
        wrong.stop()


async def test_a_call_over_tcp(sip_server: SipServer, tmp_path: Path) -> None:
    server, port = sip_server.server, sip_server.port
    speech = concat(silence(4000), piper("Do you sell roses?"), silence(30_000))  # we hang up
    caller = Baresip(tmp_path / "baresip", speech)
    try:
        caller.start()
        mark = server.log_mark()
        await caller.command("dial", f"sip:{NUMBER}@127.0.0.1:{port};transport=tcp")
        await caller.wait_logged("Call established")
        async with httpx.AsyncClient() as client:
            listed = (await client.get(f"{server.url}/calls")).json()["calls"]
        call_id = max(listed, key=lambda c: c["started_at"])["call_id"]
        call = await call_where(server, call_id, lambda d: d.get("records"))
        assert "roses" in call["records"][0]["caller_text"].lower()
        await logged(server, f"sip: call {call_id} from 127.0.0.1 over TCP", since=mark)
        mark = server.log_mark()
        await caller.command("hangup")
        await logged(server, f"call {call_id}: hang-up (caller hung up (BYE))", since=mark)
    finally:
        caller.stop()


async def test_eight_simultaneous_calls_are_all_answered(
    sip_server: SipServer, tmp_path: Path
) -> None:
    server, port = sip_server.server, sip_server.port
    phones = [Baresip(tmp_path / f"phone{n}", silence(20_000), user=f"phone{n}") for n in range(8)]
    try:
        for phone in phones:
            phone.start()
        for phone in phones:
            await phone.command("dial", f"sip:{NUMBER}@127.0.0.1:{port}")
        await asyncio.gather(*(phone.wait_logged("Call established") for phone in phones))
        async with httpx.AsyncClient() as client:
            listed = (await client.get(f"{server.url}/calls")).json()["calls"]
        ours = {c["caller"]: c["call_id"] for c in listed if c["transport"] == "sip"}
        assert {f"phone{n}" for n in range(8)} <= set(ours)
        mark = server.log_mark()
        for phone in phones:
            await phone.command("hangup")
        hang_ups = [f"call {ours[f'phone{n}']}: hang-up (caller hung up (BYE))" for n in range(8)]
        await logged(server, *hang_ups, since=mark)
    finally:
        for phone in phones:
            phone.stop()


def timed_invite(port: int, call: str, expires: int) -> bytes:
    """An INVITE asking for a session timer of `expires` seconds (RFC 4028)."""
    message = invite(port, call).decode()
    head, body = message.split("\r\n\r\n", 1)
    head += f"\r\nSupported: timer\r\nSession-Expires: {expires}"
    return f"{head}\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode()


def in_dialog(method: str, port: int, call: str, to_tag: str, cseq: int) -> bytes:
    return (
        f"{method} sip:hotline@127.0.0.1:{port} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 127.0.0.1:5999;branch=z9hG4bK{call}{method}{cseq};rport\r\n"
        f"Max-Forwards: 70\r\nFrom: <sip:pbx@127.0.0.1>;tag=b2\r\n"
        f"To: <sip:{NUMBER}@127.0.0.1>;tag={to_tag}\r\nCall-ID: {call}@pbx\r\n"
        f"CSeq: {cseq} {method}\r\nContent-Length: 0\r\n\r\n"
    ).encode()


def session_timer_call(port: int) -> tuple[str, str, str]:
    """A call asking for a 2 s session timer: refreshed once by UPDATE, then left to expire.
    The 200 OK, the UPDATE's answer, and the request the server sends when it expires."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(10.0)
        sock.sendto(timed_invite(port, "timer1", 2), ("127.0.0.1", port))
        while not (ok := sock.recv(65535).decode()).startswith("SIP/2.0 200"):
            pass
        to_tag = ok.split("\r\nTo: ", 1)[1].split("\r\n", 1)[0].split("tag=")[1]
        sock.sendto(in_dialog("ACK", port, "timer1", to_tag, 1), ("127.0.0.1", port))
        sock.sendto(in_dialog("UPDATE", port, "timer1", to_tag, 2), ("127.0.0.1", port))
        while not (refreshed := sock.recv(65535).decode()).startswith("SIP/2.0 200"):
            pass
        while not (expiry := sock.recv(65535).decode()).startswith("BYE"):
            pass  # RTP and retransmissions may come first
        return ok, refreshed, expiry


async def test_session_timers(sip_server: SipServer, digest_sip_server: SipServer) -> None:
    server, port = digest_sip_server.server, digest_sip_server.port  # accepts intervals from 1 s
    mark = server.log_mark()
    ok, refreshed, expiry = await asyncio.to_thread(session_timer_call, port)
    assert "Session-Expires: 2;refresher=uac" in ok and "Require: timer" in ok
    assert "Session-Expires: 2;refresher=uac" in refreshed
    assert expiry.startswith("BYE ")
    await logged(server, "session expired (no refresh)", since=mark)
    # under the server's minimum (90 s): 422 and the minimum
    small_port = sip_server.port
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(5.0)
        sock.sendto(timed_invite(small_port, "timer2", 30), ("127.0.0.1", small_port))
        statuses = [sock.recv(65535).decode() for _ in range(2)]
    assert statuses[1].startswith("SIP/2.0 422 Session Interval Too Small")
    assert "Min-SE: 90" in statuses[1]
