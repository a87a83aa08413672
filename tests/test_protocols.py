"""Phone wire protocols (Twilio, Telnyx, Vonage) against message samples shaped as each
provider documents them; Twilio's webhook signature and TwiML."""

from __future__ import annotations

import base64
import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from voice.audio import mulaw_decode, mulaw_encode
from voice.transports.phone.telnyx import REORDER_WINDOW, TelnyxProtocol
from voice.transports.phone.twilio import (
    TwilioProtocol,
    dial_twiml,
    reject_twiml,
    signature_is_valid,
    stream_twiml,
    twilio_signature,
)
from voice.transports.phone.vonage import VonageProtocol
from voice.transports.phone.wire import (
    Dtmf,
    Ignored,
    MarkPlayed,
    Media,
    ProtocolError,
    Start,
    Stop,
    WireEvent,
)


def tone(samples: int, rate: int = 8000, level: int = 6000) -> np.ndarray:
    t = np.arange(samples) / rate
    return np.round(level * np.sin(2 * np.pi * 440 * t)).astype(np.int16)


def mulaw_b64(pcm: np.ndarray) -> str:
    return base64.b64encode(mulaw_encode(pcm)).decode()


def media_of(events: list[WireEvent]) -> list[np.ndarray]:
    return [event.pcm for event in events if isinstance(event, Media)]


# -- Twilio --------------------------------------------------------------------------------

SID = "MZ18ad3ab5a668481ce02b83e7395059f0"
CALL = "CA8e1c4a5b2fd06b1e51d1e2f2f3d7a9b0"
ACCOUNT = "AC0f9e2d1c0b9a8f7e6d5c4b3a2f1e0d9c"
FRAME = tone(160)

TWILIO_CONNECTED = {"event": "connected", "protocol": "Call", "version": "1.0.0"}
TWILIO_START = {
    "event": "start",
    "sequenceNumber": "1",
    "start": {
        "accountSid": ACCOUNT,
        "streamSid": SID,
        "callSid": CALL,
        "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        "customParameters": {"from": "+15555550100", "to": "+15555550199", "FirstName": "Jane"},
    },
    "streamSid": SID,
}
TWILIO_MEDIA = {
    "event": "media",
    "sequenceNumber": "2",
    "media": {"track": "inbound", "chunk": "1", "timestamp": "5", "payload": mulaw_b64(FRAME)},
    "streamSid": SID,
}
TWILIO_DTMF = {
    "event": "dtmf",
    "streamSid": SID,
    "sequenceNumber": "3",
    "dtmf": {"track": "inbound_track", "digit": "1"},
}
TWILIO_MARK = {
    "event": "mark",
    "sequenceNumber": "4",
    "streamSid": SID,
    "mark": {"name": "my label"},
}
TWILIO_STOP = {
    "event": "stop",
    "sequenceNumber": "5",
    "streamSid": SID,
    "stop": {"accountSid": ACCOUNT, "callSid": CALL},
}


def started_twilio() -> TwilioProtocol:
    protocol = TwilioProtocol()
    protocol.parse(json.dumps(TWILIO_CONNECTED))
    protocol.parse(json.dumps(TWILIO_START))
    return protocol


def test_twilio_stream_messages_become_events() -> None:
    protocol = TwilioProtocol()
    assert protocol.parse(json.dumps(TWILIO_CONNECTED)) == [Ignored("connected")]
    assert protocol.parse(json.dumps(TWILIO_START)) == [
        Start(
            call_id=CALL,
            stream_id=SID,
            caller="+15555550100",
            callee="+15555550199",
            parameters={"from": "+15555550100", "to": "+15555550199", "FirstName": "Jane"},
            sample_rate=8000,
        )
    ]
    (media,) = protocol.parse(json.dumps(TWILIO_MEDIA))
    assert isinstance(media, Media) and media.pcm.dtype == np.int16
    assert np.array_equal(media.pcm, mulaw_decode(mulaw_encode(FRAME)))
    assert protocol.parse(json.dumps(TWILIO_DTMF)) == [Dtmf("1")]
    assert protocol.parse(json.dumps(TWILIO_MARK)) == [MarkPlayed("my label")]
    assert protocol.parse(json.dumps(TWILIO_STOP)) == [Stop("stream stopped")]


