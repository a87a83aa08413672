"""Why calls end, in a few fixed categories.

A call's `end_reason` is free text, as the transport or the switchboard said it ("caller hung up
(BYE)", "no audio for 10 s", "transferred to +1555…"): fine for a log line or a call record,
unusable as a Prometheus label (one series per distinct text). `end_category` maps it to one of
`CATEGORIES`, which the call record (`end_category`, beside `end_reason`) and the metric
`hotline_calls_ended_total{reason}` carry.

The texts come from the places that hang calls up (`Transport.hang_up` and `HangUp` callers in
voice/ and pipeline/); `tests/test_end_reasons.py` reads every such text in the source and
fails on one that falls into `other`, so a new reason gets its category here.
"""

from __future__ import annotations

from typing import Literal, get_args

EndCategory = Literal[
    "caller_hung_up",  # the caller, or the caller's provider, ended the call
    "agent_ended",  # the agent's end_call tool
    "transferred",  # put through to a person (the bot's leg ends)
    "api_hang_up",  # POST /calls/{id}/hangup
    "timeout",  # no audio for too long; a SIP session that was not refreshed
    "setup_failed",  # never connected: no ICE connection, no ACK, no usable SDP answer
    "connection_lost",  # the media connection failed or broke off without a hang-up
    "shutdown",  # the worker shut down (after the drain timeout) with the call in progress
    "error",  # a protocol error, or the conversation failed (no reason recorded)
    "other",  # a reason this table does not know (the test above keeps this empty)
]
CATEGORIES: tuple[EndCategory, ...] = get_args(EndCategory)

# First match wins, on the lower-cased reason's start.
_PREFIXES: tuple[tuple[str, EndCategory], ...] = (
    ("caller hung up", "caller_hung_up"),  # SIP BYE
    ("stop:", "caller_hung_up"),  # the provider's stop message: the call ended there
    ("caller track ended", "caller_hung_up"),  # WebRTC: the browser ended its track
    ("replay finished", "caller_hung_up"),  # experiments: the recorded caller is done
    ("connection failed", "connection_lost"),  # WebRTC: ICE or DTLS failed mid-call
    ("connection ", "caller_hung_up"),  # WebRTC: "connection closed", the browser left
    ("socket closed", "caller_hung_up"),  # a media websocket closed (Vonage's only end)
    ("client stopped reading", "connection_lost"),  # its sends backed up
    ("ended by the agent", "agent_ended"),
    ("voicemail:", "agent_ended"),  # a placed call reached a machine: message left, or not
    ("transferred to", "transferred"),
    ("hung up through the api", "api_hang_up"),
    ("no audio for", "timeout"),
    ("session expired", "timeout"),  # SIP session timer (RFC 4028)
    ("never connected", "setup_failed"),
    ("no ack", "setup_failed"),
    ("no usable answer", "setup_failed"),
    ("server shutdown", "shutdown"),
    ("too many bad messages", "error"),
)


def end_category(reason: str | None) -> EndCategory:
    """The category of a call that ended for `reason` (None: no hang-up was recorded, so the
    conversation failed: `error`)."""
    if reason is None:
        return "error"
    text = reason.lower()
    for prefix, category in _PREFIXES:
        if text.startswith(prefix):
            return category
    return "other"
