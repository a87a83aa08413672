"""The recipe: which turns the set holds, drawn from the pools with a fixed seed.

`build_turns(pools, seed, count)` draws `count` turns, each of a kind picked with `KINDS`'
weights, from a `numpy.random.default_rng(seed)`: the same pools and seed give the same turns,
sample for sample.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from voice.audio import PCM
from voice.devtools.turn_bench.corpus import (
    DIGIT_NAMES,
    PAUSES,
    RATE,
    Assembler,
    Builder,
    PauseModel,
    Pools,
    Turn,
    joined_category,
)


def _pick(rng: np.random.Generator, items: Sequence[object]) -> int:
    return int(rng.integers(len(items)))


def _say_phrases(
    a: Assembler, split: list[tuple[str, PCM]], at_comma: str = "continuation"
) -> None:
    for index, (text, audio) in enumerate(split):
        a.speak(text, audio)
        if index < len(split) - 1:
            category = joined_category(text)
            a.pause(at_comma if category == "continuation" else category)


def one_sentence(p: Pools, rng: np.random.Generator, a: Assembler) -> tuple[str, bool]:
    _say_phrases(a, p.sentences[_pick(rng, p.sentences)])
    return "one sentence", False


def prompt(p: Pools, rng: np.random.Generator, a: Assembler) -> tuple[str, bool]:
    """A prompt with an internal comma: "To leave a message, ..." """
    _say_phrases(a, p.prompts[_pick(rng, p.prompts)])
    return "continuation prompt", False


def two_sentences(p: Pools, rng: np.random.Generator, a: Assembler) -> tuple[str, bool]:
    pool = p.sentences + p.prompts
    first, second = rng.choice(len(pool), 2, replace=False)
    _say_phrases(a, pool[int(first)])
    a.pause("sentence")
    _say_phrases(a, pool[int(second)])
    return "two sentences", False


def _group(a: Assembler, p: Pools, digits: Sequence[int], rng: np.random.Generator) -> None:
    for index, digit in enumerate(digits):
        oh = digit == 0 and rng.random() < 0.5
        a.speak("oh" if oh else DIGIT_NAMES[digit], p.digits["oh" if oh else str(digit)])
        if index < len(digits) - 1:
            a.tight()


def digits(p: Pools, rng: np.random.Generator, a: Assembler) -> tuple[str, bool]:
    """A lead-in, then digits spoken in groups (3-3-4, 3-4, 4-4-4-4 or 2-2-2)."""
    text, audio = p.lead_ins[_pick(rng, p.lead_ins)]
    a.speak(text, audio).pause(joined_category(text))
    shapes = ((3, 3, 4), (3, 4), (4, 4, 4, 4), (2, 2, 2), (4, 4))
    shape = shapes[_pick(rng, shapes)]
    for index, size in enumerate(shape):
        _group(a, p, [int(d) for d in rng.integers(0, 10, size)], rng)
        if index < len(shape) - 1:
            a.pause("digits")
    return "digits", False


def a_list(p: Pools, rng: np.random.Generator, a: Assembler) -> tuple[str, bool]:
    """Three or four days or months: "Monday, Wednesday, and Friday"."""
    months = rng.random() < 0.5
    pool = p.items[7:] if months else p.items[:7]
    chosen = sorted(rng.choice(len(pool), int(rng.integers(3, 5)), replace=False))
    for index, item in enumerate(chosen):
        if index == len(chosen) - 1:
            a.speak("and", p.words["and"]).tight()
        text, audio = pool[int(item)]
        a.speak(text + ("," if index < len(chosen) - 1 else "."), audio)
        if index < len(chosen) - 1:
            a.pause("continuation")
    return "list", False


def self_correction(p: Pools, rng: np.random.Generator, a: Assembler) -> tuple[str, bool]:
    """ "... 4 2 [pause] no, [pause] 4 3" or "Tuesday [pause] no, [pause] Thursday"."""
    if rng.random() < 0.5:
        text, audio = p.lead_ins[_pick(rng, p.lead_ins)]
        a.speak(text, audio).pause(joined_category(text))
        said = [int(d) for d in rng.integers(0, 10, 2)]
        _group(a, p, said, rng)
        a.pause("hesitation").speak("no,", p.words["no"]).pause("continuation")
        _group(a, p, [said[0], (said[1] + 1) % 10], rng)
    else:
        first, second = rng.choice(7, 2, replace=False)
        a.speak(p.items[int(first)][0], p.items[int(first)][1]).pause("hesitation")
        a.speak("no,", p.words["no"]).pause("continuation")
        a.speak(p.items[int(second)][0] + ".", p.items[int(second)][1])
    return "self-correction", False


def _filler(a: Assembler, p: Pools, rng: np.random.Generator) -> None:
    word = "um" if rng.random() < 0.5 else "uh"
    a.pause("hesitation").speak(word, p.fillers[word]).pause("hesitation")


def hesitation(p: Pools, rng: np.random.Generator, a: Assembler) -> tuple[str, bool]:
    """A LibriVox sentence held mid-phrase, or a prompt's comma stretched around a filler."""
    with_filler = bool(p.fillers) and rng.random() < 0.6
    if rng.random() < 0.5 and p.librivox:
        clip = p.librivox[_pick(rng, p.librivox)]
        words = clip.words
        cut = int(rng.integers(2, max(3, len(words) - 2)))
        split = round((words[cut - 1][2] + words[cut][1]) / 2 * RATE)
        before = " ".join(w for w, _, _ in words[:cut])
        after = " ".join(w for w, _, _ in words[cut:])
        a.speak(before, clip.audio[int(words[0][1] * RATE) : split])
        if with_filler:
            _filler(a, p, rng)
        else:
            a.pause("hesitation")
        a.speak(after, clip.audio[split : int(words[-1][2] * RATE) + RATE // 50])
    else:
        split_prompt = p.prompts[_pick(rng, p.prompts)]
        for index, (text, audio) in enumerate(split_prompt):
            a.speak(text, audio)
            if index < len(split_prompt) - 1:
                if text.endswith(",") and with_filler:
                    _filler(a, p, rng)
                else:
                    a.pause("hesitation" if text.endswith(",") else joined_category(text))
    return "hesitation", with_filler


def librivox(p: Pools, rng: np.random.Generator, a: Assembler) -> tuple[str, bool]:
    """A LibriVox reading, whole (its own pauses only), or two consecutive ones."""
    clips = p.librivox
    first = _pick(rng, clips)
    for index, clip in enumerate(clips[first : first + 1 + int(rng.random() < 0.5)]):
        if index:
            a.pause("sentence")
        w = clip.words
        a.speak(clip.text, clip.audio[int(w[0][1] * RATE) : int(w[-1][2] * RATE) + RATE // 50])
    return "reading", False


KINDS: tuple[tuple[Builder, float], ...] = (
    (one_sentence, 0.16),
    (prompt, 0.16),
    (two_sentences, 0.16),
    (digits, 0.16),
    (a_list, 0.1),
    (self_correction, 0.08),
    (hesitation, 0.13),
    (librivox, 0.05),
)


def build_turns(
    pools: Pools, seed: int = 24, count: int = 240, pauses: PauseModel = PAUSES
) -> list[Turn]:
    """`count` turns from `pools`, the same ones for the same seed."""
    rng = np.random.default_rng(seed)
    floor = np.random.default_rng((seed, 1))
    weights = np.array([w for _, w in KINDS])
    turns = []
    for index in range(count):
        builder = KINDS[int(rng.choice(len(KINDS), p=weights / weights.sum()))][0]
        assembler = Assembler(rng, pauses, floor)
        kind, filler = builder(pools, rng, assembler)
        turns.append(assembler.turn(f"t{index:03d}", kind, filler))
    return turns