def test_twilio_outbound_messages_carry_the_stream_sid() -> None:
    protocol = started_twilio()
    media = json.loads(protocol.media(FRAME))
    assert media["event"] == "media" and media["streamSid"] == SID
    assert set(media["media"]) == {"payload"}
    assert len(base64.b64decode(media["media"]["payload"])) == 160
    assert json.loads(protocol.mark("sentence-1")) == {
        "event": "mark",
        "streamSid": SID,
        "mark": {"name": "sentence-1"},
    }
    assert json.loads(protocol.clear()) == {"event": "clear", "streamSid": SID}
    assert protocol.supports_marks and protocol.wire_rate == 8000
    with pytest.raises(RuntimeError):
        TwilioProtocol().media(FRAME)  # no stream to address yet


def test_twilio_media_round_trip() -> None:
    """What we send, decoded as Twilio would, is the audio within μ-law's precision."""
    protocol = started_twilio()
    sent = tone(160, level=12000)
    payload = json.loads(protocol.media(sent))["media"]["payload"]
    heard = mulaw_decode(base64.b64decode(payload))
    assert np.max(np.abs(heard.astype(int) - sent.astype(int))) <= 12000 // 32 + 8
    echo = dict(TWILIO_MEDIA, media={"track": "inbound", "payload": payload})
    assert np.array_equal(media_of(started_twilio().parse(json.dumps(echo)))[0], heard)


def test_twilio_ignores_the_outbound_track_of_a_unidirectional_stream() -> None:
    message = dict(TWILIO_MEDIA, media={**TWILIO_MEDIA["media"], "track": "outbound"})
    assert started_twilio().parse(json.dumps(message)) == [Ignored("outbound track")]


BAD_TWILIO = {
    "not JSON": "{event: media",
    "binary": b"\x01\x02",
    "JSON that is not an object": "[1, 2]",
    "no event": json.dumps({"streamSid": SID}),
    "unknown event": json.dumps({"event": "transcription", "streamSid": SID}),
    "invalid base64": json.dumps(
        {**TWILIO_MEDIA, "media": {"track": "inbound", "payload": "no+Jho!!"}}
    ),
    "media without payload": json.dumps({**TWILIO_MEDIA, "media": {"track": "inbound"}}),
    "media not an object": json.dumps({**TWILIO_MEDIA, "media": "x"}),
    "dtmf without digit": json.dumps({**TWILIO_DTMF, "dtmf": {"track": "inbound_track"}}),
    "mark without name": json.dumps({**TWILIO_MARK, "mark": {}}),
    "second start": json.dumps(TWILIO_START),
}


@pytest.mark.parametrize("message", BAD_TWILIO.values(), ids=BAD_TWILIO.keys())
def test_twilio_rejects_bad_messages(message: str | bytes) -> None:
    with pytest.raises(ProtocolError):
        started_twilio().parse(message)


def test_twilio_rejects_media_before_start_and_anything_after_stop() -> None:
    with pytest.raises(ProtocolError, match="before start"):
        TwilioProtocol().parse(json.dumps(TWILIO_MEDIA))
    protocol = started_twilio()
    protocol.parse(json.dumps(TWILIO_STOP))
    with pytest.raises(ProtocolError, match="after stop"):
        protocol.parse(json.dumps(TWILIO_MEDIA))


@pytest.mark.parametrize(
    "start",
    [
        {k: v for k, v in TWILIO_START["start"].items() if k != "streamSid"},
        {k: v for k, v in TWILIO_START["start"].items() if k != "callSid"},
        {**TWILIO_START["start"], "mediaFormat": {"encoding": "audio/x-l16", "sampleRate": 16000}},
        {**TWILIO_START["start"], "customParameters": {"n": 1}},
    ],
    ids=["no streamSid", "no callSid", "not mu-law", "parameter not a string"],
)
def test_twilio_rejects_a_start_it_cannot_use(start: dict[str, object]) -> None:
    with pytest.raises(ProtocolError):
        TwilioProtocol().parse(json.dumps({**TWILIO_START, "start": start}))


