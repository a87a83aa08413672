"""Token stream -> speakable sentences: boundaries, clause cuts, markdown, streaming."""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import AsyncIterator

import pytest
from pydantic import ValidationError

from pipeline.sentences import SentenceSettings, SentenceSplitter, sentences

# (reply text, sentences expected) with the default settings.
CASES: list[tuple[str, list[str]]] = [
    # plain sentence ends, with closing quotes and brackets
    ("Hello there. How are you? I'm fine!", ["Hello there.", "How are you?", "I'm fine!"]),
    ('He said "Hello." Then he left.', ['He said "Hello."', "Then he left."]),
    ("That's it (for now.) Bye now.", ["That's it (for now.)", "Bye now."]),
    ("Really?! Yes, really.", ["Really?!", "Yes, really."]),
    ("Hello   there.\tBye  now.", ["Hello there.", "Bye now."]),
    # abbreviations and initials
    ("Dr. Smith is in. Mrs. Jones is out.", ["Dr. Smith is in.", "Mrs. Jones is out."]),
    ("We fly to St. Louis, e.g. Monday. Okay?", ["We fly to St. Louis, e.g. Monday.", "Okay?"]),
    ("Say hi, i.e. Hello. Fine.", ["Say hi, i.e. Hello.", "Fine."]),
    ("It's Cats vs. Dogs tonight. Enjoy.", ["It's Cats vs. Dogs tonight.", "Enjoy."]),
    (
        "Bring pens, paper, etc. and a bag. Thanks.",
        ["Bring pens, paper, etc. and a bag.", "Thanks."],
    ),
    ("Wake at 7 a.m. tomorrow. Okay.", ["Wake at 7 a.m. tomorrow.", "Okay."]),
    ("Meet at 5 p.m. Bring snacks.", ["Meet at 5 p.m.", "Bring snacks."]),
    ("J. Smith called. He left.", ["J. Smith called.", "He left."]),
    (
        "We moved to the U.S. last year. It was fun.",
        ["We moved to the U.S. last year.", "It was fun."],
    ),
    ("Call ext. 204 now. Room No. 5 is free.", ["Call ext. 204 now.", "Room No. 5 is free."]),
    ("Did you say no? No. I did not.", ["Did you say no?", "No.", "I did not."]),
    # decimals, versions, times, URLs, e-mail addresses
    (
        "Pi is 3.14 today. Version v1.2.3 shipped. Meet at 7:30 or 7.30 p.m. sharp. Okay.",
        [
            "Pi is 3.14 today.",
            "Version v1.2.3 shipped.",
            "Meet at 7:30 or 7.30 p.m. sharp.",
            "Okay.",
        ],
    ),
    (
        "Visit example.com or write to bob@example.com. Thanks!",
        ["Visit example.com or write to bob@example.com.", "Thanks!"],
    ),
    (
        "Go to https://example.com/a.b?x=1 now. Bye.",
        ["Go to https://example.com/a.b?x=1 now.", "Bye."],
    ),
    ("The total is 42. Would you like more?", ["The total is 42.", "Would you like more?"]),
    ("It costs $5.99. Shall I order?", ["It costs $5.99.", "Shall I order?"]),
    # ellipses: mid-thought before a lowercase word, a sentence end before a capitalised one
    (
        "Well... maybe later. Hmm... Let me check.",
        ["Well... maybe later.", "Hmm...", "Let me check."],
    ),
    ("Wait… okay, fine.", ["Wait… okay, fine."]),
    # numbered and bulleted lists
    ("Your options:\n1. Pasta\n2. Pizza", ["Your options:", "1. Pasta", "2. Pizza"]),
    ("1. Pasta 2. Pizza 3. Salad", ["1. Pasta", "2. Pizza", "3. Salad"]),
    ("Pick 1. pasta or 2. pizza. Which one?", ["Pick 1. pasta or 2. pizza.", "Which one?"]),
    ("- Pasta\n- Pizza\n* Salad\n+ Soup", ["Pasta", "Pizza", "Salad", "Soup"]),
    ("Steps:\n\n1. **Call** us.\n2. Wait.", ["Steps:", "1. Call us.", "2. Wait."]),
    # markdown is not spoken
    ("**Sure!** Here's `the code`.", ["Sure!", "Here's the code."]),
    ("# Booking\nYou're all set.", ["Booking", "You're all set."]),
    ("## Hours ##\nWe open at _nine_.", ["Hours", "We open at nine."]),
    ("See [our site](https://example.com) for more.", ["See our site for more."]),
    ("> Quoted text here.", ["Quoted text here."]),
    ("Run this:\n```python\nprint(1)\n```\nDone.", ["Run this:", "print(1)", "Done."]),
    ("Use snake_case names.", ["Use snake_case names."]),
    # never empty, whitespace-only or punctuation-only
    ("", []),
    ("   \n\n  ", []),
    ("... !!! \n\n --- \n ** `` ?", []),
    ("Hello! ... Bye.", ["Hello!", "Bye."]),
    # too short to speak alone: joined to the next piece
    ("A. Big deal.", ["A. Big deal."]),
    ("Hi\nthere.", ["Hi there."]),
]


