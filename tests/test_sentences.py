"""Token stream -> speakable sentences: boundaries, clause cuts, first phrase, markdown,
streaming."""

from __future__ import annotations

import random
import re
import statistics
import time

import pytest
from pydantic import ValidationError

from pipeline.sentences import SentenceSettings, SentenceSplitter
from pipeline.tts import TextToSpeech

# The splitter as it was before the short first chunk: a first sentence is cut only when long.
TODAY = SentenceSettings(short_first_chunk=False)

# (reply text, sentences expected) with `TODAY`; the default settings give the same, except
# for the replies in `FIRST_PHRASE`.
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

# What the default settings (short first chunk) give where that differs from `CASES`.
FIRST_PHRASE: dict[str, list[str]] = {
    "Bring pens, paper, etc. and a bag. Thanks.": [
        "Bring pens,",
        "paper, etc. and a bag.",
        "Thanks.",
    ]
}
SETTINGS = [pytest.param(None, id="default"), pytest.param(TODAY, id="today")]


def expected_for(text: str, expected: list[str], settings: SentenceSettings | None) -> list[str]:
    return FIRST_PHRASE.get(text, expected) if settings is None else expected


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


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize(("text", "expected"), CASES)
def test_splits_whole_text(
    text: str, expected: list[str], settings: SentenceSettings | None
) -> None:
    assert split_whole(text, settings) == expected_for(text, expected, settings)


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize(("text", "expected"), CASES)
def test_one_character_at_a_time_gives_the_same_sentences(
    text: str, expected: list[str], settings: SentenceSettings | None
) -> None:
    got = split_in_pieces(text, [1] * len(text), settings)
    assert got == expected_for(text, expected, settings)


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize(("text", "expected"), CASES)
def test_random_deltas_give_the_same_sentences(
    text: str, expected: list[str], settings: SentenceSettings | None
) -> None:
    rng = random.Random(text)
    for _ in range(20):
        sizes = [rng.randint(1, 7) for _ in range(len(text))]
        assert split_in_pieces(text, sizes, settings) == expected_for(text, expected, settings)