# -- Twilio webhook signature and TwiML ----------------------------------------------------

DOCS_URL = "https://mycompany.com/myapp.php?foo=1&bar=2"


@pytest.mark.parametrize(
    ("number", "expected"),
    [
        ("+12349013030", "0/KCTR6DLpKmkAf8muzZqo1nDgQ="),  # Twilio's "Webhooks security" page
        ("+14158675309", "RSOYDt4T1cUTdK1PDd93/VVr8B8="),  # Twilio's own validator tests
    ],
)
def test_signature_matches_twilios_published_examples(number: str, expected: str) -> None:
    params = {
        "CallSid": "CA1234567890ABCDE",
        "Caller": number,
        "Digits": "1234",
        "From": number,
        "To": "+18005551212",
    }
    assert twilio_signature("12345", DOCS_URL, params) == expected
    assert twilio_signature("12345", DOCS_URL, dict(reversed(params.items()))) == expected
    assert signature_is_valid("12345", DOCS_URL, params, expected)


def test_wrong_or_missing_signatures_are_refused() -> None:
    params = {"CallSid": "CA1234567890ABCDE", "From": "+14158675309", "To": "+18005551212"}
    good = twilio_signature("12345", DOCS_URL, params)
    assert signature_is_valid("12345", DOCS_URL, params, good)
    assert not signature_is_valid("12345", DOCS_URL, params, None)
    assert not signature_is_valid("12345", DOCS_URL, params, "")
    assert not signature_is_valid("12345", DOCS_URL, params, good[:-2])
    assert not signature_is_valid("54321", DOCS_URL, params, good)
    assert not signature_is_valid("12345", DOCS_URL + "&baz=3", params, good)
    assert not signature_is_valid("12345", DOCS_URL, {**params, "From": "+1999"}, good)
    assert not signature_is_valid("12345", DOCS_URL, {**params, "Extra": ""}, good)


def test_stream_twiml_connects_a_stream_with_escaped_parameters() -> None:
    awkward = 'Tom & "Jerry" <cat>'
    twiml = stream_twiml(
        "wss://example.com/twilio/stream?a=1&b=2",
        {"from": "+15555550100", "note": awkward},
    )
    assert twiml.startswith('<?xml version="1.0" encoding="UTF-8"?>')
    response = ET.fromstring(twiml)
    assert response.tag == "Response"
    (connect,) = list(response)
    (stream,) = list(connect)
    assert connect.tag == "Connect" and stream.tag == "Stream"
    assert stream.get("url") == "wss://example.com/twilio/stream?a=1&b=2"
    assert [(p.tag, p.get("name"), p.get("value")) for p in stream] == [
        ("Parameter", "from", "+15555550100"),
        ("Parameter", "note", awkward),
    ]


def test_reject_twiml_says_sorry_then_hangs_up() -> None:
    message = "All our lines are busy <3 & we're sorry"
    response = ET.fromstring(reject_twiml(message))
    assert [child.tag for child in response] == ["Say", "Hangup"]
    assert response[0].text == message


CONTROL = "".join(map(chr, range(0x20))) + "\x7f"


@pytest.mark.parametrize("dirt", [CONTROL, "\ud800\udfff\ufffe\uffff", "\x00\x1b\r\n"])
def test_stream_twiml_parses_whatever_the_parameters_contain(dirt: str) -> None:
    twiml = stream_twiml(
        f"wss://example.com/{dirt}twilio/stream",
        {"from": f"+1555{dirt}0100", f"to{dirt}": dirt, "call_sid": f"CA{dirt}<&>"},
    )
    twiml.encode("utf-8")  # no lone surrogates left
    (stream,) = ET.fromstring(twiml).iter("Stream")
    assert stream.get("url") == "wss://example.com/twilio/stream"
    assert [(p.get("name"), p.get("value")) for p in stream] == [
        ("from", "+15550100"),
        ("to", ""),
        ("call_sid", "CA<&>"),
    ]


