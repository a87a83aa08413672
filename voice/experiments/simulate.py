"""`hotline experiments simulate`: try an experiment's arms before they meet live calls.

Caller utterances (spoken by the bundled piper voice) are replayed through the real pipeline
(turn detector, faster-whisper, the controller and router, piper) against the tier simulator,
whose tiers can be scripted to slow down or fail at chosen turns. Every arm gets the same
script on a fresh simulator (same seed) and a fresh controller, one arm after another, and
leaves the same turn records a live call does (tagged with experiment and arm).

The replayed caller (`ReplayLine`) is a transport. It delivers each utterance's speech at once,
stamped with the times it would have arrived (ending now); then it sends trailing silence in
real time. End of turn, early transcription and the turn's zero therefore behave as on a live
call, without waiting out the speech. Reply audio counts as sent and heard as soon as it is
queued: first audio is when the server would start sending. The next utterance follows as soon
as the turn is recorded, with no time spent listening to the reply.

Callers are scripted (`utterances`, dealt out as `calls` x `turns_per_call`) or recorded
(`recordings`: each call's caller channel, split at its pauses; `voice.experiments.recorded`).
A recorded call is one simulated call per arm, its call id the recording's (the file's stem).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import BaseModel, Field, model_validator

from pipeline.conversation import Conversation
from pipeline.llm.controller import Controller
from pipeline.llm.routing import CallRouter, TierRouter
from pipeline.llm.settings import ControllerSettings, LLMSettings
from pipeline.records import TurnRecord
from pipeline.sentences import SentenceSettings
from pipeline.stt import SpeechToText, STTSettings
from pipeline.transport import (
    FRAME_SAMPLES,
    PCM,
    SAMPLE_RATE,
    AudioIn,
    HangUp,
    InboundEvent,
    Taps,
)
from pipeline.tts import TextToSpeech, TTSSettings
from pipeline.turn_taking import model as smart_turn
from pipeline.turns import TurnSettings
from voice.audio import frames, resample
from voice.experiments.arms import Arm, Experiment
from voice.experiments.recorded import RecordedCall, RecordingSplit, load_recorded_calls
from voice.llm_sim.serving import running_simulator
from voice.llm_sim.simulator import (
    SimulatorSettings,
    change_tier,
    create_simulator_app,
)

log = logging.getLogger(__name__)

DEFAULT_UTTERANCES = [
    "Hi, I would like to book a table for two people tonight.",
    "What time do you open on Saturday morning?",
    "Can you tell me if my order has shipped yet?",
    "I need to change the address on my account.",
    "How much does the premium plan cost per month?",
    "My internet has been down since this morning.",
    "Could you send me a copy of my last invoice?",
    "I want to cancel my appointment for tomorrow.",
    "Is there a pharmacy near the main station?",
    "Thanks, that is all I needed for today.",
]
_FRAME_S = FRAME_SAMPLES / SAMPLE_RATE


class TierChange(BaseModel):
    """From turn ``at_turn`` of every arm's run (1-based), change a simulated tier."""

    at_turn: int = Field(ge=1)
    tier: str = Field(description="A simulator profile name, e.g. 'fast'.")
    set: dict[str, Any] = Field(description="TierProfile fields, e.g. {ttft_ms: 900}.")


class Simulation(BaseModel):
    """What `hotline experiments simulate` runs (a YAML or JSON file)."""

    experiment: Experiment
    calls: int = Field(default=3, ge=1, description="Calls per arm.")
    turns_per_call: int = Field(default=10, ge=1)
    utterances: list[str] = Field(default_factory=lambda: list(DEFAULT_UTTERANCES), min_length=1)
    recordings: list[Path] = Field(
        default_factory=list,
        description="Recorded calls (files, or directories of *.ogg) to replay instead of the "
        "scripted callers: one call each, whatever `calls` and `turns_per_call` say. Relative "
        "paths are read from the simulation file's directory.",
    )
    split: RecordingSplit = Field(default_factory=RecordingSplit)
    simulator: SimulatorSettings = Field(default_factory=lambda: SimulatorSettings(seed=1))
    changes: list[TierChange] = Field(default_factory=list)
    controller: ControllerSettings = Field(default_factory=ControllerSettings)
    llm: LLMSettings = Field(default_factory=LLMSettings)
    stt: STTSettings = Field(default_factory=STTSettings)
    tts: TTSSettings = Field(default_factory=TTSSettings)
    turns: TurnSettings = Field(default_factory=TurnSettings)
    sentences: SentenceSettings = Field(default_factory=SentenceSettings)
    turn_timeout_s: float = Field(default=30.0, gt=0, description="Give up on a silent turn.")

    @model_validator(mode="after")
    def _tiers_exist(self) -> Simulation:
        for change in self.changes:
            if change.tier not in self.simulator.profiles:
                raise ValueError(f"change at turn {change.at_turn}: no tier {change.tier!r}")
        return self


