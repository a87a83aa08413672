"""SIP digest authentication (RFC 3261 §22, RFC 2617 with qop=auth; MD5, as every PBX speaks
it): challenges for sources not on the allow-list, and checking the answers. Nonces are
stateless (a timestamp and its HMAC under a per-process key), so any request within
`nonce_ttl_s` may answer, and the check is constant-time."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping

from voice.transports.sip.message import SipMessage, SipParseError, parse_auth_params


def _md5(text: str) -> str:
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


class DigestAuth:
    """Users and passwords of the PBXs and trunks that may authenticate (`realm`)."""

    def __init__(
        self, users: Mapping[str, str], realm: str = "hotline", nonce_ttl_s: float = 300.0
    ) -> None:
        self.users = dict(users)
        self.realm = realm
        self.nonce_ttl_s = nonce_ttl_s
        self._key = secrets.token_bytes(32)

    def _nonce(self, issued: int) -> str:
        mac = hmac.new(self._key, str(issued).encode(), hashlib.sha256).hexdigest()[:32]
        return f"{issued:x}.{mac}"

    def _fresh(self, nonce: str, now: float) -> bool:
        issued_hex, _, _ = nonce.partition(".")
        try:
            issued = int(issued_hex, 16)
        except ValueError:
            return False
        return 0 <= now - issued <= self.nonce_ttl_s and hmac.compare_digest(
            nonce, self._nonce(issued)
        )

    def challenge(self, now: float | None = None) -> str:
        """A WWW-Authenticate value."""
        nonce = self._nonce(int(time.time() if now is None else now))
        return f'Digest realm="{self.realm}", nonce="{nonce}", algorithm=MD5, qop="auth"'

    def check(self, request: SipMessage, now: float | None = None) -> str | None:
        """The user a request's Authorization proves, or None (absent, unknown user, stale
        nonce, wrong response)."""
        header = request.header("Authorization")
        if not header:
            return None
        try:
            scheme, params = parse_auth_params(header)
        except SipParseError:
            return None
        user = params.get("username", "")
        password = self.users.get(user)
        nonce = params.get("nonce", "")
        if scheme.lower() != "digest" or password is None or params.get("realm") != self.realm:
            return None
        if not self._fresh(nonce, time.time() if now is None else now):
            return None
        ha1 = _md5(f"{user}:{self.realm}:{password}")
        ha2 = _md5(f"{request.method}:{params.get('uri', '')}")
        if params.get("qop") == "auth":
            nc, cnonce = params.get("nc", ""), params.get("cnonce", "")
            expected = _md5(f"{ha1}:{nonce}:{nc}:{cnonce}:auth:{ha2}")
        else:
            expected = _md5(f"{ha1}:{nonce}:{ha2}")
        given = params.get("response", "")
        return user if hmac.compare_digest(given.encode(), expected.encode()) else None
