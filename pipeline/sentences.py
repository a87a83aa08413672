"""LLM token stream -> speakable sentences, each handed to TTS as early as it is known.

One `SentenceSplitter` per reply: `push()` every delta as it arrives, `flush()` at the end.

Rules (each one is in `tests/test_sentences.py`):
- A sentence ends at `.`, `!`, `?` or `…` (plus any closing quotes, brackets or markdown after
  them) followed by whitespace, and at every line break, so each list item or heading is a
  sentence of its own.
- A sentence is not handed out until the next non-space character is known, because that
  character decides: a lowercase letter means the thought goes on ("7 p.m. tomorrow",
  "e.g. apples", "Well... maybe"), so no split. `flush()` needs no next character.
- So an ellipsis ends a sentence only when a capitalised word follows ("Hmm... Let me check"):
  before a lowercase word it is a pause mid-thought and is spoken as part of the sentence.
- No split after titles and Latin abbreviations (Mr. Dr. St. e.g. vs. ...), single initials
  before a name ("J. Smith"), "No. 5"-style abbreviations before a number, a list number that
  opens a sentence ("1. First"), nor the next number of an inline list ("1. Pasta 2. Pizza"
  splits before "2."). Decimals, versions, times, URLs and e-mail addresses never have
  whitespace right after their dots, so they are never split.
- Audio starts sooner when the first piece is short (`short_first_chunk`): the first piece of a
  reply is its first phrase ("Sure,", "Of course —", "Okay, so"), cut at the first clause
  boundary (`,` `;` `:` or a dash, never one between two numbers: "June 5, 2024", "5 - 7")
  that has 1 to `first_chunk_max_words` words before it. It is cut only when the sentence has
  more than `first_chunk_whole_words` words and at least `first_chunk_rest_words` after the cut,
  so a short sentence goes whole and no tiny fragment dangles; that is known once enough words
  have streamed in, not at the sentence end. With no such boundary the rule below applies.
- If the first sentence (or what is left of it after the short first phrase) runs past
  `first_clause_cut_chars`, it is cut at its last clause boundary (`,` `;` `:` or a dash) that
  has at least `first_clause_min_chars` before it (or else its first clause boundary after the
  limit). Later sentences are spoken while earlier audio plays, so they are only cut once they
  run past `max_chars` (last clause boundary, else last space) to bound TTS latency.
- A piece shorter than `min_chars` is joined to the next one; markdown (**bold**, `code`,
  bullets, headings, links) is stripped; nothing empty or punctuation-only is ever emitted.

Every rule looks only at text already received plus the next non-space character, so the
sentences do not depend on how the stream was cut into deltas.
"""

from __future__ import annotations

import re
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

_TERMINATORS = ".!?…"
_CLOSERS = "\"'”’)]}»*_`"
_OPENERS = "\"'“‘([{*_`"

# A sentence-ending run followed by whitespace, or a line break.
_BOUNDARY = re.compile(
    rf"(?P<end>[{re.escape(_TERMINATORS)}]+[{re.escape(_CLOSERS)}]*)(?=\s)|(?P<newline>\n)"
)
# The end of a clause: `,` `;` `:` (plus closers) before whitespace, a spaced dash, or an em
# dash between letters ("course—let"; not an en dash, which joins a range: "Monday–Friday", "5–7").
_CLAUSE = re.compile(
    rf"[,;:][{re.escape(_CLOSERS)}]*(?=\s)|(?<=\s)[-–—](?=\s)|(?<=[^\W\d_])—(?=[^\W\d_])"
)
# Whatever at the end of the text could still become part of a sentence boundary.
_UNDECIDED_TAIL = re.compile(rf"[{re.escape(_TERMINATORS + _CLOSERS)}\s]*\Z")
_WORD_BEFORE = re.compile(r"\S*\Z")
_WHITESPACE = re.compile(r"\s*")
_LIST_MARKER = re.compile(r"\s*(?:[-*+•]\s+)?[*_]*(\d{1,3})\.")

# Markdown a model may emit despite the prompt.
_CODE_FENCE = re.compile(r"```[\w+-]*")
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_LINE_PREFIX = re.compile(r"^\s*(?:#{1,6}|[-*+•]|>)\s+", re.MULTILINE)
_EDGE_UNDERSCORES = re.compile(r"(?<!\w)_+|_+(?!\w)")
_LONE_HASHES = re.compile(r"(?<!\S)#+(?!\S)")
_TRAILING_DASH = re.compile(r"\s*[-–—]\Z")
# What separates words ("Of course—let me" is four words).
_WORD_GAP = re.compile(r"[\s–—]+")
_NOT_SPACE = re.compile(r"\S")

