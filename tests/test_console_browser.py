"""The supervisor console in a real browser (Debian's chromium, headless, Playwright), served by
worker B while the call runs on worker A (two real `hotline serve` sharing a real Redis), the
caller the faithful Twilio phone speaking real speech: sign-in, the live call, its live
transcript, listen-in audio from A over WebRTC, say, and a hang-up from the console.

With HOTLINE_UPDATE_SCREENSHOT=1 it also renews the README's screenshot of the console."""

from __future__ import annotations

import asyncio
import json
import math
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets
from playwright.async_api import Page, async_playwright

from tests.support.browser import chromium
from tests.support.redis_server import RedisServer
from tests.support.server import Server, start_server, stop_server
from tests.support.speech import concat, piper, silence
from voice.devtools.twilio_call import place_twilio_call

pytestmark = pytest.mark.slow

TOKEN = "console-browser-api-token-3c1d"
TWILIO_TOKEN = "console-browser-twilio-token"
SCREENSHOT = Path("deploy/screenshots/console.png")
# Seconds of audio the recording player could load (its metadata), or -1 if it failed.
PLAYABLE_SECONDS = """() => new Promise((resolve) => {
  const audio = document.getElementById("recording");
  const done = () => resolve(audio.error ? -1 : audio.duration);
  if (audio.readyState >= 1 || audio.error) done();
  audio.addEventListener("loadedmetadata", done);
  audio.addEventListener("error", done);
  audio.load();
})"""


@pytest.fixture(scope="module")
def workers(redis_server: RedisServer) -> Iterator[tuple[Server, Server]]:
    shared = {
        "HOTLINE_REDIS_URL": redis_server.url,
        "HOTLINE_API_TOKEN": TOKEN,
        "HOTLINE_TELEPHONY__TWILIO_AUTH_TOKEN": TWILIO_TOKEN,
        "HOTLINE_CONVERSATION__GREETING": "Thanks for calling the garden centre.",
    }
    a = start_server(shared)
    try:
        b = start_server(shared)
    except Exception:
        stop_server(a)
        raise
    yield a, b
    stop_server(b)
    stop_server(a)


async def signed_in(page: Page, server: Server) -> None:
    await page.goto(f"{server.url}/console")
    await page.fill("#token", "not the token")
    await page.click("#sign-in")
    await page.locator(".error").wait_for(timeout=10_000)  # refused, said so
    await page.fill("#token", TOKEN)
    await page.click("#sign-in")
    await page.locator("#calls").wait_for(timeout=10_000)


async def loudest_rms(page: Page, within_s: float) -> float:
    """The loudest listen-in level the page reported (its `data-rms`, 10 times a second)."""
    loudest = 0.0
    deadline = asyncio.get_running_loop().time() + within_s
    while asyncio.get_running_loop().time() < deadline and loudest < 0.02:
        value = await page.locator("#listen-level").get_attribute("data-rms")
        loudest = max(loudest, float(value or 0))
        await asyncio.sleep(0.1)  # sampling the page's meter, not waiting for an event
    return loudest


