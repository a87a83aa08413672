"""The scripted SIP caller against a real `hotline serve` with SIP on: one call timed at the
caller and found in the server's records, and `hotline bench --transport sip`."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from tests.support.poll import until
from tests.support.server import Server, free_port, logged, start_server
from tests.support.sip_server import NUMBER, stopped_cleanly
from tests.support.speech import concat, resample, silence, utterance
from voice.cli.main import app
from voice.devtools.bench import sip_call_id
from voice.devtools.sip_caller import CallerRtp, open_caller_rtp, place_sip_call
from voice.devtools.sip_leg import SipLeg, offer_sdp
from voice.transports.sip.sdp import parse_sdp

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sip_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SipWorker]:
    """A worker with SIP over UDP, TCP and TLS, its certificate made for 127.0.0.1 by openssl."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    port, tls_port = free_port(), free_port()
    server = start_server(
        {
            "HOTLINE_SIP__ENABLED": "true",
            "HOTLINE_SIP__PORT": str(port),
            "HOTLINE_SIP__TLS_PORT": str(tls_port),
            "HOTLINE_SIP__TLS_CERT_FILE": str(cert),
            "HOTLINE_SIP__TLS_KEY_FILE": str(key),
        }
    )
    yield SipWorker(server, port, tls_port, cert)
    stopped_cleanly(server)


@dataclass
class SipWorker:
    server: Server
    port: int
    tls_port: int
    cert: Path


@pytest.mark.parametrize("transport", ["udp", "tcp"])
async def test_a_sip_call_is_answered_timed_and_recorded(
    sip_server: SipWorker, transport: Literal["udp", "tcp"]
) -> None:
    server, port = sip_server.server, sip_server.port
    speech = utterance("I would like to book a table")  # (then silence, as the phone sends)
    mark = server.log_mark()
    result = await place_sip_call("127.0.0.1", port, [speech], dtmf="5#", transport=transport)

    assert result.rejected is None and result.status == 200, server.log[-40:]
    assert result.codec == "PCMU" and 100 in result.provisional
    assert result.bye_status == 200 and not result.server_hung_up
    assert result.packets_sent > 0 and result.packets_received > 0
    assert len(result.turns) == 1
    v2v = result.turns[0].voice_to_voice_ms
    assert v2v is not None and v2v > 0
    async with httpx.AsyncClient(base_url=server.url) as http:
        call_id = await sip_call_id(http, result.caller)  # the server's id, by the From user
        assert call_id is not None
        detail: dict[str, Any] = (await http.get(f"/calls/{call_id}")).json()
    assert detail["transport"] == "sip" and detail["caller"] == result.caller
    assert detail["callee"] == "+15551230000"
    assert "table" in detail["records"][0]["caller_text"].lower()
    await logged(server, f"call {call_id}: DTMF 5", f"call {call_id}: DTMF #", since=mark)


def test_bench_over_sip_reports_voice_to_voice(sip_server: SipWorker, tmp_path: Path) -> None:
    server, port = sip_server.server, sip_server.port
    out = tmp_path / "bench.json"
    command = ["bench", "--transport", "sip", "--url", server.url, "--sip-port", str(port)]

    ran = CliRunner().invoke(app, [*command, "--calls", "2", "--turns", "2", "--out", str(out)])

    assert ran.exit_code == 0, ran.output + "\n".join(server.log[-40:])
    report = json.loads(out.read_text())
    assert report["transport"] == "sip" and report["failures"] == 0
    assert report["voice_to_voice_ms"]["count"] == 4
    assert report["voice_to_voice_ms"]["p50"] > 0 and report["voice_to_voice_ms"]["p95"] > 0
    assert {"stt", "first_audio"} <= set(report["parts_ms"])  # the server's records, matched
    assert report["cpu_s_per_call_minute"] > 0
    assert len({call["call_id"] for call in report["samples"]}) == 2


