"""The supervisor console in a real browser (Debian's chromium, headless, Playwright), served by
worker B while the call runs on worker A (two real `hotline serve` sharing a real Redis), the
caller the faithful Twilio phone speaking real speech: sign-in, the live call, its live
transcript (the greeting, a tool's result as fields, the operator's message), listen-in audio
from A over WebRTC, say, and a hang-up from the console; the same transcript after the call.
The softphone page signs in with the console's form.

With HOTLINE_UPDATE_SCREENSHOT=1 it also renews the README's screenshot of the console."""

from __future__ import annotations

import asyncio
import json
import math
import os
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import websockets
from playwright.async_api import Dialog, Page, async_playwright

from tests.support.browser import chromium
from tests.support.redis_server import RedisServer
from tests.support.server import Server, start_server, stop_server
from tests.support.speech import concat, piper, silence
from voice.devtools.twilio_call import place_twilio_call

pytestmark = pytest.mark.slow

TOKEN = "console-browser-api-token-3c1d"
TWILIO_TOKEN = "console-browser-twilio-token"
SCREENSHOT = Path("deploy/screenshots/console.png")
GREETING = "Thanks for calling the garden centre."
ORDERS = "+15559870042"  # the number the console's call dials: the agent with the order tool
ORDER_AGENT = """
name: garden-orders
numbers: ["{number}"]
instructions: You answer questions about orders of plants and bulbs.
tools:
  - name: order_status
    description: Look up an order by its number
    parameters:
      type: object
      properties: {{order_number: {{type: string}}}}
      required: [order_number]
    url: {url}
"""
# Seconds of audio the recording player could load (its metadata), or -1 if it failed.
PLAYABLE_SECONDS = """() => new Promise((resolve) => {
  const audio = document.getElementById("recording");
  const done = () => resolve(audio.error ? -1 : audio.duration);
  if (audio.readyState >= 1 || audio.error) done();
  audio.addEventListener("loadedmetadata", done);
  audio.addEventListener("error", done);
  audio.load();
})"""


