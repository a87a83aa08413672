"""Feeding a provider's media websocket into its `PhoneStream`, until the call ends."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from starlette.websockets import WebSocketDisconnect

from voice.transports.phone.opening import BadMessages, receive
from voice.transports.phone.wire import ProtocolError

if TYPE_CHECKING:
    from voice.transports.phone.stream import PhoneStream

log = logging.getLogger("voice.transports.phone.stream")  # as when it lived there


async def pump(stream: PhoneStream, bad: BadMessages, idle_timeout_s: float | None = None) -> None:
    """Feed the socket's messages to the stream until it closes, or until the line has carried
    no audio for `idle_timeout_s` (voice/transports/activity.py: a client that answers pings,
    or trickles tiny or all-zero frames, holds no line). One timeout covers every message read
    until it runs out (a timeout a message cost 5 µs, 50 messages a second a call); then the
    line's own clock says whether it was idle, and if not, when to look again."""
    while True:
        idle_left = None
        if idle_timeout_s is not None:
            idle_left = stream.last_audio_at + idle_timeout_s - time.monotonic()
        try:
            async with asyncio.timeout(idle_left):
                if not await _feed(stream, bad):
                    return
        except TimeoutError:
            assert idle_timeout_s is not None
            if stream.activity.idle_for(time.monotonic()) < idle_timeout_s:
                continue  # audio came (or reply audio went out) meanwhile
            log.warning(
                "call %s: no audio for %.0f s (%d frames too short or all zero), hanging up",
                stream.call_id,
                idle_timeout_s,
                stream.activity.not_audio,
            )
            stream.hang_up(f"no audio for {idle_timeout_s:.0f} s")
            return


async def _feed(stream: PhoneStream, bad: BadMessages) -> bool:
    """Hand the socket's messages to the stream; False once the stream is over."""
    while True:
        try:
            message = await receive(stream.websocket)
        except (WebSocketDisconnect, RuntimeError):
            message = None
        if message is None:
            stream.hang_up("socket closed")
            return False
        try:
            stream.accept(stream.protocol.parse(message))
        except ProtocolError as error:
            if not bad(error):
                stream.hang_up("too many bad messages")
                await stream.websocket.close(1008)
                return False
