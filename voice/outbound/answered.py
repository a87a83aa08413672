"""A placed call's answering-machine detection (`pipeline.answering.screening`), as its media
stream starts it: with the dial's voicemail message, on the phone recognizer, and noting who
answered once decided, written into the call's record in Redis so that any worker's
`GET /calls/{id}` shows it."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping

from pipeline.answering.screening import OnMachine, Screening, ScreeningSettings
from pipeline.services import SpeechRecognizer
from voice.cluster.records import UnknownCall
from voice.cluster.registry import CallRegistry
from voice.outbound.dials import Dial


def screening_of(
    dial: Dial | None,
    call_id: str,
    stt: SpeechRecognizer,
    settings: ScreeningSettings,
    sessions: CallRegistry,
) -> Screening | None:
    """The machine detection of the placed call `dial` (None: not placed, or none asked for)."""
    if dial is None or not dial.machine_detection:
        return None
    noted = functools.partial(note_answered, sessions, call_id)
    on_machine = OnMachine(dial.voicemail)
    return Screening(on_machine, stt, settings, on_answered=noted, call_id=call_id)


def note_answered(sessions: CallRegistry, call_id: str, answered_by: Mapping[str, object]) -> None:
    """Keep who answered `call_id` in its record (again if a beep overturned it)."""
    with contextlib.suppress(UnknownCall):  # the registry let it go (say, Redis lost it)
        sessions.update_call(call_id, answered_by=dict(answered_by))
