"""Settings from the environment, as operators write them."""

from __future__ import annotations

import pytest

from voice.server.settings import IceServer, Settings


def test_defaults_work_offline() -> None:
    settings = Settings()
    assert settings.llm.base_url is None  # the embedded simulator
    assert settings.webrtc.ice_servers == []
    assert settings.api_token is None
    # tiny.en for both (see README), in the fitted window: phone audio and the browser's.
    assert settings.phone_stt.model == settings.stt.model == "tiny.en"
    assert (settings.phone_stt.encoder_window, settings.stt.encoder_window) == ("fit", "fit")


def test_nested_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOTLINE_PORT", "9000")
    monkeypatch.setenv("HOTLINE_PHONE_STT__MODEL", "base")
    monkeypatch.setenv("HOTLINE_TELEPHONY__TWILIO_AUTH_TOKEN", "tok")
    monkeypatch.setenv("HOTLINE_SIP__LIMITS__STRANGER_RATE", "50")
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
    assert settings.sip.limits.stranger_rate == 50 and settings.sip.limits.stranger_burst == 40
    assert settings.webrtc.ice_servers == [
        "stun:stun.example.org:3478",
        IceServer(urls="turn:turn.example.org:3478", username="u", credential="p"),
    ]


def test_controller_policy_and_tiers_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOTLINE_CONTROLLER__BUDGET_MS", "1500")
    monkeypatch.setenv("HOTLINE_CONTROLLER__HEDGE", "true")
    monkeypatch.setenv("HOTLINE_POLICY", '{"policy": "fixed", "effort": "low"}')
    monkeypatch.setenv(
        "HOTLINE_LLM__TIERS",
        '[{"name": "groq", "service_tier": null, "base_url": "https://api.groq.com/openai/v1",'
        ' "api_key": "gsk", "model": "m", "cost_rank": 1, "prior_ttft_ms": 150,'
        ' "prior_tokens_per_s": 900, "efforts": ["low", "medium"]},'
        ' {"name": "standard", "service_tier": "default", "prior_ttft_ms": 550,'
        ' "prior_tokens_per_s": 55}]',
    )
    settings = Settings()
    assert settings.controller.budget_ms == 1500 and settings.controller.hedge
    assert (settings.policy.policy, settings.policy.effort) == ("fixed", "low")
    groq, standard = settings.llm.tiers
    assert groq.base_url == "https://api.groq.com/openai/v1" and groq.efforts == ("low", "medium")
    assert groq.api_key is not None and groq.api_key.get_secret_value() == "gsk"
    assert standard.base_url is None and standard.cost_rank == 0
    # defaults: the fast tier first, then the standard one; adaptive calls
    monkeypatch.delenv("HOTLINE_LLM__TIERS")
    monkeypatch.delenv("HOTLINE_POLICY")
    defaults = Settings()
    assert [t.name for t in defaults.llm.tiers] == ["fast", "standard"]
    assert defaults.policy.policy == "adaptive" and defaults.policy.budget_ms is None
