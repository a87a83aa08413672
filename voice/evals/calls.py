"""A scenario's call: the caller's turns as audio, played over a caller's line, and the
server's record of the call once it ended.

Text turns are spoken by piper (the bundled voice) and go through the transport's path like a
real caller's (over a phone line as 8 kHz μ-law, so a word the STT mishears is misheard here
too); keypad turns are DTMF. `play` runs the turns over any `voice.devtools.turns.Line` (each
transport's line is opened by `voice.evals.lines`). Each turn waits for the previous reply to
be heard out, as `voice.devtools.turns.converse` does; this loop is its own because a turn here
may be keys as well as speech, and each turn's wall-clock start is kept to find its records in
the call record.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from pipeline.transport import PCM, SAMPLE_RATE
from voice.audio import read_wav, resample
from voice.cli.client import auth_headers
from voice.devtools.turns import (
    FRAME_S,
    OPENING_WAIT_S,
    CallerTurn,
    Line,
    first_audible_after,
    silent_for_after,
    voiced_span,
)
from voice.evals.scenario import Scenario, Turn

OPENING_START_S = 5.0  # how long the caller waits to hear a greeting before speaking anyway
REPLY_TIMEOUT_S = 30.0  # a turn with no reply heard this long ends the script
QUIET_S = 0.8  # a reply has finished once the line is quiet this long
RECORD_WAIT_S = 30.0  # how long the call record may take to say the call ended

Answered = Callable[[str], Awaitable[None]]  # told the server's call id before the first turn


def speak(text: str) -> PCM:
    """`text` as a caller says it: piper's bundled voice, 16 kHz, with 300 ms of silence before
    and 200 ms after (blocking: call it in a thread)."""
    from pipeline.tts import TextToSpeech

    voice = TextToSpeech.shared()
    spoken = resample(voice.synthesize_blocking(text), voice.sample_rate, SAMPLE_RATE)
    quiet = np.zeros(SAMPLE_RATE // 10, dtype=np.int16)
    return np.concatenate([quiet, quiet, quiet, spoken, quiet, quiet])


def turn_audio(turn: Turn, base: Path) -> PCM | None:
    """What a turn plays (16 kHz), or None for keys (blocking)."""
    if turn.say is not None:
        return speak(turn.say)
    if turn.wav is not None:
        return read_wav(base / turn.wav)
    return None


@dataclass
class HeardTurn(CallerTurn):
    """One scripted turn as the caller lived it (`CallerTurn`'s times; `onset` is the first
    voiced frame sent, or the first key), and when it began on the wall clock (to find its
    records in the call record)."""

    began_at: float = 0.0  # wall clock (time.time()) when the caller began it


@dataclass
class ScriptedCall:
    """What the scripted caller lived through, and where its side was told to transfer it."""

    call_id: str
    turns: list[HeardTurn] = field(default_factory=list)
    rejected: str | None = None  # the call was turned away or failed (what was said)
    # Twilio: the number or SIP URI `<Connect action>`'s `<Dial>` put the caller through to;
    # SIP: the REFER's target (Telnyx, Vonage, WebRTC: only the call record says)
    transferred_to: str | None = None
    server_ended: bool = False  # the server ended the stream (a transfer, a hang-up)


class CallWatch:
    """The server's side of a scripted call, as the script consults it (`GET /calls/{id}`):
    told when the call runs (`answered`, e.g. to set the call's tool mocks), and asked whether
    the server has recorded the turn the caller just heard answered. A reply may pause longer
    than a caller's patience (`QUIET_S`) while a tool runs and the model reads its result; the
    server writes a turn's record once all of its reply was played, so a caller that waits for
    it never speaks over, or hangs up on, the rest of the reply."""

    def __init__(self, base_url: str, token: str | None, answered: Answered) -> None:
        self.base_url, self.token, self._answered = base_url.rstrip("/"), token, answered
        self.call_id = ""  # set by the line, once known
        self._recorded = 0  # turn records the server had when last asked

    async def answered(self) -> None:
        """The call runs on the server (its greeting was heard): before the first turn."""
        await self._answered(self.call_id)
        self._recorded = len((await self._record()).get("records") or [])

    async def turn_recorded(self, within_s: float) -> None:
        """Once the server has recorded another turn (or the call ended; or `within_s` went by:
        the script goes on, and the checks say what the record lacks)."""
        deadline = time.monotonic() + within_s
        while True:
            record = await self._record()
            count = len(record.get("records") or [])
            ended = record.get("state") == "ended" or record.get("ended_at") is not None
            if count > self._recorded or ended or time.monotonic() > deadline:
                self._recorded = count
                return
            await asyncio.sleep(0.1)  # polled: the server pushes nothing here

    async def _record(self) -> dict[str, Any]:
        url = f"{self.base_url}/calls/{self.call_id}"
        async with httpx.AsyncClient(timeout=10, headers=auth_headers(self.token)) as http:
            response = await http.get(url)
        if response.status_code == 404:  # not listed yet (or no longer): nothing recorded
            return {}
        response.raise_for_status()
        record: dict[str, Any] = response.json()
        return record


async def play(
    line: Line,
    audio: Sequence[PCM | None],
    keys: Sequence[str],
    out: list[HeardTurn],
    server: CallWatch,
) -> None:
    """The scenario's turns over `line` (any transport's): each after the previous reply was
    heard out (the greeting first) and recorded by the server, appended to `out` as it begins;
    stops at a turn that gets no reply. `server.answered` runs once the greeting was heard,
    before the first turn."""
    opened = await line.hear(first_audible_after(0.0), OPENING_START_S)
    if opened is not None:
        await line.hear(silent_for_after(opened, QUIET_S), OPENING_WAIT_S)
    await server.answered()
    for pcm, digits in zip(audio, keys, strict=True):
        began, pressed_at = time.time(), time.monotonic()
        if pcm is not None:
            sent = await line.say(pcm)
            first, last = voiced_span(pcm)
            onset, speech_end = sent[first], sent[last] + FRAME_S
        else:
            await line.press(digits)
            onset, speech_end = pressed_at, time.monotonic()
        turn = HeardTurn(onset, speech_end, began_at=began)
        out.append(turn)
        turn.reply_start = await line.hear(first_audible_after(speech_end), REPLY_TIMEOUT_S)
        if turn.reply_start is None:
            return  # no reply (or the call ended): the rest of the script cannot go on
        await line.hear(silent_for_after(turn.reply_start, QUIET_S), REPLY_TIMEOUT_S)
        await server.turn_recorded(REPLY_TIMEOUT_S)
        # What the reply said after a pause has been played: heard out once quiet again.
        await line.hear(silent_for_after(time.monotonic() - QUIET_S, QUIET_S), REPLY_TIMEOUT_S)


def keys_of(scenario: Scenario) -> list[str]:
    """Each turn's keys ("" for a spoken turn)."""
    return [turn.keys or "" for turn in scenario.turns]


async def call_record(base_url: str, call_id: str, token: str | None) -> dict[str, Any]:
    """The server's record of the call (GET /calls/{id}), once the call has ended there."""
    url = f"{base_url.rstrip('/')}/calls/{call_id}"
    deadline = time.monotonic() + RECORD_WAIT_S
    async with httpx.AsyncClient(timeout=10, headers=auth_headers(token)) as http:
        while True:
            response = await http.get(url)
            if response.status_code != 404:
                response.raise_for_status()
                record: dict[str, Any] = response.json()
                if record.get("state") == "ended" or record.get("ended_at") is not None:
                    return record
            if time.monotonic() > deadline:
                raise TimeoutError(f"the call {call_id} did not end within {RECORD_WAIT_S:g} s")
            await asyncio.sleep(0.1)  # the record is polled: the server pushes nothing here
