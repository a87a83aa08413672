"""Debian's chromium, headless, for tests that drive a page with Playwright."""

from __future__ import annotations

from playwright.async_api import Browser, Playwright

CHROMIUM = "/usr/bin/chromium"
_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--allow-loopback-in-peer-connection",
    "--autoplay-policy=no-user-gesture-required",
]


async def chromium(playwright: Playwright, *args: str) -> Browser:
    """Chromium with loopback WebRTC and autoplay allowed, plus `args`."""
    return await playwright.chromium.launch(executable_path=CHROMIUM, args=[*_ARGS, *args])
