"""What `POST /campaigns` takes: the calls' common part (agent, provider, caller id, machine
detection, voicemail), how they are paced (concurrency, calling hours, retries) and the rows:
one number each, with its time zone and the variables the agent's words are rendered with.

Checked strictly and in one pass: unknown fields are refused, each problem is named by its
place (`rows[12].timezone: …`; after `MAX_PROBLEMS` of them the rest is not looked at), a
number is normalised to E.164 (and may appear once), and the body, the rows and each row's
variables have caps."""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from voice.agents.variables import VALUE_CHARS, VARIABLE_NAME
from voice.campaigns.dnc import e164
from voice.campaigns.hours import BadZone, Window, clock_time, zone
from voice.campaigns.rules import RetryRules
from voice.outbound.request import BadRequest, parse_request
from voice.server.api import MAX_JSON_DEPTH, json_nesting

CAMPAIGN_PROVIDERS = ("twilio", "telnyx", "vonage", "sip")
MAX_PROBLEMS = 20  # named in one refusal; the rest are counted
MAX_VARIABLES = 32  # per row
VARIABLES_BYTES = 3000  # of a row's variables as JSON (they ride in the call's 4 KB metadata)


class BadCampaign(ValueError):
    """Not a campaign Hotline can run; the message names each problem by its place."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


class CallingHours(BaseModel):
    model_config = ConfigDict(extra="forbid")

    start: str = "09:00"
    end: str = "20:00"

    @field_validator("start", "end")
    @classmethod
    def _time(cls, text: str) -> str:
        clock_time(text)
        return text

    def window(self) -> Window:
        return Window.of(self.start, self.end)


class CampaignHead(BaseModel):
    """Everything of a campaign but its rows."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    name: str = Field(default="", max_length=200, description="A label, for people.")
    agent: str = Field(max_length=64)
    transport: str = Field(default="twilio", max_length=16)
    from_: str | None = Field(default=None, alias="from", max_length=40)
    trunk: str | None = Field(default=None, max_length=64, description="SIP only.")
    ring_timeout_s: float | None = Field(default=None, description="SIP only.")
    concurrency: int = Field(default=5, ge=1, le=200, description="Calls at once, cluster-wide.")
    window: CallingHours = Field(default_factory=CallingHours)
    timezone: str = Field(default="UTC", description="For rows that name none.")
    retry: RetryRules = Field(default_factory=RetryRules)
    machine_detection: bool = False
    voicemail: str | None = Field(default=None, min_length=1, max_length=2000)

    @field_validator("window")
    @classmethod
    def _window(cls, hours: CallingHours) -> CallingHours:
        hours.window()  # ValueError names what is wrong
        return hours

    @field_validator("transport")
    @classmethod
    def _provider(cls, transport: str) -> str:
        if transport not in CAMPAIGN_PROVIDERS:
            raise ValueError(
                f"{transport!r}: campaigns call through {', '.join(CAMPAIGN_PROVIDERS)}"
            )
        return transport

    @field_validator("timezone")
    @classmethod
    def _zone(cls, name: str) -> str:
        zone(name)
        return name


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid")

    to: str
    timezone: str | None = None
    variables: dict[str, str | int | float | bool | None] = Field(default_factory=dict)


@dataclass(frozen=True)
class CampaignRow:
    """One number to call: E.164, its time zone's name, its variables (all text)."""

    to: str
    timezone: str
    variables: dict[str, str]


@dataclass(frozen=True)
class CampaignSpec:
    head: CampaignHead
    rows: list[CampaignRow]
    voicemail_given: bool = False  # `voicemail` was in the request (null: hang up)
    problems: list[str] = field(default_factory=list)

    def spec_json(self) -> str:
        """The head as stored with the campaign (the rows are stored one by one)."""
        data = self.head.model_dump(mode="json", by_alias=True)
        data["voicemail_given"] = self.voicemail_given
        return json.dumps(data, separators=(",", ":"))