def test_mixed_reply_is_delta_independent_under_many_settings() -> None:
    fragments = [text for text, _ in CASES] + [
        "Sure, no problem, I will",
        " book it, ok; then",
        " — wait",
        "Of course—let me see",
        "June 5, 2024 or 5 - 7",
        "1,000 at 7:30, e.g. now,",
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
            short_first_chunk=rng.random() < 0.7,
            first_chunk_max_words=rng.randint(1, 10),
            first_chunk_whole_words=rng.randint(0, 8),
            first_chunk_rest_words=rng.randint(1, 5),
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


# Tokens that sit next to a possible boundary: numbers, times, abbreviations, addresses, dashes.
SOUP = [
    *("Sure", "Okay", "word", "Word", "I", "so", "5", "2024", "1,000", "3.5", "7:30"),
    *("e.g.", "Dr.", "x@y.com", "http://a.b/c,d", ",", ":", ";", ".", "!", "?", "..."),
    *("—", "–", "-", "(", ")", '"', "**", "\n", " ", "  "),
]


def test_token_soup_is_delta_independent_under_many_settings() -> None:
    rng = random.Random(5)
    for _ in range(1500):
        text = rng.choice(["", " "]).join(rng.choices(SOUP, k=rng.randint(1, 40)))
        settings = SentenceSettings(
            min_chars=rng.randint(1, 5),
            first_clause_min_chars=rng.randint(1, 10),
            first_clause_cut_chars=rng.randint(10, 20),
            max_chars=rng.randint(20, 80),
            first_chunk_max_words=rng.randint(1, 9),
            first_chunk_whole_words=rng.randint(0, 8),
            first_chunk_rest_words=rng.randint(1, 4),
        )
        whole = split_whole(text, settings)
        assert split_in_pieces(text, [1] * len(text), settings) == whole, text
        sizes = [rng.randint(1, 4) for _ in text]
        assert split_in_pieces(text, sizes, settings) == whole, text
        assert _alnum("".join(whole)) == _alnum(text), text


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


CLAUSE_CUTS: list[tuple[str, list[str]]] = [
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
]
# What the default settings give where that differs from `CLAUSE_CUTS`: the first phrase first.
CLAUSE_CUTS_FIRST_PHRASE: dict[str, list[str]] = {
    "Of course, Maria, I can book that table for you right now.": [
        "Of course,",
        "Maria, I can book that table for you right now.",
    ],
    "Thanks for calling, this is Joe; how can I help you with your booking?": [
        "Thanks for calling,",
        "this is Joe; how can I help you with your booking?",
    ],
}


@pytest.mark.parametrize(("text", "expected"), CLAUSE_CUTS)
def test_first_sentence_clause_cut(text: str, expected: list[str]) -> None:
    assert split_whole(text, TODAY) == expected
    assert split_in_pieces(text, [1] * len(text), TODAY) == expected
    # with the first phrase cut out (the default), the rest of the first sentence is still cut
    # like a first sentence, and the same pieces come out whatever the deltas
    default = CLAUSE_CUTS_FIRST_PHRASE.get(text, expected)
    assert split_whole(text) == default
    assert split_in_pieces(text, [1] * len(text)) == default


def test_first_clause_comes_out_before_the_first_sentence_ends() -> None:
    splitter = SentenceSplitter(TODAY)
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
    settings = SentenceSettings(first_clause_cut_chars=200, max_chars=200, short_first_chunk=False)
    assert split_whole(LONG_FIRST, settings)[0] == (
        "I'd be happy to help, and I have a few options for you on Saturday evening."
    )


FIRST_PHRASES: list[tuple[str, list[str]]] = [
    # the first phrase of the reply goes first, the rest of its sentence after it
    (
        "Sure, I can help you with that right away.",
        ["Sure,", "I can help you with that right away."],
    ),
    # a trailing dash is spoken as a comma (piper gives both the same short pause)
    ("Of course — let me check that for you.", ["Of course,", "let me check that for you."]),
    ("Of course—let me check that for you.", ["Of course,", "let me check that for you."]),
    ("Okay, so let me check that for you now.", ["Okay,", "so let me check that for you now."]),
    ("Hmm; let me look that up in the system.", ["Hmm;", "let me look that up in the system."]),
    (
        "Here's the plan: I book the table and text you.",
        ["Here's the plan:", "I book the table and text you."],
    ),
    # a first sentence that is a phrase anyway goes whole, and so does a short one
    ("Okay. Let me check that for you.", ["Okay.", "Let me check that for you."]),
    ("Sure, I can do that. Anything else?", ["Sure, I can do that.", "Anything else?"]),
    ("Yes, of course, Maria!", ["Yes, of course, Maria!"]),
    # no tiny fragment is left dangling after the cut
    ("I can book that for you, Maria.", ["I can book that for you, Maria."]),
    ("We fly to St. Louis, e.g. Monday.", ["We fly to St. Louis, e.g. Monday."]),
    # later sentences are not cut at their commas
    (
        "Okay. Sure, I can help you with that right away.",
        ["Okay.", "Sure, I can help you with that right away."],
    ),
    (
        "Sure, I can help you with that. Yes, I can book it for you today.",
        ["Sure,", "I can help you with that.", "Yes, I can book it for you today."],
    ),
    # never inside a number, an abbreviation, a time, a URL or an e-mail address
    (
        "That comes to 1,000 dollars, tip and tax included in it.",
        ["That comes to 1,000 dollars,", "tip and tax included in it."],
    ),
    (
        "It is 3.5 miles away, about ten minutes by car.",
        ["It is 3.5 miles away,", "about ten minutes by car."],
    ),
    (
        "Dr. Smith, your results are ready to pick up.",
        ["Dr. Smith,", "your results are ready to pick up."],
    ),
    (
        "We have options, e.g. the terrace or the bar inside.",
        ["We have options,", "e.g. the terrace or the bar inside."],
    ),
    (
        "Your table is at 7:30 tonight, under the name Smith.",
        ["Your table is at 7:30 tonight,", "under the name Smith."],
    ),
    (
        "Write to bob@example.com, and we will reply today.",
        ["Write to bob@example.com,", "and we will reply today."],
    ),
    (
        "See https://example.com/a,b?x=1:2;y=3 for the menu and the prices.",
        ["See https://example.com/a,b?x=1:2;y=3 for the menu and the prices."],
    ),
    # nor between two numbers: a date, a list of numbers, a range
    (
        "On June 5, 2024 we opened our second restaurant downtown.",
        ["On June 5, 2024 we opened our second restaurant downtown."],
    ),
    ("Pick 1, 2 or 3 and I will book it for you.", ["Pick 1, 2 or 3 and I will book it for you."]),
    (
        "We are open 9 - 5 on weekdays and Monday–Friday only.",
        ["We are open 9 - 5 on weekdays and Monday–Friday only."],
    ),
    (
        "We are open 9 - 5, Monday–Friday, and on Sundays too.",
        ["We are open 9 - 5,", "Monday–Friday, and on Sundays too."],
    ),
    # no boundary within the first 8 words: the first sentence is cut as before
    (
        "Thanks for calling the booking line of the restaurant, how can I help?",
        ["Thanks for calling the booking line of the restaurant,", "how can I help?"],
    ),
    # what is left of a long first sentence is still cut like a first sentence
    (
        "Sure, I'd be happy to help, and I have a few options for you on Saturday evening.",
        [
            "Sure,",
            "I'd be happy to help,",
            "and I have a few options for you on Saturday evening.",
        ],
    ),
    # markdown around the phrase is not spoken
    (
        "**Sure**, I can help you with that right away.",
        ["Sure,", "I can help you with that right away."],
    ),
]


def pieces_by_word(text: str) -> list[int]:
    """Delta sizes of `text` streamed word by word, each word with the space before it."""
    return [len(word) for word in re.findall(r"\s*\S+", text)]


@pytest.mark.parametrize(("text", "expected"), FIRST_PHRASES)
def test_first_chunk_is_the_first_phrase(text: str, expected: list[str]) -> None:
    assert split_whole(text) == expected
    assert split_in_pieces(text, [1] * len(text)) == expected
    assert split_in_pieces(text, pieces_by_word(text)) == expected
    rng = random.Random(text)
    for _ in range(20):
        assert split_in_pieces(text, [rng.randint(1, 9) for _ in text]) == expected


def test_first_phrase_comes_out_once_enough_words_have_streamed_in() -> None:
    text = "Sure, I can help you with that right away."
    splitter = SentenceSplitter()
    out: list[str] = []
    for i, char in enumerate(text):
        out += splitter.push(char)
        if out:
            # known as soon as the sentence has a 7th word ("that"): not a short sentence
            assert out == ["Sure,"]
            assert text[: i + 1] == "Sure, I can help you with t"
            break
    # without the short-sentence and rest limits it comes out as soon as the next word starts
    settings = SentenceSettings(first_chunk_whole_words=0, first_chunk_rest_words=1)
    splitter = SentenceSplitter(settings)
    assert splitter.push("Sure,") == []
    assert splitter.push(" ") == []
    assert splitter.push("I") == ["Sure,"]


def test_first_phrase_is_cut_once_per_reply() -> None:
    splitter = SentenceSplitter()
    reply = "Sure, I can help you with that right away. Yes, I can book it for you today. "
    assert splitter.push(reply) == ["Sure,", "I can help you with that right away."]
    assert splitter.flush() == ["Yes, I can book it for you today."]
    # a new reply (or a splitter reused after flush) cuts its own first phrase again
    assert splitter.push(reply) == ["Sure,", "I can help you with that right away."]
    assert splitter.flush() == ["Yes, I can book it for you today."]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Sure, I can help you with that right away.",
            ["Sure, I can help you with that right away."],
        ),
        ("Of course — let me check that for you.", ["Of course — let me check that for you."]),
        ("Okay, so let me check that for you now.", ["Okay, so let me check that for you now."]),
        (
            "Sure, I'd be happy to help, and I have a few options for you on Saturday evening.",
            [
                "Sure, I'd be happy to help,",
                "and I have a few options for you on Saturday evening.",
            ],
        ),
    ],
)
def test_short_first_chunk_can_be_turned_off(text: str, expected: list[str]) -> None:
    # today's pieces (`CASES` and `CLAUSE_CUTS` check them with these settings too)
    assert split_whole(text, TODAY) == expected
    assert split_in_pieces(text, [1] * len(text), TODAY) == expected


