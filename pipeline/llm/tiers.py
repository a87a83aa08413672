"""The tiers a turn may be sent to, and the reasoning efforts they offer.

A *tier* is one of our profiles, named in the settings (``fast``, ``standard``): the controller
plans on it, the router keeps a client for it, and decisions and attempts name it. A *service
tier* is the ``service_tier`` field of a request: what a tier sends to the provider
(``priority``, ``default``), and what the provider echoes back as having served the request.
Turn records keep both service tiers, ``service_tier_requested`` and ``service_tier_served``;
their decision names the tier.

`TierOption` is the controller's view of a tier (its service tier, efforts, price and priors);
`LLMTier` adds where and how to reach it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
# Default reasoning-token priors per effort: what the simulator spends.
REASONING_TOKENS = dict(zip(EFFORTS, (0.0, 16.0, 64.0, 256.0, 1024.0, 2048.0, 4096.0), strict=True))


class TierOption(BaseModel):
    """One way to call the LLM: a service tier, the efforts it takes, its price and priors."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="Our label for the tier, e.g. 'fast'.")
    service_tier: str | None = Field(description="The service_tier sent; None: send none.")
    efforts: tuple[str, ...] = Field(default=EFFORTS, min_length=1, description="Efforts offered.")
    cost_rank: int = Field(default=0, ge=0, description="0 is cheapest; premium tiers rank higher.")
    prior_ttft_ms: float = Field(gt=0, description="Queueing + prefill, reasoning excluded.")
    prior_tokens_per_s: float = Field(gt=0, description="Decode speed, reasoning included.")
    prefill_tokens_per_s: float | None = Field(
        default=None, gt=0, description="Prompt processing speed; None: prompt size ignored."
    )


# The simulator's tier profiles; the fast tier is the premium one.
FAST_TIER = TierOption(
    name="fast",
    service_tier="priority",
    cost_rank=1,
    prior_ttft_ms=200,
    prior_tokens_per_s=750,
    prefill_tokens_per_s=8000,
)
STANDARD_TIER = TierOption(
    name="standard",
    service_tier="default",
    prior_ttft_ms=550,
    prior_tokens_per_s=55,
    prefill_tokens_per_s=4000,
)
DEFAULT_TIERS = (FAST_TIER, STANDARD_TIER)


class LLMTier(TierOption):
    """A tier the calls may use: the controller's view of it plus where and how to reach it.

    Connection fields left unset are taken from `LLMSettings` (base URL, key, model, API).
    """

    base_url: str | None = Field(default=None, description="None: LLMSettings.base_url.")
    api_key: SecretStr | None = Field(default=None, description="None: LLMSettings.api_key.")
    model: str | None = Field(default=None, description="None: LLMSettings.model.")
    api: Literal["chat", "responses"] | None = Field(
        default=None, description="None: LLMSettings.api."
    )


def default_tiers() -> list[LLMTier]:
    """The provider's fast (premium) tier first, then its standard tier, on one base URL."""
    return [LLMTier(**FAST_TIER.model_dump()), LLMTier(**STANDARD_TIER.model_dump())]
