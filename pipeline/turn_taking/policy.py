"""The end-of-turn policy: the silence after which a pause ends the caller's turn.

LiveKit's shape: at each pause the turn model's score picks between a short delay (the model
is confident the turn is over) and a long one (it is not: the timeout, `TurnSettings.
end_silence_ms`). The early transcript of the pause may veto an end: words left hanging ("my
number is", "to leave a message,") wait for the timeout whatever the audio sounds like;
optionally (`unfinished_words`) so do words that do not sound finished (digits without a full
stop, a trailing "um"), and (`wait_for_words`) a confident model waits for the words.

`end_delay_ms` is a pure function of what was heard at the pause, so `hotline turn-bench`
replays it on recorded turns exactly as a call decides live: it is asked again whenever the
score or the transcript arrives, and the answer given with what was there holds until then.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from pipeline.endpoint import leaves_hanging, sounds_finished


class TurnPolicy(BaseModel):
    """When a pause ends the turn. Defaults: `hotline turn-bench`'s chosen operating point
    (README, "Turn-taking"): a turn the model does not call unfinished ends after today's
    500 ms; one it calls unfinished (score below 0.1: digit groups, most hesitations) waits
    1.2 s. Without a score (no model, or none in yet) `TurnSettings.end_silence_ms` ends it."""

    model: bool = Field(
        default=True, description="Score each pause with the turn model (Smart Turn v3.2)."
    )
    threshold: float = Field(
        default=0.1, gt=0.0, lt=1.0, description="Model score at which the turn is over."
    )
    min_delay_ms: int = Field(
        default=500, ge=0, description="Silence that ends a turn judged over."
    )
    timeout_ms: int = Field(
        default=1200,
        gt=0,
        description="Silence that ends a turn the model judged unfinished, or whose words "
        "were vetoed (the timeout).",
    )
    hanging_words: bool = Field(
        default=True,
        description="An early transcript left hanging (a comma, 'and', 'my', 'is') waits for "
        "the timeout whatever the model says.",
    )
    unfinished_words: bool = Field(
        default=False,
        description="With the model: an early transcript that does not sound finished (no "
        "full stop, digits, a hesitation: `pipeline.endpoint.sounds_finished`) waits for the "
        "timeout whatever the model says.",
    )
    wait_for_words: bool = Field(
        default=False,
        description="With hanging_words or unfinished_words: a pause the model judges over "
        "still waits for its early transcript (at most the timeout), so that the words can "
        "veto the end.",
    )
    finished_words: bool = Field(
        default=False,
        description="Without the model: a transcript that sounds finished ends the turn after "
        "min_delay_ms (today's text rules, `pipeline.endpoint`).",
    )


def end_delay_ms(
    policy: TurnPolicy, timeout_ms: int, score: float | None, transcript: str | None
) -> int:
    """The silence (ms from the end of speech) after which this pause ends the turn. `score`:
    the model's probability that the turn is over (None: not scored); `transcript`: the early
    transcript of the turn so far (None: not in yet). Ask again when either arrives: the answer
    given with what was there holds until then."""
    if policy.hanging_words and transcript is not None and leaves_hanging(transcript):
        return timeout_ms
    if score is not None:
        if score < policy.threshold:
            return timeout_ms
        vetoes = policy.hanging_words or policy.unfinished_words
        if vetoes and policy.wait_for_words and transcript is None:
            return timeout_ms  # until the words are in
        if policy.unfinished_words and transcript is not None and not sounds_finished(transcript):
            return timeout_ms
        return policy.min_delay_ms
    if policy.finished_words and transcript is not None and sounds_finished(transcript):
        return policy.min_delay_ms
    return timeout_ms
