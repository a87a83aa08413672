"""Twilio as a campaign's calls meet it, for tests: the fake Calls API of
tests/support/outbound_apis.py, which then plays each call's far end by a script per number and
attempt, and reports how the call ended to its `StatusCallback` as Twilio does
(https://www.twilio.com/docs/voice/api/call-resource#statuscallback): a form POST, signed with
`X-Twilio-Signature`, `CallStatus` `busy`, `no-answer`, `failed` or, for an answered call,
`completed` (with `CallDuration`) once it has hung up.

An `answer` in the script is the emulated phone (`voice.devtools.phone_caller.TwilioPhone`):
Twilio opens the media stream the call's TwiML names, the callee hears the greeting out and
hangs up. The others never open a stream. Every call is kept (`calls`) with when it was created
and when its end was reported, so a test can say which number was dialled when, and how often.
A create whose client is gone by the time it would be answered (`create_delay_s`) creates no
call, as if the request never arrived whole.

Also the receiver of the server's webhooks (`Webhooks`): every signed document, by event."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from websockets.asyncio.client import connect

from tests.support.outbound_apis import OutboundApis
from tests.support.outbound_calls import stream_of
from voice.agents.http_tools import SIGNATURE_HEADER, verify
from voice.devtools.phone_caller import TwilioPhone
from voice.devtools.stream_phone import talk
from voice.devtools.turns import converse
from voice.transports.phone.twilio import SIGNATURE_HEADER as TWILIO_SIGNATURE
from voice.transports.phone.twilio import twilio_signature

RING_S = 0.15  # how long a call rings before the callee is busy, does not answer, or answers
GREETING_QUIET_S = 2.0  # the callee hangs up after this much silence once the greeting began
SIP_CODES = {"busy": "486", "no-answer": "487", "failed": "500"}


@dataclass
class RungCall:
    sid: str
    to: str
    created_at: float
    happened: str  # busy, no-answer, failed, answer
    callback: str | None
    reported_at: float | None = None  # when its end was reported (before the POST)
    callback_status: int | None = None
    error: str | None = None  # what broke the fake's side of it (a test's failure shows it)


@dataclass
class CampaignTwilio(OutboundApis):
    """`script[number]`: what each dial of it comes to, in order (the last one repeats)."""

    script: dict[str, list[str]] = field(default_factory=dict)
    # run once a call to that number is placed (before it rings), not for a create that died
    on_placed: dict[str, Callable[[], Awaitable[None]]] = field(default_factory=dict)
    create_delay_s: float = 0.0  # Twilio's create takes this long to answer
    calls: list[RungCall] = field(default_factory=list)
    pending: set[int] = field(default_factory=set)  # client ports of creates being answered
    aborted: int = 0  # creates whose client went away before Twilio had read them
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def dialled(self, number: str) -> list[RungCall]:
        with self.lock:
            return [call for call in self.calls if call.to == number]

    async def _create(self, request: Request) -> Response:
        form = dict(parse_qsl((await request.body()).decode()))
        to = form.get("To", "")
        port = request.client.port if request.client else 0
        self.pending.add(port)
        try:
            await asyncio.sleep(self.create_delay_s)  # the fake's own pace, not a wait on Hotline
        finally:
            self.pending.discard(port)
        if await request.is_disconnected():  # the worker died: this call never was
            self.aborted += 1
            return Response(status_code=499)
        response = await super()._create(request)
        if response.status_code == 201:
            sid = json.loads(bytes(response.body))["sid"]
            plan = self.script.get(to) or ["busy"]
            with self.lock:
                done = sum(1 for call in self.calls if call.to == to)
                call = RungCall(sid, to, time.time(), plan[min(done, len(plan) - 1)], None)
                call.callback = form.get("StatusCallback")
                self.calls.append(call)
            # Only for a call that was placed: a create whose worker died on the way is none.
            hook = self.on_placed.pop(to, None)
            if hook is not None:
                await hook()
            task = asyncio.create_task(self._ring(call, form))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return response

    async def _ring(self, call: RungCall, form: dict[str, str]) -> None:
        try:
            await self._ring_out(call, form)
        except Exception as exc:  # kept for the test's failure message, not swallowed silently
            call.error = repr(exc)
            raise

    async def _ring_out(self, call: RungCall, form: dict[str, str]) -> None:
        await asyncio.sleep(RING_S)  # the fake's ringing, not a wait on Hotline
        status, extra = call.happened, {}
        if call.happened == "answer":
            began = time.monotonic()
            await self._answer(call, form["Twiml"])
            status, extra = "completed", {"CallDuration": str(round(time.monotonic() - began))}
        else:
            extra = {"SipResponseCode": SIP_CODES[status]}
        await self._report(call, form, status, extra)

    async def _answer(self, call: RungCall, twiml: str) -> None:
        """The callee picks up: the stream Twilio opens, the greeting heard out, a hang-up."""
        url, _, parameters = stream_of(twiml)
        async with connect(url, compression=None, open_timeout=10) as socket:
            phone = TwilioPhone(socket, call.sid, self.account_sid, parameters)
            await phone.open()
            # The greeting is heard out once 2 s pass in silence, not the bench caller's 0.8: the
            # tests read the greeting's words from the record, and on a CI runner busy with
            # other tests its second piece came later than 0.8 s after "Hi Ada," (once).
            opening = converse(phone, [], [], opening_wait_s=10, quiet_s=GREETING_QUIET_S)
            await talk(phone, 0.0, opening)

    async def _report(
        self, call: RungCall, form: dict[str, str], status: str, extra: dict[str, str]
    ) -> None:
        call.reported_at = time.time()
        if not call.callback:
            return
        params = {
            "AccountSid": self.account_sid,
            "ApiVersion": "2010-04-01",
            "CallSid": call.sid,
            "CallStatus": status,
            "Called": call.to,
            "Caller": form.get("From", ""),
            "Direction": "outbound-api",
            "From": form.get("From", ""),
            "To": call.to,
            "CallbackSource": "call-progress-events",
            "SequenceNumber": "0",
            "Timestamp": time.strftime("%a, %d %b %Y %H:%M:%S +0000", time.gmtime()),
            **extra,
        }
        signature = twilio_signature(self.auth_token, call.callback, params)
        async with httpx.AsyncClient(timeout=10) as client:
            answer = await client.post(
                call.callback, data=params, headers={TWILIO_SIGNATURE: signature}
            )
        call.callback_status = answer.status_code


class Webhooks:
    """The webhook receiver: each signed document with its headers; 401 for a bad signature."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.received: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.refused = 0

    async def receive(self, request: Request) -> Response:
        raw = await request.body()
        signature = request.headers.get(SIGNATURE_HEADER, "")
        if not verify(self.secret.encode(), signature, raw, time.time()):
            self.refused += 1
            return JSONResponse({"error": "bad signature"}, status_code=401)
        self.received.append((dict(request.headers), json.loads(raw)))
        return JSONResponse({"ok": True})

    def of_event(self, event: str) -> list[tuple[dict[str, str], dict[str, Any]]]:
        return [(h, d) for h, d in self.received if h.get("x-hotline-event") == event]
