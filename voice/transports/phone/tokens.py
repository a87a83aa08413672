"""Admission tokens for phone media streams: a stream is a call only if the server said so.

A provider's media websocket (`/twilio/stream`, `/telnyx/stream`, `/vonage/stream`) carries
the caller's audio and gets the bot's replies: left open, anyone who guesses the URL places
free calls (toll fraud, free LLM use). So, once any secret is configured, a stream is admitted
only with a token that

- the server issued for this provider and this call id (Twilio: the signed voice webhook puts
  it in the stream's `<Parameter name="token">`; Telnyx and Vonage: `POST /phone/stream-token`,
  behind the API token, returns a stream URL that carries it as `?token=`);
- is used before it expires (`ttl_s`, a minute by default: the provider connects at once);
- is used once: its nonce is claimed in Redis, so a replay on any worker is refused.

A token is `<payload>.<signature>`, both base64url: the payload is JSON
`{"p": provider, "c": call id, "e": expiry (unix s), "n": nonce}`, the signature its
HMAC-SHA256 under the stream secret. Comparison is constant-time.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass


class InvalidToken(Exception):
    """The stream's token is missing, forged, expired, or for another call."""


@dataclass(frozen=True)
class StreamGrant:
    """What a valid token allows: one stream of `provider` for `call_id`, claimed by `nonce`."""

    provider: str
    call_id: str
    expires_at: float
    nonce: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class StreamTokens:
    """Issues and checks stream tokens under one secret (every worker must share it)."""

    def __init__(
        self, secret: bytes, ttl_s: float = 60.0, clock: Callable[[], float] = time.time
    ) -> None:
        if not secret:
            raise ValueError("a stream token secret must not be empty")
        self._key = hashlib.sha256(b"hotline stream token\0" + secret).digest()
        self.ttl_s = ttl_s
        self._clock = clock

    def issue(self, provider: str, call_id: str) -> str:
        payload = {
            "p": provider,
            "c": call_id,
            "e": round(self._clock() + self.ttl_s, 3),
            "n": secrets.token_urlsafe(12),
        }
        body = _b64(json.dumps(payload, separators=(",", ":")).encode())
        return f"{body}.{self._sign(body)}"

    def check(self, token: str | None, provider: str, call_id: str) -> StreamGrant:
        """The grant `token` gives for this stream; InvalidToken (with why) otherwise. The
        caller still has to claim `grant.nonce` once (Redis) to refuse a replay."""
        if not token:
            raise InvalidToken("no stream token")
        body, _, signature = token.partition(".")
        if not hmac.compare_digest(self._sign(body).encode(), signature.encode()):
            raise InvalidToken("stream token signature does not match")
        try:
            payload = json.loads(_unb64(body))
            grant = StreamGrant(
                str(payload["p"]), str(payload["c"]), float(payload["e"]), str(payload["n"])
            )
        except (ValueError, KeyError, TypeError, binascii.Error) as exc:
            raise InvalidToken(f"malformed stream token ({type(exc).__name__})") from None
        if grant.provider != provider:
            raise InvalidToken(f"stream token is for {grant.provider}, not {provider}")
        if not hmac.compare_digest(grant.call_id.encode(), call_id.encode()):
            raise InvalidToken("stream token is for another call")
        if self._clock() > grant.expires_at:
            raise InvalidToken("stream token expired")
        return grant

    def _sign(self, body: str) -> str:
        return _b64(hmac.new(self._key, body.encode("ascii", "replace"), hashlib.sha256).digest())
