"""Placing calls, the parts without a server: the REST client against an address where nothing
listens, and the calls-per-second budget on an injected clock."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from pydantic import SecretStr

from tests.support.server import free_port
from voice.agents.transfer import CallControlSettings
from voice.outbound.placed import DialError
from voice.outbound.rate import CallRate
from voice.outbound.twilio import TwilioCalls

ACCOUNT_SID = "AC" + "5" * 32
TWILIO_TOKEN = "twilio-auth-token-0c9b"
OURS, CUSTOMER = "+15551110000", "+15557654321"


def test_an_unreachable_twilio_is_a_dial_error() -> None:
    """In process, the REST client alone: nothing listens at the API's address."""
    settings = CallControlSettings(
        twilio_account_sid=ACCOUNT_SID,
        twilio_auth_token=SecretStr(TWILIO_TOKEN),
        twilio_api_url=f"http://127.0.0.1:{free_port()}",
    )

    async def dial() -> DialError:
        async with httpx.AsyncClient() as client:
            with pytest.raises(DialError) as raised:
                await TwilioCalls(settings, client).create(CUSTOMER, OURS, "<Response/>")
        return raised.value

    failed = asyncio.run(dial())
    assert failed.status is None and "cannot reach Twilio" in str(failed)
    assert TWILIO_TOKEN not in str(failed)


def test_the_calls_per_second_budget_refills_with_time() -> None:
    """The budget alone, on an injected clock: one second's worth of calls at once, then one
    each 1/rate seconds, per provider."""
    now = [100.0]
    rate = CallRate(2.0, clock=lambda: now[0])
    assert [rate.take("twilio"), rate.take("twilio")] == [None, None]
    assert rate.take("twilio") == pytest.approx(0.5)
    assert rate.take("telnyx") is None  # its own budget
    now[0] += 0.25
    assert rate.take("twilio") == pytest.approx(0.25)
    now[0] += 0.25
    assert rate.take("twilio") is None
    assert CallRate.retry_after(0.25) == "1" and CallRate.retry_after(1.5) == "2"