class OrderStatus(BaseHTTPRequestHandler):
    """The operator's order service: every order has shipped."""

    def do_POST(self) -> None:
        asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        number = asked["arguments"].get("order_number", "")
        answer = json.dumps({"order": number, "status": "shipped", "eta": "Friday"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def order_agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory with the agent of the order line, its order service running."""
    service = ThreadingHTTPServer(("127.0.0.1", 0), OrderStatus)
    thread = threading.Thread(target=service.serve_forever, daemon=True)
    thread.start()
    directory = tmp_path_factory.mktemp("agents")
    url = f"http://127.0.0.1:{service.server_address[1]}/status"
    (directory / "orders.yaml").write_text(ORDER_AGENT.format(number=ORDERS, url=url))
    yield directory
    service.shutdown()
    thread.join(10)


@pytest.fixture(scope="module")
def workers(redis_server: RedisServer, order_agents: Path) -> Iterator[tuple[Server, Server]]:
    shared = {
        "HOTLINE_REDIS_URL": redis_server.url,
        "HOTLINE_API_TOKEN": TOKEN,
        "HOTLINE_TELEPHONY__TWILIO_AUTH_TOKEN": TWILIO_TOKEN,
        "HOTLINE_CONVERSATION__GREETING": GREETING,
        "HOTLINE_AGENTS__DIR": str(order_agents),
        "HOTLINE_AGENTS__SIGNING_SECRET": "console-browser-signing-secret",
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


async def shows_the_transcript(page: Page) -> None:
    """The call's transcript as said: the greeting first (an announcement), the order tool's
    result as its fields, the operator's message as the operator's."""
    greeting = page.locator("#transcript .line.announcement", has_text="garden centre")
    await greeting.wait_for(timeout=30_000)
    first = await page.locator("#transcript .line").first.get_attribute("class")
    assert "announcement" in (first or ""), first
    result = page.locator("#transcript .line.tool", has=page.locator("dl.fields"))
    await result.first.wait_for(timeout=30_000)
    assert (await result.first.locator(".text").inner_text()).startswith("order_status ok")
    fields = await result.first.locator("dl.fields").inner_text()
    assert "status" in fields and "shipped" in fields and "Friday" in fields, fields
    operator = page.locator("#transcript .line.operator", has_text="supervisor is listening")
    await operator.wait_for(timeout=20_000)
    assert await page.locator("#transcript", has_text="operator said").count() == 0


async def shows_the_chart_labelled(page: Page) -> None:
    """Each turn's number is first audio, the red line the budget, both said so."""
    value = await page.locator("#chart g.turn text.first-audio").first.text_content()
    assert (value or "").startswith("first audio "), value
    budget = await page.locator("#chart text.budget-label").first.text_content()
    assert (budget or "").startswith("budget "), budget
    legend = await page.locator("#chart-legend").inner_text()
    assert "budget" in legend and "first audio" in legend, legend


async def hangs_up_once_confirmed(page: Page) -> str:
    """Hang up, accepting the page's question; the question."""
    asked: list[str] = []

    async def accept(dialog: Dialog) -> None:
        asked.append(dialog.message)
        await dialog.accept()

    page.once("dialog", accept)
    await page.click("#hangup")
    await page.locator("#call-state", has_text="ended").wait_for(timeout=20_000)
    assert asked, "hung up without asking"
    return asked[0]


async def test_console_shows_listens_to_and_hangs_up_a_call_of_another_worker(
    workers: tuple[Server, Server], tmp_path: Path
) -> None:
    a, b = workers
    call_id = f"CA{uuid.uuid4().hex}"
    lines = ["Where is my order, number four five one two?", "Do you deliver on Saturdays?"]
    utterances = [concat(silence(2500), piper(text), silence(300)) for text in lines]
    phone = asyncio.create_task(
        place_twilio_call(
            a.url,
            utterances,
            auth_token=TWILIO_TOKEN,
            call_sid=call_id,
            parameters={"to": ORDERS},
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
            assert "order" in (await caller_line.inner_text()).lower()
            await page.locator("#transcript .line.bot").first.wait_for(timeout=45_000)
            await page.locator("#turns tbody tr[data-turn]").first.wait_for(timeout=30_000)
            await page.locator("#chart g.turn").first.wait_for(timeout=30_000)
            await shows_the_chart_labelled(page)
            # listen-in: the call's audio, both sides, from worker A
            await page.click("#listen")
            rms = await loudest_rms(page, within_s=30.0)
            print(f"\nlisten-in RMS {rms:.3f}")
            assert rms > 0.02, "no audio reached the supervisor"
            # said once the caller has said all (their speech would cut it short); it cuts
            # the bot's answer short
            await page.locator("#transcript .line.caller").nth(1).wait_for(timeout=45_000)
            await page.fill("#say-text", "A supervisor is listening.")
            await page.click("#say")
            await shows_the_transcript(page)  # live, the operator's line once it was heard
            shot = SCREENSHOT if os.environ.get("HOTLINE_UPDATE_SCREENSHOT") else None
            await page.screenshot(path=shot or tmp_path / "console.png")
            # a hang-up from the console, once confirmed, ends the call (the phone's stream is
            # closed)
            assert call_id in await hangs_up_once_confirmed(page)
            result = await asyncio.wait_for(phone, 30)
            assert result.rejected is None
            # the ended call, shown afresh: the same transcript, from the call's events ...
            await page.reload()
            await page.locator("#call-state", has_text="ended").wait_for(timeout=20_000)
            await shows_the_transcript(page)
            raw = page.locator("#transcript .line.tool details.raw").first
            await raw.locator("summary").click()  # the tool's raw JSON, one click away
            assert '"status":"shipped"' in await raw.locator("pre").inner_text()
            # ... and its recording (on worker A) plays in the page served by B
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


# What the softphone's Call button does, with junk for an offer: its answer's status.
OFFER_STATUS = """() => fetch("/offer", {
  method: "POST",
  headers: { "Content-Type": "application/json" },
  body: JSON.stringify({ sdp: "v=0", type: "offer" }),
}).then((response) => response.status)"""


async def test_the_softphone_signs_in_with_the_consoles_form(
    workers: tuple[Server, Server],
) -> None:
    """With a token set, the softphone page asks for it as the console does and keeps the
    console's session cookie: its calls are then let through (here refused for the SDP, not
    for a missing token), and the token is in no URL and no log line."""
    a, _ = workers
    mark = a.log_mark()
    async with async_playwright() as playwright:
        browser = await chromium(playwright)
        try:
            page = await browser.new_page()
            await page.goto(a.url)
            await page.fill("#token", TOKEN)
            await page.click("#sign-in")
            await page.locator("#call").wait_for(timeout=10_000)  # the softphone, signed in
            assert page.url == f"{a.url}/"
            assert await page.evaluate(OFFER_STATUS) == 400
        finally:
            await browser.close()
    assert not [line for line in a.log[mark.line :] if TOKEN in line]


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