def test_reject_twiml_parses_whatever_the_message_contains() -> None:
    response = ET.fromstring(reject_twiml("All lines\nare busy\x00\x07\x1b\x7f\ufffe, sorry"))
    assert response[0].text == "All lines are busy, sorry"
    assert ET.fromstring(reject_twiml(CONTROL + "\ud800"))[0].text is None


# -- Telnyx --------------------------------------------------------------------------------

STREAM_ID = "32DE0DEA-53CB-4B21-89A4-9E1819C043BC"
TELNYX_START = {
    "event": "start",
    "sequence_number": "1",
    "start": {
        "user_id": "3E6F995F-85F7-4705-9741-53B116D28237",
        "call_control_id": "v3:T02llQxIyaRkhfRKxgAP8nY511EhFLizdvdUKJiSw8d6A9BborherQ",
        "call_session_id": "ff55a038-6f5d-11ef-9692-02420aeffb1f",
        "from": "+13122010094",
        "to": "+13122123456",
        "client_state": "aGF2ZSBhIG5pY2UgZGF5ID1d",
        "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1},
    },
    "stream_id": STREAM_ID,
}


def telnyx_media(sequence: int, pcm: np.ndarray = FRAME) -> str:
    return json.dumps(
        {
            "event": "media",
            "sequence_number": str(sequence),
            "media": {
                "track": "inbound",
                "chunk": str(sequence - 1),
                "timestamp": str((sequence - 2) * 20),
                "payload": mulaw_b64(pcm),
            },
            "stream_id": STREAM_ID,
        }
    )


def started_telnyx() -> TelnyxProtocol:
    protocol = TelnyxProtocol()
    protocol.parse(json.dumps({"event": "connected", "version": "1.0.0"}))
    protocol.parse(json.dumps(TELNYX_START))
    return protocol


def level(value: int) -> np.ndarray:
    """A frame recognisable after μ-law: constant `value`."""
    return np.full(160, value, dtype=np.int16)


def levels(events: list[WireEvent]) -> list[int]:
    return [round(float(np.mean(pcm)) / 1000) for pcm in media_of(events)]


def test_telnyx_stream_messages_become_events() -> None:
    protocol = TelnyxProtocol()
    assert protocol.parse(json.dumps({"event": "connected", "version": "1.0.0"})) == [
        Ignored("connected")
    ]
    (start,) = protocol.parse(json.dumps(TELNYX_START))
    assert start == Start(
        call_id=TELNYX_START["start"]["call_control_id"],
        stream_id=STREAM_ID,
        caller="+13122010094",
        callee="+13122123456",
        parameters={"client_state": "aGF2ZSBhIG5pY2UgZGF5ID1d"},
        sample_rate=8000,
    )
    assert np.array_equal(
        media_of(protocol.parse(telnyx_media(2)))[0], mulaw_decode(mulaw_encode(FRAME))
    )
    dtmf = {"event": "dtmf", "stream_id": STREAM_ID, "sequence_number": "3", "dtmf": {"digit": "1"}}
    assert protocol.parse(json.dumps(dtmf)) == [Dtmf("1")]
    mark = {"event": "mark", "sequence_number": "4", "stream_id": STREAM_ID, "mark": {"name": "s1"}}
    assert protocol.parse(json.dumps(mark)) == [MarkPlayed("s1")]
    error = {"event": "error", "payload": {"code": 100002, "title": "Unknown", "detail": "oops"}}
    (ignored,) = protocol.parse(json.dumps(error))
    assert isinstance(ignored, Ignored) and "oops" in ignored.what
    stop = {"event": "stop", "sequence_number": "6", "stop": {}, "stream_id": STREAM_ID}
    assert protocol.parse(json.dumps(stop)) == [Stop("stream stopped")]


