"""Placing one call, start to end: the provider's budget of calls per second, the dial kept for
the stream to find, the instructions that connect the answered call to Hotline's media stream
(with a stream token for this dial), and the provider's REST request."""

from __future__ import annotations

import dataclasses
import logging
from urllib.parse import urlencode

import httpx

from voice.agents.transfer import CallControl
from voice.cluster.registry import CallRegistry
from voice.outbound.dials import Dial, DialBook
from voice.outbound.placed import PlacedCall
from voice.outbound.rate import ClusterCallRate
from voice.outbound.request import BadRequest, OutboundRequest
from voice.outbound.sip import SipCalls
from voice.outbound.streams import DIRECTION_PARAMETER, OUTBOUND_PARAMETER, token_subject
from voice.outbound.telnyx import TelnyxCalls
from voice.outbound.twilio import TwilioCalls
from voice.outbound.vonage import VonageCalls
from voice.server.settings import Settings
from voice.server.urls import websocket_url
from voice.transports.phone.tokens import StreamTokens
from voice.transports.phone.twilio import (
    CALLEE_PARAMETER,
    CALLER_PARAMETER,
    STREAM_TOKEN_PARAMETER,
    stream_twiml,
)

log = logging.getLogger(__name__)


class NotPlaceable(Exception):
    """This server cannot place the call asked for (a provider or option it lacks)."""


class TooFast(Exception):
    """The provider's calls-per-second budget is spent; `wait_s` until the next call."""

    def __init__(self, provider: str, wait_s: float) -> None:
        super().__init__(f"more than the {provider} calls per second allowed; retry shortly")
        self.wait_s = wait_s


