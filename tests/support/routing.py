"""A TierRouter rig for the LLM routing tests: quick simulated tiers, the router's view of them,
a controller on a hand-driven clock, the real tier simulator on 127.0.0.1 (`rig_for`), and
helpers to read a reply and its decision's attempts."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Any

from starlette.applications import Starlette

from pipeline.llm.client import ChatMessage
from pipeline.llm.controller import Controller
from pipeline.llm.decision import Decision
from pipeline.llm.routing import CallRouter, Policy, RoutedReply, TierRouter
from pipeline.llm.settings import ControllerSettings, LLMSettings
from pipeline.llm.tiers import LLMTier
from voice.llm_sim.serving import running_simulator
from voice.llm_sim.simulator import (
    SimulatorSettings,
    SimulatorStats,
    TierProfile,
    create_simulator_app,
    simulator_settings,
    simulator_stats,
)

# Quick tiers (as in test_simulator): the standard tier stays ~10x slower than the fast one.
FAST_PROFILE = TierProfile(ttft_ms=5, tokens_per_s=20_000, reported_as="priority")
STANDARD_PROFILE = TierProfile(ttft_ms=30, tokens_per_s=1_500, reported_as="default")
# Reasoning scaled down 32x from the simulator's defaults: quick replies at every effort.
REASONING = {"none": 0, "minimal": 1, "low": 2, "medium": 8, "high": 32, "xhigh": 64, "max": 128}
# The router's view of the same tiers: priors that match the profiles; fast is the premium one.
FAST = LLMTier(
    name="fast", service_tier="priority", cost_rank=1, prior_ttft_ms=5, prior_tokens_per_s=20_000
)
STANDARD = LLMTier(
    name="standard", service_tier="default", cost_rank=0, prior_ttft_ms=30, prior_tokens_per_s=1_500
)
# No standard option fits this budget, so the plan is the fastest option: the fast tier.
TIGHT_MS = 40.0

HEARD = "Book a table for two tonight"
HISTORY = [ChatMessage("user", HEARD)]
TIMINGS = {"first_sentence": 40.0, "first_audio": 55.0}


class Clock:
    """The controller's clock; it only ends cool-downs."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Rig:
    app: Starlette
    router: TierRouter
    controller: Controller
    clock: Clock

    @property
    def stats(self) -> SimulatorStats:
        return simulator_stats(self.app)

    @property
    def sim(self) -> SimulatorSettings:
        return simulator_settings(self.app)

    def call(self, **policy: Any) -> CallRouter:
        return self.router.for_call(Policy(**policy), "exp-1", "arm-a")


@contextlib.asynccontextmanager
async def rig_for(
    tiers: list[LLMTier] | None = None,
    profiles: dict[str, TierProfile] | None = None,
    llm: dict[str, Any] | None = None,
    **controller: Any,
) -> AsyncIterator[Rig]:
    profiles = profiles or {}
    sim = SimulatorSettings(
        profiles={
            "fast": profiles.get("fast", FAST_PROFILE).model_copy(),
            "standard": profiles.get("standard", STANDARD_PROFILE).model_copy(),
        },
        reasoning_tokens=REASONING,
        seed=7,
    )
    app = create_simulator_app(sim)
    clock = Clock()
    settings = ControllerSettings(
        **{"reasoning_tokens": dict(REASONING), "tts_prior_ms": 10.0, **controller}
    )
    ctrl = Controller(settings, clock=clock)
    async with running_simulator(app=app) as url:
        llm_settings = LLMSettings(base_url=url, tiers=tiers or [FAST, STANDARD], **(llm or {}))
        router = TierRouter(llm_settings, ctrl)
        try:
            yield Rig(app, router, ctrl, clock)
        finally:
            await router.aclose()


async def speak(reply: RoutedReply) -> str:
    return "".join([delta async for delta in reply])


def attempt(
    tier: str, effort: str, kind: str, result: str, status: int | None = None
) -> dict[str, object]:
    return {"tier": tier, "effort": effort, "kind": kind, "result": result, "status": status}


def attempts(decision: Decision) -> list[dict[str, object]]:
    """The decision's attempts without their error messages (checked on their own)."""
    listed = decision.attempts
    assert isinstance(listed, tuple)
    return [{k: v for k, v in asdict(a).items() if k != "error"} for a in listed]
