"""One call's loop: caller audio in, turns out, one response task at a time, barge-in.

```
transport.inbound() -> TurnDetector -> SpeechStarted: barge-in (clear, cancel, await)
                                    -> TurnSegment: response task
response task: STT -> LLM stream -> sentences -> TTS -> transport.play()
                        | tool calls: run them (pipeline.tool_turns), then the next request
```

The history keeps only what the caller heard: every sentence is queued at a known outbound
position, and when a response ends (finished or interrupted) the transport's played position
says how far the caller got. Every turn the caller spoke leaves one record, also when they hang
up before hearing its reply (then with nothing heard).

What the conversation needs of its STT, TTS and LLM is in `pipeline.services`; what a reply
heard and the record it leaves, in `pipeline.replies`; speculation's gate, in
`pipeline.speculation`; tool rounds, in `pipeline.tool_turns`; a sentence's synthesis and
place on the line, in `pipeline.speaking`. This module stays over 400 lines because it is one
state machine whose handlers share one call's state (the response task, the early transcript,
the speculation, the words carried over); split into mixins, each part would read only with
the others open (the keypad's own rules are in `pipeline.keypad`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from pipeline.answering.screening import Screening
from pipeline.conversation_settings import ConversationSettings
from pipeline.endpoint import leaves_hanging
from pipeline.keypad import Keypad
from pipeline.llm.client import ChatMessage
from pipeline.llm.errors import LLMError
from pipeline.long_turns import LongTurns
from pipeline.opening import ANNOUNCEMENT, NOTICE_ATTEMPTS, Notice, announce
from pipeline.records import TurnClock, TurnRecord
from pipeline.replies import (
    Reply,
    Spoken,
    answered_record,
    heard_text,
    llm_timings,
    turn_history,
    unanswered_record,
)
from pipeline.scheduling import Urgency
from pipeline.sentences import SentenceSettings, SentenceSplitter
from pipeline.services import LanguageModel, ReplyStream, SpeechRecognizer, SpeechSynthesizer
from pipeline.speaking import Speaker
from pipeline.speculation import Discarded, Gate, Speculation, Unanswered
from pipeline.stt import Transcript
from pipeline.tool_turns import ToolRound, ToolRunner, ToolSettings, rounds_ms
from pipeline.tools import ActionFailed, CallAction, EndCall, Toolbox, ToolContext
from pipeline.transport import (
    AudioIn,
    Dtmf,
    HangUp,
    PlaybackCleared,
    Transport,
)
from pipeline.turn_taking.end_of_turn import EndOfTurn, TurnJudge
from pipeline.turn_taking.interruptions import Interruptions
from pipeline.turns import (
    SpeechResumed,
    SpeechStarted,
    TurnDetector,
    TurnPause,
    TurnSegment,
    TurnSettings,
)

log = logging.getLogger(__name__)


class _Early(NamedTuple):
    """A transcription started at the caller's pause, by the audio position where speech ended."""

    end_position: int
    task: asyncio.Task[Transcript]
    urgency: Urgency


