"""End-of-turn detection on generated speech, on an audio clock (at = t0 + samples / 16 000)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

from pipeline.turns import (
    SpeechResumed,
    SpeechStarted,
    TurnDetector,
    TurnEvent,
    TurnPause,
    TurnSegment,
    TurnSettings,
)
from tests.support.speech import RATE, concat, espeak, noise, silence

T0 = 1000.0  # arbitrary monotonic origin: nothing may assume the clock starts at zero
BOOKING = "I would like to book a table, for two people, at seven"
Event = TurnEvent
Pushed = tuple[int, TurnEvent]


def run(
    detector: TurnDetector, pcm: np.ndarray, chunk: int = 320, pauses: bool = False
) -> list[tuple[int, Event]]:
    """Feed `pcm` in `chunk`-sample pieces; each event with the samples pushed when it came.

    TurnPause and SpeechResumed events are left out unless `pauses` is set.
    """
    out: list[tuple[int, Event]] = []
    pushed = 0
    for start in range(0, len(pcm), chunk):
        piece = pcm[start : start + chunk]
        pushed += len(piece)
        out += [
            (pushed, e)
            for e in detector.push(piece, T0 + pushed / RATE)
            if pauses or not isinstance(e, TurnPause | SpeechResumed)
        ]
    return out


def kinds(events: list[tuple[int, Event]]) -> list[str]:
    return [type(e).__name__ for _, e in events]


def voiced_span(pcm: np.ndarray) -> tuple[int, int]:
    """First and last sample louder than -40 dBFS: where the words really are."""
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > 328)
    return int(loud[0]), int(loud[-1]) + 1


def at_of(position: int) -> float:
    return T0 + position / RATE


def test_one_utterance_gives_one_start_then_one_turn_covering_the_words() -> None:
    speech = espeak(BOOKING)
    lead = len(silence(700))
    pcm = concat(silence(700), speech, silence(1200))
    onset, offset = (lead + p for p in voiced_span(speech))
    settings = TurnSettings()

    began = time.perf_counter()
    events = run(TurnDetector(settings), pcm)
    cost_ms = (time.perf_counter() - began) * 1000 / (len(pcm) / 320)
    print(f"TurnDetector.push: {cost_ms:.3f} ms of CPU per 20 ms frame")

    assert kinds(events) == ["SpeechStarted", "TurnSegment"]
    started, turn = events[0][1], events[1][1]
    assert isinstance(started, SpeechStarted) and isinstance(turn, TurnSegment)
    assert started.at == turn.speech_started_at
    # The turn's edges sit on the words (within two 32 ms VAD windows and Silero's own lag).
    assert abs(turn.speech_started_at - at_of(onset)) < 0.1
    assert abs(turn.speech_ended_at - at_of(offset)) < 0.15
    # End of turn was decided end_silence_ms after the end of speech (+ window/frame rounding).
    delay = turn.detected_at - turn.speech_ended_at
    print(f"endpoint delay {delay * 1000:.0f} ms")
    assert settings.end_silence_ms / 1000 <= delay <= (settings.end_silence_ms + 32 + 20) / 1000
    assert turn.detected_at == pytest.approx(at_of(events[1][0]))
    # The audio is exactly the input from pre-roll before the onset to post-roll after the end.
    first = round((turn.speech_started_at - T0) * RATE) - settings.pre_roll_ms * RATE // 1000
    last = round((turn.speech_ended_at - T0) * RATE) + settings.post_roll_ms * RATE // 1000
    assert turn.audio.dtype == np.int16
    assert np.array_equal(turn.audio, pcm[first:last])
    assert first <= onset and last >= offset - 0.1 * RATE


def test_two_utterances_apart_give_two_turns() -> None:
    pcm = concat(
        silence(400), espeak("Hello, is anyone there"), silence(1500), espeak("Yes I am"),
        silence(1000),
    )  # fmt: skip

    events = run(TurnDetector(), pcm)

    assert kinds(events) == ["SpeechStarted", "TurnSegment"] * 2
    first, second = events[1][1], events[3][1]
    assert isinstance(first, TurnSegment) and isinstance(second, TurnSegment)
    assert first.detected_at < second.speech_started_at
    assert second.speech_started_at - first.speech_ended_at > 1.2


@pytest.mark.parametrize(
    ("text", "voice", "wpm"),
    [
        (BOOKING, "en-us", 160),
        (BOOKING, "en-gb", 160),
        ("Yes, that's right, my account number is four, five, six, seven", "en-us+f3", 160),
        ("Well, I'm not sure, maybe, let me think about it", "en-gb-scotland", 130),
    ],
)
def test_comma_pauses_stay_in_one_turn(text: str, voice: str, wpm: int) -> None:
    speech = espeak(text, voice, wpm)
    pcm = concat(silence(500), speech, silence(1000))

    events = run(TurnDetector(), pcm)

    assert kinds(events) == ["SpeechStarted", "TurnSegment"]
    turn = events[1][1]
    assert isinstance(turn, TurnSegment)
    onset, offset = voiced_span(speech)
    assert turn.speech_ended_at - turn.speech_started_at > (offset - onset) / RATE - 0.2


def test_a_short_word_is_a_turn() -> None:
    events = run(TurnDetector(), concat(silence(500), espeak("no", wpm=200), silence(800)))

    assert kinds(events) == ["SpeechStarted", "TurnSegment"]


def _tone(hz_a: float, hz_b: float, ms: int) -> np.ndarray:
    t = np.arange(RATE * ms // 1000) / RATE
    return ((np.sin(2 * np.pi * hz_a * t) + np.sin(2 * np.pi * hz_b * t)) * 5000).astype(np.int16)


@pytest.mark.parametrize(
    "sound",
    [
        pytest.param(concat(silence(300), (np.hanning(160) * 25000).astype(np.int16)), id="click"),
        pytest.param(
            concat(*[concat(silence(150), (np.hanning(80) * 30000).astype(np.int16))] * 6),
            id="clicks",
        ),
        pytest.param(noise(3000, level=0.01), id="noise-40dBFS"),
        pytest.param(noise(3000, level=0.1), id="noise-20dBFS"),
        pytest.param(concat(silence(300), noise(150, level=0.3)), id="noise-burst"),
        pytest.param(concat(*[concat(_tone(770, 1336, 100), silence(100))] * 5), id="dtmf"),
    ],
)
def test_clicks_noise_and_tones_start_nothing(sound: np.ndarray) -> None:
    events = run(TurnDetector(), concat(sound, silence(1000)))

    assert events == []


def test_speech_started_comes_soon_after_the_onset_in_audio_time() -> None:
    for voice in ("en-us", "en-gb", "en-us+f3"):
        speech = espeak("Sorry, can I stop you there", voice)
        lead = len(silence(600))
        onset = lead + voiced_span(speech)[0]

        events = run(TurnDetector(), concat(silence(600), speech, silence(800)))

        decided_at, started = events[0]
        assert isinstance(started, SpeechStarted)
        lag_ms = (decided_at - onset) * 1000 / RATE
        print(f"{voice}: SpeechStarted decided {lag_ms:.0f} ms of audio after the onset")
        assert 0 < lag_ms <= 200  # leaves 100 ms of the 300 ms barge-in budget for the rest
        assert abs(started.at - at_of(onset)) < 0.1


@pytest.mark.parametrize("chunk", [160, 333, 512, 1000, 4800])
def test_any_chunk_size_gives_the_same_turn(chunk: int) -> None:
    pcm = concat(silence(500), espeak(BOOKING), silence(1000))
    reference = [e for _, e in run(TurnDetector(), pcm, chunk=320)]

    events = [e for _, e in run(TurnDetector(), pcm, chunk=chunk)]

    assert [type(e) for e in events] == [type(e) for e in reference]
    turn, expected = events[1], reference[1]
    assert isinstance(turn, TurnSegment) and isinstance(expected, TurnSegment)
    assert turn.speech_started_at == pytest.approx(expected.speech_started_at, abs=1e-9)
    assert turn.speech_ended_at == pytest.approx(expected.speech_ended_at, abs=1e-9)
    assert np.array_equal(turn.audio, expected.audio)
    # Decided on the chunk that completed the deciding window: later only by chunk granularity.
    assert expected.detected_at <= turn.detected_at + 0.02
    assert turn.detected_at - expected.detected_at < chunk / RATE


def test_interleaved_calls_keep_their_own_state() -> None:
    a = concat(silence(300), espeak(BOOKING), silence(900))
    b = concat(silence(900), espeak("Cancel my order please", "en-gb"), silence(1500))
    n = max(len(a), len(b))
    a, b = concat(a, np.zeros(n - len(a), np.int16)), concat(b, np.zeros(n - len(b), np.int16))
    alone_a, alone_b = run(TurnDetector(), a, pauses=True), run(TurnDetector(), b, pauses=True)

    det_a, det_b = TurnDetector(), TurnDetector()
    both_a: list[tuple[int, Event]] = []
    both_b: list[tuple[int, Event]] = []
    for start in range(0, n, 320):
        pushed = min(start + 320, n)
        at = T0 + pushed / RATE
        both_a += [(pushed, e) for e in det_a.push(a[start:pushed], at)]
        both_b += [(pushed, e) for e in det_b.push(b[start:pushed], at)]

    assert kinds(alone_a)[0] == kinds(alone_b)[0] == "SpeechStarted"
    assert kinds(alone_a)[-1] == kinds(alone_b)[-1] == "TurnSegment"
    for together, alone in ((both_a, alone_a), (both_b, alone_b)):
        assert [p for p, _ in together] == [p for p, _ in alone]
        assert together[0][1] == alone[0][1]  # SpeechStarted: same back-dated onset
        turn, expected = together[-1][1], alone[-1][1]
        assert isinstance(turn, TurnSegment) and isinstance(expected, TurnSegment)
        assert np.array_equal(turn.audio, expected.audio)


def test_reset_forgets_a_half_heard_utterance() -> None:
    speech = concat(silence(300), espeak(BOOKING), silence(900))
    fresh = run(TurnDetector(), speech)
    detector = TurnDetector()
    run(detector, speech[: len(speech) // 2])

    detector.reset()
    after = run(detector, speech)

    assert kinds(after) == kinds(fresh) == ["SpeechStarted", "TurnSegment"]
    assert [p for p, _ in after] == [p for p, _ in fresh]
    turn, expected = after[1][1], fresh[1][1]
    assert isinstance(turn, TurnSegment) and isinstance(expected, TurnSegment)
    assert np.array_equal(turn.audio, expected.audio)


def test_a_turn_longer_than_max_turn_is_cut() -> None:
    talk = concat(*[espeak("and then we went to the shops and bought some bread")] * 3)
    pcm = concat(silence(300), talk, silence(900))
    settings = TurnSettings(max_turn_s=2.0)

    events = run(TurnDetector(settings), pcm)

    turns = [e for _, e in events if isinstance(e, TurnSegment)]
    assert len(turns) >= 2
    for turn in turns:
        assert turn.speech_ended_at - turn.speech_started_at <= 2.0 + 0.032
    assert kinds(events)[0] == "SpeechStarted"


def test_a_pause_offers_the_same_audio_as_the_turn_that_follows() -> None:
    pcm = concat(silence(500), espeak("Book me a taxi"), silence(1000))
    events = run(TurnDetector(), pcm, pauses=True)

    assert kinds(events) == ["SpeechStarted", "TurnPause", "TurnSegment"]
    (paused_after, pause), (ended_after, turn) = events[1], events[2]
    assert isinstance(pause, TurnPause) and isinstance(turn, TurnSegment)
    assert pause.end_position == turn.end_position
    assert np.array_equal(pause.audio, turn.audio)
    # Offered end_silence_ms - pause_ms of audio before the turn is decided.
    settings = TurnSettings()
    ahead_s = (settings.end_silence_ms - settings.pause_ms) / 1000
    assert (ended_after - paused_after) / RATE == pytest.approx(ahead_s, abs=0.04)


def test_speech_resuming_after_a_pause_moves_the_turn_end() -> None:
    first, rest = espeak("I would like"), espeak("a table for two")
    pcm = concat(silence(500), first, silence(100), rest, silence(1000))
    events = run(TurnDetector(), pcm, pauses=True)

    assert kinds(events) == [
        "SpeechStarted",
        "TurnPause",
        "SpeechResumed",  # the pause did not end the turn: a reply begun there is void
        "TurnPause",
        "TurnSegment",
    ]
    pauses = [e for _, e in events if isinstance(e, TurnPause)]
    resumed, turn = events[2][1], events[-1][1]
    assert isinstance(resumed, SpeechResumed) and isinstance(turn, TurnSegment)
    assert pauses[0].end_position < pauses[1].end_position == turn.end_position
    assert pauses[1].speech_ended_at == pytest.approx(turn.speech_ended_at, abs=1e-9)
    assert pauses[0].speech_ended_at < resumed.at < pauses[1].speech_ended_at


def test_pause_off_gives_no_pause_events() -> None:
    pcm = concat(silence(500), espeak("Book me a taxi"), silence(1000))
    events = run(TurnDetector(TurnSettings(pause_ms=0)), pcm, pauses=True)
    assert kinds(events) == ["SpeechStarted", "TurnSegment"]


def feed_until_pause(detector: TurnDetector, pcm: np.ndarray) -> tuple[int, TurnPause]:
    """Push 20 ms chunks until the first TurnPause; (samples pushed, the pause)."""
    for pushed, event in run_lazily(detector, pcm):
        if isinstance(event, TurnPause):
            return pushed, event
    raise AssertionError("no pause")


def run_lazily(detector: TurnDetector, pcm: np.ndarray, start: int = 0) -> Iterator[Pushed]:
    for begin in range(start, len(pcm), 320):
        piece = pcm[begin : begin + 320]
        for event in detector.push(piece, T0 + (begin + len(piece)) / RATE):
            yield begin + len(piece), event


def test_a_finished_sounding_pause_ends_the_turn_sooner() -> None:
    said = concat(silence(500), espeak("Book me a taxi"), silence(1000))
    pcm = concat(said, espeak("and a hotel"), silence(1000))
    detector = TurnDetector()
    paused_after, pause = feed_until_pause(detector, pcm)
    assert detector.hasten(pause.end_position, 300) is None  # silent for only ~200 ms so far
    events = list(run_lazily(detector, pcm, paused_after))
    (ended_after, turn), (next_after, next_turn) = [
        (n, e) for n, e in events if isinstance(e, TurnSegment)
    ]

    assert isinstance(turn, TurnSegment) and turn.end_position == pause.end_position
    assert np.array_equal(turn.audio, pause.audio)
    assert (ended_after - pause.end_position) / RATE == pytest.approx(0.3, abs=0.04)
    # The next turn waits the whole end_silence_ms again.
    assert isinstance(next_turn, TurnSegment)
    assert (next_after - next_turn.end_position) / RATE == pytest.approx(0.5, abs=0.04)


def test_hastened_past_its_silence_the_turn_ends_at_once() -> None:
    pcm = concat(silence(500), espeak("Book me a taxi"), silence(1000))
    detector = TurnDetector()
    _, pause = feed_until_pause(detector, pcm)
    turn = detector.hasten(pause.end_position, 100)  # the transcript came after 100 ms

    assert isinstance(turn, TurnSegment) and turn.end_position == pause.end_position
    assert detector.hasten(pause.end_position, 100) is None  # that turn is over


def test_hastening_a_pause_the_caller_spoke_after_changes_nothing() -> None:
    first, rest = espeak("I would like"), espeak("a table for two")
    pcm = concat(silence(500), first, silence(100), rest, silence(1000))
    detector = TurnDetector()
    paused_after, stale = feed_until_pause(detector, pcm)
    resumed_after = next(
        n for n, e in run_lazily(detector, pcm, paused_after) if isinstance(e, SpeechResumed)
    )
    # The transcript of that pause arrives after the caller went on.
    assert detector.hasten(stale.end_position, 100) is None
    segments = [
        (n, e) for n, e in run_lazily(detector, pcm, resumed_after) if isinstance(e, TurnSegment)
    ]

    assert len(segments) == 1
    ended_after, turn = segments[0]
    assert isinstance(turn, TurnSegment) and turn.end_position > stale.end_position
    assert (ended_after - turn.end_position) / RATE == pytest.approx(0.5, abs=0.04)


def test_silero_rests_on_a_quiet_line_and_still_hears_the_caller_start() -> None:
    """A caller listening in silence costs no Silero run; their first words are still heard,
    at the same moment as with Silero hearing every window."""
    pcm = concat(silence(3000), espeak(BOOKING), silence(1200))
    gated, every = TurnDetector(TurnSettings()), TurnDetector(TurnSettings(quiet_floor=0))
    gated_events, every_events = run(gated, pcm), run(every, pcm)

    assert kinds(gated_events) == kinds(every_events) == ["SpeechStarted", "TurnSegment"]
    windows = len(pcm) // 512
    assert every._vad.runs == windows
    assert gated._vad.runs < windows - 3000 // 32  # the lead-in silence never reached Silero
    for (_, g), (_, e) in zip(gated_events, every_events, strict=True):
        if isinstance(g, SpeechStarted) and isinstance(e, SpeechStarted):
            assert g.at == e.at


def test_without_the_noise_margin_a_noisy_line_is_always_heard_by_silero() -> None:
    """The quiet floor alone skips only near-digital silence: line noise above it goes to
    Silero (the noise margin rests it there: tests/test_vad_noise.py)."""
    pcm = noise(2000, level=0.003)  # -50 dBFS RMS
    detector = TurnDetector(TurnSettings(noise_margin=0))
    assert kinds(run(detector, pcm)) == []
    assert detector._vad.runs == len(pcm) // 512
