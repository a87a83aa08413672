"""How post-call webhooks are sent (`HOTLINE_WEBHOOK__*`): where, signed with what, and how hard
Hotline tries (`voice.cluster.webhooks`, which re-exports it, says how these are used)."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, Field, HttpUrl, SecretStr, model_validator


class WebhookSettings(BaseModel):
    """Where post-call webhooks go and how hard Hotline tries (`HOTLINE_WEBHOOK__*`)."""

    url: HttpUrl | None = None  # None: no deliveries
    secret: SecretStr | None = None  # signs every delivery; required with `url`
    timeout_s: float = Field(default=10.0, gt=0)  # one attempt, the whole request
    give_up_after_s: float = Field(default=24 * 3600, gt=0)  # since enqueued: then `failed`
    first_retry_s: float = Field(default=2.0, gt=0)  # backoff doubles, capped at max_retry_s
    max_retry_s: float = Field(default=300.0, gt=0)
    lease_s: float | None = Field(default=None, gt=0)  # a worker's hold on a delivery it
    # sends; None: timeout_s + 10. Past it the delivery is sent again (the worker died).
    concurrency: int = Field(default=8, ge=1)  # deliveries one worker sends at once
    retention_s: int = Field(default=7 * 24 * 3600, ge=1)  # final outcomes kept this long

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.url is not None and (self.secret is None or not self.secret.get_secret_value()):
            raise ValueError(
                "webhook.url is set but its secret is not: set HOTLINE_WEBHOOK__SECRET "
                "(every delivery is signed with it)"
            )
        if self.lease_s is not None and self.lease_s <= self.timeout_s:
            raise ValueError("webhook.lease_s must be longer than webhook.timeout_s")
        return self

    @property
    def lease(self) -> float:
        return self.lease_s if self.lease_s is not None else self.timeout_s + 10.0
