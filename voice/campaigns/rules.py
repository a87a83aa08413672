"""What became of one dial of a campaign row (`Outcome`), as the provider or the call's record
says it, and whether the row is dialled again (`RetryRules`): pure functions.

A row's status is `queued` (waiting for its turn, its calling hours or a retry), `dialling`
(a worker holds it and asks the provider), `ringing` (the provider took the call: ringing, or
answered and talking), or final: `answered` (a person, or nobody asked: no machine detection),
`machine`, `busy`, `no_answer`, `failed` (refused by the provider, or no media stream),
`dnc` (on the do-not-call list when its turn came: never dialled then) or `stopped`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Outcome = Literal["answered", "machine", "busy", "no_answer", "failed", "dnc"]
FINAL = ("answered", "machine", "busy", "no_answer", "failed", "dnc", "stopped")
IN_FLIGHT = ("dialling", "ringing")
STATUSES = ("queued", *IN_FLIGHT, *FINAL)
MAX_BACKOFF_S = 24 * 3600.0

# Twilio's final CallStatus values (https://www.twilio.com/docs/voice/api/call-resource#call-
# status-values) for a call that was never answered; `completed` means it was answered.
TWILIO_UNANSWERED: Mapping[str, Outcome] = {
    "busy": "busy",
    "no-answer": "no_answer",
    "failed": "failed",
    "canceled": "failed",
}

# Telnyx's `call.hangup` `hangup_cause` (https://developers.telnyx.com/api-reference/callbacks/
# call-hangup) in Twilio's words; any other cause (normal_clearing, time_limit, unspecified):
# `completed`, and the call's record says whether it talked.
TELNYX_HANGUP: Mapping[str, str] = {
    "user_busy": "busy",
    "timeout": "no-answer",
    "no_answer": "no-answer",
    "call_rejected": "failed",
    "not_found": "failed",
    "originator_cancel": "canceled",
}

# Vonage's event `status` (https://developer.vonage.com/en/voice/voice-api/webhook-reference#
# event-webhook) in Twilio's words; the others (started, ringing, answered…) are not asked for.
VONAGE_STATUS: Mapping[str, str] = {
    "busy": "busy",
    "timeout": "no-answer",
    "unanswered": "no-answer",
    "rejected": "failed",
    "failed": "failed",
    "cancelled": "canceled",
    "completed": "completed",
}

# A SIP call's `outcome.cause` (voice/outbound/sip.py) when it never connected.
SIP_UNANSWERED: Mapping[str, Outcome] = {
    "busy": "busy",
    "no_answer": "no_answer",
    "rejected": "failed",
    "failed": "failed",
    "unreachable": "failed",
    "cancelled": "failed",
}


class RetryRules(BaseModel):
    """How many times in all a row may be dialled when its last dial was busy, not answered or
    reached a machine; and how long before a retry: `backoff_s`, doubling with each retry."""

    model_config = ConfigDict(extra="forbid")

    busy: int = Field(default=3, ge=1, le=10, description="Attempts at most after busy.")
    no_answer: int = Field(default=2, ge=1, le=10, description="…after no answer.")
    machine: int = Field(default=1, ge=1, le=10, description="…after a machine answered.")
    backoff_s: float = Field(default=300.0, ge=0, le=MAX_BACKOFF_S)

    def retry_in(self, outcome: str, attempts: int) -> float | None:
        """Seconds until the row is dialled again after `attempts` dials, the last of which
        came to `outcome`; None when it is not (answered, failed, or its attempts are spent)."""
        limit = {"busy": self.busy, "no_answer": self.no_answer, "machine": self.machine}
        if outcome not in limit or attempts >= limit[outcome]:
            return None
        return min(self.backoff_s * 2.0 ** max(0, attempts - 1), MAX_BACKOFF_S)


def outcome_of_record(
    answered_by: Mapping[str, object] | None, outcome: Mapping[str, object] | None = None
) -> Outcome:
    """An ended call's outcome from its record: a SIP call that never connected by its cause
    (`outcome`); else `machine` when the machine detection said so, else `answered` (a person,
    unknown, or no detection asked for)."""
    cause = outcome.get("cause") if outcome is not None else None
    if isinstance(cause, str) and cause in SIP_UNANSWERED:
        return SIP_UNANSWERED[cause]
    if answered_by is not None and answered_by.get("result") == "machine":
        return "machine"
    return "answered"
