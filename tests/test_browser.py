"""The softphone page in a real browser: Debian's chromium, headless, driven by Playwright.

Chromium's fake microphone plays a WAV file (in a loop), so the file holds one utterance
followed by a long silence. The utterance is piper's natural voice: through Chrome (echo
cancelled, Opus) and the fitted window, tiny.en heard espeak's robotic "I need a taxi" as "I need
not access it" in 2 calls of 12 with the cores busy (the same audio offline: 1 of 12; how the
speech falls on Whisper's 10 ms frames decides it), piper's "I need a taxi" right in 16 of 16.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import Page, async_playwright

from tests.support.browser import chromium
from tests.support.server import Server
from tests.support.speech import concat, piper, silence, write_wav

pytestmark = pytest.mark.slow

GREY = "rgb(154, 163, 173)"  # a disabled button's background (#9aa3ad)


async def background(page: Page, selector: str) -> str:
    """The computed background colour of the element `selector` names."""
    colour: str = await page.eval_on_selector(
        selector, "(element) => getComputedStyle(element).backgroundColor"
    )
    return colour


async def test_softphone_page_places_a_call(server: Server, tmp_path: Path) -> None:
    speech = tmp_path / "caller.wav"
    write_wav(
        speech, concat(silence(1500), piper("I need a taxi to the airport."), silence(30_000))
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
            # Its own icon: a headed browser asks for /favicon.ico (a 404) when a page has none.
            assert await page.locator('link[rel="icon"]').count() == 1
            # A disabled button looks disabled (grey), an enabled one does not.
            assert await background(page, "#hangup") == GREY != await background(page, "#call")
            await page.click("#call")
            caller = page.locator("#transcript li.caller .text").first
            await caller.wait_for(timeout=45_000)
            # The microphone as Whisper should hear it: echo cancelled, otherwise untouched
            # (through Chrome's noise suppression and gain, the fitted window misheard espeak's
            # "a taxi" as "that access" in 5 calls of 6).
            mic = await page.evaluate("() => pc.getSenders()[0].track.getSettings()")
            heard_as = (mic["echoCancellation"], mic["noiseSuppression"], mic["autoGainControl"])
            assert heard_as == (True, False, False), mic
            bot = page.locator("#transcript li.bot .text").first
            await bot.wait_for(timeout=45_000)
            latency = page.locator("#transcript li.bot .latency").first
            await latency.wait_for(timeout=45_000)
            assert await background(page, "#call") == GREY != await background(page, "#hangup")
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
