"""A real uvicorn server in the test's own event loop, serving phone media websockets the way
the phone route runs a call (voice/server/routes/phone.py): wait for the provider's start, a
`PhoneStream`, `pump` with the media idle timeout. No pipeline: a call optionally plays one
reply and records how it ended. Routes as the server's: `/twilio/stream`, `/telnyx/stream`,
`/vonage/stream`.

`serving_on_loopback` is how a test serves any ASGI app this way (the webhook receiver of
tests/test_webhooks.py too): uvicorn in the test's own event loop, on a free loopback port,
listening once the context is entered."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.types import ASGIApp
from starlette.websockets import WebSocket

from pipeline.transport import HangUp
from voice.transports.phone.stream import (
    SEND_TIMEOUT_S,
    BadMessages,
    PhoneStream,
    ProtocolFactory,
    pump,
    wait_for_start,
)
from voice.transports.phone.telnyx import TelnyxProtocol
from voice.transports.phone.twilio import TwilioProtocol
from voice.transports.phone.vonage import VonageProtocol


@contextlib.asynccontextmanager
async def serving_on_loopback(app: ASGIApp, **options: Any) -> AsyncIterator[int]:
    """Serve `app` with uvicorn in the running event loop on a free loopback port, which it
    yields once listening; shut down (waiting `timeout_graceful_shutdown` for requests still
    open, 2 s unless given) on exit. `options` are more `uvicorn.Config` arguments."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    settings: dict[str, Any] = {
        "lifespan": "off",
        "log_config": None,
        "access_log": False,
        "timeout_graceful_shutdown": 2,
    }
    config = uvicorn.Config(app, **(settings | options))
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)  # what Server.serve would set
    await server.startup(sockets=[listener])  # listening once this returns
    try:
        yield listener.getsockname()[1]
    finally:
        await server.shutdown(sockets=[listener])
        listener.close()


PROTOCOLS: dict[str, ProtocolFactory] = {
    "/twilio/stream": TwilioProtocol,
    "/telnyx/stream": TelnyxProtocol,
    "/vonage/stream": VonageProtocol,
}


@dataclass(frozen=True)
class Ended:
    """How a call ended: its hang-up reason, and when (monotonic) the stream hung up."""

    reason: str
    at: float


class MediaLine:
    """The server's side; `ended(call_id)` resolves when that call hangs up."""

    def __init__(
        self,
        *,
        idle_s: float | None,
        send_timeout_s: float = SEND_TIMEOUT_S,
        reply: np.ndarray | None = None,
        ping_interval_s: float = 20.0,
        ping_timeout_s: float = 20.0,
    ) -> None:
        self.idle_s = idle_s
        self.send_timeout_s = send_timeout_s
        self.reply = reply
        self.ping_interval_s = ping_interval_s
        self.ping_timeout_s = ping_timeout_s
        self.started: dict[str, float] = {}  # call id -> when its stream was made
        self._ended: dict[str, asyncio.Future[Ended]] = {}
        self.base = ""

    def ended(self, call_id: str) -> asyncio.Future[Ended]:
        if call_id not in self._ended:
            self._ended[call_id] = asyncio.get_running_loop().create_future()
        return self._ended[call_id]

    async def _answer(self, websocket: WebSocket) -> None:
        await websocket.accept()
        protocol = PROTOCOLS[websocket.url.path]()
        bad = BadMessages(websocket.url.path)
        start = await wait_for_start(websocket, protocol, bad)
        if start is None:
            return
        # Before the stream, whose idle clock starts as it is made: a hang-up for idleness is
        # never seen to come sooner than the timeout after this.
        self.started[start.call_id] = time.monotonic()
        stream = PhoneStream(
            start.call_id, websocket, protocol, start, send_timeout_s=self.send_timeout_s
        )
        if self.reply is not None:
            stream.play(self.reply)
        pumping = asyncio.create_task(pump(stream, bad, idle_timeout_s=self.idle_s))
        try:
            async for event in stream.inbound():
                if isinstance(event, HangUp):
                    ended = self.ended(start.call_id)
                    if not ended.done():
                        ended.set_result(Ended(event.reason, time.monotonic()))
        finally:
            await stream.close()
            pumping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pumping

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[MediaLine]:
        app = Starlette(routes=[WebSocketRoute(path, self._answer) for path in PROTOCOLS])
        async with serving_on_loopback(
            app,
            ws_max_size=64 * 1024,
            ws_ping_interval=self.ping_interval_s,
            ws_ping_timeout=self.ping_timeout_s,
        ) as port:
            self.base = f"ws://127.0.0.1:{port}"
            yield self
