"""SIP digest authentication (RFC 2617 as SIP uses it): a PBX's answer to our challenge is
checked against what RFC 2617's formulas give; stale and forged nonces, answers without
qop=auth, for another Request-URI or from another host, and replays (a nonce count that does not
count up) prove nothing; an expired nonce answered right gets a stale challenge."""

from __future__ import annotations

import hashlib

from voice.transports.sip.digest import DigestAuth
from voice.transports.sip.message import SipMessage, parse_auth_params

PBX = "127.0.0.2"
URI = "sip:+15551230000@10.0.0.1"


def md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def nonce_of(auth: DigestAuth, source: str = PBX, now: float = 1000.0) -> str:
    _, challenge = parse_auth_params(auth.challenge(source, now))
    assert challenge["realm"] == auth.realm and challenge["qop"] == "auth"
    return challenge["nonce"]


def answered(
    nonce: str,
    user: str = "pbx",
    password: str = "s3cret",
    *,
    nc: int = 1,
    qop: bool = True,
    uri: str = URI,
    request_uri: str = URI,
    call: str = "call-1",
) -> SipMessage:
    """An INVITE to `request_uri` (Call-ID and branch from `call`) carrying the answer a PBX
    computes for `nonce`, for `uri`."""
    ha1 = md5(f"{user}:hotline:{password}")
    ha2 = md5(f"INVITE:{uri}")
    if qop:
        response = md5(f"{ha1}:{nonce}:{nc:08x}:abc:auth:{ha2}")
        extra = f', qop=auth, nc={nc:08x}, cnonce="abc"'
    else:
        response = md5(f"{ha1}:{nonce}:{ha2}")
        extra = ""
    message = SipMessage(method="INVITE", uri=request_uri)
    message.add_header("Via", f"SIP/2.0/UDP {PBX}:5060;branch=z9hG4bK{call}")
    message.add_header("Call-ID", call)
    message.add_header(
        "Authorization",
        f'Digest username="{user}", realm="hotline", nonce="{nonce}", '
        f'uri="{uri}", response="{response}", algorithm=MD5{extra}',
    )
    return message


def replayed(original: SipMessage, call: str, request_uri: str = URI) -> SipMessage:
    """The same Authorization header in a new INVITE (a new Call-ID and branch)."""
    message = SipMessage(method="INVITE", uri=request_uri)
    message.add_header("Via", f"SIP/2.0/UDP {PBX}:5060;branch=z9hG4bK{call}")
    message.add_header("Call-ID", call)
    message.add_header("Authorization", original.header("Authorization") or "")
    return message


def test_a_right_answer_proves_the_user() -> None:
    auth = DigestAuth({"pbx": "s3cret"}, realm="hotline")
    verdict = auth.check(answered(nonce_of(auth)), PBX, now=1010.0)
    assert verdict.user == "pbx" and not verdict.stale


def test_an_answer_without_qop_auth_proves_nothing() -> None:
    auth = DigestAuth({"pbx": "s3cret"})
    verdict = auth.check(answered(nonce_of(auth), qop=False), PBX, now=1010.0)
    assert verdict.user is None and not verdict.stale
    assert verdict.reason == "no qop=auth"


def test_wrong_password_unknown_user_stale_or_forged_nonce_prove_nothing() -> None:
    auth = DigestAuth({"pbx": "s3cret"}, nonce_ttl_s=60)
    assert auth.check(answered(nonce_of(auth), password="guess"), PBX, now=1010.0).user is None
    assert auth.check(answered(nonce_of(auth), user="intruder"), PBX, now=1010.0).user is None
    other = DigestAuth({"pbx": "s3cret"})  # another process's key: its nonces are not ours
    assert auth.check(answered(nonce_of(other)), PBX, now=1010.0).user is None
    assert auth.check(SipMessage(method="INVITE", uri=URI), PBX, now=1010.0).user is None
    garbage = SipMessage(method="INVITE", uri=URI)
    garbage.add_header("Authorization", 'Digest username="pbx", nonce="zz.zz", response=')
    assert auth.check(garbage, PBX, now=1010.0).user is None
    forged = answered("3e8." + "0" * 16 + "." + "0" * 32)  # our format, not our HMAC
    assert auth.check(forged, PBX, now=1010.0).user is None


