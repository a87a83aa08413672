"""What a reply did, what the caller heard of it, and the turn record it leaves.

Positions are reply samples on the transport's outbound clock: a sentence is `Spoken` at
[start, end), and the played position at the end of the turn says how much of it was heard.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.llm.client import ChatMessage
from pipeline.llm.decision import Decision
from pipeline.records import TurnClock, TurnRecord
from pipeline.services import LanguageModel, ReplyStream
from pipeline.speculation import Gate
from pipeline.stt import Transcript
from pipeline.tool_turns import ToolRound, rounds_ms


@dataclass
class Spoken:
    """A sentence queued for playback at outbound positions [start, end)."""

    text: str
    start: int
    end: int


@dataclass
class Reply:
    """What one response did: the turn it answers, what it queued and generated."""

    turn: int
    said: str
    spoken: list[Spoken]
    generated: str
    finished: bool  # played to its end
    gate: Gate | None  # held at a pause's gate (speculative), or None
    rounds: list[ToolRound] = field(default_factory=list)  # tool calls, in order


def heard_text(spoken: Sequence[Spoken], played: int) -> str:
    """The part of the spoken sentences the caller heard, given the played position.

    Sentences played in full are kept whole; the sentence playing when the caller cut in keeps
    the share of its words proportional to the share of its audio that was played.
    """
    parts: list[str] = []
    for sentence in spoken:
        if played >= sentence.end:
            parts.append(sentence.text)
        elif played > sentence.start:
            words = sentence.text.split()
            share = (played - sentence.start) / (sentence.end - sentence.start)
            kept = words[: int(len(words) * share)]
            if kept:
                parts.append(" ".join(kept) + " —")
            break
        else:
            break
    return " ".join(parts)


def answered_record(
    reply: Reply,
    heard: str,
    clock: TurnClock,
    stt_ms: float | None,
    stream: ReplyStream,
    decision: Decision | None,
    llm: LanguageModel,
) -> TurnRecord:
    """The record of a turn that was answered (or whose answer was cut off): `heard` is what
    the caller heard of the reply."""
    ttft = None
    if stream.first_token_at is not None:
        ttft = round((stream.first_token_at - stream.requested_at) * 1e3, 1)
    return TurnRecord(
        turn=reply.turn,
        caller_text=reply.said,
        reply_text=heard,
        generated_text=reply.generated,
        interrupted=not reply.finished,
        effort=stream.effort,
        service_tier_requested=stream.service_tier_requested,
        service_tier_served=stream.service_tier_served,
        reason=decision.reason if decision else "",
        timings_ms=clock.ms(),
        stt_inference_ms=stt_ms,
        llm_ttft_ms=ttft,
        reasoning_tokens=stream.reasoning_tokens,
        output_tokens=stream.output_tokens,
        started_at=time.time() - (time.monotonic() - clock.zero),
        experiment=llm.experiment,
        arm=llm.arm,
        budget_ms=decision.budget_ms if decision else None,
        decision=decision,
        speculative=reply.gate is not None,
        tools=[row for tool_round in reply.rounds for row in tool_round.summary()],
        tools_ms=rounds_ms(reply.rounds) if reply.rounds else None,
        turn_score=clock.turn_score,
        turn_delay_ms=clock.turn_delay_ms,
        stt_earlier_s=round(clock.stt_earlier_s, 2),
        stt_early_skipped=clock.early_skipped,
        reply_gaps=list(clock.gaps),
        reply_fillers=clock.fillers,
    )


def unanswered_record(
    turn: int, said: str, clock: TurnClock, transcript: Transcript, llm: LanguageModel
) -> TurnRecord:
    """The record of words the caller said just before hanging up: nothing was answered."""
    return TurnRecord(
        turn=turn,
        caller_text=said,
        reply_text="",
        generated_text="",
        interrupted=True,
        effort=None,
        service_tier_requested=None,
        service_tier_served=None,
        reason="the caller hung up before the reply",
        timings_ms=clock.ms(),
        stt_inference_ms=round(transcript.inference_s * 1e3, 1),
        started_at=time.time() - (time.monotonic() - clock.zero),
        experiment=llm.experiment,
        arm=llm.arm,
        turn_score=clock.turn_score,
        turn_delay_ms=clock.turn_delay_ms,
        stt_earlier_s=round(clock.stt_earlier_s, 2),
        stt_early_skipped=clock.early_skipped,
        reply_gaps=list(clock.gaps),
        reply_fillers=clock.fillers,
    )


def turn_history(reply: Reply, played: int) -> list[ChatMessage] | None:
    """A turn with tool calls as the history keeps it: the caller's words, then each round
    (what the caller heard before its calls, the calls, their results), then what they heard
    after the last round. None for a turn without tools (the plain user/assistant pair)."""
    if not reply.rounds:
        return None
    messages = [ChatMessage(role="user", content=reply.said)]
    start = 0
    for tool_round in reply.rounds:
        heard = heard_text(reply.spoken[start : tool_round.spoken_before], played)
        messages.extend(tool_round.messages(heard))
        start = tool_round.spoken_before
    rest = heard_text(reply.spoken[start:], played)
    if rest:
        messages.append(ChatMessage(role="assistant", content=rest))
    return messages


def llm_timings(clock: TurnClock, rounds: Sequence[ToolRound]) -> dict[str, float]:
    """The turn's timings for the controller: when first audio waited on tools (nothing was
    said before the first round), the stages after the LLM's first token are left out."""
    timings = clock.ms()
    if not rounds or rounds[0].spoken_before > 0:
        return timings
    return {k: v for k, v in timings.items() if k in ("endpoint", "stt", "llm_first_token")}
