"""Whisper in an encoder window sized to the audio, from faster-whisper's own pieces.

`WhisperModel.transcribe()` always encodes a 30 s window, so a 2 s turn costs as much as a 28 s
one. CTranslate2's Whisper encoder accepts shorter windows, and the encoder (and the decoder's
cross-attention) cost grows with the window. `WindowedDecoder` runs one window:

1. the audio, padded with digital silence to the window (`window_for`: audio + `MARGIN_S`,
   rounded up to one of `BUCKETS_S`, so few shapes ever reach CTranslate2), through the model's
   `feature_extractor`. The audio is padded, never the log-mel array: zeros there are not
   silence to the model, and made half of the short windows loop;
2. `WhisperModel.encode`, then `model.model.generate` with the prompt, suppressed tokens,
   no-speech rule and decoding options that `transcribe()` uses (one temperature, no
   timestamps), under the caller's token cap.

Whisper was trained on 30 s windows, and with too little silence after the speech it reads the
sentence again ("Yes, that's right. Yes, that's right") or misreads it. The margin keeps that
rare; `WindowResult.suspect` catches what is left (no words; the token cap reached; three or
more words repeating the stretch just before them; text that compresses like a loop), and the
caller then transcribes in faster-whisper's own 30 s window instead.

Why 4 s, and 10 s at least (tiny.en, 2 cores, the WER study's 200 utterances of 1.5–6.3 s, clean
and over an 8 kHz μ-law line; full window 17.4% / 35.6% WER, 477 ms median; WER before any
retry, and how many of the 400 transcripts the guard flags): audio + 1 s in 5 s steps: 32.8% /
54.1%, 97 flagged; + 2 s: 25.3% / 44.5%, 57; + 3 s: 18.0% / 34.6%, 11; + 4 s in 2 s steps from
6 s: 16.7% / 35.2%, 11, 59 ms median, but "Yes, that's right" (1.5–1.9 s) still loops in 6 s;
and audio + 4 s from 10 s (these buckets): 17.2% / 33.9%, 3 flagged, 72 ms median.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.transport import SAMPLE_RATE

if TYPE_CHECKING:
    from pipeline.stt import STTSettings

RATE = SAMPLE_RATE  # Whisper hears 16 kHz, the pipeline's rate
HOP = 160  # audio samples per log-mel frame (10 ms)
FULL_WINDOW_S = 30  # Whisper's own window; longer audio is cut into 30 s windows
BUCKETS_S: tuple[int, ...] = (10, 15, 20, FULL_WINDOW_S)
MARGIN_S = 4.0  # silence after the audio, at least
# faster-whisper's defaults for `transcribe()`, kept so both paths agree.
NO_SPEECH_PROB = 0.6  # with `LOGPROB_FLOOR`: a window read as silence gives no text
LOGPROB_FLOOR = -1.0
COMPRESSION_LIMIT = 2.4  # gzip ratio above which Whisper's text is a repetition loop
BEST_OF = 5  # samples drawn when temperature > 0
LOOP_WORDS = 3  # this many words in a row repeating the stretch just before them: a loop
SPEECH_RMS = 0.005  # a 32 ms frame this loud (-46 dBFS) is not silence


def window_for(audio_s: float, margin_s: float = MARGIN_S) -> int | None:
    """The encoder window (seconds) for `audio_s` of audio: the smallest of `BUCKETS_S` that
    holds the audio and `margin_s` of silence after it; `None` when not even 30 s does."""
    for bucket in BUCKETS_S:
        if audio_s + margin_s <= bucket:
            return bucket
    return None


def repeated_run(words: Sequence[str]) -> int:
    """The longest stretch of consecutive words each equal to the word `p` places earlier, for
    any period `p`: 3 for "yes that's right yes that's right", 2 for "no no no"."""
    longest = 0
    for period in range(1, len(words)):
        run = 0
        for i in range(period, len(words)):
            run = run + 1 if words[i] == words[i - period] else 0
            longest = max(longest, run)
    return longest


def compression_ratio(text: str) -> float:
    """How well `text` compresses (faster-whisper's loop measure); 0.0 for no text."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def looks_looped(words: Sequence[str], text: str, tokens: int, cap: int) -> bool:
    """Whisper stuck repeating itself: `tokens` reached the `cap`, `LOOP_WORDS` `words` in a row
    repeat the stretch before them, or the `text` compresses like a loop."""
    return (
        tokens >= cap
        or repeated_run(words) >= LOOP_WORDS
        or compression_ratio(text) > COMPRESSION_LIMIT
    )


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def has_sound(samples: np.ndarray) -> bool:
    """Some 32 ms frame of float32 audio is louder than `SPEECH_RMS`."""
    frame = 512
    usable = len(samples) // frame * frame
    if not usable:
        return bool(len(samples)) and float(np.sqrt(np.mean(samples**2))) >= SPEECH_RMS
    power = np.mean(samples[:usable].reshape(-1, frame) ** 2, axis=1)
    return float(np.sqrt(power.max())) >= SPEECH_RMS


@dataclass(frozen=True)
class WindowResult:
    """One window's transcript and what the decoder saw."""

    text: str
    window_s: int
    tokens: int  # generated tokens (the end-of-text token not counted)
    cap: int  # the most tokens it could generate
    no_speech_prob: float
    avg_logprob: float

    @property
    def suspect(self) -> bool:
        """Too doubtful to keep: no words ("", ". . .": the audio is not silent, see
        `has_sound`), or a loop."""
        words = _words(self.text)
        return not words or looks_looped(words, self.text, self.tokens, self.cap)


class WindowedDecoder:
    """Transcribes audio in one encoder window of a loaded faster-whisper `WhisperModel`.

    Stateless between calls and safe from several threads at once, like the model itself."""

    def __init__(self, model: Any, settings: STTSettings) -> None:
        self._model = model
        self._settings = settings
        self._multilingual = bool(model.model.is_multilingual)
        self._language = settings.language if self._multilingual else "en"
        # language -> (faster-whisper Tokenizer, token ids suppressed while decoding)
        self._tokenizers: dict[str, tuple[Any, list[int]]] = {}
        if self._language:
            self._tokenizer(self._language)  # fail at load on an unknown language code

    def _tokenizer(self, language: str) -> tuple[Any, list[int]]:
        found = self._tokenizers.get(language)
        if found is None:  # two threads may both build it: harmless
            from faster_whisper.tokenizer import Tokenizer
            from faster_whisper.transcribe import get_suppressed_tokens

            tokenizer = Tokenizer(
                self._model.hf_tokenizer, self._multilingual, "transcribe", language
            )
            found = (tokenizer, list(get_suppressed_tokens(tokenizer, [-1])))
            self._tokenizers[language] = found
        return found

    def decode(self, samples: np.ndarray, window_s: int, max_new_tokens: int) -> WindowResult:
        """Transcribe float32 16 kHz `samples` (at most `window_s` long) in a `window_s` window,
        generating at most `max_new_tokens` tokens (fewer if the prompt leaves less room)."""
        frames = window_s * RATE // HOP
        padded = np.zeros(window_s * RATE, dtype=np.float32)
        padded[: len(samples)] = samples[: len(padded)]
        features = self._model.feature_extractor(padded)[:, :frames]
        encoded = self._model.encode(features)
        tokenizer, suppressed = self._tokenizer(self._language or self._detect(encoded))
        prompt = self._prompt(tokenizer)
        cap = max(1, min(max_new_tokens, self._model.max_length - len(prompt)))
        result = self._model.model.generate(
            encoded,
            [prompt],
            max_length=len(prompt) + cap,
            return_scores=True,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=suppressed,
            **self._search(),
        )[0]
        tokens: list[int] = result.sequences_ids[0]
        avg_logprob = float(result.scores[0]) * len(tokens) / (len(tokens) + 1)
        silent = result.no_speech_prob > NO_SPEECH_PROB and avg_logprob < LOGPROB_FLOOR
        text = "" if silent else str(tokenizer.decode(tokens)).strip()
        return WindowResult(
            text, window_s, len(tokens), cap, float(result.no_speech_prob), avg_logprob
        )

    def room(self) -> int:
        """The most tokens a window may generate: the model's length less the prompt's."""
        tokenizer, _suppressed = self._tokenizer(self._language or "en")
        return int(self._model.max_length) - len(self._prompt(tokenizer))

    def _detect(self, encoded: Any) -> str:
        """The most likely language of the window (multilingual models with no language set)."""
        ranked = self._model.model.detect_language(encoded)[0]
        return str(ranked[0][0])[2:-2]  # "<|de|>" -> "de"

    def _prompt(self, tokenizer: Any) -> list[int]:
        context: list[int] = []
        if self._settings.initial_prompt:
            context = tokenizer.encode(" " + self._settings.initial_prompt.strip())
        prompt: list[int] = self._model.get_prompt(tokenizer, context, without_timestamps=True)
        return prompt

    def _search(self) -> dict[str, Any]:
        """Greedy or beam search at temperature 0, else sampling (as `transcribe()` does)."""
        s = self._settings
        if s.temperature > 0:
            return {
                "beam_size": 1,
                "num_hypotheses": BEST_OF,
                "sampling_topk": 0,
                "sampling_temperature": s.temperature,
            }
        return {"beam_size": s.beam_size, "patience": 1.0}
