"""The scripted SIP caller against a real `hotline serve` with SIP on: one call timed at the
caller and found in the server's records, and `hotline bench --transport sip`."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from typer.testing import CliRunner

from tests.support.server import Server, free_port, logged, start_server, stop_server
from tests.support.speech import concat, piper, silence
from voice.cli.main import app
from voice.devtools.bench import sip_call_id
from voice.devtools.sip_caller import place_sip_call

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sip_server() -> Iterator[tuple[Server, int]]:
    port = free_port()
    server = start_server({"HOTLINE_SIP__ENABLED": "true", "HOTLINE_SIP__PORT": str(port)})
    yield server, port
    assert stop_server(server) == 0, "\n".join(server.log[-40:])


@pytest.mark.parametrize("transport", ["udp", "tcp"])
async def test_a_sip_call_is_answered_timed_and_recorded(
    sip_server: tuple[Server, int], transport: Literal["udp", "tcp"]
) -> None:
    server, port = sip_server
    speech = concat(silence(300), piper("I would like to book a table"), silence(300))
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


def test_bench_over_sip_reports_voice_to_voice(
    sip_server: tuple[Server, int], tmp_path: Path
) -> None:
    server, port = sip_server
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
    sip_server: tuple[Server, int],
) -> None:
    """The scripted caller answers REFER with 501 (it cannot transfer): the bot says it could
    not put the caller through, and the call goes on with the bot."""
    server, port = sip_server
    speech = concat(silence(300), piper("Can I speak to someone?"), silence(9000))
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


@pytest.fixture(scope="module")
def one_line_server() -> Iterator[tuple[Server, int]]:
    """A worker that takes one call at a time."""
    port = free_port()
    server = start_server(
        {"HOTLINE_SIP__ENABLED": "true", "HOTLINE_SIP__PORT": str(port), "HOTLINE_MAX_CALLS": "1"}
    )
    yield server, port
    assert stop_server(server) == 0, "\n".join(server.log[-40:])


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


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, int, Path]]:
    """A worker with SIP over TLS, its certificate made for 127.0.0.1 by openssl."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    tls_port = free_port()
    server = start_server(
        {
            "HOTLINE_SIP__ENABLED": "true",
            "HOTLINE_SIP__PORT": str(free_port()),
            "HOTLINE_SIP__TLS_PORT": str(tls_port),
            "HOTLINE_SIP__TLS_CERT_FILE": str(cert),
            "HOTLINE_SIP__TLS_KEY_FILE": str(key),
        }
    )
    yield server, tls_port, cert
    assert stop_server(server) == 0, "\n".join(server.log[-40:])


async def test_a_call_over_tls(tls_server: tuple[Server, int, Path]) -> None:
    server, port, cert = tls_server
    trusted = ssl.create_default_context(cafile=str(cert))  # checks the server's certificate
    mark = server.log_mark()
    speech = concat(silence(300), piper("I would like to book a table"), silence(300))
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
