"""Stream tokens, call ids and the exposure warning: pure units, no server."""

from __future__ import annotations

import logging

import pytest
from pydantic import SecretStr

from voice.server.app import _warn_if_exposed
from voice.server.call_records import valid_call_id
from voice.server.settings import Settings, TelephonySettings
from voice.transports.phone.tokens import InvalidToken, StreamTokens


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_token_admits_its_own_call_once_checked() -> None:
    clock = Clock()
    tokens = StreamTokens(b"secret", ttl_s=60, clock=clock)
    token = tokens.issue("telnyx", "v3:abc")
    grant = tokens.check(token, "telnyx", "v3:abc")
    assert (grant.provider, grant.call_id, grant.expires_at) == ("telnyx", "v3:abc", clock.now + 60)
    assert grant.nonce != tokens.check(tokens.issue("telnyx", "v3:abc"), "telnyx", "v3:abc").nonce


@pytest.mark.parametrize(
    ("provider", "call_id", "why"),
    [
        ("vonage", "v3:abc", "is for telnyx, not vonage"),
        ("telnyx", "v3:abd", "for another call"),
    ],
)
def test_a_token_for_another_stream_is_refused(provider: str, call_id: str, why: str) -> None:
    tokens = StreamTokens(b"secret")
    with pytest.raises(InvalidToken, match=why):
        tokens.check(tokens.issue("telnyx", "v3:abc"), provider, call_id)


def test_an_expired_token_is_refused() -> None:
    clock = Clock()
    tokens = StreamTokens(b"secret", ttl_s=60, clock=clock)
    token = tokens.issue("twilio", "CA1")
    clock.now += 60.5
    with pytest.raises(InvalidToken, match="expired"):
        tokens.check(token, "twilio", "CA1")


@pytest.mark.parametrize(
    "forge",
    [
        lambda t: None,
        lambda t: "",
        lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),  # signature changed
        lambda t: "e30." + t.partition(".")[2],  # payload swapped
        lambda t: t.partition(".")[0],  # no signature
        lambda t: "not a token at all",
        lambda t: StreamTokens(b"another secret").issue("twilio", "CA1"),
    ],
)
def test_forged_or_missing_tokens_are_refused(forge: object) -> None:
    tokens = StreamTokens(b"secret")
    token = tokens.issue("twilio", "CA1")
    assert callable(forge)
    with pytest.raises(InvalidToken):
        tokens.check(forge(token), "twilio", "CA1")


def test_a_signed_but_malformed_payload_is_refused_not_crashed() -> None:
    tokens = StreamTokens(b"secret")
    body = "bm90IGpzb24"  # base64url of "not json"
    token = f"{body}.{tokens._sign(body)}"
    with pytest.raises(InvalidToken, match="malformed"):
        tokens.check(token, "twilio", "CA1")


@pytest.mark.parametrize(
    ("call_id", "valid"),
    [
        ("CA0123456789abcdef0123456789abcdef", True),
        ("v3:u5OAKGEPT3Dx8SZSSDRWEMdNH2OripQhO", True),
        ("aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa", True),
        ("CA1\nINFO forged line", False),
        ("../../etc/passwd", False),
        ("", False),
        ("a" * 129, False),
        ("CA1\x00", False),
    ],
)
def test_provider_call_ids_are_plain(call_id: str, valid: bool) -> None:
    assert valid_call_id(call_id) is valid


def test_the_stream_secret_falls_back_to_the_api_token_then_twilios() -> None:
    assert Settings().stream_secret() is None
    twilio = TelephonySettings(twilio_auth_token=SecretStr("tw"))
    assert Settings(telephony=twilio).stream_secret() == b"tw"
    assert Settings(telephony=twilio, api_token=SecretStr("api")).stream_secret() == b"api"
    own = TelephonySettings(twilio_auth_token=SecretStr("tw"), stream_secret=SecretStr("own"))
    assert Settings(telephony=own, api_token=SecretStr("api")).stream_secret() == b"own"


def test_an_exposed_worker_without_secrets_says_so_loudly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="voice.server.app"):
        _warn_if_exposed(Settings(host="127.0.0.1"))
        assert not caplog.records
        _warn_if_exposed(Settings(host="0.0.0.0"))
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and all(m.startswith("SECURITY:") for m in said)
    assert "HOTLINE_API_TOKEN" in said[0] and "/twilio/stream" in said[1]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="voice.server.app"):
        _warn_if_exposed(Settings(host="0.0.0.0", api_token=SecretStr("t")))
    assert not caplog.records  # the API token also keys the stream tokens
