"""What a hostile client sends a real server: bodies too large to hold, control characters in
Twilio's webhook, JSON nested past the parser's recursion limit, a body built to make the nesting
check slow. Each gets a clear 4xx, and the server keeps serving. The server is conftest's
session `server` (the default configuration), shared with the other modules on the worker."""

from __future__ import annotations

import json
import re
import socket
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.server import Server, logged

pytestmark = pytest.mark.slow

MAX_BODY = 64 * 1024  # the default `max_body_bytes`
JSON_ROUTES = [("POST", "/offer"), ("POST", "/calls/x/say"), ("PUT", "/experiments/x")]
BODY_ROUTES = [("POST", "/twilio/voice"), *JSON_ROUTES]


def health(server: Server) -> dict[str, Any]:
    response = httpx.get(f"{server.url}/healthz", timeout=10)
    assert response.status_code == 200
    found: dict[str, Any] = response.json()
    return found


def read_response(sock: socket.socket) -> tuple[str, bytes]:
    """One HTTP/1.1 response with a Content-Length, read off a raw socket: head and body."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = re.search(rb"(?im)^content-length: *(\d+)", head)
        if length is not None and len(body) >= int(length[1]):
            break
    head, _, body = data.partition(b"\r\n\r\n")
    return head.decode("latin-1"), body


def form_body(total: int, chunk: int = 256 * 1024) -> Iterator[bytes]:
    for _ in range(total // chunk):
        yield b"From=%2B1555" + b"0" * (chunk - 12)


def test_a_streamed_oversized_webhook_body_is_refused_without_being_held(server: Server) -> None:
    """256 MB, far more than the server's memory moves by otherwise: held, it would raise the
    peak (counted from when the server became ready) by that much."""
    before = health(server)
    response = httpx.post(
        f"{server.url}/twilio/voice",
        content=form_body(256 * 2**20),  # chunked: no Content-Length to refuse it by
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        timeout=60,
    )
    assert response.status_code == 413
    assert "error" in response.json()
    after = health(server)
    assert after["peak_rss_mb"] - before["peak_rss_mb"] < 32, (before, after)
    assert after["rss_mb"] - before["rss_mb"] < 32, (before, after)


@pytest.mark.parametrize(("method", "path"), BODY_ROUTES)
def test_a_declared_length_over_the_limit_is_refused_before_the_body_comes(
    server: Server, method: str, path: str
) -> None:
    address = urlsplit(server.url)
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {address.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {MAX_BODY + 1}\r\n\r\n"
    )
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        sock.sendall(head.encode())  # and not one byte of the body
        head, body = read_response(sock)
    assert head.startswith("HTTP/1.1 413"), head
    assert "error" in json.loads(body)
    assert health(server)["status"] == "ok"


def test_control_characters_in_the_webhook_never_break_the_twiml(server: Server) -> None:
    dirt = "".join(map(chr, range(0x20))) + "\x7f"
    form = {
        "From": f"+1555{dirt}0100001",
        "To": f"{dirt}+15550100002",
        "CallSid": f"CA0123{dirt}</Stream>",
    }
    response = httpx.post(f"{server.url}/twilio/voice", data=form, timeout=10)
    assert response.status_code == 200
    stream = ET.fromstring(response.text).find("./Connect/Stream")
    assert stream is not None
    parameters = {p.get("name"): p.get("value") for p in stream.findall("Parameter")}
    assert parameters == {
        "from": "+15550100001",
        "to": "+15550100002",
        "call_sid": "CA0123</Stream>",
    }


@pytest.mark.parametrize(
    "nested",
    [
        "[" * 30_000 + "]" * 30_000,
        '{"a":' * 10_000 + "1" + "}" * 10_000,
        '{"text":' + "[" * 30_000,  # unterminated as well
    ],
    ids=["arrays", "objects", "unterminated"],
)
@pytest.mark.parametrize(("method", "path"), JSON_ROUTES)
async def test_deeply_nested_json_is_a_400_and_the_server_keeps_serving(
    server: Server, method: str, path: str, nested: str
) -> None:
    mark = server.log_mark()  # this case's refusal, not an earlier case's
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.request(
            method,
            server.url + path,
            content=nested.encode(),
            headers={"Content-Type": "application/json"},
        )
    assert response.status_code == 400, response.text
    assert "nest" in response.json()["error"]
    await logged(server, f"HTTP 400: {response.json()['error']}", since=mark)
    assert health(server)["status"] == "ok"


def test_ordinary_nesting_is_still_accepted(server: Server) -> None:
    note: object = '[[[[{{{{ \\" [[[['  # brackets in strings are not nesting
    for _ in range(60):
        note = [note]
    body = {"text": "hello", "note": note}
    response = httpx.post(f"{server.url}/calls/x/say", json=body, timeout=10)
    assert response.status_code == 404  # parsed, then: no call x in progress


async def test_a_body_of_escaped_quotes_costs_what_its_size_does(server: Server) -> None:
    """The probe's body (`{"text":"` and 32 700 escaped quotes, never closed) once held the event
    loop for 13 s before its 400. It now costs less than ten plain bodies of the same size, and
    a /healthz asked meanwhile waits less than that too (compared within this run, not to a
    fixed time)."""
    mark = server.log_mark()
    pathological = b'{"text":"' + b'\\"' * 32_700
    plain = b'{"text":"' + b"a" * (len(pathological) - 9)  # as long, unclosed too
    headers = {"Content-Type": "application/json"}

    def refused(http: httpx.Client, body: bytes) -> float:
        started = time.perf_counter()
        response = http.post("/calls/x/say", content=body, headers=headers)
        assert response.status_code == 400, response.text
        assert response.json()["error"] == "body is not valid JSON"
        return time.perf_counter() - started

    def healthz(http: httpx.Client) -> float:
        started = time.perf_counter()
        assert http.get("/healthz").status_code == 200
        return time.perf_counter() - started

    with (
        httpx.Client(base_url=server.url, timeout=60) as http,
        httpx.Client(base_url=server.url, timeout=60) as other,
    ):
        refused(http, plain)  # connections open, code paths warm
        healthz(other)
        ten_plain = sum(refused(http, plain) for _ in range(10))
        with ThreadPoolExecutor(1) as pool:
            posted = pool.submit(refused, http, pathological)
            waits = [healthz(other)]
            while not posted.done() and len(waits) < 100:  # bounded: ask again while it runs
                waits.append(healthz(other))
            pathological_s = posted.result()
    assert pathological_s < ten_plain, (pathological_s, ten_plain)
    assert max(waits) < ten_plain, (waits, ten_plain)
    # Each of the 12 refusals (11 plain bodies, then the probe's) logged its own line.
    await logged(server, "HTTP 400: body is not valid JSON", since=mark, times=12)
