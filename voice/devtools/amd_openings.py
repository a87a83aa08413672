"""The openings `hotline amd-bench` replays: what a callee's side says in the first seconds.

What is recorded and what is synthetic:
- Recorded (one human speaker, Allison, Debian `asterisk-core-sounds-en(-wav)`, 8 kHz,
  upsampled): the voicemail greetings are Asterisk's own VoiceMail prompts played back to
  back as Asterisk plays them, untrimmed ("The person at extension" 4 digits "is unavailable"
  / "is on the phone", "Please leave your message after the tone. When done, hang up or press
  the pound key.", "Nobody is available to take your call at the moment", "sorry but the
  user's mail box can't accept more messages"), then its `beep.wav` (a 700 Hz tone, 425 ms).
  The human answers are her short words: "Hello.", "One moment, please.", "I'm sorry.".
- Synthetic: the joining pauses (silence, drawn per opening), the time before the first word,
  and every piper greeting and answer (bundled joe voice, noise off: the same audio every
  run); a piper machine greeting is followed by the recorded beep.
- Not covered: beeps of other machines (only frequency differs to the detector; the tests try
  400–2000 Hz), background noise (`hotline amd-bench --noise-dbfs` adds white noise), more
  than one human speaker.

Every opening ends in `TAIL_MS` of silence; truths are in samples: the spans of speech (each
piece trimmed of its silence by energy), the greeting's end and the beep's span.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from voice.audio import PCM
from voice.devtools.turn_bench.corpus import trim
from voice.devtools.turn_bench.sources import Clip

RATE = 16000
TAIL_MS = 3000
Truth = Literal["human", "machine"]
BEEP_PAUSES_MS = (0, 400, 1000)  # silence between a machine's greeting and its beep


@dataclass
class Opening:
    """One callee's opening, 16 kHz int16, from the answer on."""

    name: str
    truth: Truth
    synthetic: bool  # piper speech in it (pauses are synthetic everywhere)
    audio: PCM = field(repr=False)
    spans: list[tuple[int, int]]  # speech, in samples
    greeting_end: int | None = None  # machine: last speech sample of the greeting
    beep: tuple[int, int] | None = None  # machine: the beep's true span

    def ms(self, samples: int) -> float:
        return samples * 1000 / RATE


