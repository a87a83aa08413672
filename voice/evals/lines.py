"""A scenario's call placed over its transport: each opens the caller's line with the scripted
callers of `voice.devtools`, and `voice.evals.calls.play` speaks the turns over it.

- **twilio**: the incoming-call webhook, its `<Connect><Stream>`, the emulated Twilio phone, and
  `<Connect action>` once the server ends the stream (a `<Dial>` is the transfer).
- **telnyx**, **vonage**: a stream token from `POST /phone/stream-token`, then the provider's
  media websocket (`voice.devtools.provider_phones`), as its call-control app opens it; a
  transfer is a command to the provider's API (`voice.evals.call_control` plays it for the
  run's own server).
- **sip**: an INVITE to the server's SIP port (`voice.devtools.sip_caller`) over the scenario's
  `sip_transport` (UDP, TCP, or TLS to the TLS port); the server's id of the call is the new one
  `GET /calls` lists from the caller's From user. A REFER (a transfer) is accepted and reported
  done.
- **webrtc**: an offer to `POST /offer` (`voice.devtools.webrtc_caller`); it reaches the agent
  whose `webrtc` is on, and has no keypad.

The server's call id goes to the call's `CallWatch`, which is told once the greeting was heard,
before the caller's first turn, so the run's tool mocks know the call (or are set on it) before
any tool is called.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
from websockets.asyncio.client import connect

from pipeline.llm.settings import LLMSettings
from pipeline.transport import PCM
from voice.cli.client import auth_headers
from voice.devtools.bench import sip_call_id, sip_calls
from voice.devtools.phone_caller import DEFAULT_CALLER, TwilioPhone, twilio_sid
from voice.devtools.provider_phones import Provider, provider_call_id, provider_stream
from voice.devtools.sip_caller import open_sip_call
from voice.devtools.stream_phone import talk
from voice.devtools.twilio_call import after_stream, answer_webhook
from voice.devtools.webrtc_caller import open_webrtc_call
from voice.evals.call_control import CallControlApi
from voice.evals.calls import CallWatch, ScriptedCall, keys_of, play
from voice.evals.scenario import Scenario
from voice.transports.phone.twilio import (
    CALLEE_PARAMETER,
    CALLER_PARAMETER,
    SIGNATURE_HEADER,
    twilio_signature,
)

SIP_PORT = 5060
SIP_TLS_PORT = 5061
SIP_LISTED_S = 10.0  # how long an answered SIP call may take to be listed by GET /calls


@dataclass
class Target:
    """The server the calls go to."""

    url: str
    token: str | None = None
    twilio_auth_token: str | None = None
    judge: LLMSettings | None = None
    sip_port: int = SIP_PORT  # UDP and TCP
    sip_host: str | None = None  # default: the URL's host
    sip_tls_port: int = SIP_TLS_PORT
    sip_tls: ssl.SSLContext | None = None  # checks the server's certificate (default: system CAs)
    # One SIP call set up at a time: a call is told from others from the same caller by being
    # the one new in `GET /calls` once answered.
    sip_setup: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Telnyx's and Vonage's API as the run's own server calls it (where the run faked it)
    call_control: CallControlApi | None = None
    # The run's own server, whose agent copies point mocked tools at the run's endpoint (else
    # the mocks are set on each call through the server's testing API)
    own: bool = False


async def place_call(
    target: Target,
    scenario: Scenario,
    number: str,
    audio: Sequence[PCM | None],
    server: CallWatch,
) -> ScriptedCall:
    """Call `number` at `target` over `scenario.transport` and play `scenario`'s turns."""
    if scenario.transport == "twilio":
        return await _twilio(target, scenario, number, audio, server)
    if scenario.transport in ("telnyx", "vonage"):
        provider: Provider = "telnyx" if scenario.transport == "telnyx" else "vonage"
        return await _provider(target, scenario, provider, number, audio, server)
    if scenario.transport == "sip":
        return await _sip(target, scenario, number, audio, server)
    return await _webrtc(target, scenario, audio, server)


