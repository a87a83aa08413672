"""Server URLs between their HTTP and websocket forms: only a leading scheme changes."""

from __future__ import annotations

import pytest

from voice.server.urls import http_url, websocket_url

CASES = [
    ("http://127.0.0.1:8080", "ws://127.0.0.1:8080"),
    ("https://hotline.example/twilio/stream", "wss://hotline.example/twilio/stream"),
    (
        "http://host/phone?next=https://other.example/",
        "ws://host/phone?next=https://other.example/",
    ),
    ("https://host/r/http://inner/x?u=http://q", "wss://host/r/http://inner/x?u=http://q"),
    ("ws://already.example/x", "ws://already.example/x"),
    ("wss://already.example/x?back=https://h", "wss://already.example/x?back=https://h"),
    ("/relative/http://path", "/relative/http://path"),
]


@pytest.mark.parametrize(("url", "expected"), CASES)
def test_websocket_url_changes_only_a_leading_http_scheme(url: str, expected: str) -> None:
    assert websocket_url(url) == expected


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("ws://127.0.0.1:8080/twilio/stream", "http://127.0.0.1:8080/twilio/stream"),
        ("wss://hotline.example/x?to=ws://inner", "https://hotline.example/x?to=ws://inner"),
        ("https://host/x?to=wss://inner", "https://host/x?to=wss://inner"),
    ],
)
def test_http_url_changes_only_a_leading_websocket_scheme(url: str, expected: str) -> None:
    assert http_url(url) == expected


@pytest.mark.parametrize(("url", "_"), CASES[:4])
def test_the_two_are_inverses_on_http_urls(url: str, _: str) -> None:
    assert http_url(websocket_url(url)) == url
