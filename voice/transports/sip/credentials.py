"""Answering a digest challenge to a request of ours (RFC 3261 §22.2, §22.3; RFC 2617 §3.2.2):
a 401's `WWW-Authenticate` is answered by an `Authorization`, a 407's `Proxy-Authenticate` by a
`Proxy-Authorization`, on the request sent again. MD5 only (what trunks and PBXs speak), with
qop=auth when the challenge offers it (nonce count 1, a fresh cnonce), else RFC 2069's plain
digest; `opaque` is echoed. The arithmetic is the server side's (`digest.digest_response`).

The password goes into the hash and nowhere else: nothing here logs, and a `ChallengeError`'s
message names what the challenge lacked, never a credential."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from voice.transports.sip.digest import digest_response, user_hash
from voice.transports.sip.message import SipMessage, SipParseError, parse_auth_params

_ANSWERS = {
    401: ("WWW-Authenticate", "Authorization"),
    407: ("Proxy-Authenticate", "Proxy-Authorization"),
}


class ChallengeError(ValueError):
    """A challenge we cannot answer (no Digest MD5, no nonce, only qop=auth-int)."""


@dataclass(frozen=True)
class Challenge:
    """One digest challenge: the header its answer goes in, and what the answer repeats."""

    header: str  # "Authorization" (a 401) or "Proxy-Authorization" (a 407)
    realm: str
    nonce: str
    qop: bool  # qop=auth offered: answer with nc and cnonce
    opaque: str | None = None


def read_challenge(response: SipMessage) -> Challenge:
    """The first Digest MD5 challenge of a 401 or 407; ChallengeError if none can be answered."""
    if response.status not in _ANSWERS:
        raise ChallengeError(f"a {response.status} is not a challenge")
    asking, answer = _ANSWERS[response.status]
    why = f"no {asking} header"
    for value in response.header_values(asking):
        try:
            scheme, params = parse_auth_params(value)
        except SipParseError as exc:
            why = f"malformed {asking}: {exc}"
            continue
        if scheme.lower() != "digest" or params.get("algorithm", "MD5").upper() != "MD5":
            why = f"{asking} asks for {scheme} {params.get('algorithm', '')}".rstrip()
            continue
        options = (
            {o.strip().lower() for o in params["qop"].split(",")} if "qop" in params else set()
        )
        if options and "auth" not in options:
            why = f"{asking} offers qop {params['qop']!r}, not auth"
            continue
        if not params.get("nonce") or "realm" not in params:
            why = f"{asking} has no nonce or realm"
            continue
        return Challenge(
            answer, params["realm"], params["nonce"], bool(options), params.get("opaque")
        )
    raise ChallengeError(why)


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def answer(
    challenge: Challenge,
    user: str,
    password: str,
    method: str,
    uri: str,
    *,
    cnonce: str | None = None,
    nc: int = 1,
) -> str:
    """The header value answering `challenge` for `method` on Request-URI `uri`."""
    ha1 = user_hash(user, challenge.realm, password)
    counted = (f"{nc:08x}", cnonce or secrets.token_hex(8)) if challenge.qop else None
    response = digest_response(ha1, challenge.nonce, method, uri, counted)
    parts = [
        f"username={_quoted(user)}",
        f"realm={_quoted(challenge.realm)}",
        f"nonce={_quoted(challenge.nonce)}",
        f"uri={_quoted(uri)}",
        f"response={_quoted(response)}",
        "algorithm=MD5",
    ]
    if counted is not None:
        parts += [f"cnonce={_quoted(counted[1])}", "qop=auth", f"nc={counted[0]}"]
    if challenge.opaque is not None:
        parts.append(f"opaque={_quoted(challenge.opaque)}")
    return "Digest " + ", ".join(parts)
