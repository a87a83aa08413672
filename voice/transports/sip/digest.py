"""SIP digest authentication (RFC 3261 §22, RFC 2617 with qop=auth; MD5, as every PBX speaks
it): challenges for sources not on the allow-list, and checking the answers.

A nonce is `<issued>.<salt>.<HMAC(key, issued, salt, source host)>` under a per-process key:
issuing one keeps no state, and it is good only from the host it was given to, for
`nonce_ttl_s`. An answer must be qop=auth, name the Request-URI as its `uri`, and count up: each
nonce's highest nonce count (`nc`) is remembered once it proved a user (per worker, at most
`max_nonces` nonces), so the same Authorization in another request is a replay and refused.
A right answer to an expired or used-up nonce is `stale`: challenge again with stale=true and a
PBX retries without asking anyone for the password (RFC 2617 §3.2.1). Every comparison of a
secret is constant-time; nothing here logs."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from voice.transports.sip.message import SipMessage, SipParseError, parse_auth_params

_NONCE = re.compile(r"([0-9a-f]{1,16})\.([0-9a-f]{16})\.([0-9a-f]{32})")
_NC = re.compile(r"[0-9a-fA-F]{8}")  # RFC 2617 §3.2.2: 8 hex digits, from 00000001
_RETRANSMISSION_S = 32.0  # RFC 3261 §17: 64*T1, how long a request may be retransmitted


def _md5(text: str) -> str:
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


def digest_response(
    ha1: str, nonce: str, method: str, uri: str, counted: tuple[str, str] | None
) -> str:
    """The request-digest of RFC 2617 §3.2.2.1 (MD5) for HA1 = MD5(user:realm:password): with
    qop=auth (`counted`: the nonce count and cnonce) MD5(HA1:nonce:nc:cnonce:auth:HA2), without
    (RFC 2069) MD5(HA1:nonce:HA2); HA2 = MD5(method:uri). Both sides of a challenge use it."""
    ha2 = _md5(f"{method}:{uri}")
    if counted is None:
        return _md5(f"{ha1}:{nonce}:{ha2}")
    nc, cnonce = counted
    return _md5(f"{ha1}:{nonce}:{nc}:{cnonce}:auth:{ha2}")


def user_hash(user: str, realm: str, password: str) -> str:
    """HA1 of RFC 2617 §3.2.2.2: MD5(user:realm:password)."""
    return _md5(f"{user}:{realm}:{password}")


def _host(source: str) -> str:
    """One spelling per address (an IPv4-mapped IPv6 address is its IPv4 address)."""
    try:
        address = ipaddress.ip_address(source)
    except ValueError:
        return source.lower()
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def _transaction(request: SipMessage) -> tuple[str, str]:
    """(Call-ID, top Via branch): what a retransmission of the same request repeats."""
    try:
        branch = request.branch or ""
    except SipParseError:
        branch = ""
    return request.header("Call-ID") or "", branch


@dataclass(frozen=True)
class DigestCheck:
    """What an Authorization proved: `user`, or why not (`reason`, safe to log: it holds
    nothing the request sent). `stale`: the answer was right but its nonce expired or was used
    up; answer 401 with `challenge(source, stale=True)`."""

    user: str | None = None
    reason: str = "no credentials"
    stale: bool = False


@dataclass
class _Used:
    """The last answer a nonce gave: its count, and the request (for retransmissions)."""

    issued: int
    nc: int
    request: tuple[str, str]  # (Call-ID, Via branch)
    at: float


class DigestAuth:
    """Users and passwords of the PBXs and trunks that may authenticate (`realm`)."""

    def __init__(
        self,
        users: Mapping[str, str],
        realm: str = "hotline",
        nonce_ttl_s: float = 60.0,
        max_nonces: int = 4096,
    ) -> None:
        self.users = dict(users)
        self.realm = realm
        self.nonce_ttl_s = nonce_ttl_s
        self.max_nonces = max_nonces
        self._key = secrets.token_bytes(32)
        self._decoy = secrets.token_hex(16)  # an unknown user's password: as slow as a known one
        self._used: OrderedDict[str, _Used] = OrderedDict()  # nonce -> its last answer, by use
        self._floor = -1  # nonces issued at or before this (ms) may be forgotten: stale

    @property
    def remembered(self) -> int:
        """How many nonces' counts are remembered (at most `max_nonces`)."""
        return len(self._used)

    def _mac(self, issued: int, salt: str, source: str) -> str:
        text = f"{issued:x}.{salt}.{_host(source)}".encode()
        return hmac.new(self._key, text, hashlib.sha256).hexdigest()[:32]

    def challenge(self, source: str, now: float | None = None, stale: bool = False) -> str:
        """A WWW-Authenticate value with a fresh nonce for `source` (a host)."""
        issued = int(1000 * (time.monotonic() if now is None else now))  # in milliseconds
        salt = secrets.token_hex(8)
        nonce = f"{issued:x}.{salt}.{self._mac(issued, salt, source)}"
        extra = ", stale=true" if stale else ""
        return f'Digest realm="{self.realm}", nonce="{nonce}", algorithm=MD5, qop="auth"{extra}'

    def check(self, request: SipMessage, source: str, now: float | None = None) -> DigestCheck:
        """What the request's Authorization proves, coming from host `source`."""
        header = request.header("Authorization")
        if not header:
            return DigestCheck()
        try:
            scheme, params = parse_auth_params(header)
        except SipParseError:
            return DigestCheck(reason="malformed credentials")
        if scheme.lower() != "digest" or params.get("algorithm", "MD5").upper() != "MD5":
            return DigestCheck(reason="not MD5 digest")
        if params.get("qop", "").lower() != "auth":
            return DigestCheck(reason="no qop=auth")
        nc_text, cnonce = params.get("nc", ""), params.get("cnonce", "")
        if _NC.fullmatch(nc_text) is None or int(nc_text, 16) == 0 or not cnonce:
            return DigestCheck(reason="malformed nc or cnonce")
        if params.get("uri") != request.uri:
            return DigestCheck(reason="uri is not the Request-URI")
        if params.get("realm") != self.realm:
            return DigestCheck(reason="another realm")
        nonce = params.get("nonce", "")
        match = _NONCE.fullmatch(nonce)
        if match is None:
            return DigestCheck(reason="not our nonce")
        issued_hex, salt, mac = match.groups()
        issued = int(issued_hex, 16)
        if not hmac.compare_digest(mac, self._mac(issued, salt, source)):
            return DigestCheck(reason="not our nonce, or not given to this source")
        user = params.get("username", "")
        password = self.users.get(user)
        ha1 = user_hash(user, self.realm, self._decoy if password is None else password)
        method, uri = request.method or "", params["uri"]
        expected = digest_response(ha1, nonce, method, uri, (nc_text, cnonce))
        given = params.get("response", "")
        if not hmac.compare_digest(given.encode(), expected.encode()) or password is None:
            return DigestCheck(reason="wrong user or password")
        return self._count(user, nonce, issued, int(nc_text, 16), request, now)

    def _count(
        self, user: str, nonce: str, issued: int, nc: int, request: SipMessage, now: float | None
    ) -> DigestCheck:
        """A right answer: fresh, and counting up from the nonce's last one (or the same
        request again: a retransmission)?"""
        now = time.monotonic() if now is None else now
        if not 0 <= now - issued / 1000 <= self.nonce_ttl_s:
            return DigestCheck(reason="nonce expired", stale=True)
        key = _transaction(request)
        used = self._used.get(nonce)
        if used is None and issued <= self._floor:
            return DigestCheck(reason="nonce forgotten", stale=True)
        if used is not None and nc <= used.nc:
            if nc == used.nc and key == used.request and now - used.at <= _RETRANSMISSION_S:
                return DigestCheck(user, reason="retransmission")
            return DigestCheck(reason="nonce count replayed", stale=True)
        self._used[nonce] = _Used(issued, nc, key, now)
        self._used.move_to_end(nonce)
        if len(self._used) > self.max_nonces:
            self._forget(now)
        return DigestCheck(user, reason="ok")

    def _forget(self, now: float) -> None:
        """Past `max_nonces`: drop the expired nonces, then the least recently used ones (whose
        nonces become stale, so a PBX is challenged again and a replay never counts again).
        Each pass frees a quarter of the room, so its cost is shared by the answers between."""
        for nonce in [n for n, u in self._used.items() if now - u.issued / 1000 > self.nonce_ttl_s]:
            del self._used[nonce]
        while len(self._used) > self.max_nonces * 3 // 4:
            _, oldest = self._used.popitem(last=False)
            self._floor = max(self._floor, oldest.issued)
