"""`sounds_finished` and `leaves_hanging`: which early transcripts read as a finished turn, and
which stop mid-sentence (no models)."""

from __future__ import annotations

import pytest

from pipeline.endpoint import leaves_hanging, sounds_finished

FINISHED = [
    "I need a taxi to the airport at 6.",
    "Can you check it, please?",
    "Hello, is anyone there?",
    "Yes, that's right.",
    "Goodbye!",
    "I'd like to book a table for two people tonight.",
    "Well, let me see, maybe around 730.",
    "Where are you from?",  # a preposition may end a question
    "Which folder should I save the message to?",  # Asterisk's Allison: a human question
    "Do you know where it is?",  # so may a verb
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
    "My number is, um?",  # a hesitation is one, question or not
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


HANGING = [
    "I would like",
    "I would like to book a table for.",
    "My number is",
    "I need a taxi,",
    "Well, let me see...",
    "No... wait…",
    "I want to talk about, um.",
    "Can you send it to the",
    "The card ends in four two —",
    "So the order was placed on Monday;",
    "...",  # Whisper's way of trailing off
]

# Not hanging: whole sentences, lone answers (the most common short turns), and digits, which
# Whisper leaves without a period: a reply to any of these is worth asking for at the pause.
NOT_HANGING = [
    *FINISHED,
    "Yes.",
    "No, sorry.",
    "Okay",
    "My number is 5, 5, 5, 1, 2, 3, 4",
    "Hello?",
    "",
]


@pytest.mark.parametrize("text", HANGING)
def test_words_stopping_mid_sentence_leave_it_hanging(text: str) -> None:
    assert leaves_hanging(text)
    assert not sounds_finished(text)


@pytest.mark.parametrize("text", NOT_HANGING)
def test_whole_sentences_answers_and_digits_do_not(text: str) -> None:
    assert not leaves_hanging(text)
