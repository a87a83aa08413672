"""The API token (`HOTLINE_API_TOKEN`) as a FastAPI dependency: `require_token` on every route
that needs it. Every request passes when no token is configured.

The token comes as `Authorization: Bearer …`, or, from the supervisor console's browser, as the
console's session cookie (HttpOnly, SameSite=Strict, set by signing in at /console). Websockets
may also give it as `?token=` (browsers cannot set headers on them).

A console session is `v1.<issued at>.<session id>.<HMAC>`: its issue time (unix seconds) and a
random id, signed with a key derived from the API token (never the token itself), so every
worker can check it and a new API token ends every session. The server refuses it 12 h after
it was issued (`SESSION_S`), and once signed out: signing out puts the session id in Redis, in a
key every worker reads, which expires when the session would have. Every comparison is
constant-time."""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import Request
from pydantic import SecretStr
from starlette.requests import HTTPConnection

from voice.cluster.records import RegistryUnavailable
from voice.cluster.registry import CallRegistry
from voice.cluster.store import REDIS_UNREACHABLE, claim_key
from voice.server.api import APIError

log = logging.getLogger(__name__)

CONSOLE_COOKIE = "hotline_console"
SESSION_S = 12 * 3600  # a console session lasts a working day
CLOCK_SKEW_S = 300  # workers' clocks may differ this much: a session issued "later" is refused
_SIGNED_OUT = "console-signed-out"  # the claim kind (voice.cluster.store.claim_key) of a logout
_SESSION = re.compile(r"v1\.([0-9]{1,12})\.([A-Za-z0-9_-]{22})\.([0-9a-f]{64})")
_MAX_COOKIE = 128  # longer is not ours: refused before the pattern looks at it


@dataclass(frozen=True)
class ConsoleSession:
    """A console sign-in, as its cookie carries it."""

    session_id: str
    issued_at: int  # unix seconds

    @property
    def expires_at(self) -> int:
        return self.issued_at + SESSION_S


def _session_key(token: SecretStr) -> bytes:
    """The key that signs console sessions: derived from the API token, the same on every
    worker, different for every token."""
    key = token.get_secret_value().encode()
    return hmac.new(key, b"hotline console session key v1", hashlib.sha256).digest()


def _signature(token: SecretStr, issued_at: int, session_id: str) -> str:
    signed = f"v1.{issued_at}.{session_id}".encode()
    return hmac.new(_session_key(token), signed, hashlib.sha256).hexdigest()


def issue_console_session(token: SecretStr, clock: Callable[[], float] = time.time) -> str:
    """A new console session's cookie value: issued now (`clock`), with a random id."""
    issued_at, session_id = int(clock()), secrets.token_urlsafe(16)
    return f"v1.{issued_at}.{session_id}.{_signature(token, issued_at, session_id)}"


def read_console_session(
    token: SecretStr, cookie: str, clock: Callable[[], float] = time.time
) -> ConsoleSession | None:
    """The session `cookie` carries, if it is signed with `token`'s key and has not expired
    (None otherwise: malformed, tampered with, signed with another token, too old, from the
    future). Whether it was signed out is `console_session_revoked`'s question."""
    found = _SESSION.fullmatch(cookie) if len(cookie) <= _MAX_COOKIE else None
    if found is None:
        return None
    issued_at, session_id, signature = int(found[1]), found[2], found[3]
    if not hmac.compare_digest(signature, _signature(token, issued_at, session_id)):
        return None
    now = clock()
    if not issued_at - CLOCK_SKEW_S <= now < issued_at + SESSION_S:
        return None
    return ConsoleSession(session_id, issued_at)


def _signed_out_key(sessions: CallRegistry, session: ConsoleSession) -> str:
    return claim_key(sessions.settings.key_prefix, _SIGNED_OUT, session.session_id)


async def console_session_revoked(sessions: CallRegistry, session: ConsoleSession) -> bool:
    """Whether `session` was signed out, on any worker (RegistryUnavailable without Redis)."""
    try:
        return bool(await sessions.redis.exists(_signed_out_key(sessions, session)))
    except REDIS_UNREACHABLE as exc:
        raise RegistryUnavailable(str(exc)) from exc


async def revoke_console_session(
    sessions: CallRegistry, session: ConsoleSession, clock: Callable[[], float] = time.time
) -> None:
    """Sign `session` out on every worker, until it would have expired anyway (and the clock
    skew allowed between workers); RegistryUnavailable without Redis."""
    ttl_s = session.expires_at + CLOCK_SKEW_S - clock()
    if ttl_s > 0:
        await sessions.claim(_SIGNED_OUT, session.session_id, ttl_s + 1)


def _same(given: str, expected: str) -> bool:
    """Constant-time, also in the lengths: both sides are hashed to 32 bytes first."""
    digest = hashlib.sha256
    return hmac.compare_digest(digest(given.encode()).digest(), digest(expected.encode()).digest())


def token_matches(connection: HTTPConnection, given: str) -> bool:
    """Whether `given` is the API token (true for anything when none is configured)."""
    token: SecretStr | None = connection.app.state.settings.api_token
    return token is None or _same(given, token.get_secret_value())


async def _console_session_valid(connection: HTTPConnection, token: SecretStr) -> bool:
    cookie = connection.cookies.get(CONSOLE_COOKIE)
    session = read_console_session(token, cookie) if cookie else None
    if session is None:
        return False
    sessions: CallRegistry = connection.app.state.switchboard.sessions
    return not await console_session_revoked(sessions, session)


async def _authorized(connection: HTTPConnection, query_token: bool) -> bool:
    token: SecretStr | None = connection.app.state.settings.api_token
    if token is None:
        return True
    scheme, _, given = connection.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and _same(given.strip(), token.get_secret_value()):
        return True
    query = connection.query_params.get("token") if query_token else None
    if query is not None and _same(query, token.get_secret_value()):
        return True
    return await _console_session_valid(connection, token)  # the only check that asks Redis


async def authorized(request: Request) -> bool:
    """Whether the request carries the API token or a live console session (always true when
    no token is configured). A session cannot be checked while Redis is unreachable: 503."""
    try:
        return await _authorized(request, query_token=False)
    except RegistryUnavailable:
        log.warning("console session not checked: Redis unreachable")
        raise APIError(
            503, "console sessions cannot be checked now: use the bearer token"
        ) from None


async def authorized_socket(connection: HTTPConnection) -> bool:
    """The API token on a websocket: the header, the console's cookie, or `?token=` (a session
    that cannot be checked, Redis unreachable, is refused)."""
    try:
        return await _authorized(connection, query_token=True)
    except RegistryUnavailable:
        log.warning("console session not checked: Redis unreachable")
        return False


async def require_token(request: Request) -> None:
    """The API token, as a dependency of every route that needs it (401 without it)."""
    if not await authorized(request):
        raise APIError(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})
