"""Recorded calls as simulated callers (`voice.experiments.recorded`): stereo Ogg/Opus files
written here as the recorder writes them (16 kHz int16 in, caller left, bot right), split at
the caller's pauses, and replayed through `hotline experiments simulate`."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pytest
from typer.testing import CliRunner

from tests.support.speech import concat, noise, piper, silence, words
from voice.cli.main import app
from voice.experiments.recorded import (
    RecordingError,
    RecordingSplit,
    load_recorded_call,
    load_recorded_calls,
    split_utterances,
)
from voice.experiments.simulate import load_simulation

RATE = 16_000
BOOKING = "Hi, I would like to book a table for two people tonight."
INVOICE = "Could you send me a copy of my last invoice?"
REPLY = "Sure, one moment please."


def write_recording(path: Path, caller: np.ndarray, heard: np.ndarray | None = None) -> Path:
    """A call recording: Opus in Ogg from 16 kHz int16, caller left, `heard` right (default:
    silence)."""
    heard = np.zeros_like(caller) if heard is None else heard
    n = max(len(caller), len(heard))
    both = np.zeros((n, 2), dtype=np.int16)
    both[: len(caller), 0], both[: len(heard), 1] = caller, heard
    return _write_opus(path, both, "stereo")


def _write_opus(path: Path, samples: np.ndarray, layout: str) -> Path:
    with av.open(str(path), "w", format="ogg") as out:
        stream = out.add_stream("libopus", rate=RATE, layout=layout)
        stream.bit_rate = 32_000
        for start in range(0, len(samples), RATE // 50):  # 20 ms frames, as on a call
            chunk = np.ascontiguousarray(samples[start : start + RATE // 50]).reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(chunk, format="s16", layout=layout)
            frame.sample_rate = RATE
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path


def seconds(*parts: np.ndarray) -> float:
    return sum(len(p) for p in parts) / RATE


@pytest.fixture(scope="module")
def booking() -> np.ndarray:
    return piper(BOOKING)


@pytest.fixture(scope="module")
def invoice() -> np.ndarray:
    return piper(INVOICE)


@pytest.fixture()
def two_turns(tmp_path: Path, booking: np.ndarray, invoice: np.ndarray) -> Path:
    """0.5 s, the booking, 1.5 s in which the bot answers, the invoice question, 1 s."""
    caller = concat(silence(500), booking, silence(1500), invoice, silence(1000))
    reply = piper(REPLY)[: RATE * 3 // 2]  # within the caller's pause
    heard = concat(np.zeros(RATE // 2 + len(booking), np.int16), reply, noise(4000))
    return write_recording(tmp_path / "call-0001.ogg", caller, heard)


def test_the_caller_channel_splits_into_its_two_utterances(
    two_turns: Path, booking: np.ndarray, invoice: np.ndarray
) -> None:
    call = load_recorded_call(two_turns)

    assert call.call_id == "call-0001"
    first, second = call.utterances
    booking_ends = seconds(silence(500), booking)
    invoice_starts = booking_ends + 1.5
    assert 0.0 <= first.start_s <= 0.5 < booking_ends <= first.end_s <= booking_ends + 0.6
    assert invoice_starts - 0.6 <= second.start_s <= invoice_starts
    assert second.end_s >= invoice_starts + seconds(invoice) - 0.1
    assert len(first.pcm) == round((first.end_s - first.start_s) * RATE)
    assert all(u.pcm.dtype == np.int16 for u in call.utterances)


def test_a_pause_shorter_than_the_split_stays_within_one_utterance(
    booking: np.ndarray, invoice: np.ndarray
) -> None:
    caller = concat(silence(300), booking, silence(700), invoice, silence(500))

    assert len(split_utterances(caller)) == 1
    assert len(split_utterances(caller, RecordingSplit(pause_s=0.6))) == 2


def test_a_truncated_recording_still_gives_its_first_utterance(
    two_turns: Path, booking: np.ndarray
) -> None:
    data = two_turns.read_bytes()
    cut = two_turns.with_name("crashed.ogg")
    cut.write_bytes(data[: len(data) // 2])  # no end-of-stream page, a page cut in two

    call = load_recorded_call(cut)

    assert call.call_id == "crashed"
    assert call.duration_s < load_recorded_call(two_turns).duration_s
    first = call.utterances[0]
    assert first.start_s <= 0.5 and first.end_s >= seconds(silence(500), booking)


def test_recordings_that_cannot_be_replayed_say_why(tmp_path: Path, booking: np.ndarray) -> None:
    mono = _write_opus(tmp_path / "mono.ogg", booking.reshape(-1, 1), "mono")
    garbage = tmp_path / "garbage.ogg"
    garbage.write_bytes(b"OggS not really" * 100)
    silent = write_recording(tmp_path / "silent.ogg", silence(2000), piper(REPLY))
    empty_dir = tmp_path / "nothing-here"
    empty_dir.mkdir()

    cases = {
        mono: "1 channel.*expected a stereo Ogg/Opus call recording",
        garbage: "cannot be read.*expected a stereo Ogg/Opus",
        tmp_path / "missing.ogg": "missing.ogg: no such file",
        silent: "silent.ogg: no caller speech",
        empty_dir: "no recordings",
    }
    for path, message in cases.items():
        with pytest.raises(RecordingError, match=message):
            load_recorded_calls([path])


def test_a_directory_gives_its_recordings_once_each_by_name(
    tmp_path: Path, two_turns: Path
) -> None:
    (tmp_path / "call-0000.ogg").write_bytes(two_turns.read_bytes())
    (tmp_path / "notes.txt").write_text("not a recording")

    calls = load_recorded_calls([tmp_path, two_turns])

    assert [c.call_id for c in calls] == ["call-0000", "call-0001"]
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    (elsewhere / "call-0001.ogg").write_bytes(two_turns.read_bytes())
    with pytest.raises(RecordingError, match="two recordings of call call-0001"):
        load_recorded_calls([two_turns, elsewhere])


def simulation_file(tmp_path: Path) -> Path:
    path = tmp_path / "sim.yaml"
    arm = "{name: fixed-none, policy: fixed, effort: none, budget_ms: 10000}"
    path.write_text(f"experiment:\n  name: replay\n  arms: [{arm}]\n")
    return path


def test_the_cli_refuses_a_mono_recording_cleanly(tmp_path: Path, booking: np.ndarray) -> None:
    mono = _write_opus(tmp_path / "mono.ogg", booking.reshape(-1, 1), "mono")
    command = ["experiments", "simulate", str(simulation_file(tmp_path))]

    result = CliRunner().invoke(app, [*command, "--recording", str(mono)])

    assert result.exit_code == 2
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "expected a stereo Ogg/Opus call recording" in result.output
    assert "Traceback" not in result.output


def test_simulate_replays_a_recorded_call_through_the_pipeline(
    tmp_path: Path, two_turns: Path
) -> None:
    out = tmp_path / "records.jsonl"
    command = ["experiments", "simulate", str(simulation_file(tmp_path)), "--out", str(out)]

    result = CliRunner().invoke(app, [*command, "--recording", str(two_turns)])

    assert result.exit_code == 0, result.output
    assert "from 1 recorded calls" in result.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["call_id"], r["turn"]) for r in records] == [("call-0001", 1), ("call-0001", 2)]
    assert all(r["arm"] == "fixed-none" and r["reply_text"] for r in records)
    # tiny.en's words, loosely: it heard "my last invoice" as "my last end voice" once
    assert "table" in records[0]["caller_text"].lower()
    assert {"copy", "invoice", "send"} & words(records[1]["caller_text"])


def test_a_simulation_file_names_recordings_relative_to_itself(tmp_path: Path) -> None:
    path = simulation_file(tmp_path)
    path.write_text(path.read_text() + "recordings: [last-week, /srv/calls/a.ogg]\n")

    sim = load_simulation(path)

    assert sim.recordings == [tmp_path / "last-week", Path("/srv/calls/a.ogg")]
    assert sim.split.pause_s == 1.0
    with pytest.raises(ValueError, match="at most half of pause_s"):
        RecordingSplit(pause_s=0.5, pad_ms=300)