async def test_a_refused_refer_is_told_to_the_caller_and_the_call_goes_on(
    sip_server: SipWorker,
) -> None:
    """The scripted caller answers REFER with 501 (it cannot transfer): the bot says it could
    not put the caller through, and the call goes on with the bot."""
    server, port = sip_server.server, sip_server.port
    speech = concat(utterance("Can I speak to someone?"), silence(8800))
    caller = "refer-refuser"
    mark = server.log_mark()
    phone = asyncio.create_task(
        place_sip_call("127.0.0.1", port, [speech], caller=caller, quiet_s=8.0)
    )
    async with httpx.AsyncClient(base_url=server.url) as http:
        call_id = await sip_call_id(http, caller)
        assert call_id is not None
        await logged(server, f"call {call_id} turn 1", since=mark, within_s=30)  # heard out
        mark = server.log_mark()
        asked = await http.post(f"/calls/{call_id}/transfer", json={"target": "+15557654321"})
        assert asked.status_code == 200, asked.text
        [line] = await logged(server, f"call {call_id}: transfer failed", since=mark, within_s=20)
        assert "501" in line
        result = await phone
        detail: dict[str, Any] = (await http.get(f"/calls/{call_id}")).json()
    assert result.rejected is None and not result.server_hung_up  # the call went on
    assert detail["transfer"] is None
    said = [m["content"] for m in detail["history"] if m["role"] == "assistant"]
    assert "Sorry, I couldn't put you through right now." in said


MEDIA_TIMEOUT_S = 2


@pytest.fixture(scope="module")
def one_line_server() -> Iterator[tuple[Server, int]]:
    """A worker that takes one call at a time, and hangs up a call whose RTP stops for
    `MEDIA_TIMEOUT_S` (the scripted caller's RTP never stops: silence between its words)."""
    port = free_port()
    server = start_server(
        {
            "HOTLINE_SIP__ENABLED": "true",
            "HOTLINE_SIP__PORT": str(port),
            "HOTLINE_MAX_CALLS": "1",
            "HOTLINE_SIP__MEDIA_TIMEOUT_S": str(MEDIA_TIMEOUT_S),
        }
    )
    yield server, port
    stopped_cleanly(server)


async def test_a_full_worker_answers_busy_never_silence(
    one_line_server: tuple[Server, int],
) -> None:
    server, port = one_line_server
    first = asyncio.create_task(
        place_sip_call(
            "127.0.0.1", port, [silence(6000)], caller="first", quiet_s=0.5, reply_timeout_s=2.0
        )
    )
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert await sip_call_id(http, "first") is not None  # the line is taken
    mark = server.log_mark()
    second = await place_sip_call("127.0.0.1", port, [silence(500)], caller="second")
    assert second.rejected == "486 Busy Here" and second.status == 486
    await logged(server, "sip: INVITE from 127.0.0.1 refused: capacity", since=mark)
    assert (await first).rejected is None


async def test_a_call_over_tls(sip_server: SipWorker) -> None:
    server, port, cert = sip_server.server, sip_server.tls_port, sip_server.cert
    trusted = ssl.create_default_context(cafile=str(cert))  # checks the server's certificate
    mark = server.log_mark()
    speech = utterance("I would like to book a table")  # (then silence, as the phone sends)
    result = await place_sip_call(
        "127.0.0.1", port, [speech], caller="over-tls", transport="tls", tls=trusted
    )
    assert result.rejected is None and result.status == 200 and result.bye_status == 200
    async with httpx.AsyncClient(base_url=server.url) as http:
        call_id = await sip_call_id(http, "over-tls")
    await logged(server, f"sip: call {call_id} from 127.0.0.1 over TLS", since=mark)
    # plain TCP to the TLS port: the handshake fails, the connection is closed; the endpoint goes on
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"OPTIONS sip:x SIP/2.0\r\n\r\n")
    await writer.drain()
    assert await reader.read() == b""  # closed
    writer.close()
    again = await place_sip_call(
        "127.0.0.1", port, [silence(500)], transport="tls", tls=trusted, reply_timeout_s=1.0
    )
    assert again.status == 200
    untrusting = await place_sip_call(
        "127.0.0.1", port, [silence(500)], transport="tls", reply_timeout_s=1.0
    )
    assert untrusting.rejected is not None and "CERTIFICATE_VERIFY_FAILED" in untrusting.rejected


