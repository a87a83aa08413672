"""A placed call's opening under machine detection (`pipeline.answering.screening`), on
Allison's real Asterisk recordings over the phone path, with a scripted recognizer (a faithful
stand-in for `SpeechToText`: it answers each opening offered with a fixed text). The screening's
clock is the audio fed to it, so times are sample counts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from pipeline.answering.screening import HUNG_UP, MESSAGE_LEFT, OnMachine, Screening
from pipeline.scheduling import Urgency
from pipeline.stt import Transcript
from voice.audio import PCM, read_wav
from voice.devtools.turn_bench.decisions import phone_line
from voice.devtools.turn_bench.sources import ASTERISK_SOUNDS, sources_dir

RATE = 16000
FRAME = 320


@pytest.fixture(scope="module")
def sounds() -> Path:
    return sources_dir() / ASTERISK_SOUNDS


def silence(ms: int) -> PCM:
    return np.zeros(ms * RATE // 1000, dtype=np.int16)


class Scripted:
    """A recognizer that hears `text` in every opening; notes whether each was urgent."""

    busy = False

    def __init__(self, text: str) -> None:
        self.text = text
        self.urgent: list[bool | Urgency] = []

    async def transcribe(
        self, audio: npt.NDArray[np.int16], urgent: bool | Urgency = True
    ) -> Transcript:
        self.urgent.append(urgent)
        return Transcript(self.text, len(audio) / RATE, 0.01)


class Call:
    """The conversation's side: what the screening made it do, at which audio position."""

    def __init__(self, screening: Screening) -> None:
        self.screening = screening
        self.done: list[tuple[str, int]] = []
        self.turns_heard = 0  # frames the turn detector would have heard

    async def greet(self) -> None:
        self.done.append(("greet", self.screening.detector.position))

    async def say(self, text: str) -> bool:
        self.done.append((f"say {text}", self.screening.detector.position))
        return True

    def hang_up(self, reason: str) -> None:
        self.done.append((f"hang up: {reason}", self.screening.detector.position))

    async def play(self, audio: PCM) -> None:
        """Open the call and feed it `audio` frame by frame, letting its tasks run between."""
        opened = asyncio.create_task(
            self.screening.open(self.greet, self.say, self.hang_up, lambda event: None)
        )
        leaving: list[asyncio.Task[None]] = []
        for start in range(0, len(audio) - FRAME + 1, FRAME):
            if not self.screening.push(audio[start : start + FRAME]):
                self.turns_heard += 1
            elif self.screening.overturned():  # as the conversation does: leave the message
                leaving.append(asyncio.create_task(self.screening.leave(self.say, self.hang_up)))
            for _ in range(3):  # the scripted transcription and the opening take their turns
                await asyncio.sleep(0)
        self.screening.close()
        for task in (opened, *leaving):
            task.cancel()


def test_a_person_is_greeted_after_hello_and_the_turns_hear_only_what_follows(
    sounds: Path,
) -> None:
    hello = read_wav(sounds / "hello.wav")
    audio = phone_line(np.concatenate([silence(300), hello, silence(2000)]))
    recognizer = Scripted("Hello.")
    screening = Screening(OnMachine("Call us back."), recognizer)
    call = Call(screening)
    asyncio.run(call.play(audio))
    [(done, at)] = call.done
    assert done == "greet"
    answered = screening.answered_by()
    assert answered is not None
    assert (answered["result"], answered["basis"], answered["beep_ms"]) == ("human", "shape", None)
    assert at - FRAME <= int(str(answered["ms"])) * RATE // 1000 <= at  # decided in that frame
    assert call.turns_heard == (len(audio) - at) // FRAME  # from the verdict on, not before
    assert recognizer.urgent and not any(recognizer.urgent)  # early transcripts wait behind turns


def test_a_machine_without_a_beep_is_hung_up_on_once_its_greeting_has_ended(
    sounds: Path,
) -> None:
    greeting = np.concatenate([silence(300), read_wav(sounds / "vm-intro.wav")])
    audio = phone_line(np.concatenate([greeting, silence(3000)]))
    screening = Screening(OnMachine(None), Scripted("Please leave your message"))
    call = Call(screening)
    asyncio.run(call.play(audio))
    [(done, at)] = call.done
    assert done == f"hang up: {HUNG_UP}"
    quiet = screening.settings.quiet_ms * RATE // 1000
    spoken_to = int(np.flatnonzero(np.abs(greeting) > 1000)[-1])  # the greeting's last word
    assert spoken_to + quiet <= at <= spoken_to + quiet + 400 * RATE // 1000
    assert call.turns_heard == 0  # a machine is never a turn
    answered = screening.answered_by()
    assert answered is not None and answered["result"] == "machine"


def test_a_machine_s_message_follows_its_beep(sounds: Path) -> None:
    greeting = np.concatenate([silence(300), read_wav(sounds / "vm-intro.wav"), silence(400)])
    beep = read_wav(sounds / "beep.wav")
    audio = phone_line(np.concatenate([greeting, beep, silence(1500)]))
    screening = Screening(OnMachine("Call us back."), Scripted("Please leave your message"))
    call = Call(screening)
    asyncio.run(call.play(audio))
    (said, at), (hung_up, _) = call.done
    assert (said, hung_up) == ("say Call us back.", f"hang up: {MESSAGE_LEFT}")
    assert len(greeting) + len(beep) <= at <= len(greeting) + len(beep) + 2 * FRAME
    answered = screening.answered_by()
    assert answered is not None and answered["beep_ms"] is not None


def test_a_beep_after_a_person_was_heard_makes_it_a_machine_and_the_message_follows(
    sounds: Path,
) -> None:
    """A machine that only says "Hello." and pauses is greeted as a person until its beep."""
    hello = np.concatenate([silence(300), read_wav(sounds / "hello.wav"), silence(1500)])
    beep = read_wav(sounds / "beep.wav")
    audio = phone_line(np.concatenate([hello, beep, silence(1000)]))
    screening = Screening(OnMachine("Call us back."), Scripted("Hello."))
    call = Call(screening)
    asyncio.run(call.play(audio))
    (greeted, _), (said, at), (hung_up, _) = call.done
    assert (greeted, said, hung_up) == ("greet", "say Call us back.", f"hang up: {MESSAGE_LEFT}")
    assert len(hello) + len(beep) <= at <= len(hello) + len(beep) + 2 * FRAME
    answered = screening.answered_by()
    assert answered is not None
    assert (answered["result"], answered["basis"], answered["revised"]) == ("machine", "beep", True)
    assert call.turns_heard * FRAME < len(hello)  # the turns heard the pause, not the beep on
