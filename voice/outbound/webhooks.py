"""The providers' call-event webhooks for the calls Hotline places, as their wire says them:
Telnyx's signature and its `call.hangup` event; Vonage's signed `event_url` and its status.

Telnyx (https://developers.telnyx.com/docs/messaging/messages/receiving-webhooks, "Webhook
signing"; the event: https://developers.telnyx.com/api-reference/callbacks/call-hangup) signs
`{telnyx-timestamp}|{raw body}` with ed25519: `telnyx-signature-ed25519` is the signature in
base64, checked with the account's public key (Mission Control: Keys & Credentials, base64 of
the 32 raw bytes; `HOTLINE_OUTBOUND__TELNYX_PUBLIC_KEY`); a timestamp more than
`TOLERANCE_S` away from our clock is refused (a replay).

Vonage (https://developer.vonage.com/en/getting-started/concepts/webhooks#decoding-signed-
webhooks; the events: https://developer.vonage.com/en/voice/voice-api/webhook-reference#event-
webhook) puts a JWT in `Authorization: Bearer`, HS256 with the account's signature secret
(`HOTLINE_OUTBOUND__VONAGE_SIGNATURE_SECRET`), its `iat` within `TOLERANCE_S`, and when it
has `payload_hash`, that is the SHA-256 (hex) of the body, compact JSON."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

TOLERANCE_S = 300.0
SIGNATURE_HEADER, TIMESTAMP_HEADER = "telnyx-signature-ed25519", "telnyx-timestamp"
_MAX_SIGNATURE_CHARS = 200  # base64 of 64 bytes is 88
_MAX_JWT_CHARS = 4096


def telnyx_signature_is_valid(
    public_key: str, body: bytes, signature: str | None, timestamp: str | None, now: float
) -> bool:
    """Whether Telnyx signed `body` at `timestamp` (within `TOLERANCE_S` of `now`)."""
    if not signature or not timestamp or len(signature) > _MAX_SIGNATURE_CHARS:
        return False
    if not timestamp.isascii() or not timestamp.isdigit() or len(timestamp) > 12:
        return False
    if abs(now - int(timestamp)) > TOLERANCE_S:
        return False
    try:
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key, validate=True))
        key.verify(base64.b64decode(signature, validate=True), timestamp.encode() + b"|" + body)
    except (ValueError, binascii.Error, InvalidSignature):
        return False
    return True


@dataclass(frozen=True)
class TelnyxEvent:
    """One Call Control event: its type, the call, and for `call.hangup` its cause."""

    event_type: str
    call_id: str
    hangup_cause: str


def telnyx_event(body: bytes) -> TelnyxEvent | None:
    """The event in a webhook's body (`{"data": {"event_type", "payload": {…}}}`); None if
    it is not one."""
    try:
        document: Any = json.loads(body)
    except ValueError:
        return None
    data = document.get("data") if isinstance(document, dict) else None
    payload = data.get("payload") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(payload, dict):
        return None
    return TelnyxEvent(
        str(data.get("event_type") or "")[:64],
        str(payload.get("call_control_id") or "")[:128],
        str(payload.get("hangup_cause") or "")[:64],
    )


def vonage_signature_is_valid(
    secret: str, body: bytes, authorization: str | None, now: float
) -> bool:
    """Whether Vonage signed this webhook (`authorization`: its Authorization header)."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token or len(token) > _MAX_JWT_CHARS:
        return False
    try:
        claims = jwt.decode(token, secret, algorithms=["HS256"], options={"require": ["iat"]})
    except jwt.InvalidTokenError:
        return False
    issued = claims.get("iat")
    if not isinstance(issued, int | float) or abs(now - issued) > TOLERANCE_S:
        return False
    payload_hash = claims.get("payload_hash")
    return payload_hash is None or _hashes_to(body, str(payload_hash))


def _hashes_to(body: bytes, payload_hash: str) -> bool:
    """Whether the body, as sent or as compact JSON, has this SHA-256."""
    forms = [body]
    try:
        compact = json.dumps(json.loads(body), separators=(",", ":"), ensure_ascii=False)
        forms.append(compact.encode())
    except ValueError:
        pass
    given = payload_hash.lower().encode()
    return any(hmac.compare_digest(hashlib.sha256(f).hexdigest().encode(), given) for f in forms)


def vonage_event(body: bytes) -> tuple[str, str] | None:
    """The call's uuid and status in an event webhook's JSON body; None if it is not one."""
    try:
        document: Any = json.loads(body)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    return str(document.get("uuid") or "")[:128], str(document.get("status") or "")[:32]