def load_simulation(path: str | Path) -> Simulation:
    try:
        data = yaml.safe_load(Path(path).read_text("utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read simulation file {path}: {exc}") from exc
    sim = Simulation.model_validate(data)
    sim.recordings = [Path(path).parent / recording for recording in sim.recordings]
    return sim


@dataclass(frozen=True)
class Caller:
    """One simulated call's caller: an utterance a turn (16 kHz), scripted or recorded."""

    utterances: Sequence[PCM]
    recording: str | None = None  # the recorded call's id

    def call_id(self, arm: str, number: int) -> str:
        return self.recording or f"sim-{arm}-{number}"


def scripted_callers(sim: Simulation, spoken: Sequence[PCM]) -> list[Caller]:
    """`sim.calls` callers of `sim.turns_per_call` turns, dealing out the spoken utterances."""
    turns = sim.turns_per_call
    return [
        Caller([spoken[(number * turns + i) % len(spoken)] for i in range(turns)])
        for number in range(sim.calls)
    ]


def recorded_callers(calls: Sequence[RecordedCall]) -> list[Caller]:
    """Each recorded call's caller, saying what they said, in order."""
    return [Caller([u.pcm for u in call.utterances], call.call_id) for call in calls]


class ReplayLine:
    """A transport whose caller replays utterances, one a turn, and hears replies at once."""

    def __init__(
        self,
        utterances: Sequence[PCM],
        before_turn: Callable[[int], None] = lambda index: None,
        turn_timeout_s: float = 30.0,
    ) -> None:
        self.utterances = list(utterances)
        self.before_turn = before_turn
        self.turn_timeout_s = turn_timeout_s
        self.events: list[dict[str, object]] = []
        self.taps = Taps()  # none: nothing listens in on a replay
        self._queued = 0
        self._turn_over = asyncio.Event()
        self._hung_up: str | None = None

    def turn_finished(self) -> None:
        self._turn_over.set()

    def inbound(self) -> AsyncIterator[InboundEvent]:
        return self._replay()

    async def _replay(self) -> AsyncIterator[InboundEvent]:
        silence = np.zeros(FRAME_SAMPLES, dtype=np.int16)
        for index, pcm in enumerate(self.utterances):
            self.before_turn(index)
            self._turn_over.clear()
            speech = list(frames(pcm))
            now = time.monotonic()
            for k, frame in enumerate(speech):  # as if it had arrived in real time until now
                yield AudioIn(frame, now - (len(speech) - 1 - k) * _FRAME_S)
            start, k = now, 0
            while not self._turn_over.is_set() and self._hung_up is None:
                k += 1
                due = start + k * _FRAME_S
                if due - start > self.turn_timeout_s:
                    log.warning("replay: turn %d got no reply in %.0f s", index + 1, due - start)
                    break
                await asyncio.sleep(max(0.0, due - time.monotonic()))  # the mic's own pace
                yield AudioIn(silence, due)
            if self._hung_up is not None:
                break
        yield HangUp(self._hung_up or "replay finished")

    def play(self, pcm: PCM) -> int:
        self._queued += len(pcm)
        return self._queued

    async def clear(self) -> None:
        return None

    async def pause(self) -> None:
        return None  # never needed: replies play at once, so none is audible to pause

    async def resume(self) -> None:
        return None

    @property
    def played_samples(self) -> int:
        return self._queued

    @property
    def queued_samples(self) -> int:
        return self._queued

    async def wait_played(self, position: int) -> float:
        return time.monotonic()

    async def wait_sent(self, position: int) -> float:
        return time.monotonic()

    def hang_up(self, reason: str) -> None:
        self._hung_up = reason
        self._turn_over.set()

    def send_event(self, event: dict[str, object]) -> None:
        self.events.append(event)

    async def close(self) -> None:
        return None


def caller_utterances(texts: Sequence[str], tts: TextToSpeech) -> list[PCM]:
    """Each text spoken by the bundled voice at 16 kHz, with 300 ms of silence before it."""
    lead = np.zeros(SAMPLE_RATE * 3 // 10, np.int16)
    return [
        np.concatenate([lead, resample(tts.synthesize_blocking(text), tts.sample_rate)])
        for text in texts
    ]


async def simulate(
    sim: Simulation,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    recorded: Sequence[RecordedCall] | None = None,
) -> list[dict[str, Any]]:
    """Run every arm of the simulation; every turn record, tagged and with its call id.

    The callers are `recorded` if given (already loaded), else `sim.recordings`' if any, else
    the scripted ones. RecordingError if a recording cannot be replayed.
    """
    if recorded is None and sim.recordings:
        recorded = await asyncio.to_thread(load_recorded_calls, sim.recordings, sim.split)
    stt = await asyncio.to_thread(SpeechToText.shared, sim.stt)
    tts = await asyncio.to_thread(TextToSpeech.shared, sim.tts)
    if recorded:
        callers = recorded_callers(recorded)
    else:
        spoken = await asyncio.to_thread(caller_utterances, sim.utterances, tts)
        callers = scripted_callers(sim, spoken)
    warm = [asyncio.to_thread(stt.warm_up), asyncio.to_thread(tts.warm_up)]
    if sim.turns.policy.model:  # the one turn model of the process, as the server has it
        warm.append(asyncio.to_thread(smart_turn.shared().warm_up))
    await asyncio.gather(*warm)
    records: list[dict[str, Any]] = []

    def emit(row: dict[str, Any]) -> None:
        records.append(row)
        if on_record is not None:
            on_record(row)

    for arm in sim.experiment.arms:
        await _run_arm(sim, arm, stt, tts, callers, emit)
    return records


async def _run_arm(
    sim: Simulation,
    arm: Arm,
    stt: SpeechToText,
    tts: TextToSpeech,
    callers: Sequence[Caller],
    emit: Callable[[dict[str, Any]], None],
) -> None:
    """One arm's calls, on a fresh simulator (the script's tier changes) and controller."""
    app = create_simulator_app(sim.simulator.model_copy(deep=True))
    turn = 0

    def before_turn(index: int) -> None:
        nonlocal turn
        turn += 1
        for change in sim.changes:
            if change.at_turn == turn:
                change_tier(app, change.tier, **change.set)
                log.info("turn %d: tier %s changed: %s", turn, change.tier, change.set)

    async with running_simulator(app=app) as url:
        router = TierRouter(sim.llm, Controller(sim.controller, time.monotonic), url)
        try:
            for number, caller in enumerate(callers, 1):
                call_id = caller.call_id(arm.name, number)
                line = ReplayLine(caller.utterances, before_turn, sim.turn_timeout_s)
                llm = router.for_call(arm, sim.experiment.name, arm.name)
                await _run_call(sim, call_id, line, stt, llm, tts, emit)
        finally:
            await router.aclose()


async def _run_call(
    sim: Simulation,
    call_id: str,
    line: ReplayLine,
    stt: SpeechToText,
    llm: CallRouter,
    tts: TextToSpeech,
    emit: Callable[[dict[str, Any]], None],
) -> None:
    def on_turn(record: TurnRecord) -> None:
        emit({"call_id": call_id, **record.to_dict()})
        line.turn_finished()

    conversation = Conversation(
        call_id,
        line,
        stt=stt,
        llm=llm,
        tts=tts,
        turn_settings=sim.turns,
        sentence_settings=sim.sentences,
        on_turn=on_turn,
        turn_model=smart_turn.shared() if sim.turns.policy.model else None,
    )
    await conversation.run()
