"""Endpointing by words: does an early transcript read as a finished turn?

`sounds_finished(text)` judges the transcript of a `TurnPause` (Whisper tiny.en): a whole
sentence or question (ends with ".", "?" or "!", not "..."), whose last word leaves nothing
hanging (a conjunction, article, possessive, a preposition that does not end sentences, "is",
"that's", a hesitation), and that says more than hesitations, acknowledgements and greetings
("Okay, thanks.", "Yes.", "Hello?", "No, sorry."). If so, the server may end the turn after
`TurnSettings.finished_silence_ms` instead of `end_silence_ms` (`TurnDetector.hasten`).

Measured with `hotline endpoint-study` (200 single caller turns with comma pauses and
sentence stops: 10 phrases x 6 espeak-ng voices at 130/160/200 wpm and piper's joe, normal and
fast; 20 ms frames on a simulated clock; the transcript of each pause arrives after its measured
inference time on 2 busy cores). Split: share of turns heard as two or more; delay: endpoint
delay of the last turn, median / p95.

- No early end: end_silence_ms 300: 48.5%, 328/336 ms; 400: 28.5%; 500 (today): 10.0%,
  520/528 ms; 600: 1.0%, 616/624 ms; 700: 0%. All splits at 500 ms are sentence stops at
  130 wpm (about 420-610 ms of silence; 290-420 at 160 wpm, 220-260 at 200, up to 450 ms for
  piper).
- 30 s window (the "full" STT window; tiny.en median 446 ms): no change at any setting. The
  transcript comes ~670 ms into the silence, after the turn has ended.
- Fitted window ("fit", median 68 ms; with the 120 ms pause the transcript comes ~200 ms into
  the silence), end_silence_ms 500, finished_silence_ms 250: 49.0%, 268/524 ms; 300: 34.0%,
  332; 350: 26.5%, 364; 400: 20.5%, 428; 450: 12.5%, 492/524. With end_silence_ms 550 and 450:
  9.5%, 492/588; 600 and 450: 7.0%, 492/620; 600 and 500: 3.5%, 520/620. With the 200 ms pause
  of before, all the same but 250 ms: 38.5%, 320/524 (the sooner transcript matters only for a
  finished_silence_ms shorter than its arrival, ~300 ms then).

So no finished_silence_ms below 500 keeps the split rate at today's 10.0% (default: 0, off).
The words cannot tell the first sentence of a turn from a whole turn ("My order never arrived."
before "Can you check it, please?", "Hello, is anyone there?" before "I can't hear you."), and a
slow caller's stop between the two is long enough to be taken for the end. At a turn's end 75%
of the fitted window's transcripts sound finished, in the middle of one 48% (120 ms pauses;
77% and 44% at 200 ms, where fewer short pauses are transcribed); the rule on
acknowledgements and greetings took the middle from 71% to 48% on the transcripts it was tuned
on, with none lost at the ends (no phrase is an acknowledgement alone; a caller's lone "Yes."
still waits end_silence_ms). Ends that do not sound finished are mostly digits, which Whisper
leaves without a period ("My number is 5 5 5 1 2 3 4"): kept unfinished, as callers pause
between groups of digits. No pause fell after a hanging word (the phrases pause at
punctuation); of 26 transcripts ending in "...", 25 were in the middle of a turn. Used the other
way, the words do pay: end_silence_ms 600, with 500 when the turn sounds finished, splits 3.5%
of turns at today's median delay (p95 +92 ms; the fitted window only).
"""

from __future__ import annotations

import re

# Words after which a sentence is left hanging: the caller is about to say more.
# fmt: off
HANGING: frozenset[str] = frozenset({
    # conjunctions
    "and", "but", "or", "nor", "so", "because", "cause", "if", "than", "that", "which", "who",
    "whose", "when", "where", "while", "although", "though", "unless", "until", "whether",
    "plus", "then",
    # articles and possessives
    "a", "an", "the", "my", "your", "our", "their", "its",
    # prepositions that do not end a sentence ("where are you from?" does, so not "from")
    "to", "of", "at", "for", "with", "into", "onto", "about", "via", "per", "like", "between",
    "towards", "toward",
    # the verb be, and contractions of a subject with an auxiliary ("that's", "i'm")
    "is", "are", "was", "were", "am",
    "i'm", "it's", "that's", "there's", "here's", "what's", "i'd", "i'll", "i've", "you're",
    "we're", "they're", "he's", "she's", "let's",
})
# Hesitations: a transcript of nothing else is no turn, and one ending on them is unfinished.
FILLERS: frozenset[str] = frozenset({
    "um", "uh", "er", "erm", "uhm", "hmm", "mm", "ah", "eh",
})
# Acknowledgements, greetings and apologies: a caller often says one, stops a sentence's length,
# and goes on ("Okay. Thanks. Goodbye.", "Yes. That's right. My number is ..."); a transcript of
# nothing else is not taken for a finished turn.
OPENERS: frozenset[str] = frozenset({
    "yes", "yeah", "yep", "yup", "no", "nope", "okay", "ok", "alright", "right", "sure", "fine",
    "good", "great", "hi", "hello", "hey", "thanks", "thank", "you", "sorry", "well", "oh", "so",
    "wait",
})
# fmt: on

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_CLOSERS = "\"')]» "


def leaves_hanging(text: str) -> bool:
    """Whether `text` (an early transcript) stops mid-sentence: on a comma, a dash or "...", or
    on a word that leaves it hanging (`HANGING`, `FILLERS`). A speculative reply waits for the
    end of such a turn before it asks the LLM: the caller is most likely to go on, and a
    request thrown away still costs its tokens."""
    text = text.strip().rstrip(_CLOSERS)
    if not text:
        return False
    if text[-1] in ",;:-–—…" or text.endswith(".."):
        return True
    words = _WORD.findall(text.lower().replace("’", "'"))
    return bool(words) and (_hangs(text, words[-1]) or words[-1] in FILLERS)


def _hangs(text: str, last_word: str) -> bool:
    """Whether the last word leaves the sentence hanging. Not in a question: English ends one on
    a preposition or a verb ("Which folder should I save the message to?", "Do you know where
    it is?"), and Whisper writes the question mark only when it heard a question's end."""
    return last_word in HANGING and not text.endswith("?")


def sounds_finished(text: str) -> bool:
    """Whether `text` (an early Whisper transcript) reads as a finished turn: it ends a sentence
    (".", "?" or "!", not "..."), its last word leaves nothing hanging, and it says more than
    hesitations, acknowledgements and greetings."""
    text = text.strip().rstrip(_CLOSERS)
    if not text or text[-1] not in ".?!" or text.endswith("..") or text.endswith("…"):
        return False
    words = _WORD.findall(text.lower().replace("’", "'"))
    if all(word in OPENERS or word in FILLERS for word in words):  # none, or "Okay, thanks."
        return False
    return not _hangs(text, words[-1]) and words[-1] not in FILLERS