async def _twilio(
    target: Target, scenario: Scenario, number: str, audio: Sequence[PCM | None], server: CallWatch
) -> ScriptedCall:
    """As Twilio places it: the webhook, its `<Connect><Stream>`, then `<Connect action>` once
    the server ends the stream."""
    numbers = {CALLER_PARAMETER: scenario.caller or DEFAULT_CALLER, CALLEE_PARAMETER: number}
    call, account, auth = ScriptedCall(twilio_sid("CA")), twilio_sid("AC"), target.twilio_auth_token
    answer = await answer_webhook(target.url, call.call_id, account, numbers, auth)
    if isinstance(answer, str):
        call.rejected = answer
        return call
    url = answer.stream_url
    signed = {SIGNATURE_HEADER: twilio_signature(auth, url, {})} if auth else {}
    async with connect(url, compression=None, open_timeout=10, additional_headers=signed) as socket:
        phone = TwilioPhone(socket, call.call_id, account, answer.parameters)
        await phone.open()
        server.call_id = call.call_id
        script = play(phone, audio, keys_of(scenario), call.turns, server)
        call.server_ended = await talk(phone, 0.0, script)
    if call.server_ended and answer.action_url is not None:
        _, call.transferred_to = await after_stream(
            answer.action_url, call.call_id, account, numbers, auth
        )
    return call


async def _provider(
    target: Target,
    scenario: Scenario,
    provider: Provider,
    number: str,
    audio: Sequence[PCM | None],
    server: CallWatch,
) -> ScriptedCall:
    """As Telnyx or Vonage streams it: a stream token, then the provider's media websocket."""
    call = ScriptedCall(provider_call_id(provider))
    async with provider_stream(
        target.url,
        provider,
        caller=scenario.caller or DEFAULT_CALLER,
        callee=number,
        headers=auth_headers(target.token),
        call_id=call.call_id,
    ) as phone:
        server.call_id = call.call_id
        script = play(phone, audio, keys_of(scenario), call.turns, server)
        call.server_ended = await talk(phone, 0.0, script)
    if target.call_control is not None:
        call.transferred_to = target.call_control.transferred_to(call.call_id)
    return call


async def _sip(
    target: Target, scenario: Scenario, number: str, audio: Sequence[PCM | None], server: CallWatch
) -> ScriptedCall:
    """An INVITE from the scenario's caller (else a unique From user); the server's id of the
    call is the new one `GET /calls` lists from that caller once it is answered."""
    caller = scenario.caller or f"hotline-test-{secrets.token_hex(4)}"
    host = target.sip_host or urlsplit(target.url).hostname or "127.0.0.1"
    over = scenario.sip_transport
    port = target.sip_tls_port if over == "tls" else target.sip_port
    headers = auth_headers(target.token)
    async with (
        httpx.AsyncClient(base_url=target.url, headers=headers, timeout=10) as http,
        contextlib.AsyncExitStack() as stack,
    ):
        async with target.sip_setup:
            known = await sip_calls(http, caller)
            line = await stack.enter_async_context(
                open_sip_call(
                    host,
                    port,
                    number=number,
                    caller=caller,
                    transport=over,
                    tls=target.sip_tls,
                    accept_refer=True,
                )
            )
            found = None
            if line.result.rejected is None:
                found = await sip_call_id(http, caller, SIP_LISTED_S, known)
        if line.result.rejected is not None:
            return ScriptedCall("", rejected=line.result.rejected)
        if found is None:
            raise TimeoutError(f"GET /calls did not list the SIP call from {caller}")
        call = ScriptedCall(found)
        server.call_id = found
        await line.talk(play(line.phone, audio, keys_of(scenario), call.turns, server))
    call.server_ended = line.result.server_hung_up
    call.transferred_to = line.result.referred_to
    if line.result.rejected is not None:
        call.rejected = line.result.rejected
    return call


async def _webrtc(
    target: Target, scenario: Scenario, audio: Sequence[PCM | None], server: CallWatch
) -> ScriptedCall:
    """An offer to `POST /offer`: the call reaches the agent whose `webrtc` is on."""
    async with open_webrtc_call(target.url, target.token) as webrtc:
        call = ScriptedCall(webrtc.call_id)
        server.call_id = webrtc.call_id
        await webrtc.talk(play(webrtc.line, audio, keys_of(scenario), call.turns, server))
        call.server_ended = webrtc.line.ear.hung_up.is_set()
    return call
