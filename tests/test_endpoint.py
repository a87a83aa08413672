"""`sounds_finished`: which early transcripts read as a finished turn (no models)."""

from __future__ import annotations

import pytest

from pipeline.endpoint import sounds_finished

FINISHED = [
    "I need a taxi to the airport at 6.",
    "Can you check it, please?",
    "Hello, is anyone there?",
    "Yes, that's right.",
    "Goodbye!",
    "I'd like to book a table for two people tonight.",
    "Well, let me see, maybe around 730.",
    "Where are you from?",  # a preposition may end a question
    "I can't hear you.",
    '"Cancel my order."',  # closing quotes and brackets are not the end of the words
    "Sure, go ahead, I'm listening. ",
    "It’s my husband’s car.",  # typographic apostrophes
]

UNFINISHED = [
    # no sentence end
    "",
    "   ",
    "My number is 5, 5, 5, 1, 2, 3, 4",
    "I'm listening",
    "Okay",
    # trailing off
    "Well, let me see...",
    "No... wait…",
    # the last word leaves the sentence hanging
    "I would like to book a table for.",
    "My number is.",
    "I need a taxi and.",
    "Can you send it to the.",
    "Please charge it to my.",
    "Yes, that's.",
    "I want to talk about, um.",
    # nothing but hesitations, acknowledgements or greetings: more usually follows
    "Um.",
    "Uh, um...",
    "Okay.",
    "Yes.",
    "No, sorry.",
    "Okay, thanks.",
    "Hello?",
    "Hi!",
    "No, wait.",
    "You.",  # what Whisper hears in silence
    "...",
    "?",
]


@pytest.mark.parametrize("text", FINISHED)
def test_a_whole_sentence_or_question_sounds_finished(text: str) -> None:
    assert sounds_finished(text)


@pytest.mark.parametrize("text", UNFINISHED)
def test_a_fragment_or_an_opener_does_not(text: str) -> None:
    assert not sounds_finished(text)