def test_telnyx_accepts_the_older_mulaw_name() -> None:
    start = {
        **TELNYX_START,
        "start": {
            **TELNYX_START["start"],
            "media_format": {"encoding": "audio/x-mulaw", "sample_rate": 8000},
        },
    }
    (event,) = TelnyxProtocol().parse(json.dumps(start))
    assert isinstance(event, Start) and event.sample_rate == 8000


def test_telnyx_restores_frame_order_by_sequence_number() -> None:
    protocol = started_telnyx()
    assert levels(protocol.parse(telnyx_media(2, level(2000)))) == [2]
    assert levels(protocol.parse(telnyx_media(4, level(4000)))) == []  # held: 3 is missing
    assert levels(protocol.parse(telnyx_media(3, level(3000)))) == [3, 4]
    dtmf = {"event": "dtmf", "sequence_number": "6", "stream_id": STREAM_ID, "dtmf": {"digit": "9"}}
    assert protocol.parse(json.dumps(dtmf)) == [Dtmf("9")]  # at once; its slot stays open
    assert levels(protocol.parse(telnyx_media(7, level(7000)))) == []
    assert levels(protocol.parse(telnyx_media(5, level(5000)))) == [5, 7]


def test_telnyx_gives_up_on_a_lost_frame_after_a_bounded_wait() -> None:
    protocol = started_telnyx()
    protocol.parse(telnyx_media(2, level(2000)))
    released: list[int] = []
    for sequence in range(4, 4 + REORDER_WINDOW + 1):  # 3 never comes
        released += levels(protocol.parse(telnyx_media(sequence, level(1000 * (sequence % 10)))))
    assert released == [4, 5, 6, 7, 8, 9]
    assert protocol.parse(telnyx_media(3, level(3000))) == [Ignored("late media")]
    assert protocol.late_frames == 1


def test_telnyx_stop_releases_what_was_held() -> None:
    protocol = started_telnyx()
    protocol.parse(telnyx_media(2, level(2000)))
    protocol.parse(telnyx_media(4, level(4000)))
    events = protocol.parse(
        json.dumps({"event": "stop", "sequence_number": "5", "stream_id": STREAM_ID})
    )
    assert levels(events) == [4] and events[-1] == Stop("stream stopped")


def test_telnyx_outbound_messages_and_round_trip() -> None:
    protocol = started_telnyx()
    media = json.loads(protocol.media(FRAME))
    assert media == {"event": "media", "media": {"payload": mulaw_b64(FRAME)}}
    assert json.loads(protocol.mark("s1")) == {"event": "mark", "mark": {"name": "s1"}}
    assert json.loads(protocol.clear()) == {"event": "clear"}
    heard = media_of(started_telnyx().parse(telnyx_media(2, FRAME)))[0]
    assert np.array_equal(heard, mulaw_decode(base64.b64decode(media["media"]["payload"])))


BAD_TELNYX = {
    "binary": b"\x00" * 160,
    "not JSON": "nope",
    "unknown event": json.dumps({"event": "transcription", "stream_id": STREAM_ID}),
    "invalid base64": json.dumps(
        {"event": "media", "sequence_number": "2", "media": {"payload": "@@"}}
    ),
    "sequence number not a number": json.dumps(
        {"event": "media", "sequence_number": "two", "media": {"payload": mulaw_b64(FRAME)}}
    ),
    "media without payload": json.dumps({"event": "media", "sequence_number": "2", "media": {}}),
}


@pytest.mark.parametrize("message", BAD_TELNYX.values(), ids=BAD_TELNYX.keys())
def test_telnyx_rejects_bad_messages(message: str | bytes) -> None:
    with pytest.raises(ProtocolError):
        started_telnyx().parse(message)


