"""Speech-to-text with the bundled Whisper models, on espeak-ng speech."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from pipeline.stt import SpeechToText, STTSettings, resolve_model_dir
from tests.support.speech import RATE, concat, espeak, silence, words

BOOKING = "I would like to book a table, for two people, at seven"


def turn(text: str, voice: str = "en-us") -> np.ndarray:
    """`text` in espeak-ng at its own speed, framed as the VAD hands a turn to STT (its 200 ms
    pre-roll before, 300 ms after): what the model is given in a call, not a caller's utterance
    (that is `tests.support.speech.utterance`, framed for a line)."""
    return concat(silence(200), espeak(text, voice), silence(300))


@pytest.fixture(scope="module")
def tiny() -> SpeechToText:
    stt = SpeechToText.shared()
    stt.warm_up()
    return stt


def test_tiny_en_transcribes_the_key_words(tiny: SpeechToText) -> None:
    audio = turn(BOOKING)

    transcript = tiny.transcribe_blocking(audio)

    print(f"tiny.en: {transcript.inference_s * 1000:.0f} ms for {transcript.audio_s:.2f} s")
    assert {"book", "table", "people"} <= words(transcript.text)
    assert transcript.audio_s == pytest.approx(len(audio) / RATE)
    assert transcript.inference_s > 0


async def test_transcribe_runs_off_the_event_loop(tiny: SpeechToText) -> None:
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0)

    ticking = asyncio.create_task(ticker())
    transcript = await tiny.transcribe(turn("Please cancel my order", "en-gb"))
    done.set()
    await ticking

    print(f"event loop ticked {ticks} times during {transcript.inference_s * 1000:.0f} ms")
    assert {"cancel", "order"} <= words(transcript.text)
    assert ticks > 20  # a blocking call would have let it tick at most once


async def test_concurrent_turns_all_get_their_own_text(tiny: SpeechToText) -> None:
    texts = ["Yes please", "My name is Alice", "What time do you open tomorrow"]

    results = await asyncio.gather(*(tiny.transcribe(turn(t)) for t in texts))

    for transcript in results:
        print(
            f"{transcript.text!r}: queued {transcript.queued_s * 1000:.0f} ms, "
            f"inference {transcript.inference_s * 1000:.0f} ms"
        )
    assert "please" in words(results[0].text)
    assert "alice" in words(results[1].text)
    assert {"time", "open", "tomorrow"} <= words(results[2].text)


async def test_busy_while_as_many_transcriptions_wait_as_run(tiny: SpeechToText) -> None:
    """Early transcriptions (at a pause) are what `busy` holds back: they never take the lane."""
    workers = tiny.settings.workers
    assert not tiny.busy
    early = [tiny.transcribe(turn("Yes please"), urgent=False) for _ in range(2 * workers)]
    jobs = [asyncio.create_task(job) for job in early]
    await asyncio.sleep(0)  # each job has taken a worker or joined the line
    assert tiny.busy and tiny.scheduler.waiting == workers
    await asyncio.gather(*jobs)
    assert not tiny.busy


async def test_a_finished_turn_does_not_wait_for_early_transcriptions(tiny: SpeechToText) -> None:
    """Every worker busy with a long transcription begun at a pause: a finished turn's starts
    on the lane (its own model replica) at once and is done first."""
    done: list[str] = []

    def start(name: str, audio: np.ndarray, urgent: bool) -> asyncio.Task[object]:
        task = asyncio.create_task(tiny.transcribe(audio, urgent=urgent))
        task.add_done_callback(lambda _: done.append(name))
        return task

    long = turn(" ".join([BOOKING] * 5))
    early = [start(f"early {n}", long, False) for n in range(tiny.settings.workers)]
    await asyncio.sleep(0)  # they hold the workers
    finished = start("finished turn", turn("Yes please"), True)
    await asyncio.gather(finished, *early)
    assert done[0] == "finished turn"


def test_shared_returns_one_model_per_settings(tiny: SpeechToText) -> None:
    assert SpeechToText.shared() is tiny
    assert SpeechToText.shared(STTSettings()) is tiny
    assert SpeechToText.shared(STTSettings(model="tiny.en")) is tiny
    other = SpeechToText.shared(STTSettings(workers=1))
    assert other is not tiny
    assert SpeechToText.shared(STTSettings(workers=1)) is other


def test_window_modes_share_one_loaded_model_and_its_workers(tiny: SpeechToText) -> None:
    full = SpeechToText.shared(STTSettings(window="full"))
    assert full is not tiny and full.settings.encoder_window == "full"
    assert tiny.settings.encoder_window == "fit"  # "auto" on tiny.en
    assert full._model is tiny._model and full._workers is tiny._workers
    said = espeak("What time do you open tomorrow?")
    assert words(full.transcribe_blocking(said).text) >= {"time", "open", "tomorrow"}


def test_empty_audio_is_an_empty_transcript(tiny: SpeechToText) -> None:
    transcript = tiny.transcribe_blocking(np.zeros(0, dtype=np.int16))

    assert (transcript.text, transcript.audio_s) == ("", 0.0)


def test_model_names_resolve_to_local_directories(tiny: SpeechToText) -> None:
    tiny_dir = resolve_model_dir("tiny.en")
    assert (tiny_dir / "model.bin").is_file()
    assert resolve_model_dir(str(tiny_dir)) == tiny_dir
    with pytest.raises(ValueError, match="never downloaded"):
        resolve_model_dir("large-v3")


def test_base_is_joined_once_and_transcribes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOTLINE_CACHE_DIR", str(tmp_path))

    built = resolve_model_dir("base")

    assert built == tmp_path / "whisper-base"
    names = sorted(p.name for p in built.iterdir())
    assert names == ["config.json", "model.bin", "tokenizer.json", "vocabulary.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["whisper-base"]  # no temp dirs left
    model_bin = (built / "model.bin").stat()
    assert model_bin.st_size > 140_000_000

    # Second use: the verified cache is reused as it is, not rewritten.
    assert resolve_model_dir("base") == built
    assert (built / "model.bin").stat().st_mtime_ns == model_bin.st_mtime_ns
    assert (built / "model.bin").stat().st_ino == model_bin.st_ino

    # A half-written cache (wrong size) is never used: it is rebuilt.
    with open(built / "model.bin", "r+b") as half:
        half.truncate(1000)
    assert resolve_model_dir("base") == built
    assert (built / "model.bin").stat().st_size == model_bin.st_size

    base = SpeechToText(STTSettings(model="base", workers=1, cpu_threads=2))
    transcript = base.transcribe_blocking(turn(BOOKING))
    print(f"base: load {base.load_s:.2f} s, {transcript.inference_s * 1000:.0f} ms (cold)")
    assert {"book", "table", "people"} <= words(transcript.text)