class _Builder:
    """Appends pieces and silences, keeping the truth in samples."""

    def __init__(self) -> None:
        self.parts: list[PCM] = []
        self.length = 0
        self.spans: list[tuple[int, int]] = []
        self.beep: tuple[int, int] | None = None

    def pause(self, ms: int) -> _Builder:
        return self.add(np.zeros(ms * RATE // 1000, dtype=np.int16), speech=False)

    def add(self, audio: PCM, speech: bool = True, trimmed: bool = True) -> _Builder:
        """A piece; `trimmed=False` keeps the recording's own lead and tail silence (as
        Asterisk plays a prompt), its speech span found by energy."""
        piece = trim(audio) if trimmed and speech else audio
        if speech:
            voiced = trim(piece)
            lead = _find(piece, voiced)
            self.spans.append((self.length + lead, self.length + lead + len(voiced)))
        self.parts.append(np.asarray(piece, dtype=np.int16))
        self.length += len(piece)
        return self

    def add_beep(self, beep: PCM) -> _Builder:
        self.beep = (self.length, self.length + len(beep))
        return self.add(beep, speech=False)

    def opening(self, name: str, truth: Truth, synthetic: bool, greeting: bool) -> Opening:
        self.pause(TAIL_MS)
        audio = np.concatenate(self.parts).astype(np.int16)
        end = self.spans[-1][1] if greeting else None
        return Opening(name, truth, synthetic, audio, self.spans, end, self.beep)


def _find(whole: PCM, part: PCM) -> int:
    """Offset of `part` (a slice of `whole`) inside it."""
    if not len(part):
        return 0
    return int((part.ctypes.data - whole.ctypes.data) // part.itemsize)


def _digits(clips: dict[str, Clip], rng: np.random.Generator) -> list[PCM]:
    return [clips[f"digits/{int(d)}"].audio for d in rng.integers(0, 10, 4)]


def recorded_machines(clips: dict[str, Clip], rng: np.random.Generator) -> list[Opening]:
    """Asterisk's own VoiceMail greetings (Allison), each with the beep after 0/400/1000 ms,
    and one with no beep (a full mailbox)."""

    def audio(name: str) -> PCM:
        return clips[name].audio

    unavailable = ["vm-theperson", "*digits", "vm-isunavail", "vm-intro"]
    greetings = {
        "unavailable": unavailable,
        "busy": ["vm-theperson", "*digits", "vm-isonphone", "vm-intro"],
        "intro": ["vm-intro"],
        "nobody-intro": ["vm-nobodyavail", "vm-intro"],
        "nobody": ["vm-nobodyavail"],
        "unavailable-short": unavailable[:3],
    }
    openings = []
    for name, prompts in greetings.items():
        for pause in BEEP_PAUSES_MS:
            built = _Builder().pause(int(rng.integers(200, 900)))
            for prompt in prompts:
                pieces = _digits(clips, rng) if prompt == "*digits" else [audio(prompt)]
                for piece in pieces:
                    built.add(piece, trimmed=False)
            built.pause(pause).add_beep(audio("beep"))
            openings.append(built.opening(f"vm-{name}+{pause}ms+beep", "machine", False, True))
    full = _Builder().pause(400).add(audio("vm-mailboxfull"), trimmed=False)
    openings.append(full.opening("vm-mailboxfull (no beep)", "machine", False, True))
    return openings


def recorded_humans(clips: dict[str, Clip], rng: np.random.Generator) -> list[Opening]:
    """A person answering, in Allison's words, at three loudnesses where it matters."""
    hello, moment, sorry = (clips[n].audio for n in ("hello", "one-moment-please", "im-sorry"))
    shapes: dict[str, list[PCM | int]] = {
        "hello": [hello],
        "hello ... hello": [hello, 1500, hello],
        "hello, one moment please": [hello, 350, moment],
        "one moment please": [moment],
        "hello ... I'm sorry": [hello, 1200, sorry],
    }
    openings = []
    for name, pieces in shapes.items():
        for gain_db in (-10, 0, 6) if name == "hello" else (0,):
            built = _Builder().pause(int(rng.integers(150, 700)))
            for piece in pieces:
                if isinstance(piece, int):
                    built.pause(piece)
                else:
                    built.add(_gain(piece, gain_db))
            openings.append(built.opening(f"{name} ({gain_db:+d} dB)", "human", False, False))
    return openings


def _gain(audio: PCM, db: float) -> PCM:
    scaled = audio.astype(np.float64) * 10 ** (db / 20)
    return np.clip(np.round(scaled), -32768, 32767).astype(np.int16)


MACHINE_GREETINGS = (
    "Hi, you've reached Sam. I can't come to the phone right now. "
    "Please leave a message after the beep.",
    "Hello, this is Maria. Leave me a message and I'll call you back.",
    "Hey, it's Tom. Leave a message.",
    "The number you have dialed is not available. Please leave a message after the tone.",
    "You have reached the voicemail of five five five, zero one two three.",
    "Thanks for calling. We are unable to take your call right now. "
    "Please leave your name and number after the tone.",
    # No machine phrase in the first seconds: the shape or the beep must tell.
    "Hi, this is Sam. Sorry I missed you. I'll call you back as soon as I can.",
    "Hey there, it's Priya. Tell me what you need and I'll ring you back.",
)
HUMAN_ANSWERS: tuple[tuple[str, ...], ...] = (
    ("Hello?",),
    ("Yes?",),
    ("Hi.",),
    ("Yeah, hello?",),
    ("Hello, this is Jordan.",),
    ("Jordan speaking.",),
    ("Hi, who's calling?",),
    ("Hello?", "600", "Yes, this is Jordan."),
    ("Hello?", "1500", "Yes, this is Jordan."),
    ("Hello?", "1200", "Hello?"),
    # A person who greets at length: the shape alone takes them for a machine.
    ("Good afternoon, Acme Dental, this is Jordan speaking, how can I help you?",),
    ("Good morning, thank you for calling Riverside Clinic, this is Jordan, how can I help?",),
    ("Hi, yes, this is Jordan, sorry, I was just in the middle of something, who is this?",),
)


def synthetic_openings(
    speak: Callable[[str], PCM], beep: PCM, rng: np.random.Generator
) -> list[Opening]:
    """Piper greetings (then the recorded beep after 0 or 1000 ms) and piper answers."""
    openings = []
    for text in MACHINE_GREETINGS:
        for pause in (0, 1000):
            built = _Builder().pause(int(rng.integers(200, 900))).add(speak(text))
            built.pause(pause).add_beep(beep)
            name = f"piper: {text[:32]}...+{pause}ms+beep"
            openings.append(built.opening(name, "machine", True, True))
    for answer in HUMAN_ANSWERS:
        built = _Builder().pause(int(rng.integers(150, 700)))
        for piece in answer:
            built.pause(int(piece)) if piece.isdigit() else built.add(speak(piece))
        name = "piper: " + " ... ".join(p for p in answer if not p.isdigit())
        openings.append(built.opening(name, "human", True, False))
    return openings