def test_telnyx_rejects_media_before_start_and_a_start_without_stream_id() -> None:
    with pytest.raises(ProtocolError, match="before start"):
        TelnyxProtocol().parse(telnyx_media(2))
    with pytest.raises(ProtocolError):
        TelnyxProtocol().parse(
            json.dumps({k: v for k, v in TELNYX_START.items() if k != "stream_id"})
        )
    with pytest.raises(ProtocolError):
        start = {**TELNYX_START["start"], "media_format": {"encoding": "L16", "sample_rate": 16000}}
        TelnyxProtocol().parse(json.dumps({**TELNYX_START, "start": start}))


# -- what Twilio and Telnyx share (JsonMediaProtocol) --------------------------------------

JSON_STREAMS = {
    "twilio": (started_twilio, TWILIO_START, json.dumps(TWILIO_MEDIA), json.dumps(TWILIO_STOP)),
    "telnyx": (
        started_telnyx,
        TELNYX_START,
        telnyx_media(2),
        json.dumps({"event": "stop", "sequence_number": "3", "stream_id": STREAM_ID}),
    ),
}


@pytest.mark.parametrize("provider", JSON_STREAMS)
def test_json_streams_share_their_order_of_events(provider: str) -> None:
    started, start, media, stop = JSON_STREAMS[provider]
    protocol = started()
    with pytest.raises(ProtocolError, match="second start"):
        protocol.parse(json.dumps(start))
    assert len(media_of(protocol.parse(media))) == 1  # a refused second start changes nothing
    assert protocol.parse(stop)[-1] == Stop("stream stopped")
    for late in (media, stop, json.dumps(start), json.dumps({"event": "connected"})):
        with pytest.raises(ProtocolError, match="after stop"):
            protocol.parse(late)


@pytest.mark.parametrize(
    ("provider", "call_id_field"), [("twilio", "callSid"), ("telnyx", "call_control_id")]
)
def test_a_refused_start_leaves_room_for_a_correct_one(provider: str, call_id_field: str) -> None:
    protocol = {"twilio": TwilioProtocol, "telnyx": TelnyxProtocol}[provider]()
    start = JSON_STREAMS[provider][1]
    broken = json.loads(json.dumps(start))
    del broken["start"][call_id_field]
    with pytest.raises(ProtocolError, match=call_id_field):
        protocol.parse(json.dumps(broken))
    [event] = protocol.parse(json.dumps(start))
    assert isinstance(event, Start) and event.call_id == start["start"][call_id_field]


@pytest.mark.parametrize("provider", JSON_STREAMS)
def test_json_streams_hear_only_the_inbound_track(provider: str) -> None:
    started, _, media, _ = JSON_STREAMS[provider]
    message = json.loads(media)
    message["media"]["track"] = "outbound"
    assert started().parse(json.dumps(message)) == [Ignored("outbound track")]
    del message["media"]["track"]  # no track: inbound
    assert len(media_of(started().parse(json.dumps(message)))) == 1


@pytest.mark.parametrize("provider", JSON_STREAMS)
@pytest.mark.parametrize("event", ["dtmf", "mark", "stop", "error", "clear"])
def test_json_streams_refuse_events_before_start(provider: str, event: str) -> None:
    protocol = {"twilio": TwilioProtocol, "telnyx": TelnyxProtocol}[provider]()
    with pytest.raises(ProtocolError, match="before start"):
        protocol.parse(json.dumps({"event": event}))


# -- Vonage --------------------------------------------------------------------------------

VONAGE_CONNECTED = {
    "event": "websocket:connected",
    "content-type": "audio/l16;rate=16000",
    "uuid": "aaaaaaaa-bbbb-cccc-dddd-0123456789ab",
    "from": "447700900000",
    "to": "447700900001",
}


def started_vonage() -> VonageProtocol:
    protocol = VonageProtocol()
    protocol.parse(json.dumps(VONAGE_CONNECTED))
    return protocol


