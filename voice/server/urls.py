"""Server URLs between their HTTP and websocket forms: the scheme alone changes, and only a
leading one (a URL inside the path or query stays as it is)."""

from __future__ import annotations

_TO_WEBSOCKET = (("https://", "wss://"), ("http://", "ws://"))
_TO_HTTP = (("wss://", "https://"), ("ws://", "http://"))


def _swap_scheme(url: str, schemes: tuple[tuple[str, str], ...]) -> str:
    for old, new in schemes:
        if url.startswith(old):
            return new + url[len(old) :]
    return url


def websocket_url(url: str) -> str:
    """`url` with a leading http:// or https:// made ws:// or wss:// (any other unchanged)."""
    return _swap_scheme(url, _TO_WEBSOCKET)


def http_url(url: str) -> str:
    """`url` with a leading ws:// or wss:// made http:// or https:// (any other unchanged)."""
    return _swap_scheme(url, _TO_HTTP)
