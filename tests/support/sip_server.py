"""The SIP servers the SIP test modules share: one of each per pytest worker (session scope, a
plugin of tests/conftest.py), so test_sip_live, test_sip_strangers and test_sip_rtp_latch do not
each start their own `hotline serve`.

- `sip_server`: 127.0.0.1 the only allowed source and no passwords, so every other loopback
  address (127.0.0.2-.9) is a stranger that gets 403; calls ring `RING_MS` first (time for a
  CANCEL) and are greeted with `GREETING`.
- `digest_sip_server`: 127.0.0.1 allowed, anyone else challenged for `PBX_PASSWORD` (user
  `pbx`); session timers accepted from 1 s; a small RTP range (8 even ports) that a stranger
  can spray whole.

Both require a clean exit (0: every call closed, nothing crashed on the way out)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.support.server import Server, free_port, start_server, stop_server

NUMBER = "+15551230000"
GREETING = "Thank you for calling the garden centre."
RING_MS = 800
PBX_PASSWORD = "pbx-digest-secret"
DIGEST_GREETING = "Hello, this is the garden centre."


@dataclass
class SipServer:
    server: Server
    port: int  # SIP over UDP and TCP on 127.0.0.1
    rtp_ports: tuple[int, int] = (20_000, 30_000)


def stopped_cleanly(server: Server) -> None:
    """Stop a server and require a clean exit, with its last lines if not."""
    code = stop_server(server)
    tail = "\n".join(server.log[-30:])
    assert code == 0, f"hotline serve exited {code}; its last lines:\n{tail}"


@pytest.fixture(scope="session")
def sip_server() -> Iterator[SipServer]:
    port = free_port()
    server = start_server(
        {
            "HOTLINE_SIP__ENABLED": "true",
            "HOTLINE_SIP__PORT": str(port),
            "HOTLINE_SIP__ALLOW": '["127.0.0.1/32"]',  # 127.0.0.2-.9 are strangers
            "HOTLINE_CONVERSATION__GREETING": GREETING,
            "HOTLINE_SIP__ANSWER_AFTER_MS": str(RING_MS),
        }
    )
    yield SipServer(server, port)
    stopped_cleanly(server)


@pytest.fixture(scope="session")
def digest_sip_server() -> Iterator[SipServer]:
    port = free_port()
    low = random.randrange(20_000, 29_000, 16)
    server = start_server(
        {
            "HOTLINE_SIP__ENABLED": "true",
            "HOTLINE_SIP__PORT": str(port),
            "HOTLINE_SIP__ALLOW": '["127.0.0.1/32"]',
            "HOTLINE_SIP__USERS": json.dumps({"pbx": PBX_PASSWORD}),
            "HOTLINE_SIP__MIN_SESSION_EXPIRES_S": "1",  # session timers in seconds, for tests
            "HOTLINE_SIP__RTP_PORTS": json.dumps([low, low + 16]),
            "HOTLINE_CONVERSATION__GREETING": DIGEST_GREETING,
        }
    )
    yield SipServer(server, port, (low, low + 16))
    stopped_cleanly(server)
