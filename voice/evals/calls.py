"""A scenario's call: the caller's turns as audio, spoken over the emulated Twilio phone, and
the server's record of the call once it ended.

Text turns are spoken by piper (the bundled voice) and go through the phone path like a real
caller's: the emulated Twilio phone (`voice.devtools.phone_caller.TwilioPhone`) sends them as
8 kHz μ-law, so a word the STT mishears is misheard here too. Keypad turns are DTMF. Each turn
waits for the previous reply to be heard out, as `voice.devtools.turns.converse` does; this
loop is its own because a turn here may be keys as well as speech, and each turn's wall-clock
start is kept to find its records in the call record.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from websockets.asyncio.client import connect

from pipeline.transport import PCM, SAMPLE_RATE
from voice.audio import read_wav, resample
from voice.cli.client import auth_headers
from voice.devtools.phone_caller import DEFAULT_CALLER, TwilioPhone, twilio_sid
from voice.devtools.stream_phone import talk
from voice.devtools.turns import (
    FRAME_S,
    OPENING_WAIT_S,
    first_audible_after,
    silent_for_after,
    voiced_span,
)
from voice.devtools.twilio_call import after_stream, answer_webhook
from voice.evals.scenario import Scenario, Turn
from voice.transports.phone.twilio import (
    CALLEE_PARAMETER,
    CALLER_PARAMETER,
    SIGNATURE_HEADER,
    twilio_signature,
)

OPENING_START_S = 5.0  # how long the caller waits to hear a greeting before speaking anyway
REPLY_TIMEOUT_S = 30.0  # a turn with no reply heard this long ends the script
QUIET_S = 0.8  # a reply has finished once the line is quiet this long
RECORD_WAIT_S = 30.0  # how long the call record may take to say the call ended


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
class HeardTurn:
    """One scripted turn as the caller lived it."""

    began_at: float  # wall clock (time.time()) when the caller began it
    speech_end: float  # monotonic: end of the caller's speech (or the last key)
    reply_start: float | None = None  # monotonic: the first reply audio heard after it

    @property
    def voice_to_voice_ms(self) -> float | None:
        if self.reply_start is None:
            return None
        return round((self.reply_start - self.speech_end) * 1e3, 1)


@dataclass
class ScriptedCall:
    """What the scripted caller lived through, and what Twilio's `<Connect action>` said."""

    call_id: str
    turns: list[HeardTurn] = field(default_factory=list)
    rejected: str | None = None  # the webhook turned the call away (what it said)
    transferred_to: str | None = None  # the number or SIP URI a `<Dial>` put the caller through to
    server_ended: bool = False  # the server ended the stream (a transfer, a hang-up)


async def _script(
    phone: TwilioPhone, audio: Sequence[PCM | None], keys: Sequence[str], out: list[HeardTurn]
) -> None:
    opened = await phone.hear(first_audible_after(0.0), OPENING_START_S)
    if opened is not None:
        await phone.hear(silent_for_after(opened, QUIET_S), OPENING_WAIT_S)
    for pcm, digits in zip(audio, keys, strict=True):
        began = time.time()
        if pcm is not None:
            sent = await phone.say(pcm)
            speech_end = sent[voiced_span(pcm)[1]] + FRAME_S
        else:
            await phone.press(digits)
            speech_end = time.monotonic()
        turn = HeardTurn(began, speech_end)
        out.append(turn)
        turn.reply_start = await phone.hear(first_audible_after(speech_end), REPLY_TIMEOUT_S)
        if turn.reply_start is None:
            return  # no reply (or the call ended): the rest of the script cannot go on
        await phone.hear(silent_for_after(turn.reply_start, QUIET_S), REPLY_TIMEOUT_S)


async def place_call(
    base_url: str,
    scenario: Scenario,
    number: str,
    audio: Sequence[PCM | None],
    call_id: str | None = None,
    auth_token: str | None = None,
) -> ScriptedCall:
    """Call `number` at the server as Twilio does (the webhook, its `<Connect><Stream>`, then
    `<Connect action>` once the server ends the stream) and play `scenario`'s turns."""
    numbers = {CALLER_PARAMETER: scenario.caller or DEFAULT_CALLER, CALLEE_PARAMETER: number}
    call = ScriptedCall(call_id or twilio_sid("CA"))
    account = twilio_sid("AC")
    answer = await answer_webhook(base_url, call.call_id, account, numbers, auth_token)
    if isinstance(answer, str):
        call.rejected = answer
        return call
    keys = [turn.keys or "" for turn in scenario.turns]
    url = answer.stream_url
    signed = {SIGNATURE_HEADER: twilio_signature(auth_token, url, {})} if auth_token else {}
    async with connect(url, compression=None, open_timeout=10, additional_headers=signed) as socket:
        phone = TwilioPhone(socket, call.call_id, account, answer.parameters)
        await phone.open()
        call.server_ended = await talk(phone, 0.0, _script(phone, audio, keys, call.turns))
    if call.server_ended and answer.action_url is not None:
        _, call.transferred_to = await after_stream(
            answer.action_url, call.call_id, account, numbers, auth_token
        )
    return call


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
