"""The media stream of a placed call, as the phone routes admit it.

Hotline hands the provider the stream's URL and parameters before the provider has named the
call (Twilio's CallSid, Telnyx's call_control_id come back with the create request), so an
outbound stream carries the dial id (`outbound`: a Twilio `<Parameter>`, or in the Telnyx
stream URL's query), and its stream token is bound to `outbound:<dial id>` rather than to the
provider's call id. Once the token checks out, the stream takes its `Dial`
(single use: taking deletes it), which must be of this provider and name this very call."""

from __future__ import annotations

from collections.abc import Mapping

from voice.cluster.records import RegistryUnavailable
from voice.outbound.dials import Dial, DialBook
from voice.transports.phone.wire import Start

OUTBOUND_PARAMETER = "outbound"  # the dial id, in the stream's parameters
DIRECTION_PARAMETER = "direction"  # "outbound": for whoever reads the stream's parameters
VONAGE_CALL_IDS = ("uuid", "call_uuid", "conversation_uuid")  # headers naming a Vonage call


class DialRefused(Exception):
    """The stream claims to be a placed call and is not (or cannot be checked now)."""

    def __init__(self, reason: str, *, try_again: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.close_code = 1013 if try_again else 1008


def token_subject(dial_id: str) -> str:
    """What a placed call's stream token is bound to."""
    return f"{OUTBOUND_PARAMETER}:{dial_id}"


def dial_id_of(start: Start, query: Mapping[str, str]) -> str | None:
    """The dial a stream says it answers: in its parameters, else its URL's query."""
    return start.parameters.get(OUTBOUND_PARAMETER) or query.get(OUTBOUND_PARAMETER) or None


def stream_token_subject(start: Start, query: Mapping[str, str]) -> str:
    """What this stream's token must be bound to: its dial, or the provider's call id."""
    dial_id = dial_id_of(start, query)
    return token_subject(dial_id) if dial_id else start.call_id


async def take_dial(
    book: DialBook, provider: str, start: Start, query: Mapping[str, str]
) -> Dial | None:
    """The placed call this stream answers (None: an inbound call); DialRefused if it claims
    one that is unknown, taken already, or another call's."""
    dial_id = dial_id_of(start, query)
    if not dial_id:
        return None
    try:
        dial = await book.take(dial_id)
    except RegistryUnavailable:
        reason = "the call registry is unavailable to find the call"
        raise DialRefused(reason, try_again=True) from None
    if dial is None:
        raise DialRefused(f"no outbound call {dial_id} waiting (unknown, expired or taken)")
    if dial.provider != provider or not _same_call(dial, start):
        raise DialRefused(f"outbound call {dial_id} is not {provider} call {start.call_id}")
    return dial


def _same_call(dial: Dial, start: Start) -> bool:
    """Whether the stream is the dial's call. A Vonage websocket leg names no call (its headers
    were written before the call had a uuid): the dial's uuid is the call's then."""
    if dial.provider == "vonage" and not any(k in start.parameters for k in VONAGE_CALL_IDS):
        return dial.call_id is not None
    return dial.call_id == start.call_id


def call_id_of(dial: Dial | None, start: Start) -> str:
    """The call's id: the provider's, as the dial has it, else as the stream names it."""
    return dial.call_id if dial is not None and dial.call_id else start.call_id
