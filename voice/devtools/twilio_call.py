"""Places a call the way Twilio does, with the emulated phone of `voice.devtools.phone_caller`.

Twilio first POSTs the incoming call to the number's voice webhook and follows the TwiML it
answers: `<Connect><Stream>` names the Media Stream to open and its `<Parameter>`s, anything
else turns the call away. On the stream, `TwilioPhone` plays Twilio's part while the caller
speaks its turns (`voice.devtools.turns.converse`). When the server ends the stream while the
caller is still on the line, and the `<Connect>` has an `action`, Twilio POSTs that URL (signed
like every webhook) and follows its TwiML: a `<Dial>` puts the caller through
(`PhoneCallResult.transferred_to`), a `<Hangup>` ends the call.
"""

from __future__ import annotations

import logging
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import httpx
import numpy as np
from websockets.asyncio.client import connect

from pipeline.transport import PCM
from voice.devtools.phone_caller import (
    DEFAULT_CALLEE,
    DEFAULT_CALLER,
    PhoneCallResult,
    TwilioPhone,
    twilio_sid,
)
from voice.devtools.stream_phone import talk
from voice.devtools.turns import CallerTurn, converse
from voice.transports.phone.twilio import (
    CALLEE_PARAMETER,
    CALLER_PARAMETER,
    SIGNATURE_HEADER,
    twilio_signature,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Connected:
    """A `<Connect><Stream>` answer: the stream to open, its parameters, the `action` URL."""

    stream_url: str
    parameters: dict[str, str]
    action_url: str | None = None


async def answer_webhook(
    base_url: str,
    call_sid: str,
    account_sid: str,
    numbers: Mapping[str, str],
    auth_token: str | None,
) -> Connected | str:
    """POST the incoming-call webhook as Twilio does (signed when `auth_token` is given).

    Returns the `<Connect><Stream>` answer, or, when the TwiML turns the call away, what it
    said (or the verb it used). Over plain http the stream's `wss://` becomes `ws://`, since a
    local server has no TLS.
    """
    webhook = base_url.rstrip("/")
    if not webhook.endswith("/twilio/voice"):
        webhook += "/twilio/voice"
    caller, callee = numbers[CALLER_PARAMETER], numbers[CALLEE_PARAMETER]
    form = {
        "AccountSid": account_sid,
        "ApiVersion": "2010-04-01",
        "CallSid": call_sid,
        "CallStatus": "ringing",
        "Called": callee,
        "Caller": caller,
        "Direction": "inbound",
        "From": caller,
        "To": callee,
    }
    headers = {SIGNATURE_HEADER: twilio_signature(auth_token, webhook, form)} if auth_token else {}
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(webhook, data=form, headers=headers)
        response.raise_for_status()
    twiml = ET.fromstring(response.text)
    stream = twiml.find("Connect/Stream")
    if stream is None or not stream.get("url"):
        said = twiml.findtext("Say")
        return said if said else (twiml[0].tag if len(twiml) else "empty TwiML")
    url = str(stream.get("url"))
    if webhook.startswith("http://") and url.startswith("wss://"):
        url = "ws://" + url.removeprefix("wss://")
    parameters = {str(p.get("name")): str(p.get("value", "")) for p in stream.iter("Parameter")}
    connect = twiml.find("Connect")
    action = connect.get("action") if connect is not None else None
    return Connected(url, parameters, action)


async def after_stream(
    action_url: str,
    call_sid: str,
    account_sid: str,
    numbers: Mapping[str, str],
    auth_token: str | None,
) -> tuple[str, str | None]:
    """POST `<Connect action>` as Twilio does once the stream has ended; the TwiML's first
    verb and, for a `<Dial>`, the number or SIP URI dialled."""
    caller, callee = numbers[CALLER_PARAMETER], numbers[CALLEE_PARAMETER]
    form = {
        "AccountSid": account_sid,
        "ApiVersion": "2010-04-01",
        "CallSid": call_sid,
        "CallStatus": "in-progress",
        "Direction": "inbound",
        "From": caller,
        "To": callee,
    }
    headers = (
        {SIGNATURE_HEADER: twilio_signature(auth_token, action_url, form)} if auth_token else {}
    )
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(action_url, data=form, headers=headers)
        response.raise_for_status()
    twiml = ET.fromstring(response.text)
    if not len(twiml):
        return "empty TwiML", None
    verb = twiml[0]
    if verb.tag != "Dial":
        return verb.tag, None
    target = verb.findtext("Number") or verb.findtext("Sip") or (verb.text or "").strip()
    return "Dial", target or None


async def _stream_to_open(
    url: str,
    call_sid: str,
    account_sid: str,
    parameters: Mapping[str, str] | None,
    auth_token: str | None,
) -> tuple[str, dict[str, str], str | None] | str:
    """The stream to open, its custom parameters and the TwiML's action URL: `url` itself, or,
    for the server's base URL, what its incoming-call webhook answers (or why it refused)."""
    custom = {CALLER_PARAMETER: DEFAULT_CALLER, CALLEE_PARAMETER: DEFAULT_CALLEE}
    custom.update(parameters or {})
    if not url.startswith(("http://", "https://")):
        return url, custom, None
    answer = await answer_webhook(url, call_sid, account_sid, custom, auth_token)
    if isinstance(answer, str):
        return answer
    return answer.stream_url, answer.parameters, answer.action_url


async def place_twilio_call(
    stream_url: str,
    utterances: Sequence[PCM],
    *,
    barge_in_after_ms: float | None = None,
    dtmf: str = "",
    reply_timeout_s: float = 30.0,
    quiet_s: float = 0.8,
    parameters: Mapping[str, str] | None = None,
    auth_token: str | None = None,
    call_sid: str | None = None,
    linger_s: float = 0.0,
    opening_wait_s: float | None = None,
    line_noise_dbfs: float | None = None,
) -> PhoneCallResult:
    """Call Hotline the way Twilio would and speak `utterances` (16 kHz), one turn each.

    `stream_url` is either the stream itself (`ws://host/twilio/stream`; `parameters` become
    `customParameters`, with `from`/`to` numbers added) or the server's http(s) base URL, in
    which case the incoming-call webhook is asked first (signed with `auth_token` if given) and
    the stream and parameters come from its TwiML, exactly as with Twilio. Turn-taking,
    `barge_in_after_ms`, `opening_wait_s` and the `dtmf` keys (pressed after the first reply) are
    `voice.devtools.turns.converse`'s. With `auth_token`, the stream's handshake is signed too, as
    Twilio signs it.
    `line_noise_dbfs`: the caller's line carries white noise of that RMS (`Microphone`).
    Ends with `stop` and closes the socket, after staying on the line `linger_s` more (until
    the server ends the stream, if it does: say after a transfer).
    """
    call_sid, account_sid = call_sid or twilio_sid("CA"), twilio_sid("AC")
    stream = await _stream_to_open(stream_url, call_sid, account_sid, parameters, auth_token)
    if isinstance(stream, str):
        return PhoneCallResult(call_sid, [], np.zeros(0, dtype=np.int16), rejected=stream)
    stream_url, custom, action_url = stream
    turns: list[CallerTurn] = []
    signed = {SIGNATURE_HEADER: twilio_signature(auth_token, stream_url, {})} if auth_token else {}
    async with connect(
        stream_url, compression=None, open_timeout=10, additional_headers=signed
    ) as socket:
        phone = TwilioPhone(socket, call_sid, account_sid, custom, line_noise_dbfs)
        await phone.open()
        server_ended = await talk(
            phone,
            linger_s,
            converse(
                phone,
                utterances,
                turns,
                barge_in_after_ms=barge_in_after_ms,
                dtmf=dtmf,
                reply_timeout_s=reply_timeout_s,
                quiet_s=quiet_s,
                opening_wait_s=opening_wait_s,
            ),
        )
    result = phone.result(turns, barge_in_after_ms is not None)
    if server_ended and action_url is not None:
        result.after_stream, result.transferred_to = await after_stream(
            action_url, call_sid, account_sid, custom, auth_token
        )
    return result
