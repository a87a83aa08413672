"""Machine phrases in an early transcript: what voicemail greetings say and people do not.

Matching is on lower-cased words with punctuation dropped ("voice mail" and "voicemail" both
match). Phrases a person might say on picking up ("hello", "this is ...", "who's calling")
are deliberately absent: the transcript can only say *machine*; a person is told by the
opening's shape. "Not available" is in: a person answering for someone else says it, but after
their "Hello?", by which time the shape has decided.
"""

from __future__ import annotations

import re

MACHINE_PHRASES: tuple[str, ...] = (
    "leave a message",
    "leave your message",
    "leave me a message",
    "leave a brief message",
    "leave your name",
    "after the tone",
    "after the beep",
    "at the tone",
    "at the beep",
    "voicemail",
    "voice mail",
    "mailbox",
    "mail box",
    "not available",
    "unavailable",
    "is on the phone",
    "come to the phone",
    "take your call",
    "you have reached",
    "you've reached",
    "record your message",
    "person at extension",
    "nobody is available",
    "no one is available",
    "get back to you",
    "return your call",
)

_WORDS = re.compile(r"[a-z0-9']+")


def normalise(text: str) -> str:
    """Lower-case words separated by single spaces (curly apostrophes made straight)."""
    return " ".join(_WORDS.findall(text.lower().replace("\u2019", "'")))


def machine_phrase(text: str, phrases: tuple[str, ...] = MACHINE_PHRASES) -> str | None:
    """The first machine phrase `text` contains (whole words), or None."""
    padded = f" {normalise(text)} "
    for phrase in phrases:
        if f" {phrase} " in padded:
            return phrase
    return None