class Conversation:
    """One call's loop, as drawn in the module docstring: turns from the caller's audio,
    barge-in, one response task at a time (STT -> LLM -> sentences -> TTS -> transport);
    owns the call's state and history. Where it sits: README, "Architecture"."""

    def __init__(
        self,
        call_id: str,
        transport: Transport,
        *,
        stt: SpeechRecognizer,
        llm: LanguageModel,
        tts: SpeechSynthesizer,
        settings: ConversationSettings | None = None,
        turn_settings: TurnSettings | None = None,
        sentence_settings: SentenceSettings | None = None,
        on_turn: Callable[[TurnRecord], None] | None = None,
        on_key: Callable[[str], bool] | None = None,
        on_event: Callable[[dict[str, object]], None] | None = None,
        tools: Toolbox | None = None,
        tool_settings: ToolSettings | None = None,
        on_action: Callable[[CallAction], Awaitable[None]] | None = None,
        caller: str | None = None,
        callee: str | None = None,
        notice: str | None = None,
        turn_model: TurnJudge | None = None,
        notice_attempts: int = NOTICE_ATTEMPTS,
        answering: Screening | None = None,
    ) -> None:
        """`on_key(digit)` sees each DTMF key first; returning True consumes it (e.g. "0" for a
        person); other keys are collected into a keypad turn that the LLM answers. `tools` are
        the ones the LLM may call (`pipeline.tool_turns`); `on_action` carries out what a tool
        asks of the call (put through, hang up, press keys) once the reply before it has been
        heard; without it, only hanging up is done (here). `notice` is said before the greeting
        ("this call is recorded"); cut short, again before the next replies (`pipeline.opening`).
        `turn_model` judges each pause (`pipeline.turn_taking.end_of_turn`); None: none.
        `answering`: a placed call's machine detection, which opens the call and hears the
        callee alone until a person answered (`pipeline.answering.screening`)."""
        self.call_id = call_id
        self.answering = answering
        self.transport = transport
        self.llm = llm
        attempts = notice_attempts
        self.notice = Notice(call_id, notice, transport, self._emit, attempts, sentence_settings)
        self.tts = self.notice.voice(tts)  # the notice synthesised once, however often said
        self.settings = settings or ConversationSettings()
        self._speak = Speaker(transport, self.tts, self.settings).speak  # a sentence on the line
        piece_s = self.settings.long_turn_piece_s
        self.stt = LongTurns(stt, piece_s) if piece_s else stt  # long turns piece by piece
        self.sentence_settings = sentence_settings
        self.detector = TurnDetector(turn_settings)
        self.history: list[ChatMessage] = []
        self.records: list[TurnRecord] = []
        self.barge_ins: list[float] = []  # monotonic speech onsets that interrupted a reply
        self._on_turn = on_turn
        self._on_key = on_key
        self._on_event = on_event
        self.tools = tools
        self.tool_settings = tool_settings or ToolSettings()
        self._tool_runner = ToolRunner(tools, self.tool_settings, transport, self._emit)
        self._on_action = on_action
        self.caller, self.callee = caller, callee
        self._keypad = Keypad(self.settings.keypad_timeout_s, self._keypad_turn)
        self._response: asyncio.Task[None] | None = None
        # Caller speech whose reply was cut off before any of it played: it is answered together
        # with the next turn (as audio if it was cut during STT, else as text, whose record is
        # kept back). If the caller hangs up first, it is recorded as a turn of its own.
        self._unheard: Unanswered | None = None
        self._carried: TurnRecord | None = None
        self._ended = False  # the caller hung up: a reply cut off now is recorded, not carried
        self.end_reason: str | None = None  # why the call ended, as the transport said
        # Transcription started when the caller paused, by the audio position where speech ended.
        self._early: _Early | None = None
        self._skipped_at: int | None = None  # the pause where that was skipped (STT busy)
        self._speculation: Speculation | None = None  # a reply begun at that pause, held
        self.speculations_discarded = 0  # in the whole call
        self._discarded_in_turn = 0  # since the last turn record
        self._end_of_turn, self._interruptions = self._turn_taking(turn_model)

    def _turn_taking(self, turn_model: TurnJudge | None) -> tuple[EndOfTurn, Interruptions]:
        """The call's end-of-turn judge (a turn it ends goes where the detector's go) and its
        barge-in (speech over a reply pauses it, then the reply goes on or gives way)."""
        end_of_turn = EndOfTurn(
            self.detector, turn_model, lambda segment: self._interruptions.turn_ended(segment)
        )
        interruptions = Interruptions(
            self.call_id,
            self.transport,
            self.settings.barge_in,
            end_of_turn.longest_silence_ms,
            self.stt,
            early=lambda at: (
                (e.task, e.urgency) if (e := self._early) and e.end_position == at else None
            ),
            interrupt=self._interrupt,
            take_turn=self._start_response,
        )
        return end_of_turn, interruptions

    def _emit(self, event: dict[str, object]) -> None:
        """Tell the caller's screen (if any) and whoever watches the call."""
        self.transport.send_event(event)
        if self._on_event is not None:
            self._on_event(event)

    async def run(self) -> None:
        """Serve the call until the caller hangs up or the transport ends."""
        log.info("call %s: conversation started", self.call_id)
        try:
            if self.answering is not None:
                opened = self.answering.open(
                    self._opening, self._say, self.transport.hang_up, self._emit
                )
                self._response = asyncio.create_task(opened)
            elif self.notice.owed or self.settings.greeting:
                self._response = asyncio.create_task(self._opening())
            async for event in self.transport.inbound():
                if isinstance(event, AudioIn):
                    if self.answering is not None and self.answering.push(event.pcm):
                        if self.answering.overturned():  # a beep: a machine after all
                            await self._leave_message(self.answering)
                        continue  # the callee's opening, or a machine: not a turn
                    for found in self.detector.push(event.pcm, event.at):
                        if isinstance(found, SpeechStarted):
                            await self._barge_in(found)
                        elif isinstance(found, TurnPause):
                            self._transcribe_early(found)
                        elif isinstance(found, SpeechResumed):
                            self._discard_speculation("the caller spoke again")
                        else:  # answered, unless it only acknowledged the reply
                            self._interruptions.turn_ended(found)
                    self._interruptions.heard(self.detector.speech_ms)
                elif isinstance(event, Dtmf):
                    await self._key_pressed(event.digit)
                elif isinstance(event, HangUp):
                    log.info("call %s: hang-up (%s)", self.call_id, event.reason)
                    self.end_reason = event.reason
                    break
        finally:
            self._ended = True
            if self.answering is not None:
                self.answering.close()
            self._keypad.close()
            self._end_of_turn.close()
            self._discard_speculation("the caller hung up")
            self._drop_early()
            await self._stop_response()
            await self._record_unanswered()
            log.info("call %s: conversation ended after %d turns", self.call_id, len(self.records))

    # -- barge-in ---------------------------------------------------------------------------

    async def _barge_in(self, started: SpeechStarted) -> None:
        if self._response is None or self._response.done():
            return
        log.info(
            "call %s: barge-in, speech began %.0f ms ago (monotonic %.3f)",
            self.call_id,
            (time.monotonic() - started.at) * 1e3,
            started.at,
        )
        if not await self._interruptions.pause(started, self._response):
            await self._interrupt(started.at)  # else judged when this speech ends

    async def _interrupt(
        self, onset: float | None = None, response: asyncio.Task[None] | None = None
    ) -> None:
        """Silence the reply at once, then stop `response` (default: the response running
        now), for speech begun at `onset`. Only that one: a turn taken while the wire clears
        has a response of its own."""
        task = self._response if response is None else response
        if onset is not None:
            self.barge_ins.append(onset)
        if task is not None and not task.done():
            # First, so that it queues no more audio: clear() awaits the wire, and a sentence
            # whose synthesis finished meanwhile would otherwise be played after the clear.
            task.cancel()
        self._interruptions.forget(task)  # a paused reply is not resumed
        await self.transport.clear()
        await self._stop(task)

    async def say(
        self, text: str, then: CallAction | None = None, source: str = ANNOUNCEMENT
    ) -> None:
        """Speak `text` into the call now, cutting off any reply in progress; once it has been
        heard in full, carry out `then` (e.g. put the caller through). `source`: who speaks
        it (`pipeline.opening.OPERATOR` for a supervisor), as the history and watchers see it."""
        self._discard_speculation("an announcement")
        await self._interrupt()
        self._response = asyncio.create_task(self._announce(text, then, source))

    async def _leave_message(self, answering: Screening) -> None:
        """What was taken for a person is a machine: stop talking, as `say` does, and leave
        the message after its beep (`pipeline.answering.screening`)."""
        self._discard_speculation("an answering machine")
        await self._interrupt()
        leave = answering.leave(self._say, self.transport.hang_up)
        self._response = asyncio.create_task(leave)

    # -- keypad -----------------------------------------------------------------------------

    async def _key_pressed(self, digit: str) -> None:
        log.info("call %s: DTMF %s", self.call_id, digit)
        self._emit({"type": "dtmf", "digit": digit})
        if self._on_key is not None and self._on_key(digit):
            return
        self._discard_speculation("a key was pressed")
        replying = self._response is not None and not self._response.done()
        if replying and not self._keypad.collecting:
            await self._interrupt()  # a key press cuts the reply short, as speech does
        self._keypad.press(digit)

    def _keypad_turn(self, digits: list[str]) -> None:
        """The keys pressed become one caller turn, as text for the LLM."""
        if self._response is not None and not self._response.done():
            self._response.cancel()
        text = f"(The caller pressed {' '.join(digits)} on the keypad.)"
        self._response = asyncio.create_task(self._reply(text, TurnClock(time.monotonic()), None))

    async def _stop_response(self) -> None:
        await self._stop(self._response)

    async def _stop(self, task: asyncio.Task[None] | None) -> None:
        """Cancel `task` (a response) and wait for it to end."""
        if self._response is task:
            self._response = None
        if task is None or task.done():
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # this task was cancelled too, not only the response

    def _caller_audio(self, audio: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
        """The audio to transcribe: `audio`, after any speech whose reply was cut off unheard."""
        if self._unheard is None:
            return audio
        return np.concatenate([self._unheard.audio, audio])

    def _transcribe_early(self, pause: TurnPause) -> None:
        """Start transcribing at a pause, so the transcript is ready when the turn ends; with
        speculation on (and nothing else speaking), start the reply too, held at a gate."""
        self._discard_speculation("the caller paused again")
        self._drop_early()
        audio = self._caller_audio(pause.audio)
        if self.stt.busy:  # optional work: the recognizer's line is for finished turns now
            log.info("call %s: recognizer busy, no early transcription at this pause", self.call_id)
            self._skipped_at = pause.end_position
            self._end_of_turn.pause(pause.end_position, audio, None)
            return
        urgency = Urgency()  # behind finished turns' transcriptions, until its turn ends here
        task = asyncio.create_task(self.stt.transcribe(audio, urgency))
        self._early = _Early(pause.end_position, task, urgency)
        judging = self._end_of_turn.pause(pause.end_position, audio, task)  # may end the turn
        idle = self._response is None or self._response.done()
        if self.settings.speculate and idle and not self._keypad.collecting:
            words, gate = Unanswered(audio, TurnClock(pause.speech_ended_at), task), Gate()
            respond = functools.partial(self._respond, words, task, gate)
            held = judging.unless_going_on(gate, respond, words.clock, task)
            reply = asyncio.create_task(held)
            self._speculation = Speculation(pause.end_position, words, gate, reply)

    def _discard_speculation(self, why: str) -> None:
        spec, self._speculation = self._speculation, None
        if spec is None:
            return
        spec.gate.discard()
        if not spec.task.done():
            spec.task.cancel()
        log.info("call %s: speculative reply discarded: %s", self.call_id, why)

    def _count_discarded(self) -> None:
        """A speculative reply that had sent its LLM request was thrown away."""
        self.speculations_discarded += 1
        self._discarded_in_turn += 1
        self._emit({"type": "speculation_discarded", "count": self.speculations_discarded})

    def _release(self, spec: Speculation, segment: TurnSegment) -> None:
        """The turn ended at the speculation's pause: its held reply is the response now."""
        words = spec.words
        words.clock.mark("endpoint", segment.detected_at)
        words.clock.judgement = segment.judgement
        if self._early is not None and self._early.task is words.transcript:
            self._early.urgency.promote()
            self._early = None  # the reply awaits it: consumed, not cancelled
        self._drop_early()
        if self._unheard is not None and self._unheard.transcript is not None:
            self._unheard.transcript.cancel()  # its audio is in this transcript too
        # Until the transcript is in, a hang-up still records these words.
        pending = words.transcript is not None and not words.transcript.done()
        self._unheard = words if pending else None
        self._response = spec.task
        spec.gate.open()

    def _drop_early(self) -> None:
        if self._early is not None:
            self._early.task.cancel()
            self._early = None

    def _start_response(self, segment: TurnSegment) -> None:
        spec, self._speculation = self._speculation, None
        if spec is not None and spec.end_position == segment.end_position:
            if not spec.task.done():
                self._release(spec, segment)
                return
        elif spec is not None:
            self._speculation = spec
            self._discard_speculation("the turn ended at another pause")
        if self._response is not None and not self._response.done():
            # A turn can only end after speech started, which already cancelled any response.
            log.warning("call %s: turn ended while a response was running", self.call_id)
            self._response.cancel()
        early = None
        if self._early is not None and self._early.end_position == segment.end_position:
            self._early.urgency.promote()
            early, self._early = self._early.task, None
        self._drop_early()
        clock = TurnClock(segment.speech_ended_at, segment.judgement)
        clock.mark("endpoint", segment.detected_at)
        clock.early_skipped = self._skipped_at == segment.end_position
        audio = self._caller_audio(segment.audio)
        if self._unheard is not None and self._unheard.transcript is not None:
            self._unheard.transcript.cancel()  # its audio is transcribed again, with this turn's
        # The same audio was handed to STT when the caller paused, unless speech resumed.
        transcribing = early or asyncio.create_task(self.stt.transcribe(audio))
        # Kept on the call from here, not in the task: the caller may hang up before it runs.
        self._unheard = Unanswered(audio, clock, transcribing)
        self._response = asyncio.create_task(self._respond(self._unheard, transcribing))

    # -- one response -----------------------------------------------------------------------

    async def _respond(
        self,
        unheard: Unanswered,
        transcribing: asyncio.Task[Transcript],
        gate: Gate | None = None,
    ) -> None:
        try:
            # Shielded: after a hang-up, `_record_unanswered` still wants these words.
            transcript = await asyncio.shield(transcribing)
        except asyncio.CancelledError:
            if not self._ended:  # cut off: transcribed again with the caller's next turn
                transcribing.cancel()
                unheard.transcript = None
            raise
        clock = unheard.clock
        clock.mark("stt")
        clock.stt_earlier_s = transcript.earlier_s
        if self._unheard is unheard:
            self._unheard = None
        carried = self._carried.caller_text if self._carried is not None else ""
        said = " ".join(part for part in (carried, transcript.text.strip()) if part)
        if not transcript.text.strip():
            log.info("call %s: empty transcript, no reply", self.call_id)
            return
        if gate is not None and leaves_hanging(said):
            try:
                await gate.passed()  # no tokens spent on words the caller is likely to go on from
            except Discarded:
                return
        await self._reply(said, clock, round(transcript.inference_s * 1e3, 1), gate)

    async def _reply(
        self, said: str, clock: TurnClock, stt_ms: float | None, gate: Gate | None = None
    ) -> None:
        """Answer what the caller said (or keyed in): LLM -> sentences -> TTS -> transport.
        With a `gate` (a speculative reply) audio waits there, and the turn is taken (and
        recorded) only if the gate opens. A response that asks for tools is followed, in the
        same turn, by a round of tool calls and another request with their results; no tool
        runs before the gate has opened."""
        turn = len(self.records) + 1
        confirm = functools.partial(self._confirm_turn, turn, said)
        if gate is None:
            confirm()
        else:
            gate.bind(confirm)
        history = [*self.history, ChatMessage(role="user", content=said)]
        stream = self.llm.reply(history, clock.zero)
        streams = [stream]
        rounds: list[ToolRound] = []
        spoken: list[Spoken] = []
        generated: list[str] = []
        finished = False
        watchers: list[asyncio.Task[None]] = []

        async def speak(sentence: str) -> None:
            watchers.extend(await self._speak(sentence, spoken, clock, gate))

        try:
            # A notice cut short before is said again, in full, before this reply.
            watchers.extend(await self.notice.say(speak, spoken, gate))
            if stream.filler:
                await speak(stream.filler)
            splitter = SentenceSplitter(self.sentence_settings)
            while True:
                before = len(generated)
                try:
                    async for delta in stream:
                        clock.mark("llm_first_token")
                        generated.append(delta)
                        for sentence in splitter.push(delta):
                            await speak(sentence)
                except LLMError as exc:
                    log.error("call %s: no reply from the LLM: %s", self.call_id, exc)
                    splitter = SentenceSplitter(self.sentence_settings)
                    for sentence in splitter.push(self.settings.apology):
                        await speak(sentence)
                    break
                calls = tuple(stream.tool_calls)
                if not calls or self.tools is None:
                    break
                if len(rounds) >= self.tool_settings.max_rounds:
                    log.warning("call %s: tool rounds capped at %d", self.call_id, len(rounds))
                    if not spoken and not "".join(generated).strip():
                        for sentence in splitter.push(self.settings.apology):
                            await speak(sentence)  # never a silent turn
                    break
                for sentence in splitter.flush():  # "Let me look that up." before the wait
                    await speak(sentence)
                if gate is not None:
                    await gate.passed()  # nothing is done for words the caller may go on from
                tool_round = ToolRound("".join(generated[before:]), calls, len(spoken))
                rounds.append(tool_round)
                await self._tool_runner.run(tool_round, turn, self._tool_context(history), speak)
                history = [*history, *tool_round.messages(tool_round.text)]
                # The next request is planned as if the tools had taken no time: their round
                # trips are not the LLM's to make up for.
                stream = self.llm.reply(history, clock.zero + rounds_ms(rounds) / 1e3)
                streams.append(stream)
            for sentence in splitter.flush():
                await speak(sentence)
            if gate is not None:
                await gate.passed()  # a reply with nothing to say is taken only if confirmed
            if spoken:
                await self.transport.wait_played(spoken[-1].end)
            finished = True
        except (PlaybackCleared, Discarded):
            pass
        finally:
            for watcher in watchers:
                watcher.cancel()
            self.notice.stopped(spoken)
            for tool_round in rounds:
                await tool_round.cancel()
            try:
                for each in streams:
                    await each.aclose()
            finally:
                # Also when the caller hung up: this task is being cancelled, and the record
                # is written before the cancellation goes on.
                reply = Reply(turn, said, spoken, "".join(generated), finished, gate, rounds)
                self._finish_turn(reply, clock, stt_ms, streams)
        if finished:
            await self._carry_out(rounds)

    def _tool_context(self, history: Sequence[ChatMessage]) -> ToolContext:
        transcript = tuple(
            (m.role, m.content) for m in history if m.role in ("user", "assistant") and m.content
        )
        return ToolContext(self.call_id, self.caller, self.callee, transcript)

    async def _carry_out(self, rounds: Sequence[ToolRound]) -> None:
        """What the turn's tools asked of the call, now that the reply has been heard. One that
        fails changes its call's result in the history to say so."""
        for tool_round in rounds:
            for result in list(tool_round.results.values()):
                if result.action is None:
                    continue
                failure = await self._carry_out_action(result.action)
                if failure is not None:
                    self._correct_result(result.call.id, failure)

    async def _carry_out_action(self, action: CallAction) -> str | None:
        """Carry out `action`; why it failed (already told to the caller), or None."""
        log.info("call %s: %s", self.call_id, action)
        self._emit({"type": "action", "action": type(action).__name__})
        if self._on_action is not None:
            try:
                await self._on_action(action)
            except ActionFailed as exc:
                log.warning("call %s: %s failed: %s", self.call_id, action, exc.reason)
                # This task is the response ending: the caller hears why in the next one.
                self._response = asyncio.create_task(self._announce(exc.say))
                return exc.reason
        elif isinstance(action, EndCall):
            self.transport.hang_up(f"ended by the agent: {action.reason}")
        else:
            log.warning("call %s: nothing here can carry out %s", self.call_id, action)
        return None

    def _correct_result(self, tool_call_id: str, failure: str) -> None:
        """The history's result of `tool_call_id` becomes the failure: the model must not
        believe it happened."""
        for index, message in enumerate(self.history):
            if message.role == "tool" and message.tool_call_id == tool_call_id:
                output = json.dumps({"error": f"not done: {failure}"})
                self.history[index] = ChatMessage("tool", output, tool_call_id=tool_call_id)

    def _confirm_turn(self, turn: int, said: str) -> None:
        """The caller's words are a turn being answered: show them, and carry nothing over."""
        self._carried = None
        self._emit({"type": "transcript", "role": "caller", "turn": turn, "text": said})

    def _finish_turn(
        self,
        reply: Reply,
        clock: TurnClock,
        stt_ms: float | None,
        streams: Sequence[ReplyStream],
    ) -> None:
        stream = streams[0]
        # The controller learns from it either way; not from first audio that waited on tools.
        decision = stream.finish(llm_timings(clock, reply.rounds))
        for more in streams[1:]:
            more.finish({})  # a request after tool results: its own time to first token
        if reply.gate is not None and not reply.gate.opened:
            self._count_discarded()  # a speculation the caller spoke over: no turn
            return
        if not reply.finished:
            for tool_round in reply.rounds:
                tool_round.mark_not_done()
        played = self.transport.played_samples
        heard = heard_text(reply.spoken, played)
        record = answered_record(reply, heard, clock, stt_ms, stream, decision, self.llm)
        record.speculations_discarded = self._discarded_in_turn  # thrown away before this reply
        self._discarded_in_turn = 0
        if record.interrupted and not heard and not self._ended and not reply.rounds:
            # Nothing reached the caller: answer these words together with what comes next.
            # The record waits, in case the caller hangs up before then.
            log.info(
                "call %s: reply cut off before any audio; carrying the words over", self.call_id
            )
            self._carried = record
            return
        self._keep(record, turn_history(reply, played))

    def _keep(self, record: TurnRecord, messages: Sequence[ChatMessage] | None = None) -> None:
        """A turn is over: the history takes what was said and heard (`messages`, when tools
        were called: the calls and their results in between), the call its record."""
        if messages is not None:
            self.history.extend(messages)
        else:
            self.history.append(ChatMessage(role="user", content=record.caller_text))
            if record.reply_text:
                self.history.append(ChatMessage(role="assistant", content=record.reply_text))
        self.records.append(record)
        log.info(
            "call %s turn %d%s: %s",
            self.call_id,
            record.turn,
            " (interrupted)" if record.interrupted else "",
            record.timings_ms,
        )
        self._emit(
            {
                "type": "transcript",
                "role": "bot",
                "source": "bot",
                "turn": record.turn,
                "text": record.reply_text,
                "interrupted": record.interrupted,
            }
        )
        self._emit({"type": "turn", "record": record.to_dict()})
        if self._on_turn is not None:
            self._on_turn(record)

    async def _record_unanswered(self) -> None:
        """At hang-up, the caller's words that no record holds yet become turns of their own,
        with nothing heard: words carried over from a reply cut off unheard, then a turn that
        was still being transcribed (or was cut off while it was)."""
        carried, self._carried = self._carried, None
        if carried is not None:
            self._keep(carried)
        unheard, self._unheard = self._unheard, None
        if unheard is None:
            return
        transcript = await self._last_transcript(unheard)
        if transcript is None or not transcript.text.strip():
            return
        clock, said, turn = unheard.clock, transcript.text.strip(), len(self.records) + 1
        clock.mark("stt")
        self._emit({"type": "transcript", "role": "caller", "turn": turn, "text": said})
        self._keep(unanswered_record(turn, said, clock, transcript, self.llm))

    async def _last_transcript(self, unheard: Unanswered) -> Transcript | None:
        """The transcript of the speech the call ended on: the transcription under way if there
        is one, else a new one; waited for at most `hang_up_stt_s`."""
        task = unheard.transcript
        if task is None or task.cancelled():
            task = asyncio.create_task(self.stt.transcribe(unheard.audio))
        try:
            return await asyncio.wait_for(task, self.settings.hang_up_stt_s)
        except Exception:  # a timeout, or the recognizer failed: the words are lost
            log.warning(
                "call %s: the caller's last words could not be transcribed",
                self.call_id,
                exc_info=True,
            )
            return None

    async def _opening(self) -> None:
        """The notice (if any), then the greeting (if any)."""
        if self.notice.owed:
            await self._say("", self.notice)
        if self.settings.greeting:
            await self._say(self.settings.greeting)

    async def _announce(
        self, text: str, then: CallAction | None = None, source: str = ANNOUNCEMENT
    ) -> None:
        """Speak a fixed text (an operator's message); once heard in full, carry out `then`."""
        if await self._say(text, source=source) and then is not None:
            await self._carry_out_action(then)

    def _say(
        self, text: str, notice: Notice | None = None, source: str = ANNOUNCEMENT
    ) -> Awaitable[bool]:
        """Speak a fixed text (`pipeline.opening.announce`): history keeps what was heard, and
        watchers see it as a bot line spoken by `source`."""

        def heard(message: ChatMessage) -> None:
            event = {"type": "transcript", "role": "bot", "source": source}
            self._emit({**event, "text": message.content, "after_turn": len(self.records)})

        settings, history = self.sentence_settings, self.history
        return announce(text, self.transport, self._speak, settings, history, notice, source, heard)
