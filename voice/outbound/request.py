"""What `POST /calls/outbound` takes: who to call, from which number, which agent talks, through
which provider, and metadata that rides along to the call record and the post-call webhook.
Unknown fields are refused, so a misspelt option fails loudly instead of doing nothing."""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from voice.transports.sip.trunk import NUMBER, target_problem

E164 = re.compile(r"\+[1-9][0-9]{6,14}")  # whole string
PROVIDERS = ("twilio", "telnyx", "vonage", "sip")
HANG_UP = "hang_up"  # as the voicemail: hang up on a machine without a message
METADATA_BYTES = 4096  # of the metadata as JSON: it goes into every copy of the call record


class BadRequest(ValueError):
    """The request is not one Hotline can place; the message names each problem by field."""


class OutboundRequest(BaseModel):
    """One call to place."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    to: str = Field(
        description="The number to call, E.164 (+15551234567); over SIP also an "
        "extension or a sip: URI."
    )
    from_: str | None = Field(
        default=None,
        alias="from",
        description="The caller id, E.164: the provider's number (SIP: default the trunk's).",
    )
    agent: str = Field(description="The agent that talks (an agent file's name, or default).")
    transport: Literal["twilio", "telnyx", "vonage", "sip"] = "twilio"
    trunk: str | None = Field(
        default=None, description="SIP only: the trunk (HOTLINE_SIP__TRUNKS) to call through."
    )
    ring_timeout_s: float | None = Field(
        default=None, gt=0, le=600, description="SIP only: ring this long, then give up."
    )
    metadata: dict[str, Any] = Field(default_factory=dict)
    machine_detection: bool = Field(
        default=False, description="Tell a person from an answering machine before talking."
    )
    voicemail: str | None = Field(
        default=None,
        min_length=1,
        max_length=2000,
        description="Left on a machine after its beep; null or hang_up: hang up without a "
        "message; absent: the agent's voicemail (none: hang up).",
    )

    @model_validator(mode="after")
    def _voicemail_needs_detection(self) -> OutboundRequest:
        if "voicemail" in self.model_fields_set and not self.machine_detection:
            raise ValueError("voicemail: needs machine_detection: true")
        return self

    @model_validator(mode="after")
    def _numbers(self) -> OutboundRequest:
        """E.164 numbers, but over SIP: `to` may be an extension or a SIP URI, `from` an
        extension or absent (the trunk's); `trunk` and `ring_timeout_s` are SIP's alone."""
        sip = self.transport == "sip"
        for name in ("trunk", "ring_timeout_s"):
            if getattr(self, name) is not None and not sip:
                raise ValueError(f"{name}: only with transport sip")
        problem = target_problem(self.to) if sip else _not_e164(self.to)
        if problem is not None:
            raise ValueError(f"to: {problem}")
        if self.from_ is None and not sip:
            raise ValueError("from: required")
        if self.from_ is not None:
            wrong = NUMBER.fullmatch(self.from_) is None if sip else _not_e164(self.from_)
            if wrong:
                raise ValueError(f"from: {self.from_!r} is not a phone number")
        return self

    @property
    def caller(self) -> str:
        """The caller id (a provider's calls always have one: `from` is required for them)."""
        return self.from_ or ""

    def voicemail_message(self, agents_own: str | None) -> str | None:
        """What a machine is told (None: hang up): the request's message, else the agent's."""
        if "voicemail" not in self.model_fields_set:
            return agents_own
        return None if self.voicemail in (None, HANG_UP) else self.voicemail

    @field_validator("metadata")
    @classmethod
    def _small(cls, metadata: dict[str, Any]) -> dict[str, Any]:
        if len(json.dumps(metadata, separators=(",", ":"))) > METADATA_BYTES:
            raise ValueError(f"longer than {METADATA_BYTES} bytes as JSON")
        return metadata


def _not_e164(number: str) -> str | None:
    if E164.fullmatch(number) is None:
        return f"{number!r} is not a phone number in E.164 form (+15551234567)"
    return None


def parse_request(data: dict[str, Any], agents: Collection[str]) -> OutboundRequest:
    """`data` as a request to place, with an agent among `agents`; BadRequest otherwise."""
    try:
        request = OutboundRequest.model_validate(data)
    except ValidationError as exc:
        raise BadRequest("; ".join(_problem(e) for e in exc.errors())) from None
    if request.agent not in agents:
        known = ", ".join(sorted(agents))
        raise BadRequest(f"agent: no agent {request.agent!r} (known: {known})")
    return request


def _problem(error: Any) -> str:
    where = ".".join("from" if part == "from_" else str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown field (known: {', '.join(_FIELDS)})"
    if error["type"] == "missing":
        return f"{where}: required"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


_FIELDS = (
    "to",
    "from",
    "agent",
    "transport",
    "metadata",
    "machine_detection",
    "voicemail",
    "trunk",
    "ring_timeout_s",
)
