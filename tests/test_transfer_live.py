"""A live Telnyx or Vonage call that asks for a person: the real server, the scripted provider
phone on the media websocket, and faithful fakes of the providers' call control APIs, which
must receive exactly the transfer request the provider documents."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from websockets.asyncio.client import connect

from tests.support.provider_apis import ProviderApis
from tests.support.provider_phone import TestPhone
from tests.support.providers import TelnyxWire, VonageWire, Wire
from tests.support.server import start_server, stop_server
from tests.support.speech import utterance

pytestmark = pytest.mark.slow

TELNYX_KEY = "KEYlive-telnyx-0123456789"
VONAGE_APP = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
DESK = "+15551230001"
AGENT = """
name: {name}
numbers: ["{number}"]
builtin_tools: [transfer_to_human]
transfer:
  targets:
    desk: {{to: "{desk}", description: the front desk}}
"""


async def call_and_ask(url: str, wire: Wire) -> TestPhone:
    """Speak the request on the provider's socket; return once the server has closed it."""
    async with connect(url + wire.route, compression=None) as socket:
        phone = TestPhone(socket, wire)
        async with phone.call(hang_up=False):
            phone.say(utterance("Can you transfer me to a person, please?"))
            await asyncio.wait_for(phone.closed.wait(), 60)
    return phone


async def test_telnyx_and_vonage_calls_are_put_through_by_their_call_control(
    tmp_path: Path,
) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    (tmp_path / "vonage.key").write_bytes(pem)
    agents = tmp_path / "agents"
    agents.mkdir()
    telnyx, vonage = TelnyxWire(), VonageWire()
    (agents / "t.yaml").write_text(AGENT.format(name="t", number="+13122123456", desk=DESK))
    (agents / "v.yaml").write_text(AGENT.format(name="v", number="+447700900001", desk=DESK))
    fake = ProviderApis(
        telnyx_api_key=TELNYX_KEY,
        vonage_application_id=VONAGE_APP,
        vonage_public_key=key.public_key(),
    )
    async with fake as apis:
        apis.add_call(telnyx.call_id)
        apis.add_call(vonage.call_id)
        env = {
            "HOTLINE_AGENTS__DIR": str(agents),
            "HOTLINE_CALL_CONTROL__TELNYX_API_KEY": TELNYX_KEY,
            "HOTLINE_CALL_CONTROL__TELNYX_API_URL": apis.telnyx_url,
            "HOTLINE_CALL_CONTROL__VONAGE_APPLICATION_ID": VONAGE_APP,
            "HOTLINE_CALL_CONTROL__VONAGE_PRIVATE_KEY_FILE": str(tmp_path / "vonage.key"),
            "HOTLINE_CALL_CONTROL__VONAGE_API_URL": apis.vonage_url,
        }
        server = await asyncio.to_thread(start_server, env)
        try:
            url = server.url.replace("http://", "ws://")
            await call_and_ask(url, telnyx)
            await call_and_ask(url, vonage)
        finally:
            stop_server(server)
        telnyx_asked, vonage_asked = apis.accepted
    assert telnyx_asked.path == f"/v2/calls/{telnyx.call_id}/actions/transfer"
    assert telnyx_asked.body["to"] == DESK
    assert vonage_asked.method == "PUT" and vonage_asked.path == f"/v1/calls/{vonage.call_id}"
    [endpoint] = vonage_asked.body["destination"]["ncco"][0]["endpoint"]
    assert endpoint == {"type": "phone", "number": DESK.removeprefix("+")}
