"""Outbound call settings (`HOTLINE_OUTBOUND__*`)."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr

from pipeline.answering.screening import ScreeningSettings


class OutboundSettings(BaseModel):
    """How Hotline places calls (voice/outbound/)."""

    # Calls placed per second through each provider, by the whole cluster (a token bucket in
    # Redis holding as many calls as one second's worth, at least one; each worker's own while
    # Redis is away). Twilio's accounts start at 1 CPS and queue what is beyond; over this
    # limit Hotline answers 429 with Retry-After instead (campaigns wait).
    calls_per_second: float = Field(default=1.0, gt=0)
    # How long a placed call may take to be answered: its stream token and its record (agent,
    # metadata) wait this long for the media stream (Twilio rings for 60 s by default).
    answer_within_s: float = Field(default=120.0, gt=0)
    # Where the provider posts the call's progress (Twilio `StatusCallback`), if anywhere.
    status_callback_url: str | None = None
    # What checks the providers' signatures on the call events of campaign calls
    # (voice/campaigns/status.py): Telnyx's public key (base64, Mission Control: Keys &
    # Credentials) and Vonage's signature secret (the Dashboard's account settings).
    telnyx_public_key: str | None = None
    vonage_signature_secret: SecretStr | None = None
    # Answering-machine detection on calls placed with machine_detection (pipeline/answering/).
    answering: ScreeningSettings = Field(default_factory=ScreeningSettings)
