"""What the fake call-placing APIs (tests/support/outbound_apis.py) check in Telnyx's and
Vonage's bodies, as their documents describe them, and how each answers: a new call, or the
provider's error shape."""

from __future__ import annotations

import re
import uuid
from typing import Any

from starlette.responses import JSONResponse

TELNYX_DIAL_FIELDS = {  # the Dial command's documented body (what Hotline could send)
    "to", "from", "connection_id", "from_display_name", "audio_url", "media_name",
    "timeout_secs", "time_limit_secs", "answering_machine_detection",
    "answering_machine_detection_config", "custom_headers", "sip_headers", "sip_auth_username",
    "sip_auth_password", "sip_transport_protocol", "sound_modifications", "stream_url",
    "stream_track", "stream_codec", "stream_bidirectional_mode", "stream_bidirectional_codec",
    "stream_bidirectional_target_legs", "stream_bidirectional_sampling_rate",
    "stream_auth_token", "send_silence_when_idle", "webhook_url", "webhook_url_method",
    "record", "record_channels", "record_format", "record_max_length", "record_timeout_secs",
    "record_track", "record_trim", "record_custom_file_name", "client_state", "command_id",
    "link_to", "bridge_intent", "bridge_on_answer", "park_after_unbridge", "media_encryption",
    "enable_dialogflow", "dialogflow_config", "billing_group_id", "conference_config",
}  # fmt: skip
VONAGE_CREATE_FIELDS = {  # createCall's documented body
    "to", "from", "random_from_number", "ncco", "answer_url", "answer_method", "event_url",
    "event_method", "machine_detection", "advanced_machine_detection", "length_timer",
    "ringing_timer",
}  # fmt: skip
VONAGE_NUMBER = re.compile(r"[1-9]\d{6,14}")
TELNYX_ENUMS = {
    "stream_track": {"inbound_track", "outbound_track", "both_tracks"},
    "stream_bidirectional_mode": {"mp3", "rtp"},
    "stream_bidirectional_codec": {"PCMU", "PCMA", "G722", "OPUS", "AMR-WB", "L16"},
}


class Refused(Exception):
    """A request the fake refuses, with the provider's answer."""

    def __init__(self, response: JSONResponse) -> None:
        self.response = response


def vonage_error(
    status: int, title: str, invalid: list[tuple[str, str]] | None = None
) -> JSONResponse:
    problem: dict[str, Any] = {
        "type": "https://developer.nexmo.com/api-errors#bad-request",
        "title": title,
        "detail": title,
        "instance": str(uuid.uuid4()),
    }
    if invalid:
        problem["invalid_parameters"] = [{"name": n, "reason": r} for n, r in invalid]
    return JSONResponse(problem, status_code=status)


def telnyx_error(status: int, code: str, title: str, detail: str = "") -> JSONResponse:
    return JSONResponse(
        {"errors": [{"code": code, "title": title, "detail": detail or title}]}, status_code=status
    )


def telnyx_call(body: dict[str, Any], connection_id: str) -> JSONResponse:
    """Telnyx's answer to a Dial body (a new call_control_id); Refused for a bad one."""
    for name in ("to", "from", "connection_id"):
        if not body.get(name):
            detail = f"The '{name}' parameter is required."
            raise Refused(telnyx_error(422, "10004", "Missing required parameter", detail))
    unknown = sorted(set(body) - TELNYX_DIAL_FIELDS)
    if unknown:
        raise Refused(telnyx_error(422, "10015", "Bad Request", f"Unknown '{unknown[0]}'."))
    if body["connection_id"] != connection_id:
        raise Refused(telnyx_error(422, "10015", "Bad Request", "Invalid connection_id."))
    for name, allowed in TELNYX_ENUMS.items():
        if name in body and body[name] not in allowed:
            raise Refused(telnyx_error(422, "10015", "Bad Request", f"Invalid '{name}'."))
    url = body.get("stream_url", "wss://")
    if not isinstance(url, str) or not url.startswith(("ws://", "wss://")):
        raise Refused(telnyx_error(422, "10015", "Bad Request", "Invalid 'stream_url'."))
    data = {
        "call_control_id": "v3:" + uuid.uuid4().hex,
        "call_leg_id": str(uuid.uuid4()),
        "call_session_id": str(uuid.uuid4()),
        "is_alive": False,
        "record_type": "call",
    }
    return JSONResponse({"data": data}, status_code=200)


def vonage_call(body: dict[str, Any]) -> JSONResponse:
    def bad(name: str, why: str) -> Refused:
        return Refused(vonage_error(400, "Bad Request", [(name, why)]))

    for name in sorted(set(body) - VONAGE_CREATE_FIELDS):
        raise bad(name, "is not a known field")
    to, from_ = body.get("to"), body.get("from")
    if not isinstance(to, list) or len(to) != 1 or not _vonage_phone(to[0]):
        raise bad("to", "must be one phone endpoint with a number")
    if not _vonage_phone(from_):
        raise bad("from", "must be a phone endpoint with a number")
    ncco = body.get("ncco")
    if not isinstance(ncco, list) or not ncco:
        raise bad("ncco", "must be a non-empty array")
    for index, action in enumerate(ncco):
        if not isinstance(action, dict) or action.get("action") != "connect":
            raise bad(f"ncco[{index}]", "only connect is expected here")
        if set(action) - {"action", "endpoint", "from", "timeout", "eventUrl"}:
            raise bad(f"ncco[{index}]", "has an unknown field")
        endpoints = action.get("endpoint")
        if not isinstance(endpoints, list) or len(endpoints) != 1:
            raise bad(f"ncco[{index}].endpoint", "must be one endpoint")
        _vonage_websocket(endpoints[0], f"ncco[{index}].endpoint[0]")
    events = body.get("event_url", [])
    if not isinstance(events, list) or len(events) > 1:
        raise bad("event_url", "must be an array of one URL")
    if events and not (
        isinstance(events[0], str) and events[0].startswith(("http://", "https://"))
    ):
        raise bad("event_url[0]", "must be a URL")
    if body.get("event_method", "POST") not in ("GET", "POST"):
        raise bad("event_method", "must be GET or POST")
    data = {
        "uuid": str(uuid.uuid4()),
        "status": "started",
        "direction": "outbound",
        "conversation_uuid": "CON-" + str(uuid.uuid4()),
    }
    return JSONResponse(data, status_code=201)


def _vonage_phone(endpoint: object) -> bool:
    return (
        isinstance(endpoint, dict)
        and set(endpoint) <= {"type", "number", "dtmfAnswer"}
        and endpoint.get("type") == "phone"
        and isinstance(endpoint.get("number"), str)
        and VONAGE_NUMBER.fullmatch(endpoint["number"]) is not None
    )


def _vonage_websocket(endpoint: object, where: str) -> None:
    def bad(why: str) -> Refused:
        return Refused(vonage_error(400, "Bad Request", [(where, why)]))

    if not isinstance(endpoint, dict) or endpoint.get("type") != "websocket":
        raise bad("must be a websocket endpoint")
    if set(endpoint) - {"type", "uri", "content-type", "headers"}:
        raise bad("has an unknown field")
    uri = endpoint.get("uri")
    if not isinstance(uri, str) or not uri.startswith(("ws://", "wss://")):
        raise bad("uri must be ws:// or wss://")
    if endpoint.get("content-type") not in ("audio/l16;rate=16000", "audio/l16;rate=8000"):
        raise bad("content-type must be audio/l16;rate=16000 or 8000")
    headers = endpoint.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise bad("headers must be an object of strings")
