"""The simulator's reply text: what it says to the caller's latest words (no tools)."""

from __future__ import annotations

import hashlib
import re

from voice.llm_sim.settings import SimulatorSettings


def heard_words(messages: list[tuple[str, str]]) -> str:
    """The caller's latest words."""
    heard = next((" ".join(t.split()) for role, t in reversed(messages) if role == "user"), "")
    return heard.rstrip(" .!?,;:")


_SENTENCE_END = re.compile(r"(?<=[.?!])\s+")


def reply_words(heard: str, s: SimulatorSettings) -> list[str]:
    """'You said: <heard>.' and a scripted answer (chosen by the words, so the same words get
    the same reply); realistic replies go on with sentences of `reply_pool` until they have
    reply_words[0] words and reply_sentences[0] sentences, adding none that would take them
    past either maximum."""
    digest = int.from_bytes(hashlib.sha256(heard.encode()).digest()[:4], "big")
    answer = s.answers[digest % len(s.answers)]
    first = f"You said: {heard}. {answer}" if heard else answer
    if s.replies == "short":
        return first.split()
    sentences = [x for x in _SENTENCE_END.split(first) if x]
    words = sum(len(x.split()) for x in sentences)
    (least, most), (fewest, cap) = s.reply_words, s.reply_sentences
    pool = s.reply_pool
    for offset in range(len(pool)):
        if len(sentences) >= cap or (words >= least and len(sentences) >= fewest):
            break
        more = pool[(digest + offset) % len(pool)]
        if words + len(more.split()) > most and len(sentences) >= fewest:
            continue  # too long to add: a shorter one may fit
        sentences.append(more)
        words += len(more.split())
    return " ".join(sentences).split()