# Never the end of a sentence: they always lead into the next word.
_NEVER_FINAL = frozenset(
    {
        *("mr", "mrs", "ms", "mx", "dr", "prof", "st", "mt", "ft", "rev", "fr", "gen", "capt"),
        *("col", "lt", "sgt", "gov", "sen", "rep", "hon", "pres", "messrs"),
        *("e.g", "i.e", "vs", "cf", "viz"),
    }
)
# Not the end of a sentence when a number follows ("No. 5", "ext. 204", "approx. 30").
_BEFORE_NUMBER = frozenset(
    {
        *("no", "nos", "nr", "ext", "tel", "vol", "fig", "p", "pp", "ch", "sec", "art"),
        *("apt", "rm", "ste", "approx", "ca"),
    }
)

_NOT_A_BOUNDARY = -1
_UNDECIDED = -2
_SKIP = -3


class SentenceSettings(BaseModel):
    """How an LLM reply is cut into pieces for TTS (lengths in characters)."""

    model_config = ConfigDict(frozen=True)

    # A piece shorter than this ("A.") is joined to the next one instead of spoken alone.
    min_chars: int = Field(default=3, ge=1)
    # A first sentence longer than `first_clause_cut_chars` is cut at a clause boundary that has
    # at least `first_clause_min_chars` before it, so audio starts early. Set
    # `first_clause_cut_chars` to `max_chars` to turn the early cut off.
    first_clause_min_chars: int = Field(default=20, ge=1)
    first_clause_cut_chars: int = Field(default=40, ge=1)
    # Any later sentence longer than this is cut (clause boundary, else a space).
    max_chars: int = Field(default=200, ge=20)
    # The first piece of a reply is its first phrase ("Sure,") when the first clause boundary
    # has at most `first_chunk_max_words` words before it, the sentence has more than
    # `first_chunk_whole_words` words, and `first_chunk_rest_words` or more follow the cut.
    short_first_chunk: bool = True
    first_chunk_max_words: int = Field(default=8, ge=1)
    first_chunk_whole_words: int = Field(default=6, ge=0)
    first_chunk_rest_words: int = Field(default=3, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if not self.first_clause_min_chars <= self.first_clause_cut_chars <= self.max_chars:
            raise ValueError("need first_clause_min_chars <= first_clause_cut_chars <= max_chars")
        return self


class SentenceSplitter:
    """Cuts one reply's token stream into speakable sentences, as early as possible."""

    def __init__(self, settings: SentenceSettings | None = None) -> None:
        self.settings = settings or SentenceSettings()
        self._pending = ""
        self._spoke = False  # whether this reply's first sentence has been handed out
        self._phrase_spoke = False  # whether its first phrase has been handed out on its own

    def push(self, text: str) -> list[str]:
        """Add a delta of the reply; return the sentences now complete."""
        self._pending += text
        return self._take(final=False)

    def flush(self) -> list[str]:
        """End of the reply: return what is left. The splitter is then ready for a new reply."""
        sentences = self._take(final=True)
        self._pending = ""
        self._spoke = False
        self._phrase_spoke = False
        return sentences

    def _take(self, final: bool) -> list[str]:
        sentences: list[str] = []
        while True:
            self._pending = self._pending.lstrip()
            if not self._pending:
                return sentences
            found = self._next_end(self._pending, final)
            if found is None:
                return sentences
            end, phrase = max(found[0], 1), found[1]
            piece, self._pending = self._pending[:end], self._pending[end:]
            sentence = speakable(piece)
            if _has_word(sentence):
                sentences.append(sentence)
                if phrase:
                    self._phrase_spoke = True
                else:
                    self._spoke = True

    def _next_end(self, text: str, final: bool) -> tuple[int, bool] | None:
        """(where the next piece of `text` ends, whether it is the reply's first phrase cut out
        of its sentence), or None while that is not known yet."""
        end, decided = self._sentence_end(text, final)
        s = self.settings
        if s.short_first_chunk and not self._spoke and not self._phrase_spoke:
            phrase = _first_phrase_end(text, end, decided, final, s)
            if phrase is None:
                return None
            if phrase != _NOT_A_BOUNDARY:
                return phrase, True
        cut = self._cut_end(text, end, decided)
        return None if cut is None else (cut, False)

    def _cut_end(self, text: str, end: int | None, decided: int) -> int | None:
        """Where the next piece ends by the sentence and clause rules, or None if not known."""
        # The first sentence is at least this long (exactly this long when `end` is known).
        length = end if end is not None else decided
        s = self.settings
        if not self._spoke and length > s.first_clause_cut_chars:
            clauses = [c for c in _clause_ends(text, length) if c >= s.first_clause_min_chars]
            early = [c for c in clauses if c <= s.first_clause_cut_chars]
            late = [c for c in clauses if s.first_clause_cut_chars < c <= s.max_chars]
            if early:
                return early[-1]
            if late:
                return late[0]
        if length > s.max_chars:
            clauses = [c for c in _clause_ends(text, s.max_chars + 1) if c >= s.min_chars]
            if clauses:
                return clauses[-1]
            space = text.rfind(" ", 0, s.max_chars + 1)
            return space if space > 0 else s.max_chars
        return end

    def _sentence_end(self, text: str, final: bool) -> tuple[int | None, int]:
        """(end of the first sentence or None if not known yet, how far the text is decided)."""
        for match in _BOUNDARY.finditer(text):
            end = match.start() if match["newline"] else _end_at(text, match, final)
            if end == _UNDECIDED:
                return None, match.start()
            if end == _NOT_A_BOUNDARY:
                continue
            sentence = speakable(text[:end])
            if _has_word(sentence) and len(sentence) < self.settings.min_chars:
                continue  # too short to speak alone: join it to the next one
            return end, end
        if final:
            return len(text), len(text)
        tail = _UNDECIDED_TAIL.search(text)
        return None, tail.start() if tail else len(text)


def _end_at(text: str, match: re.Match[str], final: bool) -> int:
    """Where the sentence ends if `match` (a terminator run) ends it, else a sentinel."""
    after = _WHITESPACE.match(text, match.end())
    gap_end = after.end() if after else match.end()
    if "\n" in text[match.end() : gap_end]:
        return match.end()  # a line break ends the sentence anyway
    i = gap_end
    while i < len(text) and text[i] in _OPENERS:
        i += 1
    if i == len(text):
        return match.end() if final else _UNDECIDED
    following = text[i]
    if following.islower():
        return _NOT_A_BOUNDARY  # the thought goes on
    if match["end"].rstrip(_CLOSERS) != ".":
        return match.end()
    before = _WORD_BEFORE.search(text, 0, match.start())
    word_start = before.start() if before else match.start()
    word = text[word_start : match.start()]
    stripped = word.lstrip(_OPENERS)
    word_start += len(word) - len(stripped)
    word = stripped.lower()
    if word in _NEVER_FINAL:
        return _NOT_A_BOUNDARY
    if word in _BEFORE_NUMBER and (following.isdigit() or following == "#"):
        return _NOT_A_BOUNDARY
    if len(stripped) == 1 and stripped.isupper() and following.isupper():
        return _NOT_A_BOUNDARY  # an initial: "J. Smith"
    if word.isdigit() and len(word) <= 3:
        if not _has_word(speakable(text[:word_start])):
            return _NOT_A_BOUNDARY  # a list number opening the sentence: "1. First"
        marker = _LIST_MARKER.match(text)
        if marker and int(word) == int(marker[1]) + 1:
            return word_start  # the next item of an inline list starts here
    return match.end()


def _first_phrase_end(
    text: str, end: int | None, decided: int, final: bool, settings: SentenceSettings
) -> int | None:
    """Where the reply's first phrase ends, `_NOT_A_BOUNDARY` if it is not cut out of its
    sentence, or None while that is not known yet (`end`, `decided`: see `_sentence_end`)."""
    limit = end if end is not None else decided
    words = _word_count(text[:limit])  # the sentence has at least this many words
    # Only boundaries within `max_chars`: past it, the piece is cut by the `max_chars` rule.
    for match in _CLAUSE.finditer(text, 0, min(limit, settings.max_chars + 1)):
        cut = match.end()
        if cut >= limit:
            break
        before = _word_count(text[:cut])
        if before > settings.first_chunk_max_words:
            return _NOT_A_BOUNDARY
        between = _between_numbers(text, match, final)
        if between == _UNDECIDED:
            return None
        if between == _SKIP or before == 0 or len(speakable(text[:cut])) < settings.min_chars:
            continue
        need = max(settings.first_chunk_whole_words + 1, before + settings.first_chunk_rest_words)
        if words >= need or limit > settings.max_chars:
            return cut
        return _NOT_A_BOUNDARY if end is not None else None
    if end is not None or words > settings.first_chunk_max_words or limit > settings.max_chars:
        return _NOT_A_BOUNDARY
    return None


def _between_numbers(text: str, match: re.Match[str], final: bool) -> int:
    """`_SKIP` if the phrase boundary `match` stands between two numbers ("June 5, 2024",
    "5 - 7"), `_UNDECIDED` while the next character is not known, else 0."""
    if not text[: match.start()].rstrip()[-1:].isdigit():
        return 0
    following = _NOT_SPACE.search(text, match.end())
    if following is None:
        return 0 if final else _UNDECIDED
    return _SKIP if following[0].isdigit() else 0


def _word_count(text: str) -> int:
    return sum(1 for word in _WORD_GAP.split(text) if _has_word(word))


def _clause_ends(text: str, limit: int) -> list[int]:
    """Ends of the clauses in `text` before `limit`."""
    return [m.end() for m in _CLAUSE.finditer(text, 0, limit) if m.end() < limit]


def _has_word(text: str) -> bool:
    return any(ch.isalnum() for ch in text)


def speakable(text: str) -> str:
    """`text` without markdown and with its whitespace collapsed, ready for TTS."""
    text = _CODE_FENCE.sub(" ", text)
    text = _LINK.sub(r"\1", text)
    text = _LINE_PREFIX.sub("", text)
    text = text.replace("*", "").replace("`", "")
    text = _EDGE_UNDERSCORES.sub("", text)
    text = _LONE_HASHES.sub("", text)
    text = " ".join(text.split())
    return _TRAILING_DASH.sub(",", text) if _has_word(text) else text