# Replies as a model streams them, to check that nothing the caller hears differs from them.
REPLIES = [
    *(text for text, _ in FIRST_PHRASES),
    *(text for text, _ in CLAUSE_CUTS),
    "Absolutely, I can book a table for two at seven tonight. Would you like the terrace?",
    "Okay, so I have you down for Saturday at eight in the evening, for four people.",
    "Great question! Our kitchen is open until ten on weekdays, and eleven on Fridays.",
    "Let me see, we have a table by the window at half past seven, or one at nine.",
    "Yes, we do have vegetarian options, including a mushroom risotto and a salad.",
    "No problem, I'll move your booking to Friday at the same time. Anything else?",
    "Thanks for waiting; I found your reservation under the name Smith, for 7:30 p.m.",
    "Certainly, the total comes to 42.50 dollars, including the tip. Shall I charge it?",
    "Hmm, I'm not sure about that — but I can ask the manager for you, if you like.",
    "Alright, your order number is 4,512 and it ships tomorrow morning, by 10 a.m.",
    "Well... maybe later. Hmm... Let me check the calendar for Tuesday, June 5, 2024.",
    "Of course! Mr. Jones, e.g. your host tonight, will meet you at the door at 8:15.",
]


def spoken_form(text: str) -> str:
    """`text` with its whitespace collapsed and each dash between words read as a comma."""
    return re.sub(r"\s*—\s*|\s+[-–]\s+", ", ", " ".join(text.split()))