def split_whole(text: str, settings: SentenceSettings | None = None) -> list[str]:
    splitter = SentenceSplitter(settings)
    return splitter.push(text) + splitter.flush()


def split_in_pieces(
    text: str, sizes: list[int], settings: SentenceSettings | None = None
) -> list[str]:
    splitter = SentenceSplitter(settings)
    out: list[str] = []
    start = 0
    for size in sizes:
        out += splitter.push(text[start : start + size])
        start += size
    out += splitter.push(text[start:])
    return out + splitter.flush()


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_splits_whole_text(text: str, expected: list[str]) -> None:
    assert split_whole(text) == expected


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_one_character_at_a_time_gives_the_same_sentences(text: str, expected: list[str]) -> None:
    assert split_in_pieces(text, [1] * len(text)) == expected


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_random_deltas_give_the_same_sentences(text: str, expected: list[str]) -> None:
    rng = random.Random(text)
    for _ in range(20):
        sizes = [rng.randint(1, 7) for _ in range(len(text))]
        assert split_in_pieces(text, sizes) == expected


def test_mixed_reply_is_delta_independent_under_many_settings() -> None:
    fragments = [text for text, _ in CASES] + [
        "Sure, no problem, I will",
        " book it, ok; then",
        " — wait",
        "...",
        "\n\n",
        " **bold** ",
        "Mr. ",
        "7.30 p.m. ",
        "1. ",
        "2. ",
        "word " * 12,
        "x" * 30,
    ]
    rng = random.Random(7)
    for _ in range(400):
        text = " ".join(rng.choices(fragments, k=rng.randint(1, 6)))
        settings = SentenceSettings(
            min_chars=rng.randint(1, 6),
            first_clause_min_chars=rng.randint(5, 20),
            first_clause_cut_chars=rng.randint(20, 60),
            max_chars=rng.randint(60, 120),
        )
        whole = split_whole(text, settings)
        sizes = [rng.randint(1, 5) for _ in range(len(text))]
        assert split_in_pieces(text, sizes, settings) == whole, text
        for sentence in whole:
            assert sentence == sentence.strip()
            assert any(ch.isalnum() for ch in sentence)
        # nothing is lost: every letter and digit of the reply is spoken, in order, except a
        # code fence's language and a link's address
        assert _alnum("".join(whole)) == _alnum(re.sub(r"```\w*|\]\([^)]*\)", "", text))


def _alnum(text: str) -> str:
    return "".join(ch for ch in text if ch.isalnum())


def test_sentence_waits_for_the_next_non_space_character() -> None:
    splitter = SentenceSplitter()
    assert splitter.push("Hello there.") == []
    assert splitter.push("  ") == []
    assert splitter.push("H") == ["Hello there."]
    assert splitter.flush() == ["H"]


def test_abbreviation_split_across_deltas_is_not_a_sentence_end() -> None:
    splitter = SentenceSplitter()
    assert splitter.push("Dr.") == []
    assert splitter.push(" ") == []
    assert splitter.push("Smith is in") == []
    assert splitter.flush() == ["Dr. Smith is in"]


def test_a_line_break_ends_a_sentence_at_once() -> None:
    splitter = SentenceSplitter()
    assert splitter.push("Options:\n") == ["Options:"]
    assert splitter.push("1. Pasta\n") == ["1. Pasta"]
    assert splitter.push("2. Pizza") == []
    assert splitter.flush() == ["2. Pizza"]


def test_flush_resets_for_the_next_reply() -> None:
    splitter = SentenceSplitter()
    assert splitter.push("I'd be happy to help, and I have options for you on Saturday. ") == [
        "I'd be happy to help,"
    ]
    assert splitter.flush() == ["and I have options for you on Saturday."]
    # a new reply: its first sentence is cut early again
    assert splitter.push("Of course I can do that for you, and I will book it right now. ") == [
        "Of course I can do that for you,"
    ]
    assert splitter.flush() == ["and I will book it right now."]


