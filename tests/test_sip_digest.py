"""SIP digest authentication (RFC 2617 as SIP uses it): a PBX's answer to our challenge is
checked against what RFC 2617's formulas give, stale and forged nonces are refused."""

from __future__ import annotations

import hashlib

from voice.transports.sip.digest import DigestAuth
from voice.transports.sip.message import SipMessage, parse_auth_params


def md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def answered(
    auth: DigestAuth, user: str, password: str, now: float, qop: bool = True
) -> SipMessage:
    """An INVITE carrying the answer a PBX computes for our challenge."""
    _, challenge = parse_auth_params(auth.challenge(now))
    uri = "sip:+15551230000@10.0.0.1"
    ha1 = md5(f"{user}:{challenge['realm']}:{password}")
    ha2 = md5(f"INVITE:{uri}")
    nonce = challenge["nonce"]
    if qop:
        response = md5(f"{ha1}:{nonce}:00000001:abc:auth:{ha2}")
        extra = ', qop=auth, nc=00000001, cnonce="abc"'
    else:
        response = md5(f"{ha1}:{nonce}:{ha2}")
        extra = ""
    message = SipMessage(method="INVITE", uri=uri)
    message.add_header(
        "Authorization",
        f'Digest username="{user}", realm="{challenge["realm"]}", nonce="{nonce}", '
        f'uri="{uri}", response="{response}", algorithm=MD5{extra}',
    )
    return message


def test_a_right_answer_proves_the_user_with_or_without_qop() -> None:
    auth = DigestAuth({"pbx": "s3cret"}, realm="hotline")
    assert auth.check(answered(auth, "pbx", "s3cret", now=1000.0), now=1010.0) == "pbx"
    assert auth.check(answered(auth, "pbx", "s3cret", 1000.0, qop=False), now=1010.0) == "pbx"


def test_wrong_password_unknown_user_stale_or_forged_nonce_prove_nothing() -> None:
    auth = DigestAuth({"pbx": "s3cret"}, nonce_ttl_s=300)
    assert auth.check(answered(auth, "pbx", "guess", now=1000.0), now=1010.0) is None
    assert auth.check(answered(auth, "intruder", "s3cret", now=1000.0), now=1010.0) is None
    assert auth.check(answered(auth, "pbx", "s3cret", now=1000.0), now=1400.0) is None  # stale
    other = DigestAuth({"pbx": "s3cret"})  # another process's key: its nonces are not ours
    assert auth.check(answered(other, "pbx", "s3cret", now=1000.0), now=1010.0) is None
    assert auth.check(SipMessage(method="INVITE", uri="sip:x@y"), now=1010.0) is None
    garbage = SipMessage(method="INVITE", uri="sip:x@y")
    garbage.add_header("Authorization", 'Digest username="pbx", nonce="zz.zz", response=')
    assert auth.check(garbage, now=1010.0) is None
