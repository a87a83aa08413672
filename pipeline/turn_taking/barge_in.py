"""Speech during the reply: a backchannel to talk over, or an interruption to yield to?

A caller who says "mm-hm", "okay" or "I see" while the bot speaks is listening, not taking the
turn; a cough or a click is not speech at all. Before this module any 96 ms of voiced audio
(`SpeechStarted`) stopped the reply for good and became a turn of its own. Now the reply is
paused at that onset (so a real interruption still silences it at once) and `classify` decides
from the speech's duration and its early transcript (Whisper tiny.en) whether it resumes.

`classify` is a pure function of what was heard, so a study can replay it on recorded speech
exactly as a call decides it live (`pipeline.turn_taking.interruptions` is the call's glue).

Measured (the server's own VAD and Whisper tiny.en on 16 kHz speech, piper's joe and espeak-ng
en-us / en-gb at 150 wpm; duration = first voiced window to the start of the trailing silence):
- acknowledgements: "Yeah." 320-448 ms, "Okay." 416-512, "Right." 320-416, "Sure." 288-416,
  "I see." 512-544, "Uh huh." 352-512, hums ("Mm hmm.", "Mhm.") 512-768 ms, transcribed as
  "MMM", "NMMM", "Mmm", "M.H.M.", "Uh-huh."; two of them ("Yeah, okay.", "Uh-huh, yeah.", "Okay,
  sure.") 704-1216 ms;
- interruptions: "Wait." 288-448 ms, "Stop." 256-384, "No." 320-416 (short, but their words
  are no acknowledgement); "No, wait, that's not my address." 2272-2496 ms;
- Whisper tiny.en takes 84-138 ms for any of them on these 2 cores, so the transcript of the
  caller's pause (120 ms of silence) is in long before their turn ends (500 ms).
So duration alone cannot tell "Stop." from "Okay." (both ~400 ms): the words decide; speech
longer than `backchannel_max_ms` is an interruption whatever Whisper made of it. Synthetic hums
are read poorly (piper says "Mm-hm." as "MMA CHEM", Whisper hears espeak's "Hm." as "I can"):
such speech is taken for an interruption, as before; a human "mm-hm" reads "Mm-hmm.".

Replayed on 16 acknowledgements and 12 interruptions ("Wait.", "Hold on.", "Sorry, what?",
"Actually, I meant Friday.", ...) in 5 voices (piper, espeak-ng en-us, en-us+f3, en-gb,
en-gb-x-rp; the first segment of each through the server's VAD, Whisper tiny.en on it): 74 of
80 acknowledgements resume the reply (92.5%; the 6 others are espeak hums Whisper spelled out,
"M-A-M", "and anthem", and one "Got it." heard as "Guard it."), 60 of 60 interruptions stop it.
With `backchannel_max_ms` at 1000 only 63 of 80 resumed: espeak's two-word acknowledgements
at 150 wpm ("Okay, sure.") last 1024-1216 ms.
"""

from __future__ import annotations

import enum
import re

from pydantic import BaseModel, Field

# What callers say to show they are listening (Ward & Tsukahara 2000, Jurafsky's Switchboard
# dialogue acts "acknowledge (backchannel)": "uh-huh", "yeah", "right", "okay", "mm-hm").
BACKCHANNELS = (
    "yeah",
    "yes",
    "yep",
    "yup",
    "okay",
    "ok",
    "right",
    "sure",
    "i see",
    "got it",
    "all right",
    "alright",
    "uh huh",
    "cool",
)


class BargeInSettings(BaseModel):
    """What speech during the reply stops it for good."""

    resume: bool = Field(
        default=True,
        description="Pause the reply when the caller speaks, and resume it if they only "
        "acknowledged (a backchannel), coughed or made a noise. False: any speech stops the "
        "reply for good and becomes a turn (Hotline before issue 24).",
    )
    backchannel_max_ms: int = Field(
        default=1300,
        gt=0,
        description="Speech at least this long (first voiced window to the trailing silence) "
        "is an interruption whatever its words. Measured: two acknowledgements together take "
        "704-1216 ms, one 288-800 ms.",
    )
    backchannels: tuple[str, ...] = Field(
        default=BACKCHANNELS,
        description="Words and phrases that only acknowledge; hums (mm, hmm, mhm, uh, ah, oh) "
        "always do.",
    )


class Verdict(enum.Enum):
    BACKCHANNEL = "backchannel"  # resume the reply; not a turn
    INTERRUPTION = "interruption"  # stop the reply; the words are the caller's next turn
    UNDECIDED = "undecided"  # short speech whose words are not in yet


_ANNOTATION = re.compile(r"\[[^\]]*\]|\([^)]*\)|\*[^*]*\*")  # Whisper's "[cough]", "(coughs)"
_WORD = re.compile(r"[a-z']+|[0-9]+")
# mm, hmm, mhm, nmmm (Whisper's hums: any m, h and n with an m), uh, ah, oh, er, um
_HUM = re.compile(r"^(?:[hn]*m[mhn]*|h+|u+h+|a+h+|o+h+|e+r+|u+m+)$")


def spoken_words(transcript: str) -> list[str]:
    """The words of `transcript`, lower case, without Whisper's sound annotations."""
    return _WORD.findall(_ANNOTATION.sub(" ", transcript.lower()))


def only_acknowledges(words: list[str], phrases: tuple[str, ...] = BACKCHANNELS) -> bool:
    """Whether `words` are nothing but hums and acknowledgement phrases, in any order and
    number ("yeah okay", "mm hmm", "uh huh yeah"). No words at all: True (a cough, a click)."""
    known = {tuple(spoken_words(phrase)) for phrase in phrases}
    longest = max((len(phrase) for phrase in known), default=1)

    def acknowledges(part: list[str]) -> bool:
        return tuple(part) in known or (len(part) == 1 and bool(_HUM.match(part[0])))

    can_end = [False] * (len(words) + 1)  # can_end[i]: words[:i] splits into those
    can_end[0] = True
    for end in range(1, len(words) + 1):
        can_end[end] = any(
            can_end[end - size] and acknowledges(words[end - size : end])
            for size in range(1, min(longest, end) + 1)
        )
    return can_end[-1]


def classify(settings: BargeInSettings, duration_ms: float, transcript: str | None) -> Verdict:
    """Speech that began while the reply played: `duration_ms` of it (so far, or in all),
    `transcript` its early transcript (None: not in yet)."""
    if not settings.resume or duration_ms >= settings.backchannel_max_ms:
        return Verdict.INTERRUPTION
    if transcript is None:
        return Verdict.UNDECIDED
    if only_acknowledges(spoken_words(transcript), settings.backchannels):
        return Verdict.BACKCHANNEL
    return Verdict.INTERRUPTION
