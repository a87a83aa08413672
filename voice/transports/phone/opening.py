"""A provider media websocket before its call: reading messages off it, counting the unusable
ones, and waiting for the provider's start message (the stream itself is stream.py's, reading
it during the call pump.py's)."""

from __future__ import annotations

import asyncio
import logging

from starlette.websockets import WebSocket

from voice.transports.phone.wire import ProtocolError, Start, Stop, WireProtocol

log = logging.getLogger(__name__)

_MAX_BAD_MESSAGES = 200  # a socket that sends more unusable messages than this is closed


async def receive(websocket: WebSocket) -> str | bytes | None:
    """The next text or binary message; None once the socket is closed."""
    message = await websocket.receive()
    if message["type"] == "websocket.disconnect":
        # 1000/1001: a normal hang-up; 1009: a frame over the size limit; 1006: the line dropped.
        log.info("%s: socket closed, code %s", websocket.url.path, message.get("code"))
        return None
    text: str | None = message.get("text")
    if text is not None:
        return text
    data: bytes | None = message.get("bytes")
    return data if data is not None else b""


class BadMessages:
    """Counts unusable messages on one socket and logs them (not every one)."""

    def __init__(self, route: str) -> None:
        self.route = route
        self.count = 0

    def __call__(self, error: ProtocolError) -> bool:
        """Log the error; True while the socket may stay open."""
        self.count += 1
        if self.count <= 5 or self.count % 50 == 0:
            log.warning("%s: bad message #%d ignored: %s", self.route, self.count, error)
        return self.count <= _MAX_BAD_MESSAGES


async def wait_for_start(
    websocket: WebSocket, protocol: WireProtocol, bad: BadMessages, within_s: float = 10.0
) -> Start | None:
    """Read until the provider's start message; None if the socket closes or stays silent."""
    try:
        async with asyncio.timeout(within_s):
            while True:
                message = await receive(websocket)
                if message is None:
                    return None
                try:
                    events = protocol.parse(message)
                except ProtocolError as error:
                    if not bad(error):
                        await websocket.close(1008)
                        return None
                    continue
                for event in events:
                    if isinstance(event, Start):
                        return event
                    if isinstance(event, Stop):
                        return None
    except TimeoutError:
        log.warning("%s: no start message within %.0f s; closing", bad.route, within_s)
        await websocket.close(1008)
        return None
