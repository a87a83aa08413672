"""Phone calls over a provider's media websocket (Twilio, Telnyx, Vonage): one transport, any
wire protocol.

The protocol module turns websocket messages into events and back; this module owns the
socket, resampling (a `soxr` stream for the caller's audio, each reply sentence whole, so that
none of it waits for the next), real-time pacing of reply audio (never more than `lead_s` and one
message ahead of playback, so that a `clear` silences the phone at once; a message carries up to
the protocol's `frames_per_message` 20 ms frames) and the played position:
a mark every 200 ms of reply audio and after each sentence, echoed by the provider when the phone
has played it, says how much of the reply the caller heard.

`pause()` (the caller spoke: perhaps only "mm-hm") sends the provider a `clear`, so the phone
goes quiet at once, and puts every frame not known to be played (sent after the last echoed
mark, or on mark-less wires whose real-time slot has not passed) back at the head of the
queue; `resume()` sends them again from the played position, with marks renamed so that a late
echo of a cleared one is not taken for the resent one.

A client that stops reading is hung up ("client stopped reading") once a mark is `send_timeout_s`
overdue (not echoed that long after its audio should have played) or a send has been blocked
that long. The echo is the test: a socket's buffers (the kernel's on both sides, asyncio's) take
half a minute of audio or more before a send blocks, and the websocket ping comes later still.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from pipeline.transport import (
    PCM,
    SAMPLE_RATE,
    CallerAudio,
    Dtmf,
    HangUp,
    InboundEvent,
    PlaybackCleared,
    Taps,
    until_hang_up,
)
from voice.audio import StreamResampler, resample
from voice.transports.activity import LineActivity
from voice.transports.phone.opening import BadMessages, receive, wait_for_start
from voice.transports.phone.outbound import (
    Frame,
    Mark,
    end_of,
    piece_items,
    renamed,
    take_frames,
)
from voice.transports.phone.pump import pump
from voice.transports.phone.wire import Dtmf as WireDtmf
from voice.transports.phone.wire import (
    Ignored,
    MarkPlayed,
    Media,
    Start,
    Stop,
    WireEvent,
    WireProtocol,
)
from voice.transports.positions import PositionWaiters

__all__ = ["BadMessages", "PhoneStream", "ProtocolFactory", "pump", "receive", "wait_for_start"]

log = logging.getLogger(__name__)

_FRAME_S = 0.02
# A mark not echoed this long after its audio should have played, or a send that cannot
# complete this long, means the client stopped reading: it is hung up rather than left to hold
# the line and the reply's memory.
SEND_TIMEOUT_S = 5.0
# A frame may go out this much before it is due, and the pacing loop wakes half of it early: a
# timer that fires early (uvloop's round down to the millisecond and keep the loop's cached
# time) still sends its frame. Re-sleeping the rest of the millisecond spun the loop about 20
# times per frame (a tenth of one call's event-loop CPU, and a wake-up every millisecond per call).
_SEND_EARLY_S = _FRAME_S


async def _send(websocket: WebSocket, message: str | bytes) -> None:
    if isinstance(message, bytes):
        await websocket.send_bytes(message)
    else:
        await websocket.send_text(message)


class PhoneStream:
    """A `Transport` over one provider media websocket, after its `start` message."""

    def __init__(
        self,
        call_id: str,
        websocket: WebSocket,
        protocol: WireProtocol,
        start: Start,
        lead_s: float = 0.2,
        send_timeout_s: float = SEND_TIMEOUT_S,
    ) -> None:
        self.call_id = call_id
        self.websocket = websocket
        self.protocol = protocol
        self.start = start
        self.lead_s = lead_s
        self.send_timeout_s = send_timeout_s
        self._inbound: asyncio.Queue[InboundEvent] = asyncio.Queue()
        self._caller = CallerAudio(self._inbound)
        self._to_pipeline = StreamResampler(protocol.wire_rate, SAMPLE_RATE)
        self._frame_samples = protocol.frame_samples
        self._outbox: deque[Frame | Mark] = deque()
        self._in_flight: deque[Frame | Mark] = deque()  # sent, not known to be played yet
        self._paused = False
        self._epoch = 0  # bumped by clear() and pause(): a send in progress then is stale
        self._outbox_ready = asyncio.Event()
        self._queued = 0
        self._sent = 0
        self._played = 0
        self._pending_marks: dict[str, int] = {}  # sent, not yet echoed: name -> position
        self._echo_checks: dict[str, asyncio.TimerHandle] = {}  # one per pending mark
        self._mark_count = 0
        # Real-time schedule of sent frames: frame n of a burst plays at burst_start + n * 20 ms.
        self._burst_start = 0.0
        self._burst_frames = 0
        self._slots: deque[tuple[float, int]] = deque()  # (plays at, position) for mark-less
        self._sent_waiters = PositionWaiters()
        self._played_waiters = PositionWaiters()
        self._closed = False
        self._stopped_reading = False
        self.taps = Taps()
        self.activity = LineActivity(time.monotonic())  # for the media idle timeout
        self._sender = asyncio.create_task(self._send_loop(), name=f"send-{call_id}")

    # -- inbound (driven by `pump`) -----------------------------------------------------------

    def accept(self, events: list[WireEvent]) -> None:
        """Hand parsed wire events to the conversation."""
        for event in events:
            if isinstance(event, Media):
                now = time.monotonic()
                self.activity.caller_audio(event.pcm, self.protocol.wire_rate, now)
                pcm = self._to_pipeline(event.pcm)
                if pcm.size:
                    self._caller.add(pcm, now)
                    self.taps.caller(pcm, now)
            elif isinstance(event, WireDtmf):
                self._caller.put(Dtmf(event.digit, time.monotonic()))
            elif isinstance(event, MarkPlayed):
                self._mark_played(event.name)
            elif isinstance(event, Stop):
                self.hang_up(f"stop: {event.reason}")
            elif isinstance(event, Start):
                log.warning("call %s: second start message ignored", self.call_id)
            elif isinstance(event, Ignored):
                pass

    def _mark_played(self, name: str) -> None:
        check = self._echo_checks.pop(name, None)
        if check is not None:
            check.cancel()
        position = self._pending_marks.pop(name, None)
        if position is None:
            return  # unknown, or pending when the reply was cleared: nothing more was heard
        self._heard_up_to(position)

    def _heard_up_to(self, position: int) -> None:
        self._played = max(self._played, position)
        while self._in_flight and end_of(self._in_flight[0]) <= self._played:
            self._in_flight.popleft()
        self._played_waiters.reach(self._played)

    @property
    def last_audio_at(self) -> float:
        """When the line last carried audio (the caller's, or the reply going out)."""
        return self.activity.last_audio_at

    # -- Transport ---------------------------------------------------------------------------

    def inbound(self) -> AsyncIterator[InboundEvent]:
        return until_hang_up(self._inbound)

    def play(self, pcm: PCM) -> int:
        """Queue one sentence of reply audio, a mark every `MARK_EVERY_FRAMES` frames and at its
        end."""
        if pcm.size == 0 or self._closed:
            return self._queued
        wire = resample(pcm, SAMPLE_RATE, self.protocol.wire_rate)  # whole: nothing held back
        marks = self._mark_count if self.protocol.supports_marks else None
        items = piece_items(pcm, wire, self._frame_samples, self._queued, marks)
        self._outbox.extend(items)
        self._mark_count += sum(isinstance(item, Mark) for item in items)
        self._queued += int(pcm.size)
        self._outbox_ready.set()
        return self._queued

    async def clear(self) -> None:
        """Drop unsent audio, tell the provider to drop what it buffered, settle the position."""
        paused, self._paused = self._paused, False
        self._outbox.clear()
        self._in_flight.clear()
        if not paused:
            self._stop_playing()
        self._queued = self._sent = self._played
        self._sent_waiters.fail()
        self._played_waiters.fail()
        if not paused:  # a pause already cleared the provider's buffer; nothing went since
            await self._send_clear()

    async def pause(self) -> None:
        """Silence the phone now (the provider's `clear`), keeping what it did not play."""
        if self._paused or self._closed:
            return
        self._paused = True
        self._stop_playing()
        again: list[Frame | Mark] = []
        for item in self._in_flight:  # sent again on resume, its marks under new names
            if isinstance(item, Mark):
                self._mark_count += 1
                item = renamed(item, self._mark_count)
            again.append(item)
        self._in_flight.clear()
        self._outbox.extendleft(reversed(again))
        self._sent = self._played
        await self._send_clear()

    async def resume(self) -> None:
        """Send again, from the played position."""
        if self._paused:
            self._paused = False
            self._outbox_ready.set()

    def _stop_playing(self) -> None:
        """The provider drops what it had not played: settle the played position there."""
        self.taps.cut(time.monotonic())
        self._update_slots()
        self._pending_marks.clear()  # Twilio echoes pending marks on clear: they were not heard
        self._cancel_echo_checks()
        self._slots.clear()
        self._burst_frames = 0
        self._epoch += 1

    async def _send_clear(self) -> None:
        if not self._closed:
            with contextlib.suppress(WebSocketDisconnect, RuntimeError):
                await _send(self.websocket, self.protocol.clear())

    @property
    def played_samples(self) -> int:
        self._update_slots()
        return self._played

    @property
    def queued_samples(self) -> int:
        return self._queued

    async def wait_played(self, position: int) -> float:
        return await self._wait(self._played_waiters, position, self.played_samples)

    async def wait_sent(self, position: int) -> float:
        return await self._wait(self._sent_waiters, position, self._sent)

    def send_event(self, event: dict[str, object]) -> None:
        pass  # a phone has no screen

    def hang_up(self, reason: str) -> None:
        self._caller.put(HangUp(reason))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._sender.cancel()
        self._cancel_echo_checks()
        self._sent_waiters.fail()
        self._played_waiters.fail()
        # Unless the other side already closed it; a client that stopped reading may never take
        # the close frame (the send waits for buffer room): the call ends all the same.
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, TimeoutError):
            async with asyncio.timeout(self.send_timeout_s):
                await self.websocket.close(1000)

    # -- pacing ------------------------------------------------------------------------------

    async def _send_loop(self) -> None:
        try:
            while True:
                if not self._outbox or self._paused:
                    self._outbox_ready.clear()
                    await self._outbox_ready.wait()
                    continue
                item = self._outbox[0]
                if isinstance(item, Mark):
                    self._outbox.popleft()
                    message = self.protocol.mark(item.name)
                    if message is not None:
                        self._in_flight.append(item)
                        self._pending_marks[item.name] = item.position
                        self._expect_echo(
                            item.name, self._burst_start + self._burst_frames * _FRAME_S
                        )
                        await self._send(message)
                    continue
                now = time.monotonic()
                if now > self._burst_start + self._burst_frames * _FRAME_S:
                    self._burst_start, self._burst_frames = now, 0  # the phone went idle
                due = self._burst_start + self._burst_frames * _FRAME_S - self.lead_s
                if due > now + _SEND_EARLY_S:
                    await asyncio.sleep(due - now - _SEND_EARLY_S / 2)
                    continue  # the outbox may have been cleared meanwhile
                frames = take_frames(self._outbox, self.protocol.frames_per_message)
                self._in_flight.extend(frames)  # before the send: a pause meanwhile resends them
                epoch = self._epoch
                pcm = frames[0].pcm if len(frames) == 1 else np.concatenate([f.pcm for f in frames])
                await self._send(self.protocol.media(pcm))
                if epoch != self._epoch:
                    continue  # cleared or paused while it went: not counted as sent
                for frame in frames:
                    plays_at = self._burst_start + self._burst_frames * _FRAME_S
                    self.activity.in_use(plays_at + _FRAME_S)  # the caller listens until then
                    self._burst_frames += 1
                    self._sent = frame.end
                    self._slots.append((plays_at + _FRAME_S, frame.end))
                    self.taps.heard(frame.source, plays_at)
                self._sent_waiters.reach(self._sent)
        except TimeoutError:
            self._stopped_reading_for(f"a send blocked for {self.send_timeout_s:.0f} s")
        except (WebSocketDisconnect, RuntimeError) as exc:
            log.info("call %s: stopped sending (%s)", self.call_id, exc)
            self.hang_up("socket closed")

    async def _send(self, message: str | bytes) -> None:
        async with asyncio.timeout(self.send_timeout_s):
            await _send(self.websocket, message)

    def _expect_echo(self, name: str, played_by: float) -> None:
        """Hang up if mark `name` is not echoed `send_timeout_s` after `played_by` (when the
        audio before it should have finished playing): the client stopped reading."""

        def check() -> None:
            if name in self._pending_marks and not self._closed:
                late = time.monotonic() - played_by
                self._stopped_reading_for(f"mark {name} not echoed {late:.1f} s after it played")

        delay = played_by + self.send_timeout_s - time.monotonic()
        self._echo_checks[name] = asyncio.get_running_loop().call_later(max(0.0, delay), check)

    def _cancel_echo_checks(self) -> None:
        for check in self._echo_checks.values():
            check.cancel()
        self._echo_checks.clear()

    def _stopped_reading_for(self, why: str) -> None:
        if self._stopped_reading:
            return
        self._stopped_reading = True
        log.warning("call %s: the client stopped reading (%s); hanging up", self.call_id, why)
        self.hang_up("client stopped reading")

    def _update_slots(self) -> None:
        """Without marks, audio counts as played once its real-time slot has passed."""
        if self.protocol.supports_marks:
            return
        now = time.monotonic()
        while self._slots and self._slots[0][0] <= now:
            self._heard_up_to(self._slots.popleft()[1])
        self._played_waiters.reach(self._played)

    # -- waiters -----------------------------------------------------------------------------

    async def _wait(self, waiters: PositionWaiters, position: int, reached: int) -> float:
        if position <= reached:
            return time.monotonic()
        if position > self._queued or self._closed:
            raise PlaybackCleared(f"position {position} is not queued")
        future = waiters.add(position)
        if waiters is self._played_waiters and not self.protocol.supports_marks:
            self._schedule_slot_check(position)
        return await future

    def _schedule_slot_check(self, position: int) -> None:
        """Mark-less providers: re-check the played position when `position` should have played."""
        loop = asyncio.get_running_loop()

        def check() -> None:
            self._update_slots()
            if self._played_waiters.waiting_for(position):
                loop.call_later(_FRAME_S, check)

        loop.call_later(_FRAME_S, check)


ProtocolFactory = Callable[[], WireProtocol]