class QuietCaller:
    """A caller with a raw SIP leg and its own RTP: it says `speech`, then sends digital
    silence (a muted phone: μ-law zeros, 20 ms apart on the absolute clock) until told to stop
    sending anything. It notes when it last sent a packet and last heard the bot."""

    def __init__(self, speech: np.ndarray) -> None:
        wire = resample(speech, 16_000, 8000)
        wire = np.concatenate([wire, np.zeros(-len(wire) % 160, dtype=np.int16)])
        self.frames = np.split(wire, len(wire) // 160)
        self.rtp: CallerRtp | None = None
        self.last_sent = self.last_heard = 0.0

    def heard(self, pcm: np.ndarray, at: float) -> None:
        if pcm.any():  # the bot's line between replies is digital silence too
            self.last_heard = at

    def quiet_for(self, seconds: float) -> bool:
        """Whether the bot spoke, then was quiet for `seconds` (the caller sending silence)."""
        return self.last_heard > 0 and time.monotonic() - self.last_heard > seconds

    async def send(self) -> None:
        assert self.rtp is not None
        start = time.monotonic()
        for tick in range(10_000):  # bounded: 200 s
            frame = self.frames[tick] if tick < len(self.frames) else np.zeros(160, np.int16)
            self.rtp.send_frame(frame, marker=tick == 0)
            self.last_sent = time.monotonic()
            await asyncio.sleep(max(0.0, start + (tick + 1) * 0.02 - time.monotonic()))


async def test_a_call_whose_rtp_stops_is_hung_up_at_the_media_timeout(
    one_line_server: tuple[Server, int],
) -> None:
    """README, "Direct SIP" and "Idle lines": a call whose RTP stops for
    `HOTLINE_SIP__MEDIA_TIMEOUT_S` is hung up, and a received frame of digital silence counts.
    One call: a turn, then digital silence for twice the timeout after the reply (the call
    stays up: the timer does not fire on time alone), then no RTP at all: the server's BYE, no
    sooner than the timeout after the last packet, and the record keeps the turn and says why."""
    server, port = one_line_server
    caller = QuietCaller(utterance("Do you sell roses?"))
    rtp = caller.rtp = await open_caller_rtp("127.0.0.1", caller.heard)
    leg = SipLeg("udp", ("127.0.0.1", port), f"sip:{NUMBER}@127.0.0.1:{port}")
    sending: asyncio.Task[None] | None = None
    try:
        await leg.open("127.0.0.1", "goes-quiet")
        answer = await leg.invite(offer_sdp("127.0.0.1", rtp.local_port, ["PCMU"]), [])
        assert answer is not None and answer.status == 200, answer
        media = parse_sdp(answer.body)
        rtp.remote = (media.address, media.port)
        sending = asyncio.create_task(caller.send())
        async with httpx.AsyncClient(base_url=server.url) as http:
            call_id = await sip_call_id(http, "goes-quiet")
            assert call_id is not None

            async def ended() -> dict[str, Any]:
                """The call's record once it ended ({} before)."""
                found: dict[str, Any] = (await http.get(f"/calls/{call_id}")).json()
                return found if found["state"] == "ended" else {}

            # the reply is heard; then two timeouts of the caller's digital silence go by
            await until(
                lambda: caller.quiet_for(2 * MEDIA_TIMEOUT_S),
                "the reply, then two media timeouts of the caller's silence",
                within_s=40,
            )
            assert not leg.hung_up.is_set(), "hung up while the caller's RTP flowed"
            assert not await ended(), "the call ended while the caller's RTP flowed"
            mark = server.log_mark()
            sending.cancel()  # the RTP stops
            await until(leg.hung_up.is_set, "the server's BYE", within_s=MEDIA_TIMEOUT_S + 15)
            quiet_s = time.monotonic() - caller.last_sent
            assert quiet_s >= MEDIA_TIMEOUT_S, f"BYE {quiet_s:.2f} s after the last packet"
            await logged(
                server, f"call {call_id}: no audio in its RTP for {MEDIA_TIMEOUT_S} s", since=mark
            )
            checked: Callable[[], dict[str, Any] | Awaitable[dict[str, Any]]] = ended  # (for mypy)
            record = await until(checked, f"call {call_id} to end")
        assert record["end_reason"] == f"no audio for {MEDIA_TIMEOUT_S} s"
        [turn] = record["records"]  # the turn before is kept
        assert "roses" in turn["caller_text"].lower()
        roles = [m["role"] for m in record["history"]]
        assert roles == ["user", "assistant"], record["history"]
    finally:
        if sending is not None:
            sending.cancel()
        rtp.close()
        leg.close()
