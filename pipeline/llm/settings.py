"""What the LLM step is configured with: the provider and its tiers (`LLMSettings`), and the
latency budget controller's knobs (`ControllerSettings`). The server reads both from the
environment (``HOTLINE_LLM__*``, ``HOTLINE_CONTROLLER__*``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, SecretStr

from pipeline.llm.tiers import REASONING_TOKENS, LLMTier, default_tiers

DEFAULT_SYSTEM_PROMPT = (
    "You are a friendly voice assistant talking with a caller on the phone. Everything you "
    "write is spoken aloud by a text-to-speech voice, so answer in plain spoken sentences: no "
    "markdown, lists, emoji, links or symbols. Keep each reply short, one to three sentences, "
    "and ask at most one question at a time. Say numbers, dates and times the way a person "
    "would say them. If you did not understand the caller, ask them to repeat."
)


class LLMSettings(BaseModel):
    """Which provider and model to call, and how (env prefix ``HOTLINE_LLM__`` in the server)."""

    base_url: str | None = Field(
        default=None, description="OpenAI-compatible base URL; None: the embedded simulator."
    )
    api_key: SecretStr = SecretStr("sk-hotline-simulated")
    model: str = "hotline-sim"
    api: Literal["chat", "responses"] = Field(
        default="chat", description="Chat Completions or the Responses API."
    )
    # What `LLMClient.stream()` sends when the caller names no tier or effort (tools, tests).
    # Calls never rely on these: each turn's tier and effort come from the controller's plan.
    service_tier: str | None = Field(
        default="priority", description="The service_tier requested; None: send none."
    )
    reasoning_effort: str | None = Field(
        default="low", description="Reasoning effort; None: send no reasoning field."
    )
    max_output_tokens: int = Field(
        default=160, gt=0, description="Cap on generated tokens, reasoning tokens included."
    )
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    tiers: list[LLMTier] = Field(
        default_factory=default_tiers,
        min_length=1,
        description="Tiers in fallback order; a turn that fails on one falls back to the next.",
    )
    first_token_grace_ms: float = Field(
        default=750.0,
        ge=0,
        description="A request with no first token this long after the plan's first-token "
        "deadline counts as failed: the turn falls back to the next tier.",
    )
    connect_timeout_s: float = Field(default=3.0, gt=0, description="TCP/TLS connect timeout.")
    keepalive_s: float = Field(
        default=120.0,
        gt=0,
        description="How long an idle connection to the provider is kept for the next request "
        "(HTTPX2's 5 s closed it between a call's turns: a new TCP and TLS handshake each turn).",
    )
    timeout_s: float = Field(
        default=30.0, gt=0, description="Longest wait for the provider's next bytes."
    )
    max_retries: int = Field(
        default=0, ge=0, description="SDK retries with backoff; 0 leaves fallback to the caller."
    )


class ControllerSettings(BaseModel):
    """The knobs of the controller (see `pipeline.llm.estimates` for the model, and
    `pipeline.llm.controller` for the planning)."""

    budget_ms: float = Field(default=1000.0, gt=0, description="End of speech -> first audio.")
    quantile: float = Field(default=0.9, gt=0.5, lt=1, description="Plans fit at this quantile.")
    half_life_turns: float = Field(default=2.0, gt=0, description="Observation weight half-life.")
    prior_weight: float = Field(default=1.0, ge=0, description="Priors count as N observations.")
    prior_spread: float = Field(default=0.2, ge=0, description="Prior sd / prior mean.")
    min_spread: float = Field(default=0.05, ge=0, description="Floor on learned sd / mean.")
    first_sentence_tokens: int = Field(default=12, ge=1, description="Visible tokens to budget.")
    tts_prior_ms: float = Field(default=100.0, ge=0, description="First sentence -> first audio.")
    reasoning_tokens: dict[str, float] = Field(
        default_factory=lambda: dict(REASONING_TOKENS),
        min_length=1,
        description="Prior reasoning tokens per effort, lowest effort first (sets the order).",
    )
    reply_tokens: int = Field(default=160, ge=1, description="Visible tokens allowed per reply.")
    cooldown_s: float = Field(default=5.0, ge=0, description="Tier rest after a failure.")
    cooldown_max_s: float = Field(
        default=60.0, ge=0, description="Rests double with each failure in a row, up to this."
    )
    hedge: bool = Field(default=False, description="Plan a second request at the deadline.")
    filler: bool = Field(default=False, description="Offer a filler phrase when nothing fits.")
    filler_phrases: list[str] = Field(
        default_factory=lambda: ["One moment.", "Let me see.", "Okay, so."], min_length=1
    )
