"""The server's routes, one module per API area (each an `APIRouter` that `create_app`
includes): ops (softphone page, health, metrics, drain), webrtc, phone (provider webhooks and
media streams), calls, recordings, console, experiments; and sip (+ sip_calls), where SIP
calls come in (not HTTP: a service the lifespan starts). Also what they share: the process's
switchboard."""

from __future__ import annotations

from starlette.requests import HTTPConnection

from voice.server.calls import Switchboard


def switchboard(connection: HTTPConnection) -> Switchboard:
    """This process's switchboard (set up by the lifespan), from a request or a websocket."""
    board: Switchboard = connection.app.state.switchboard
    return board
