"""Campaign settings (`HOTLINE_CAMPAIGNS__*`)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class CampaignSettings(BaseModel):
    """How this worker's campaign runner works (voice/campaigns/)."""

    # Rows one campaign may have, and the largest `POST /campaigns` body.
    max_rows: int = Field(default=10_000, ge=1, le=100_000)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    # How often the runner looks at the campaigns for due rows and calls that ended (it also
    # looks at once when a campaign is created or resumed here).
    tick_s: float = Field(default=0.5, gt=0, le=60)
    # A row being dialled is this worker's for this long; a worker that dies meanwhile leaves
    # it to be taken again by another once it runs out. Longer than a provider's create.
    lease_s: float = Field(default=30.0, gt=0)
    # How often a ringing or answered row's call is looked at in the call records.
    check_s: float = Field(default=1.0, gt=0)
    # A placed call with no status from the provider and no media stream this long after it
    # was placed counts as not answered (None: HOTLINE_OUTBOUND__ANSWER_WITHIN_S + 30 s).
    no_answer_after_s: float | None = Field(default=None, gt=0)
    # An ended campaign (its rows, their outcomes) is kept this long.
    retention_s: int = Field(default=30 * 24 * 3600, ge=60)
    # Added to this worker's clock where calling hours are decided (which hour it is in each
    # callee's time zone); for rehearsals and tests. Leases, retries and records use the clock.
    clock_offset_s: float = 0.0
