"""A call as the switchboard keeps it (`Call`, from admission to hang-up) and as the calls API
and the post-call webhook show it (`CallRecord`, all that is kept once it ended); what may be a
call id; why a call may not start (`CallsFull`)."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field, replace

from pipeline.conversation import Conversation
from pipeline.llm.client import ChatMessage
from pipeline.records import TurnRecord
from voice.agents.runtime import ReadyAgent
from voice.recordings.calls import RecordingLocation
from voice.recordings.recorder import CallRecorder
from voice.server.end_reasons import end_category
from voice.transports.listen_in import Listeners


def recording_url(call_id: str, public_url: str | None = None) -> str:
    """The calls API's link to a call's recording (absolute when the public URL is set)."""
    path = f"/calls/{call_id}/recording"
    return f"{public_url.rstrip('/')}{path}" if public_url else path


def recording_view(
    call_id: str, location: RecordingLocation | None, public_url: str | None = None
) -> dict[str, object] | None:
    """A recording as the calls API and the post-call webhook show it (None: not recorded)."""
    if location is None:
        return None
    return {
        "url": recording_url(call_id, public_url),
        "content_type": location.content_type,
        "duration_s": location.duration_s,
        "bytes": location.bytes,
        "s3_key": location.s3_key,
    }


def notice_view(outcome: dict[str, object] | None, recorded: bool) -> dict[str, object] | None:
    """The recording notice as the calls API and the post-call webhook show it
    (`pipeline.opening`): heard in full or not, its tries and how many were cut short, whether
    the call was recorded, and why not (None: the call had no notice)."""
    if outcome is None:
        return None
    return {**outcome, "recording": recorded}


@dataclass(frozen=True)
class CallRecord:
    """A call as the calls API shows it: summary fields, turn records and the history the caller
    heard. Of an ended call the switchboard keeps only this, never its conversation (transport,
    audio buffers, resamplers, LLM streams), which would cost memory for every call kept."""

    call_id: str
    transport: str
    caller: str | None
    callee: str | None
    started_at: float
    ended_at: float | None
    wants_human: bool
    experiment: str | None
    arm: str | None
    end_reason: str | None
    records: tuple[TurnRecord, ...]
    history: tuple[ChatMessage, ...]
    transfer: dict[str, str] | None = None  # where the caller was put through: to, reason, summary
    agent: str = "default"  # the agent that answered
    recording: dict[str, object] | None = None  # where its recording is (RecordingLocation)
    notice: dict[str, object] | None = None  # what became of the recording notice (notice_view)
    direction: str = "inbound"  # or "outbound": Hotline placed the call (voice/outbound/)
    metadata: dict[str, object] | None = None  # an outbound call's, from its request
    # with machine detection: who answered (pipeline.answering.screening.Screening.answered_by)
    answered_by: dict[str, object] | None = None
    outcome: dict[str, object] | None = None  # a SIP call placed: how it went (outbound/sip.py)

    @property
    def state(self) -> str:
        if self.ended_at is None:
            return "active"
        return "failed" if (self.outcome or {}).get("cause", "answered") != "answered" else "ended"

    def summary(self) -> dict[str, object]:
        return {
            "call_id": self.call_id,
            "transport": self.transport,
            "caller": self.caller,
            "callee": self.callee,
            "state": self.state,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "turns": len(self.records),
            "wants_human": self.wants_human,
            "experiment": self.experiment,
            "arm": self.arm,
            "end_reason": self.end_reason,
            # its fixed category (voice.server.end_reasons), once it ended
            "end_category": end_category(self.end_reason) if self.ended_at is not None else None,
            "transfer": self.transfer,
            "agent": self.agent,
            "direction": self.direction,
            "metadata": self.metadata,
            "answered_by": self.answered_by,
            "outcome": self.outcome,
        }

    def detail(self) -> dict[str, object]:
        return {
            **self.summary(),
            "records": [record.to_dict() for record in self.records],
            "history": [_message(m) for m in self.history],
            "recording": recording_view(self.call_id, RecordingLocation.of(self.recording)),
            "notice": self.notice,
        }

    def with_recording(self, recording: dict[str, object]) -> CallRecord:
        return replace(self, recording=recording)


@dataclass
class Call:
    """One call from admission to hang-up."""

    call_id: str
    transport: str
    conversation: Conversation
    caller: str | None = None
    callee: str | None = None
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    wants_human: bool = False  # the caller asked for a person (keypad) or was put through to one
    experiment: str | None = None
    arm: str | None = None
    task: asyncio.Task[None] | None = None
    transfer: dict[str, str] | None = None  # set when the agent puts the caller through
    agent: ReadyAgent | None = None
    recorder: CallRecorder | None = None  # while it is recorded
    listeners: Listeners | None = None  # supervisors listening in
    recording: dict[str, object] | None = None  # once it ended: where (RecordingLocation)
    direction: str = "inbound"  # or "outbound" (voice/outbound/)
    metadata: dict[str, object] | None = None  # an outbound call's, from its request
    outcome: dict[str, object] | None = None  # a SIP call placed: how its INVITE went

    @property
    def state(self) -> str:
        return "ended" if self.ended_at is not None else "active"

    def record(self) -> CallRecord:
        """The call as it stands now; later turns do not change the copy."""
        conversation = self.conversation
        return CallRecord(
            self.call_id,
            self.transport,
            self.caller,
            self.callee,
            self.started_at,
            self.ended_at,
            self.wants_human,
            self.experiment,
            self.arm,
            conversation.end_reason,
            tuple(conversation.records),
            tuple(conversation.history),
            self.transfer,
            self.agent.name if self.agent is not None else "default",
            self.recording,
            self.notice(),
            self.direction,
            self.metadata,
            answering.answered_by() if (answering := conversation.answering) else None,
            self.outcome,
        )

    def notice(self) -> dict[str, object] | None:
        """What became of the call's recording notice (None: it had none)."""
        recorded = self.recorder is not None or self.recording is not None
        return notice_view(self.conversation.notice.state(), recorded)

    def summary(self) -> dict[str, object]:
        return self.record().summary()

    def detail(self) -> dict[str, object]:
        return self.record().detail()


def _message(message: ChatMessage) -> dict[str, object]:
    """A history message for the calls API: role and content, who spoke a message the caller
    heard (`source`: bot, operator or announcement), and a tool call's or result's ids and
    arguments."""
    out: dict[str, object] = {"role": message.role, "content": message.content}
    if message.role == "assistant":
        out["source"] = message.source or "bot"
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "name": c.name, "arguments": c.arguments} for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


class CallsFull(Exception):
    """The call may not start: `reason` is capacity, draining, duplicate, or what Redis said."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"call refused: {reason}")
        self.reason = reason


# A provider's call id (Twilio CallSid, Telnyx call_control_id, Vonage uuid) becomes ours: it
# goes into logs, Redis keys and URLs, so only plain characters are accepted.
_CALL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def valid_call_id(call_id: str) -> bool:
    return _CALL_ID.fullmatch(call_id) is not None