def parse_campaign(body: bytes, agents: Collection[str], max_rows: int) -> CampaignSpec:
    """`body` (JSON) as a campaign of agents among `agents`; BadCampaign otherwise. Costs its
    length: call it in a worker thread for big bodies."""
    if json_nesting(body, stop_beyond=MAX_JSON_DEPTH).depth > MAX_JSON_DEPTH:
        raise BadCampaign(f"body nests JSON deeper than {MAX_JSON_DEPTH} levels", 400)
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise BadCampaign("body is not valid JSON", 400) from None
    if not isinstance(data, dict):
        raise BadCampaign("body must be a JSON object", 400)
    rows = data.get("rows")
    if not isinstance(rows, list) or not rows:
        raise BadCampaign("rows: required, a list of at least one {to, timezone, variables}")
    if len(rows) > max_rows:
        raise BadCampaign(f"rows: {len(rows)} rows, more than the {max_rows} allowed")
    try:
        head = CampaignHead.model_validate({k: v for k, v in data.items() if k != "rows"})
    except ValidationError as exc:
        raise BadCampaign("; ".join(_problem(e) for e in exc.errors())) from None
    _check_call(head, "voicemail" in data, agents)
    problems: list[str] = []
    parsed = _rows(rows, head.timezone, problems)
    if problems:
        raise BadCampaign("; ".join(problems))
    return CampaignSpec(head, parsed, voicemail_given="voicemail" in data)


def _check_call(head: CampaignHead, voicemail_given: bool, agents: Collection[str]) -> None:
    """The campaign's calls as `POST /calls/outbound` would check one of them."""
    probe: dict[str, Any] = {
        "to": "+15550000000",
        "agent": head.agent,
        "transport": head.transport,
        "machine_detection": head.machine_detection,
    }
    for name in ("from", "trunk", "ring_timeout_s"):  # absent: as the request leaves it out
        value = getattr(head, "from_" if name == "from" else name)
        if value is not None:
            probe[name] = value
    if voicemail_given:
        probe["voicemail"] = head.voicemail
    try:
        parse_request(probe, agents)
    except BadRequest as exc:
        raise BadCampaign(str(exc)) from None


def _rows(rows: list[Any], default_zone: str, problems: list[str]) -> list[CampaignRow]:
    parsed: list[CampaignRow] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(rows):
        if len(problems) >= MAX_PROBLEMS:
            problems.append(f"rows[{index}] on: not checked")
            break
        where = f"rows[{index}]"
        try:
            row = Row.model_validate(raw)
        except ValidationError as exc:
            for error in exc.errors():
                said = _problem(error)
                problems.append(f"{where}.{said}" if error["loc"] else f"{where}: {said}")
            continue
        try:
            number = e164(row.to)
        except ValueError as exc:
            problems.append(f"{where}.to: {exc}")
            continue
        if number in seen:
            problems.append(f"{where}.to: {number} is rows[{seen[number]}] already")
            continue
        seen[number] = index
        timezone = row.timezone or default_zone
        try:
            zone(timezone)
        except BadZone as exc:
            problems.append(f"{where}.timezone: {exc}")
            continue
        variables = _variables(row.variables, where, problems)
        if variables is not None:
            parsed.append(CampaignRow(number, timezone, variables))
    return parsed


def _variables(given: dict[str, Any], where: str, problems: list[str]) -> dict[str, str] | None:
    if len(given) > MAX_VARIABLES:
        problems.append(f"{where}.variables: more than {MAX_VARIABLES}")
        return None
    variables: dict[str, str] = {}
    for name, value in given.items():
        if VARIABLE_NAME.fullmatch(name) is None:
            problems.append(f"{where}.variables: {name[:70]!r} is not a name ([A-Za-z_]\\w*)")
            return None
        text = "" if value is None else str(value)
        text = text.lower() if isinstance(value, bool) else text
        if len(text) > VALUE_CHARS:
            problems.append(f"{where}.variables.{name}: longer than {VALUE_CHARS} characters")
            return None
        variables[name] = text
    if len(json.dumps(variables, separators=(",", ":"))) > VARIABLES_BYTES:
        problems.append(f"{where}.variables: longer than {VARIABLES_BYTES} bytes as JSON")
        return None
    return variables


def _problem(error: Any) -> str:
    where = ".".join("from" if part == "from_" else str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown field"
    if error["type"] == "missing":
        return f"{where}: required"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message