async def test_console_shows_listens_to_and_hangs_up_a_call_of_another_worker(
    workers: tuple[Server, Server], tmp_path: Path
) -> None:
    a, b = workers
    call_id = f"CA{uuid.uuid4().hex}"
    lines = [
        "I would like to order some tulip bulbs for my garden.",
        "Do you deliver on Saturdays?",
        "And how much is the delivery?",
    ]
    utterances = [concat(silence(2500), piper(text), silence(300)) for text in lines]
    phone = asyncio.create_task(
        place_twilio_call(
            a.url,
            utterances,
            auth_token=TWILIO_TOKEN,
            call_sid=call_id,
            quiet_s=1.0,
            linger_s=120.0,  # stays on the line until the console hangs up
        )
    )
    async with async_playwright() as playwright:
        browser = await chromium(playwright)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            await signed_in(page, b)
            row = page.locator(f'#calls tr[data-call-id="{call_id}"]')
            await row.wait_for(timeout=30_000)
            await row.click()
            caller_line = page.locator("#transcript .line.caller").first
            await caller_line.wait_for(timeout=45_000)
            assert (
                "tulip" in (await caller_line.inner_text()).lower()
                or "order" in (await caller_line.inner_text()).lower()
            )
            await page.locator("#transcript .line.bot").first.wait_for(timeout=45_000)
            await page.locator("#turns tbody tr[data-turn]").first.wait_for(timeout=30_000)
            await page.locator("#chart g.turn").first.wait_for(timeout=30_000)
            # listen-in: the call's audio, both sides, from worker A
            await page.click("#listen")
            rms = await loudest_rms(page, within_s=30.0)
            print(f"\nlisten-in RMS {rms:.3f}")
            assert rms > 0.02, "no audio reached the supervisor"
            await page.fill("#say-text", "A supervisor is listening.")
            await page.click("#say")
            await page.locator(
                "#transcript .line.note", has_text="supervisor is listening"
            ).wait_for(timeout=10_000)
            shot = SCREENSHOT if os.environ.get("HOTLINE_UPDATE_SCREENSHOT") else None
            await page.screenshot(path=shot or tmp_path / "console.png")
            # a hang-up from the console ends the call (the phone's stream is closed)
            await page.click("#hangup")
            result = await asyncio.wait_for(phone, 30)
            assert result.rejected is None
            await page.locator("#call-state", has_text="ended").wait_for(timeout=20_000)
            # the ended call: its recording (on worker A) plays in the page served by B
            await page.locator("audio#recording").wait_for(timeout=20_000)
            duration = await page.evaluate(PLAYABLE_SECONDS)
            # finite: the player asked byte ranges for the end of the file and was answered
            assert math.isfinite(duration) and duration > 5, duration
            assert not errors, errors
            await page.click("#sign-out")  # the session is revoked: back to the sign-in form
            await page.locator("#sign-in").wait_for(timeout=10_000)
        finally:
            await browser.close()
            if not phone.done():
                phone.cancel()
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        detail = (await client.get(f"{b.url}/calls/{call_id}", timeout=10)).json()
    assert detail["state"] == "ended"
    assert detail["end_reason"] == "hung up through the API"


async def first_turn(server: Server, call_id: str) -> None:
    """Once the call's first turn is over (its live events, read from any worker)."""
    url = server.url.replace("http://", "ws://") + f"/calls/{call_id}/live?token={TOKEN}"
    async with asyncio.timeout(60):
        while True:
            try:
                async with websockets.connect(url) as socket:
                    async for message in socket:
                        if json.loads(message)["type"] == "turn":
                            return
            except websockets.InvalidStatus:
                pass  # not admitted yet: the phone is still dialling
            except websockets.ConnectionClosed:
                pass
            await asyncio.sleep(0.1)


async def test_supervisor_commands_reach_a_call_of_another_worker(
    workers: tuple[Server, Server],
) -> None:
    """The console's buttons are the calls API: sent to B, carried out by A (which owns the
    call). Bad input gets a clear error and the call goes on."""
    a, b = workers
    call_id = f"CA{uuid.uuid4().hex}"
    speech = concat(silence(2500), piper("Hello, is anybody there?"), silence(300))
    phone = asyncio.create_task(
        place_twilio_call(a.url, [speech], auth_token=TWILIO_TOKEN, call_sid=call_id, linger_s=60.0)
    )
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=b.url, headers=headers, timeout=20) as client:

        async def post(path: str, body: dict[str, str]) -> httpx.Response:
            return await client.post(f"/calls/{call_id}/{path}", json=body)

        await first_turn(b, call_id)  # the caller has spoken and been answered
        garbage = await post("listen", {"sdp": "v=0\r\nnot an offer", "type": "offer"})
        assert garbage.status_code == 400 and "malformed SDP" in garbage.json()["error"]
        bad = await post("transfer", {"target": "next door"})
        assert bad.status_code == 400 and "not a phone number" in bad.json()["error"]
        nowhere = await post("transfer", {})  # the built-in agent has no transfer target
        assert nowhere.status_code == 409 and "no transfer target" in nowhere.json()["error"]
        unknown = await client.post("/calls/CA-no-such-call/hangup")
        assert unknown.status_code == 404
        put_through = await post("transfer", {"target": "+15557654321", "reason": "VIP"})
        assert put_through.status_code == 200, put_through.text
        assert put_through.json()["to"] == "+15557654321"
        result = await asyncio.wait_for(phone, 60)
    # the caller heard the human message, then Twilio was told to dial the number
    assert result.after_stream == "Dial" and result.transferred_to == "+15557654321"