class Dialer:
    """Places calls for this worker (its calls-per-second budgets are this worker's)."""

    def __init__(self, settings: Settings, client: httpx.AsyncClient, sessions: CallRegistry):
        self.settings = settings
        outbound = settings.outbound
        secret = settings.stream_secret()  # the phone routes check tokens under the same key
        self._tokens = StreamTokens(secret, outbound.answer_within_s) if secret else None
        prefix = sessions.settings.key_prefix  # the budget is the cluster's, in Redis
        self.rate = ClusterCallRate(sessions.redis, prefix, outbound.calls_per_second)
        self.book = DialBook.of(sessions)
        fallback = settings.telephony.twilio_auth_token
        self.twilio = TwilioCalls(settings.call_control, client, fallback)
        self.telnyx = TelnyxCalls(settings.call_control, client)
        self.vonage = VonageCalls(CallControl(settings.call_control, client), client)
        self.sip: SipCalls | None = None  # once SIP is on (voice/server/app.py)

    async def place(
        self,
        order: OutboundRequest,
        base_url: str,
        voicemail: str | None = None,
        status_callback: str | None = None,
    ) -> PlacedCall:
        """Ask the provider to ring `order.to`; `base_url` is this server as the provider
        reaches it; `voicemail`: the agent's own message for a machine; `status_callback`:
        where Twilio reports the call's end (else HOTLINE_OUTBOUND__STATUS_CALLBACK_URL), or
        Telnyx and Vonage their call events (else the connection's, the application's).
        NotPlaceable, TooFast, RegistryUnavailable (Redis) or DialError (the provider) when
        the call is not placed."""
        if order.transport == "sip":
            return await self._place_sip(order, voicemail)
        self._check(order)
        wait_s = await self.rate.take(order.transport)
        if wait_s is not None:
            raise TooFast(order.transport, wait_s)
        dial = Dial(order.transport, order.to, order.caller, order.agent, dict(order.metadata))
        if order.machine_detection:
            message = order.voicemail_message(voicemail)
            dial = dataclasses.replace(dial, machine_detection=True, voicemail=message)
        ttl_s = self.settings.outbound.answer_within_s
        await self.book.put(dial, ttl_s)
        try:
            placed = await self._create(dial, base_url, status_callback)
        except Exception:
            await self.book.forget(dial.dial_id)
            raise
        await self.book.put(dataclasses.replace(dial, call_id=placed.call_id), ttl_s)
        log.info(
            "outbound call %s: %s rings %s from %s (agent %s, dial %s)",
            placed.call_id,
            order.transport,
            order.to,
            order.caller,
            order.agent,
            dial.dial_id,
        )
        return placed

    async def _place_sip(self, order: OutboundRequest, voicemail: str | None) -> PlacedCall:
        """Through a trunk, by Hotline's own SIP user agent (voice/outbound/sip.py); its calls
        per second are the trunk's. BadRequest for a trunk that is not one, CallsFull when
        the call may not be admitted now."""
        if self.sip is None:
            raise NotPlaceable("SIP calls need HOTLINE_SIP__ENABLED=true and HOTLINE_SIP__TRUNKS")
        trunk = self.sip.trunk(order.trunk)
        key = self.rate_key("sip", trunk.name)
        wait_s = await self.rate.take(key)
        if wait_s is not None:
            raise TooFast(key, wait_s)
        return await self.sip.place(order, trunk, voicemail)

    def rate_key(self, transport: str, trunk: str | None = None) -> str:
        """Whose calls per second a call counts against: its provider's, or over SIP its
        trunk's (`trunk` None: the default trunk)."""
        if transport != "sip" or self.sip is None:
            return transport
        try:
            return f"sip:{self.sip.trunk(trunk).name}"
        except BadRequest:  # a trunk that is not one: its dial fails anyway
            return "sip"

    async def _create(
        self, dial: Dial, base_url: str, status_callback: str | None = None
    ) -> PlacedCall:
        """The provider's REST request for `dial`."""
        if dial.provider == "twilio":
            twiml = self.twiml(dial, base_url)
            callback = status_callback or self.settings.outbound.status_callback_url
            return await self.twilio.create(dial.to, dial.from_, twiml, callback)
        stream_url = self.stream_url(dial, base_url)
        if dial.provider == "telnyx":
            return await self.telnyx.create(dial.to, dial.from_, stream_url, status_callback)
        headers = {
            CALLER_PARAMETER: dial.from_,
            CALLEE_PARAMETER: dial.to,
            OUTBOUND_PARAMETER: dial.dial_id,
            DIRECTION_PARAMETER: "outbound",
        }
        return await self.vonage.create(dial.to, dial.from_, stream_url, headers, status_callback)

    def _check(self, order: OutboundRequest) -> None:
        needs = {
            "twilio": (self.twilio.configured, "TWILIO_ACCOUNT_SID and …__TWILIO_AUTH_TOKEN"),
            "telnyx": (self.telnyx.configured, "TELNYX_API_KEY and …__TELNYX_CONNECTION_ID"),
            "vonage": (
                self.vonage.configured,
                "VONAGE_APPLICATION_ID and …__VONAGE_PRIVATE_KEY_FILE",
            ),
        }
        configured, settings = needs[order.transport]
        if not configured:
            raise NotPlaceable(
                f"{order.transport} is not configured: set HOTLINE_CALL_CONTROL__{settings}"
            )

    def _token(self, dial: Dial) -> str | None:
        """The stream token for this dial's media stream (None: tokens are off)."""
        if self._tokens is None:
            return None
        return self._tokens.issue(dial.provider, token_subject(dial.dial_id))

    def stream_url(self, dial: Dial, base_url: str) -> str:
        """The media stream a Telnyx call is sent to: the dial id and its token in the query."""
        query = {OUTBOUND_PARAMETER: dial.dial_id}
        token = self._token(dial)
        if token is not None:
            query[STREAM_TOKEN_PARAMETER] = token
        stream = f"{websocket_url(base_url.rstrip('/'))}/{dial.provider}/stream"
        return f"{stream}?{urlencode(query)}"

    def twiml(self, dial: Dial, base_url: str) -> str:
        """What Twilio runs once the call is answered: connect it to the media stream, as an
        inbound call's webhook answer does, with the dial's id and its stream token."""
        base = base_url.rstrip("/")
        parameters = {
            CALLER_PARAMETER: dial.from_,
            CALLEE_PARAMETER: dial.to,
            OUTBOUND_PARAMETER: dial.dial_id,
            DIRECTION_PARAMETER: "outbound",
        }
        token = self._token(dial)
        if token is not None:
            parameters[STREAM_TOKEN_PARAMETER] = token
        stream_url = f"{websocket_url(base)}/twilio/stream"
        return stream_twiml(stream_url, parameters, f"{base}/twilio/after-stream")
