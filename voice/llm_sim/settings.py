"""The tier simulator's settings: tier profiles (time to first token, speed, injected
failures), reasoning cost per effort, and the scripted answers."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

DEFAULT_ANSWERS = [
    "I can help with that. Could you tell me a little more about what you need?",
    "Sure, let me look into that for you. It should only take a moment.",
    "Thanks for letting me know. I have made a note of it, and someone will follow up today.",
    "That makes sense. Is there anything else you would like me to check while we talk?",
    "Got it. You will get a text message with the details in a few minutes.",
    "Happy to help. We are open from nine to five on weekdays, so call back any time.",
    "Good question. The short answer is yes, and I can walk you through the next step.",
    "Okay, I have that down. What is the best number to reach you on?",
]
# What a real model's spoken replies are made of beyond the first sentence: 14-20 words each.
REPLY_SENTENCES = [
    "I have pulled up your account, and everything on our side looks to be in good order.",
    "If anything changes before then, we will send you a text message and an email as well.",
    "Most requests like this are handled within one business day, often a good deal sooner.",
    "You can also manage this yourself online, under the settings page of your account.",
    "The team that looks after this is in the office until six this evening, Monday to Friday.",
    "I will stay on the line while the change goes through, so you know it has worked.",
    "There is no charge for this, and it will not affect anything else on your plan.",
    "Just so you know, this call may be recorded to help us improve the service we give.",
    "If it is easier, I can also call you back later today at a time that suits you.",
    "Please keep your reference number handy, as you may be asked for it if you call again.",
    "The next available appointment is on Thursday morning, and there is another one on Friday.",
    "Once that is done, you should see the update on your next statement at the latest.",
]
STARTUP_NOTICE = (
    "LLM replies are SIMULATED by Hotline's tier simulator: no language model is running; the "
    "agent repeats what it heard plus a scripted sentence. To use a real OpenAI-compatible "
    "provider set HOTLINE_LLM__BASE_URL, HOTLINE_LLM__API_KEY and HOTLINE_LLM__MODEL."
)


class TierProfile(BaseModel):
    """How one tier of the simulated provider behaves."""

    ttft_ms: float = Field(
        default=400.0, ge=0, description="Queueing + prefill before the first token."
    )
    jitter_ms: float = Field(default=0.0, ge=0, description="Uniform ± jitter added to ttft_ms.")
    tokens_per_s: float = Field(default=55.0, gt=0, description="Output speed, reasoning included.")
    prefill_tokens_per_s: float | None = Field(
        default=None,
        gt=0,
        description="Prompt processing speed: adds prompt_tokens / rate to ttft.",
    )
    reported_as: str = Field(default="default", description="The service_tier echoed in replies.")
    fail_status: int | None = Field(
        default=None, ge=400, le=599, description="Fail with this status."
    )
    fail_probability: float = Field(default=1.0, ge=0, le=1, description="Chance a request fails.")
    fail_times: int | None = Field(default=None, ge=0, description="Fail this many, then recover.")
    fail_after: int = Field(
        default=0, ge=0, description="Answer this many requests first, then start failing."
    )


class SimulatorSettings(BaseModel):
    """The simulated provider: tier profiles, reasoning cost, scripted answers."""

    model: str = "hotline-sim"
    profiles: dict[str, TierProfile] = Field(
        default_factory=lambda: {
            "fast": TierProfile(
                ttft_ms=200,
                jitter_ms=40,
                tokens_per_s=750,
                prefill_tokens_per_s=8000,
                reported_as="priority",
            ),
            "standard": TierProfile(
                ttft_ms=550,
                jitter_ms=150,
                tokens_per_s=55,
                prefill_tokens_per_s=4000,
                reported_as="default",
            ),
        }
    )
    service_tiers: dict[str, str] = Field(
        default_factory=lambda: {
            **dict.fromkeys(["priority", "fast", "ultrafast"], "fast"),
            **dict.fromkeys(["auto", "default", "flex", "scale"], "standard"),
        },
        description="Requested service_tier -> profile name.",
    )
    default_profile: str = Field(
        default="standard", description="Profile when no service_tier is sent."
    )
    reasoning_tokens: dict[str, int] = Field(
        default_factory=lambda: {
            "none": 0,
            "minimal": 16,
            "low": 64,
            "medium": 256,
            "high": 1024,
            "xhigh": 2048,
            "max": 4096,
        },
        description="Hidden reasoning tokens per effort; they count against the token cap.",
    )
    default_effort: str = Field(default="none", description="Effort when the request names none.")
    stream_reasoning_as: Literal["none", "reasoning", "reasoning_content"] = Field(
        default="none",
        description="Chat streams only: also stream reasoning text in this delta field, as "
        "Cerebras (`reasoning`) or DeepSeek/vLLM (`reasoning_content`) do.",
    )
    answers: list[str] = Field(default_factory=lambda: list(DEFAULT_ANSWERS), min_length=1)
    replies: Literal["realistic", "short"] = Field(
        default="realistic",
        description="realistic: 'You said: <words>.', a scripted answer, then sentences as a "
        "real model's spoken replies run on, to reply_sentences and reply_words; short: only "
        "'You said: <words>.' and the scripted answer (about 2 s of speech).",
    )
    reply_words: tuple[int, int] = Field(
        default=(40, 60), description="Realistic replies: words, at least and at most."
    )
    reply_sentences: tuple[int, int] = Field(
        default=(2, 4), description="Realistic replies: sentences, at least and at most."
    )
    reply_pool: list[str] = Field(
        default_factory=lambda: list(REPLY_SENTENCES),
        min_length=1,
        description="Realistic replies: the sentences they go on with.",
    )
    seed: int | None = Field(default=None, description="Seed for jitter and failure draws.")

    @model_validator(mode="after")
    def _names_resolve(self) -> SimulatorSettings:
        for name in [*self.service_tiers.values(), self.default_profile]:
            if name not in self.profiles:
                raise ValueError(f"unknown tier profile {name!r}")
        if self.default_effort not in self.reasoning_tokens:
            raise ValueError(f"unknown default_effort {self.default_effort!r}")
        return self
