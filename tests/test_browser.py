"""The softphone page in a real browser: Debian's chromium, headless, driven by Playwright.

Chromium's fake microphone plays a WAV file (in a loop), so the file holds one utterance
followed by a long silence.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import async_playwright

from tests.support.browser import chromium
from tests.support.server import Server
from tests.support.speech import concat, espeak, silence, write_wav

pytestmark = pytest.mark.slow


async def test_softphone_page_places_a_call(server: Server, tmp_path: Path) -> None:
    speech = tmp_path / "caller.wav"
    write_wav(
        speech, concat(silence(1500), espeak("I need a taxi to the airport."), silence(30_000))
    )
    async with async_playwright() as playwright:
        browser = await chromium(
            playwright,
            "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={speech}",
        )
        try:
            page = await browser.new_page()
            console: list[str] = []
            page.on("console", lambda message: console.append(message.text))
            await page.goto(server.url)
            await page.click("#call")
            caller = page.locator("#transcript li.caller .text").first
            await caller.wait_for(timeout=45_000)
            # The microphone as Whisper should hear it: echo cancelled, otherwise untouched
            # (Chrome's noise suppression and gain made the fitted window mishear this phrase).
            mic = await page.evaluate("() => pc.getSenders()[0].track.getSettings()")
            heard_as = (mic["echoCancellation"], mic["noiseSuppression"], mic["autoGainControl"])
            assert heard_as == (True, False, False), mic
            bot = page.locator("#transcript li.bot .text").first
            await bot.wait_for(timeout=45_000)
            latency = page.locator("#transcript li.bot .latency").first
            await latency.wait_for(timeout=45_000)
            caller_text = (await caller.inner_text()).lower()
            bot_text = (await bot.inner_text()).lower()
            print(f"\npage shows caller: {caller_text!r}\nbot: {bot_text!r}")
            shown = await latency.inner_text()
            print(shown)
            assert "of a 1000 ms budget" in shown and "effort" in shown
            assert await latency.get_attribute("title")  # the controller's reason, on hover
            assert "taxi" in caller_text and "airport" in caller_text
            assert "taxi" in bot_text
            await page.click("#hangup")
            await page.locator("#status", has_text="Hung up").wait_for(timeout=5_000)
        finally:
            await browser.close()