LONG_FIRST = (
    "I'd be happy to help, and I have a few options for you on Saturday evening. "
    "The first is at seven, and then there is another one at nine thirty."
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # a long first sentence is cut at its clause; later sentences are not
        (
            LONG_FIRST,
            [
                "I'd be happy to help,",
                "and I have a few options for you on Saturday evening.",
                "The first is at seven, and then there is another one at nine thirty.",
            ],
        ),
        # short enough: not cut
        ("Sure, I can help with that. Thanks.", ["Sure, I can help with that.", "Thanks."]),
        # the only clauses are too close to the start: not cut
        (
            "Of course, Maria, I can book that table for you right now.",
            ["Of course, Maria, I can book that table for you right now."],
        ),
        # several clauses before the limit: the last one that fits
        (
            "Thanks for calling, this is Joe; how can I help you with your booking?",
            ["Thanks for calling, this is Joe;", "how can I help you with your booking?"],
        ),
        # no clause before the limit: the first one after it
        (
            "Thanks for calling the booking line of the restaurant, how can I help?",
            ["Thanks for calling the booking line of the restaurant,", "how can I help?"],
        ),
        # a dash is a clause boundary too
        (
            "I checked every table we have tonight — and one is free at nine.",
            ["I checked every table we have tonight,", "and one is free at nine."],
        ),
        # an unfinished reply is cut the same way at flush
        (
            "I'd be happy to help, and I have a few options for you",
            ["I'd be happy to help,", "and I have a few options for you"],
        ),
    ],
)
def test_first_sentence_clause_cut(text: str, expected: list[str]) -> None:
    assert split_whole(text) == expected
    assert split_in_pieces(text, [1] * len(text)) == expected


def test_first_clause_comes_out_before_the_first_sentence_ends() -> None:
    splitter = SentenceSplitter()
    for i, char in enumerate(LONG_FIRST):
        out = splitter.push(char)
        if out:
            assert out == ["I'd be happy to help,"]
            assert i < LONG_FIRST.index(".")
            print(f"first clause out after {i + 1} of {LONG_FIRST.index('.') + 1} characters")
            break
    else:
        pytest.fail("the first clause never came out")


def test_first_clause_cut_can_be_turned_off() -> None:
    settings = SentenceSettings(first_clause_cut_chars=200, max_chars=200)
    assert split_whole(LONG_FIRST, settings)[0] == (
        "I'd be happy to help, and I have a few options for you on Saturday evening."
    )


def test_long_later_sentence_is_cut_at_a_clause() -> None:
    settings = SentenceSettings(max_chars=60)
    text = (
        "Yes. We have tables at six, at seven thirty, at eight fifteen, and at nine, "
        "all of them by the window."
    )
    out = split_whole(text, settings)
    assert out == [
        "Yes.",
        "We have tables at six, at seven thirty, at eight fifteen,",
        "and at nine, all of them by the window.",
    ]
    assert all(len(sentence) <= 60 for sentence in out)


def test_long_sentence_without_clauses_is_cut_at_a_space() -> None:
    settings = SentenceSettings(max_chars=40)
    text = "Yes. Then " + "word " * 20 + "end."
    out = split_whole(text, settings)
    assert out[0] == "Yes."
    assert all(len(sentence) <= 40 for sentence in out)
    assert " ".join(out) == text.strip()


def test_min_chars_joins_short_pieces() -> None:
    assert split_whole("Hm. Sure thing.", SentenceSettings(min_chars=4)) == ["Hm. Sure thing."]
    assert split_whole("Hm. Sure thing.", SentenceSettings(min_chars=3)) == ["Hm.", "Sure thing."]


def test_settings_must_be_ordered() -> None:
    with pytest.raises(ValidationError):
        SentenceSettings(first_clause_min_chars=50, first_clause_cut_chars=40)
    with pytest.raises(ValidationError):
        SentenceSettings(first_clause_cut_chars=300, max_chars=200)


async def test_sentences_helper_streams_and_flushes() -> None:
    async def tokens() -> AsyncIterator[str]:
        for delta in ["Hel", "lo there. Dr", ". Smith is ", "in. Bye"]:
            yield delta

    assert [s async for s in sentences(tokens())] == ["Hello there.", "Dr. Smith is in.", "Bye"]


async def test_sentences_helper_yields_before_the_stream_ends() -> None:
    release = asyncio.Event()

    async def tokens() -> AsyncIterator[str]:
        yield "Hello there. How"
        await release.wait()
        yield " are you?"

    stream = sentences(tokens())
    first = await asyncio.wait_for(anext(stream), timeout=5)
    assert first == "Hello there."
    release.set()
    assert [s async for s in stream] == ["How are you?"]


async def test_closing_the_sentences_closes_the_token_stream() -> None:
    closed = asyncio.Event()

    async def tokens() -> AsyncIterator[str]:
        try:
            yield "Hello there. How"
            yield " are you?"
        finally:
            closed.set()

    stream = sentences(tokens())
    assert await anext(stream) == "Hello there."
    await stream.aclose()
    assert closed.is_set()


async def test_sentences_helper_uses_settings() -> None:
    async def tokens() -> AsyncIterator[str]:
        yield "Hm. Sure thing."

    settings = SentenceSettings(min_chars=4)
    assert [s async for s in sentences(tokens(), settings)] == ["Hm. Sure thing."]
