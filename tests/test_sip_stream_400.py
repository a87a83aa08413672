"""A malformed request over TCP gets the 400 a datagram gets (RFC 3261 §8.2.6; issue 25 item
5), then the connection closes (its framing cannot be trusted after it): a real `SipEndpoint`
on 127.0.0.1 and a real TCP connection. Without a readable Via nothing is answered."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from voice.transports.sip.endpoint import Peer, SipEndpoint
from voice.transports.sip.message import SipMessage, StreamFramer, response_to

DEADLINE_S = 10.0  # what an answer or a close may take on a loaded runner


@pytest.fixture
async def endpoint() -> AsyncIterator[SipEndpoint]:
    """An endpoint whose handler answers 200 to anything (the good message before the bad)."""
    started: list[SipEndpoint] = []

    async def answer_ok(request: SipMessage, peer: Peer) -> None:
        if request.method != "ACK":
            started[0].send(response_to(request, 200, "OK"), peer)

    sip = SipEndpoint("127.0.0.1", 0, answer_ok, trusted=lambda host: host == "127.0.0.1")
    started.append(sip)
    await sip.start()
    yield sip
    await sip.close()


def _request(port: int, content_length: str, extra: str = "", via: bool = True) -> bytes:
    head = "OPTIONS sip:+15551230000@127.0.0.1 SIP/2.0\r\n"
    if via:
        head += f"Via: SIP/2.0/TCP 127.0.0.1:{port};branch=z9hG4bKbad400;rport\r\n"
    head += (
        "Max-Forwards: 70\r\nFrom: <sip:pbx@127.0.0.1>;tag=pbx\r\n"
        "To: <sip:+15551230000@127.0.0.1>\r\nCall-ID: stream-400\r\nCSeq: 1 OPTIONS\r\n"
    )
    return f"{head}{extra}Content-Length: {content_length}\r\n\r\n".encode()


async def _all_until_closed(reader: asyncio.StreamReader) -> list[SipMessage]:
    """Every message the endpoint sends before it closes the connection."""
    framer, messages = StreamFramer(), []
    async with asyncio.timeout(DEADLINE_S):
        while data := await reader.read(65536):
            messages.extend(framer.feed(data))
    return messages


@pytest.mark.parametrize(
    ("content_length", "extra"),
    [("twelve", ""), ("0", "Subject no colon here\r\n")],
    ids=["bad Content-Length", "bad header line"],
)
async def test_a_malformed_request_over_tcp_gets_400_then_the_connection_closes(
    endpoint: SipEndpoint, caplog: pytest.LogCaptureFixture, content_length: str, extra: str
) -> None:
    caplog.set_level(logging.WARNING, "voice.transports.sip.endpoint")
    reader, writer = await asyncio.open_connection("127.0.0.1", endpoint.port)
    port = writer.get_extra_info("sockname")[1]
    writer.write(_request(port, "0").replace(b"bad400", b"good1"))  # a good one first
    framer = StreamFramer()
    async with asyncio.timeout(DEADLINE_S):
        while not (first := framer.feed(await reader.read(65536))):
            pass
    assert first[0].status == 200
    writer.write(_request(port, content_length, extra))
    answers = await _all_until_closed(reader)  # returns only once the endpoint closes
    writer.close()
    assert [m.status for m in answers] == [400]
    bad = answers[0]
    assert bad.branch == "z9hG4bKbad400" and bad.cseq == (1, "OPTIONS")  # the bad one's Via
    assert any("answered 400" in r.getMessage() for r in caplog.records)


async def test_without_a_readable_via_the_connection_closes_unanswered(
    endpoint: SipEndpoint,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", endpoint.port)
    writer.write(_request(0, "twelve", via=False))
    assert await _all_until_closed(reader) == []
    writer.close()
    assert endpoint.bad_messages == 1