def test_the_same_authorization_in_a_new_request_is_a_replay() -> None:
    auth = DigestAuth({"pbx": "s3cret"})
    first = answered(nonce_of(auth), call="call-1")
    assert auth.check(first, PBX, now=1001.0).user == "pbx"
    replay = auth.check(replayed(first, "call-2"), PBX, now=1002.0)
    assert replay.user is None
    assert replay.reason == "nonce count replayed"
    # the same request again (a UDP retransmission: same Call-ID and branch) is still itself
    assert auth.check(first, PBX, now=1003.0).user == "pbx"
    assert auth.check(first, PBX, now=1003.0 + 33).user is None  # past any retransmission


def test_a_nonce_is_good_only_from_the_host_it_was_given_to() -> None:
    auth = DigestAuth({"pbx": "s3cret"})
    message = answered(nonce_of(auth, source=PBX))
    assert auth.check(message, "127.0.0.3", now=1001.0).user is None  # first use, elsewhere
    assert auth.check(message, PBX, now=1001.0).user == "pbx"
    assert auth.check(replayed(message, "call-2"), "127.0.0.3", now=1002.0).user is None
    assert auth.check(answered(nonce_of(auth, "::ffff:127.0.0.2")), PBX, 1003.0).user == "pbx"


def test_the_uri_must_be_the_request_uri() -> None:
    auth = DigestAuth({"pbx": "s3cret"})
    elsewhere = "sip:+15559990000@10.0.0.1"  # the answer was for URI, the request is not
    verdict = auth.check(answered(nonce_of(auth), request_uri=elsewhere), PBX, now=1001.0)
    assert verdict.user is None and verdict.reason == "uri is not the Request-URI"
    proven = answered(nonce_of(auth))
    assert auth.check(replayed(proven, "call-2", request_uri=elsewhere), PBX, 1001.0).user is None


def test_nonce_counts_must_count_up() -> None:
    auth = DigestAuth({"pbx": "s3cret"})
    nonce = nonce_of(auth)
    assert auth.check(answered(nonce, nc=1, call="a"), PBX, now=1001.0).user == "pbx"
    assert auth.check(answered(nonce, nc=2, call="b"), PBX, now=1002.0).user == "pbx"
    assert auth.check(answered(nonce, nc=2, call="c"), PBX, now=1003.0).user is None
    assert auth.check(answered(nonce, nc=1, call="d"), PBX, now=1003.0).user is None
    assert auth.check(answered(nonce, nc=5, call="e"), PBX, now=1004.0).user == "pbx"
    wrong = answered(nonce, password="guess", nc=9, call="f")
    assert auth.check(wrong, PBX, now=1005.0).user is None
    assert auth.check(answered(nonce, nc=6, call="g"), PBX, now=1006.0).user == "pbx"


def test_an_expired_nonce_answered_right_is_stale() -> None:
    auth = DigestAuth({"pbx": "s3cret"}, nonce_ttl_s=60)
    nonce = nonce_of(auth, now=1000.0)
    stale = auth.check(answered(nonce), PBX, now=1061.0)
    assert stale.user is None and stale.stale
    assert auth.check(answered(nonce, password="guess"), PBX, now=1061.0).stale is False
    scheme, challenge = parse_auth_params(auth.challenge(PBX, now=1061.0, stale=True))
    assert scheme == "Digest" and challenge["stale"] == "true"
    assert challenge["nonce"] != nonce
    assert auth.check(answered(challenge["nonce"]), PBX, now=1062.0).user == "pbx"
    assert "stale" not in auth.challenge(PBX)


def test_remembered_nonces_are_bounded_and_a_forgotten_one_never_counts_again() -> None:
    auth = DigestAuth({"pbx": "s3cret"}, max_nonces=8)
    first = answered(nonce_of(auth, now=1000.0), call="first")
    assert auth.check(first, PBX, now=1000.5).user == "pbx"
    for n in range(40):
        nonce = nonce_of(auth, now=1001.0 + n / 10)
        assert auth.check(answered(nonce, call=f"call{n}"), PBX, now=1001.0 + n / 10).user
        assert auth.remembered <= 8
    verdict = auth.check(replayed(first, "again"), PBX, now=1006.0)  # forgotten: not fresh
    assert verdict.user is None and verdict.stale