def test_chunks_are_the_reply_whatever_the_deltas() -> None:
    rng = random.Random(11)
    replies = REPLIES + [" ".join(rng.sample(REPLIES, 3)) for _ in range(200)]
    for reply in replies:
        chunks = split_whole(reply)
        assert split_in_pieces(reply, [1] * len(reply)) == chunks, reply
        assert split_in_pieces(reply, pieces_by_word(reply)) == chunks, reply
        for _ in range(10):
            sizes = [rng.randint(1, 12) for _ in reply]
            assert split_in_pieces(reply, sizes) == chunks, reply
        # the caller hears exactly the words and punctuation generated, in order
        plain = reply.replace("**", "")  # markdown emphasis is not spoken
        assert spoken_form(" ".join(chunks)) == spoken_form(plain), reply
        if not re.search(r"\s[-–—]\s|\w—\w", reply):
            assert " ".join(chunks) == " ".join(plain.split()), reply


# Typical openings of a reply, for the synthesis time of the first piece.
OPENINGS = [
    "Sure, I can help you with that right away.",
    "Of course — let me check that for you.",
    "Absolutely, I can book a table for two at seven tonight.",
    "Okay, so I have you down for Saturday at eight in the evening.",
    "Let me see, we have a table by the window at half past seven.",
    "Yes, we do have vegetarian options, including a mushroom risotto.",
    "No problem, I'll move your booking to Friday at the same time.",
    "Thanks for waiting, I found your reservation under the name Smith.",
    "Certainly, the total comes to 42.50 dollars including the tip.",
    "Hmm, I'm not sure about that, but I can ask the manager for you.",
]


def test_first_piece_is_synthesised_sooner() -> None:
    tts = TextToSpeech.shared()
    tts.warm_up()
    before: list[float] = []
    after: list[float] = []
    for text in OPENINGS[:6]:  # six: the median is as clear, at 40% less synthesis time
        pieces = (split_whole(text, TODAY)[0], split_whole(text)[0])
        best = [float("inf"), float("inf")]
        for _ in range(2):  # interleaved, so a busy machine slows both alike
            for i, piece in enumerate(pieces):
                started = time.perf_counter()
                tts.synthesize_blocking(piece)
                best[i] = min(best[i], time.perf_counter() - started)
        before.append(best[0])
        after.append(best[1])
        print(f"{best[0] * 1000:4.0f} ms -> {best[1] * 1000:4.0f} ms  {pieces[1]!r}")
    median_before, median_after = statistics.median(before), statistics.median(after)
    print(f"first piece, median: {median_before * 1000:.0f} -> {median_after * 1000:.0f} ms")
    assert median_after < 0.8 * median_before


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


def test_each_sentence_comes_out_with_the_delta_that_completes_it() -> None:
    # "Hello there." ends once the capital after it has arrived; "Dr." never ends a sentence.
    splitter = SentenceSplitter()
    pushed = [splitter.push(delta) for delta in ["Hel", "lo there. Dr", ". Smith is ", "in. Bye"]]
    assert pushed == [[], ["Hello there."], [], ["Dr. Smith is in."]]
    assert splitter.flush() == ["Bye"]


def test_a_sentence_comes_out_before_the_reply_ends() -> None:
    splitter = SentenceSplitter()
    assert splitter.push("Hello there. How") == ["Hello there."]
    assert splitter.push(" are you?") == []
    assert splitter.flush() == ["How are you?"]
