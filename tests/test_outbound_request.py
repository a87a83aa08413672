"""What `POST /calls/outbound` takes (`voice.outbound.request`): the voicemail a machine gets."""

from __future__ import annotations

import pytest

from voice.outbound.request import BadRequest, parse_request

BASE = {"to": "+15557654321", "from": "+15551110000", "agent": "survey"}
SCREENED = {**BASE, "machine_detection": True}


def test_the_voicemail_left_is_the_request_s_else_the_agent_s() -> None:
    assert parse_request(SCREENED, ["survey"]).voicemail_message("Ours.") == "Ours."
    assert parse_request(SCREENED, ["survey"]).voicemail_message(None) is None
    given = parse_request({**SCREENED, "voicemail": "Theirs."}, ["survey"])
    assert given.voicemail_message("Ours.") == "Theirs."
    for hang_up in (None, "hang_up"):
        quiet = parse_request({**SCREENED, "voicemail": hang_up}, ["survey"])
        assert quiet.voicemail_message("Ours.") is None


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({**BASE, "voicemail": None}, "voicemail: needs machine_detection: true"),
        ({**SCREENED, "voicemail": ""}, "voicemail: String should have at least 1 character"),
        ({**SCREENED, "voicemail": "x" * 2001}, "voicemail: String should have at most 2000"),
    ],
)
def test_a_voicemail_is_a_short_message_on_a_screened_call(
    body: dict[str, object], said: str
) -> None:
    with pytest.raises(BadRequest, match=said):
        parse_request(body, ["survey"])
