"""Answering-machine detection (`pipeline.answering`) on Allison's real Asterisk recordings
(Debian's `asterisk-core-sounds-en(-wav)`, fetched into the cache the way `hotline turn-bench`
and `hotline amd-bench` fetch them), over the phone path. Times are sample counts: the
detector's clock is the audio fed to it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from pipeline.answering.detector import (
    AnsweringEvent,
    AnsweringMachineDetector,
    AnsweringSettings,
    BeepEnded,
    BeepHeard,
    OpeningSoFar,
    Verdict,
)
from pipeline.answering.tone import ToneTracker
from pipeline.answering.words import machine_phrase
from pipeline.transport import AudioIn, CallerAudio, InboundEvent
from voice.audio import PCM, read_wav
from voice.devtools.amd_openings import Opening
from voice.devtools.amd_study import replay, summary
from voice.devtools.turn_bench.corpus import trim
from voice.devtools.turn_bench.decisions import phone_line
from voice.devtools.turn_bench.sources import ASTERISK_SOUNDS, sources_dir

RATE = 16000
FRAME = 320


@pytest.fixture(scope="module")
def sounds() -> Path:
    return sources_dir() / ASTERISK_SOUNDS


def clip(sounds: Path, name: str) -> PCM:
    return read_wav(sounds / f"{name}.wav")


def silence(ms: int) -> PCM:
    return np.zeros(ms * RATE // 1000, dtype=np.int16)


def tone(hz: float, ms: int, level: float = 0.25) -> PCM:
    t = np.arange(ms * RATE // 1000) / RATE
    return (np.sin(2 * np.pi * hz * t) * level * 32767).astype(np.int16)


def feed(audio: PCM, detector: AnsweringMachineDetector | None = None) -> list[AnsweringEvent]:
    detector = detector or AnsweringMachineDetector()
    events: list[AnsweringEvent] = []
    for start in range(0, len(audio) - FRAME + 1, FRAME):
        events += detector.push(audio[start : start + FRAME])
    return events


def verdicts(events: list[AnsweringEvent]) -> list[Verdict]:
    return [e for e in events if isinstance(e, Verdict)]


def test_a_voicemail_greeting_then_the_beep_is_a_machine_and_the_beep_is_placed(
    sounds: Path,
) -> None:
    greeting = np.concatenate([silence(400), clip(sounds, "vm-intro"), silence(400)])
    beep = clip(sounds, "beep")
    events = feed(phone_line(np.concatenate([greeting, beep, silence(1000)])))
    onset, end = len(greeting), len(greeting) + len(beep)
    [verdict] = verdicts(events)
    assert verdict.answer == "machine"
    assert verdict.at_ms * RATE / 1000 <= end  # decided by the end of the beep
    [heard] = [e for e in events if isinstance(e, BeepHeard)]
    [ended] = [e for e in events if isinstance(e, BeepEnded)]
    assert abs(heard.start_ms * RATE / 1000 - onset) <= 320  # within a frame of the onset
    assert abs(ended.end_ms * RATE / 1000 - end) <= 480
    assert 690 <= heard.hz <= 710  # Asterisk's beep is 700 Hz
    assert (heard.at_ms - heard.start_ms) == pytest.approx(160, abs=20)  # min_ms + a frame


def test_the_beep_is_placed_alike_whatever_the_pieces_the_audio_comes_in(sounds: Path) -> None:
    """Transports hand audio over a detector window at a time (`CallerAudio`: 40 or 20 ms),
    not every 20 ms frame: the beep is placed at the same samples and the verdict is the same,
    decided at most the 20 ms later that a frame may wait for its window to complete."""
    opening = np.concatenate([silence(400), clip(sounds, "vm-intro"), silence(400)])
    audio = phone_line(np.concatenate([opening, clip(sounds, "beep"), silence(1000)]))
    queue: asyncio.Queue[InboundEvent] = asyncio.Queue()
    caller, detector, pieces = CallerAudio(queue), AnsweringMachineDetector(), []
    chunked: list[AnsweringEvent] = []
    for start in range(0, len(audio) - FRAME + 1, FRAME):
        caller.add(audio[start : start + FRAME], 0.0)
        while not queue.empty():
            piece = queue.get_nowait()
            assert isinstance(piece, AudioIn)
            pieces.append(piece.pcm.size)
            chunked += detector.push(piece.pcm)
    framed = feed(audio)
    assert set(pieces) == {320, 640}
    [heard], [heard_by_frame] = (
        [e for e in ev if isinstance(e, BeepHeard)] for ev in (chunked, framed)
    )
    [ended], [ended_by_frame] = (
        [e for e in ev if isinstance(e, BeepEnded)] for ev in (chunked, framed)
    )
    assert (heard.start_ms, heard.hz) == (heard_by_frame.start_ms, heard_by_frame.hz)
    assert ended == ended_by_frame and 0 <= heard.at_ms - heard_by_frame.at_ms <= 20
    [by_piece], [by_frame] = verdicts(chunked), verdicts(framed)
    assert (by_piece.answer, by_piece.by) == (by_frame.answer, by_frame.by) == ("machine", "shape")
    assert 0 <= by_piece.at_ms - by_frame.at_ms <= 20


def test_hello_then_silence_is_a_person_decided_within_a_second(sounds: Path) -> None:
    hello = trim(clip(sounds, "hello"))
    events = feed(phone_line(np.concatenate([silence(500), hello, silence(3000)])))
    [verdict] = verdicts(events)
    assert (verdict.answer, verdict.by) == ("human", "shape")
    speech_end = 500 + len(hello) * 1000 / RATE
    assert 0 < verdict.at_ms - speech_end <= 1000
    assert not any(isinstance(e, BeepHeard) for e in events)


@pytest.mark.parametrize("hz", [400, 700, 1000, 1400, 2000])
def test_a_pure_tone_is_a_beep(hz: int) -> None:
    events = feed(phone_line(np.concatenate([silence(600), tone(hz, 500), silence(600)])))
    [heard] = [e for e in events if isinstance(e, BeepHeard)]
    [ended] = [e for e in events if isinstance(e, BeepEnded)]
    assert abs(heard.hz - hz) <= 5
    assert abs(heard.start_ms - 600) <= 20 and abs(ended.end_ms - 1100) <= 30
    assert [(v.answer, v.by) for v in verdicts(events)] == [("machine", "beep")]


def test_a_short_blip_or_a_two_tone_chord_is_no_beep() -> None:
    blip = tone(1000, 100)
    chord = (tone(440, 600, 0.12).astype(np.int32) + tone(480, 600, 0.12)).astype(np.int16)
    tracker = ToneTracker()
    audio = np.concatenate([silence(300), blip, silence(300), chord, silence(300)])
    found = [tracker.push(audio[i : i + FRAME], i + FRAME) for i in range(0, len(audio), FRAME)]
    assert found == [None] * len(found)


def test_speech_holds_no_beep(sounds: Path) -> None:
    """None of Allison's prompts but her two recorded tones holds a beep (her sustained
    vowels at 350–430 Hz did, before the drift limit), wide band and over the phone."""
    heard = []
    for wav in sorted(sounds.glob("*.wav")):
        if wav.stem in {"beep", "confbridge-leave"}:
            continue
        audio = read_wav(wav)
        for path, line in (("wide", audio), ("phone", phone_line(audio))):
            tracker = ToneTracker()
            for i in range(0, len(line) - FRAME + 1, FRAME):
                if tracker.push(line[i : i + FRAME], i + FRAME) is not None:
                    heard.append((wav.stem, path))
                    break
    assert heard == []


def test_a_person_heard_first_is_revised_by_a_later_beep(sounds: Path) -> None:
    hello = trim(clip(sounds, "hello"))
    audio = np.concatenate([silence(300), hello, silence(1500), tone(1000, 400), silence(300)])
    first, second = verdicts(feed(phone_line(audio)))
    assert (first.answer, first.revised) == ("human", False)
    assert (second.answer, second.by, second.revised) == ("machine", "beep", True)


def test_a_machine_phrase_in_the_early_transcript_decides_at_once(sounds: Path) -> None:
    detector = AnsweringMachineDetector()
    offers = [e for e in feed(phone_line(clip(sounds, "vm-nobodyavail")), detector)]
    assert any(isinstance(e, OpeningSoFar) for e in offers)
    assert detector.hear("Hello?") is None
    verdict = detector.hear("Nobody is available to take your call.")
    assert verdict is not None and (verdict.answer, verdict.by) == ("machine", "transcript")
    assert verdict.at_ms == detector.now_ms
    assert detector.hear("Please leave a message") is None  # decided already


def test_machine_phrases_match_whole_words() -> None:
    assert machine_phrase("Please leave your message after the tone.") == "leave your message"
    assert machine_phrase("You’ve reached Sam.") == "you've reached"  # curly apostrophe
    assert machine_phrase("Sam's VOICE MAIL") == "voice mail"
    assert machine_phrase("Hello? Who's calling?") is None
    assert machine_phrase("The unavailability") is None


def test_silence_is_unknown_at_the_timeout_and_a_long_greeting_is_a_machine(
    sounds: Path,
) -> None:
    settings = AnsweringSettings(no_speech_ms=2000)
    [quiet] = verdicts(feed(silence(3000), AnsweringMachineDetector(settings)))
    assert (quiet.answer, quiet.by) == ("unknown", "timeout")
    assert quiet.at_ms == pytest.approx(2000, abs=40)
    greeting = phone_line(np.concatenate([silence(300), clip(sounds, "vm-intro")]))
    [long] = verdicts(feed(greeting))
    assert (long.answer, long.by) == ("machine", "shape")


def test_the_study_replays_an_opening_with_transcripts_arriving_late(sounds: Path) -> None:
    greeting = clip(sounds, "vm-nobodyavail")
    beep = clip(sounds, "beep")
    audio = phone_line(np.concatenate([silence(300), greeting, beep, silence(1000)]))
    onset = 4800 + len(greeting)
    beep_span = (onset, onset + len(beep))
    opening = Opening("nobody", "machine", False, audio, [(4800, onset)], onset, beep_span)
    said: list[int] = []

    def transcribe(heard: PCM) -> tuple[str, float]:
        said.append(len(heard))
        return "Nobody is available to", 250.0

    outcome = replay(opening, transcribe)
    assert (outcome.answer, outcome.by) == ("machine", "transcript")
    first_offer_ms = said[0] * 1000 / RATE
    assert outcome.at_ms >= first_offer_ms + 250  # not before the transcript could arrive
    assert outcome.in_time and outcome.beep_heard_ms is not None
    assert summary([outcome])["accuracy"] == 1.0


def test_words_with_no_machine_phrase_hold_back_the_long_greeting_rule(sounds: Path) -> None:
    """A person greeting at length ("Good afternoon, Acme Dental, ...") is told from a
    greeting by the words: no machine phrase, so the length alone decides nothing."""
    speech = trim(clip(sounds, "dir-intro"))[: 5 * RATE]  # "Welcome to the directory. ..."
    audio = phone_line(np.concatenate([silence(300), speech, silence(2500)]))
    detector = AnsweringMachineDetector()
    events: list[AnsweringEvent] = []
    for start in range(0, len(audio) - FRAME + 1, FRAME):
        if start == 2 * RATE:
            assert detector.hear("Welcome to the directory.") is None
        events += detector.push(audio[start : start + FRAME])
    [verdict] = verdicts(events)
    assert (verdict.answer, verdict.by) == ("human", "shape")
    assert verdict.at_ms >= 300 + 5000 + 1500  # after the long silence, not at 3.5 s
    [unheard] = verdicts(feed(audio))  # no transcript: the length decides
    assert (unheard.answer, unheard.by) == ("machine", "shape")
