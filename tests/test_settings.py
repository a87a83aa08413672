"""Settings from the environment, as operators write them."""

from __future__ import annotations

import pytest

from voice.settings import IceServer, Settings


def test_defaults_work_offline() -> None:
    settings = Settings()
    assert settings.llm.base_url is None  # the embedded simulator
    assert settings.webrtc.ice_servers == []
    assert settings.api_token is None
    assert settings.phone_stt == settings.stt  # one shared tiny.en for both (see README)


def test_nested_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOTLINE_PORT", "9000")
    monkeypatch.setenv("HOTLINE_PHONE_STT__MODEL", "base")
    monkeypatch.setenv("HOTLINE_TELEPHONY__TWILIO_AUTH_TOKEN", "tok")
    monkeypatch.setenv(
        "HOTLINE_WEBRTC__ICE_SERVERS",
        '["stun:stun.example.org:3478", '
        '{"urls": "turn:turn.example.org:3478", "username": "u", "credential": "p"}]',
    )
    settings = Settings()
    assert settings.port == 9000
    assert settings.phone_stt.model == "base" and settings.stt.model == "tiny.en"
    assert settings.telephony.twilio_auth_token is not None
    assert settings.telephony.twilio_auth_token.get_secret_value() == "tok"
    assert settings.webrtc.ice_servers == [
        "stun:stun.example.org:3478",
        IceServer(urls="turn:turn.example.org:3478", username="u", credential="p"),
    ]