def test_vonage_messages_become_events() -> None:
    protocol = VonageProtocol()
    (start,) = protocol.parse(json.dumps(VONAGE_CONNECTED))
    assert start == Start(
        call_id="aaaaaaaa-bbbb-cccc-dddd-0123456789ab",
        stream_id="aaaaaaaa-bbbb-cccc-dddd-0123456789ab",
        caller="447700900000",
        callee="447700900001",
        parameters={
            k: v for k, v in VONAGE_CONNECTED.items() if k not in ("event", "content-type")
        },
        sample_rate=16000,
    )
    frame = tone(320, rate=16000)
    (media,) = protocol.parse(frame.astype("<i2").tobytes())  # 640 bytes: 20 ms
    assert isinstance(media, Media) and np.array_equal(media.pcm, frame)
    assert protocol.parse(
        json.dumps({"event": "websocket:dtmf", "digit": "5", "duration": 260})
    ) == [Dtmf("5")]
    notify = {"event": "websocket:notify", "payload": {"name": "s1"}}
    assert protocol.parse(json.dumps(notify)) == [MarkPlayed("s1")]
    assert protocol.parse(json.dumps({"event": "websocket:cleared"})) == [Ignored("cleared")]


def test_vonage_without_a_uuid_header_still_names_the_call() -> None:
    (start,) = VonageProtocol().parse(
        json.dumps({"event": "websocket:connected", "content-type": "audio/l16;rate=16000"})
    )
    assert isinstance(start, Start) and start.call_id.startswith("vonage-")
    assert start.caller is None and start.parameters == {}


def test_vonage_outbound_messages_and_round_trip() -> None:
    protocol = started_vonage()
    frame = tone(320, rate=16000)
    sent = protocol.media(frame)
    assert isinstance(sent, bytes) and len(sent) == 640
    assert np.array_equal(media_of(started_vonage().parse(sent))[0], frame)
    short = protocol.media(frame[:100])
    assert len(short) == 640 and not any(short[200:])  # padded with silence
    with pytest.raises(ValueError):
        protocol.media(tone(321, rate=16000))
    assert json.loads(protocol.mark("s1")) == {"action": "notify", "payload": {"name": "s1"}}
    assert json.loads(protocol.clear()) == {"action": "clear"}
    assert protocol.supports_marks and protocol.wire_rate == 16000 and protocol.frame_samples == 320


BAD_VONAGE = {
    "odd-length audio": b"\x00" * 641,
    "not JSON": "{",
    "unknown event": json.dumps({"event": "websocket:media:update"}),
    "notify without a name": json.dumps({"event": "websocket:notify", "payload": {"x": 1}}),
    "notify without payload": json.dumps({"event": "websocket:notify"}),
    "dtmf without a digit": json.dumps({"event": "websocket:dtmf"}),
    "second connected": json.dumps(VONAGE_CONNECTED),
}


@pytest.mark.parametrize("message", BAD_VONAGE.values(), ids=BAD_VONAGE.keys())
def test_vonage_rejects_bad_messages(message: str | bytes) -> None:
    with pytest.raises(ProtocolError):
        started_vonage().parse(message)


def test_vonage_rejects_audio_before_connected_and_8khz_legs() -> None:
    with pytest.raises(ProtocolError, match="before"):
        VonageProtocol().parse(b"\x00" * 640)
    with pytest.raises(ProtocolError, match="content-type"):
        VonageProtocol().parse(
            json.dumps({**VONAGE_CONNECTED, "content-type": "audio/l16;rate=8000"})
        )


def test_dial_twiml_puts_the_caller_through_to_a_number_or_a_sip_uri_with_headers() -> None:
    number = ET.fromstring(dial_twiml("+15551230001"))
    assert [(v.tag, [(c.tag, c.text) for c in v]) for v in number] == [
        ("Dial", [("Number", "+15551230001")])
    ]
    headers = {"X-Hotline-Reason": "wants billing & more", "X-Hotline-Summary": "a=b?c"}
    sip = ET.fromstring(dial_twiml("sip:billing@pbx.example.com", headers))
    uri = sip.findtext("Dial/Sip")
    assert uri == (
        "sip:billing@pbx.example.com?X-Hotline-Reason=wants%20billing%20%26%20more"
        "&X-Hotline-Summary=a%3Db%3Fc"
    )
    assert sip.find("Dial/Number") is None
