"""The benchmark: statistics on hand-made samples, and one small real run against a server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from tests.support.server import Server
from tests.support.speech import utterance
from voice.audio import write_wav
from voice.cli.main import app as cli
from voice.devtools.bench import run_bench, twilio_stream_url
from voice.devtools.bench_report import (
    DELIVERY,
    BenchReport,
    CallSample,
    Health,
    LoadSweep,
    TurnSample,
    match_records,
    percentile,
    stats,
    summarize,
)
from voice.devtools.turns import CallerTurn, CallResult


def test_percentiles_interpolate_between_ranks() -> None:
    values = [500.0, 100.0, 300.0, 200.0, 400.0]
    assert percentile(values, 50) == 300.0
    assert percentile(values, 95) == 480.0
    assert percentile([700.0], 95) == 700.0
    assert percentile([], 50) is None
    summary = stats(values)
    assert (summary.count, summary.p50, summary.p95, summary.max) == (5, 300.0, 480.0, 500.0)


def turn(v2v: float | None, **timings: float) -> TurnSample:
    return TurnSample(v2v, dict(timings))


def hand_made_report() -> BenchReport:
    samples = [
        CallSample(
            "a",
            60.0,
            2,
            [turn(800.0, stt=300.0, first_audio=700.0), turn(1000.0, stt=500.0)],
        ),
        CallSample("b", 30.0, 2, [turn(600.0, stt=400.0, first_audio=500.0), turn(None)]),
        CallSample("", 30.0, 2, error="ConnectError()"),
        CallSample("c", 0.0, 2, [turn(900.0)]),  # hung up after one turn
    ]
    return summarize(
        "http://127.0.0.1:8080",
        "webrtc",
        2,
        samples,
        before=Health(10.0, 400.0, 420.0, {"main": 3.0, "tts": 1.0, "other": 2.0}),
        after=Health(16.0, 450.0, 500.0, {"main": 4.0, "tts": 5.0, "other": 2.0, "stt": 1.0}),
        wall_s=61.04,
    )


def test_summary_aggregates_latency_parts_failures_and_cost() -> None:
    report = hand_made_report()

    assert report.calls == 4
    assert report.voice_to_voice_ms.count == 4  # the turn with no reply is left out
    assert report.voice_to_voice_ms.p50 == 850.0
    assert report.voice_to_voice_ms.max == 1000.0
    assert set(report.parts_ms) == {"stt", "first_audio"}
    assert report.parts_ms["stt"].count == 3
    assert report.parts_ms["stt"].p50 == 400.0
    assert report.parts_ms["first_audio"].max == 700.0
    # b has a turn with no reply, the third call broke, c stopped short: a alone succeeded
    assert report.failures == 3
    # 6 CPU seconds over 60 + 30 + 30 + 0 call-seconds = 2 call-minutes
    assert report.server_cpu_s == 6.0
    assert report.call_minutes == 2.0
    assert report.cpu_s_per_call_minute == 3.0
    assert report.server_peak_rss_mb == 500.0
    assert report.server_rss_mb == 450.0
    assert report.wall_s == 61.0
    # per thread group over the 2 call-minutes, largest first; idle groups left out, and a
    # group first seen after the start (a worker started during the run) counted from zero
    assert list(report.cpu_by_thread.items()) == [("tts", 2.0), ("main", 0.5), ("stt", 0.5)]


def test_a_server_without_thread_figures_gives_none() -> None:
    health = Health.from_json({"cpu_s": 2, "rss_mb": 3, "peak_rss_mb": 4})
    assert health.cpu_by_thread == {}
    report = summarize("u", "twilio", 3, [], health, health, 0.0)
    assert report.cpu_by_thread == {}


def test_no_calls_gives_empty_statistics() -> None:
    report = summarize("u", "twilio", 3, [], Health(1, 1, 1), Health(1, 1, 1), 0.0)
    assert report.voice_to_voice_ms.count == 0 and report.voice_to_voice_ms.p50 is None
    assert report.cpu_s_per_call_minute is None
    assert report.failures == 0


def test_report_json_round_trips_and_renders() -> None:
    report = hand_made_report()
    assert BenchReport.from_json(report.to_json()) == report
    assert report.table().row_count == 1 + len(report.parts_ms)
    console = Console(record=True, width=200)
    console.print(report)
    shown = console.export_text()
    assert "server CPU by thread, s per call-minute: tts 2.00, main 0.50, stt 0.50" in shown


def test_a_sweep_sets_each_loads_p95_against_the_first_loads_p50() -> None:
    def load(calls: int, v2v: list[float], cpu_s: float) -> BenchReport:
        # the first call's caller cut its reply short (the server's record says so)
        samples = [
            CallSample(str(i), 60.0, 1, [TurnSample(ms, cut=i == 0)]) for i, ms in enumerate(v2v)
        ]
        return summarize("u", "twilio", 1, samples, Health(0, 1, 1), Health(cpu_s, 1, 900), 60)

    one = load(1, [600.0], 5.0)
    many = load(4, [700.0, 800.0, 900.0, 1000.0], 16.0)
    sweep = LoadSweep([one, many])
    # p95 of 700..1000 interpolates to 985; over the single call's 600
    assert sweep.ratios() == [1.0, round(985.0 / 600.0, 2)]
    data = json.loads(sweep.to_json())
    assert [level["calls"] for level in data["levels"]] == [1, 4]
    assert data["p95_over_first_p50"] == sweep.ratios()
    assert BenchReport.from_json(json.dumps(data["levels"][1])) == many
    console = Console(record=True, width=250)
    console.print(sweep.table())
    shown = console.export_text()
    assert "p95 ÷ p50 at 1" in shown and "1.64" in shown and "4 of 4" in shown
    assert (one.cut_turns, many.cut_turns) == (1, 1) and "replies cut" in shown
    console.print(many)
    assert "replies the caller cut short: 1 of 4" in console.export_text()
    # a first load with no reply heard gives no ratio rather than a division by zero
    assert LoadSweep([load(1, [], 1.0), many]).ratios() == [None, None]


def test_a_barge_in_run_reports_how_soon_replies_stopped_and_fails_a_reply_that_did_not() -> None:
    both = [turn(700.0), turn(800.0)]
    samples = [
        CallSample("a", 20.0, 2, both, barge_in=True, barge_in_stop_ms=180.0),
        CallSample("b", 20.0, 2, both, barge_in=True, barge_in_stop_ms=420.0),
        CallSample("c", 20.0, 2, both, barge_in=True),  # the reply never went quiet
    ]
    health = Health(1, 1, 1)
    report = summarize("u", "twilio", 2, samples, health, health, 60.0, barge_in=True)
    assert report.barge_in_stop_ms == stats([180.0, 420.0])
    assert report.failures == 1  # c: every turn answered, but the barge-in did not stop it
    assert report.table().row_count == 2 + len(report.parts_ms)
    assert BenchReport.from_json(report.to_json()) == report
    plain = summarize("u", "twilio", 2, samples[:1], health, health, 60.0)
    assert plain.barge_in_stop_ms is None and plain.table().row_count == 1 + len(plain.parts_ms)


def test_a_backchannel_run_counts_the_replies_an_okay_stopped() -> None:
    one = [turn(700.0)]
    samples = [
        CallSample("a", 20.0, 1, one, backchannel_stopped=False),
        CallSample("b", 20.0, 1, one, backchannel_stopped=True),
        CallSample("c", 20.0, 1, one),  # no records: not counted
    ]
    health = Health(1, 1, 1)
    report = summarize("u", "twilio", 1, samples, health, health, 60.0)
    assert (report.backchannel_stops, report.backchannels) == (1, 2)
    assert report.failures == 0  # a figure, not a broken call
    assert BenchReport.from_json(report.to_json()) == report
    plain = summarize("u", "twilio", 1, samples[2:], health, health, 60.0)
    assert plain.backchannels is None and plain.backchannel_stops is None


def caller_result(*turns: tuple[float, float | None]) -> CallResult:
    return CallResult(
        "call",
        [CallerTurn(onset=end - 1.0, speech_end=end, reply_start=start) for end, start in turns],
        np.zeros(0, dtype=np.int16),
    )


def test_records_pair_by_order_when_the_counts_agree() -> None:
    result = caller_result((10.0, 10.8), (20.0, 20.6))
    records = [
        {"started_at": 0.0, "timings_ms": {"stt": 300.0, "first_audio": 700.0}},
        {"started_at": 0.0, "timings_ms": {"stt": 350.0}},
    ]
    paired = match_records(result, records, clock_offset_s=1000.0)
    assert paired[0] == TurnSample(800.0, {"stt": 300.0, "first_audio": 700.0, DELIVERY: 100.0})
    assert paired[1] == TurnSample(600.0, {"stt": 350.0})


def test_the_controllers_plan_of_each_turn_is_counted() -> None:
    result = caller_result((10.0, 10.8), (20.0, 20.6), (30.0, 30.7))
    records = [
        {"started_at": 0.0, "decision": {"tier": "fast", "effort": "low"}},
        {"started_at": 0.0, "decision": {"tier": "fast", "effort": "medium"}},
        {"started_at": 0.0, "decision": {"tier": "fast", "effort": "low"}},
    ]
    paired = match_records(result, records, clock_offset_s=1000.0)
    assert [t.plan for t in paired] == ["low on fast", "medium on fast", "low on fast"]
    unplanned = match_records(caller_result((10.0, 10.8)), [{"started_at": 0.0}], 1000.0)
    assert unplanned[0].plan is None  # a record with no decision (an older server)
    health = Health(1, 1, 1)
    report = summarize("u", "twilio", 3, [CallSample("a", 30.0, 3, paired)], health, health, 1)
    assert list(report.plans.items()) == [("low on fast", 2), ("medium on fast", 1)]
    assert BenchReport.from_json(report.to_json()) == report
    console = Console(record=True, width=200)
    console.print(report)
    assert "the controller's plans: low on fast 2, medium on fast 1" in console.export_text()


def test_the_replies_that_hesitated_into_a_dry_line_are_counted() -> None:
    result = caller_result((10.0, 10.8), (20.0, 20.6), (30.0, 30.7))
    records = [{"started_at": 0.0, "reply_fillers": n} for n in (2, 0, 1)]
    paired = match_records(result, records, clock_offset_s=1000.0)
    assert [t.fillers for t in paired] == [2, 0, 1]
    health = Health(1, 1, 1)
    report = summarize("u", "twilio", 3, [CallSample("a", 30.0, 3, paired)], health, health, 1)
    assert report.filler_turns == 2
    assert BenchReport.from_json(report.to_json()) == report


def test_records_pair_by_time_when_the_server_heard_other_turns() -> None:
    # the server split the first utterance in two; wall clock = monotonic + 1000
    result = caller_result((10.0, 10.8), (20.0, None))
    records = [
        {"started_at": 1009.2, "timings_ms": {"stt": 100.0}},
        {"started_at": 1010.05, "timings_ms": {"stt": 300.0}},
        {"started_at": 1030.0, "timings_ms": {"stt": 999.0}},
    ]
    paired = match_records(result, records, clock_offset_s=1000.0)
    assert paired[0].timings_ms == {"stt": 300.0}
    assert paired[1] == TurnSample(None, {})  # nothing near its end of speech


def test_twilio_stream_url_follows_the_server_url() -> None:
    assert twilio_stream_url("http://127.0.0.1:8185/") == "ws://127.0.0.1:8185/twilio/stream"
    assert twilio_stream_url("https://hotline.example") == "wss://hotline.example/twilio/stream"


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["webrtc", "twilio"])
async def test_a_small_real_run(server: Server, transport: Literal["webrtc", "twilio"]) -> None:
    """One call; on the phone, of two turns, the second cutting into the first reply."""
    seen: list[int] = []
    barge_in = transport == "twilio"
    turns = 2 if barge_in else 1
    report = await run_bench(
        server.url,
        transport,
        calls=1,
        turns=turns,
        progress=seen.append,
        barge_in_after_ms=600 if barge_in else None,
    )
    print(f"\n{report.to_json()}")

    assert report.transport == transport
    assert report.failures == 0, server.log[-40:]
    assert report.voice_to_voice_ms.count == turns
    if barge_in:  # measured at the caller: the reply went quiet after the caller began
        stop = report.barge_in_stop_ms
        assert stop is not None and stop.count == 1, report.samples
        assert stop.p50 is not None and stop.p50 > 0
        assert stop.p50 == report.samples[0].barge_in_stop_ms
    else:
        assert report.barge_in_stop_ms is None
    assert report.voice_to_voice_ms.p50 is not None and report.voice_to_voice_ms.p50 > 0
    assert {"endpoint", "stt", "llm_first_token", "first_audio"} <= set(report.parts_ms)
    assert report.samples[0].call_id and report.samples[0].duration_s > 0
    assert report.server_cpu_s > 0 and report.server_peak_rss_mb > 0
    assert report.cpu_s_per_call_minute is not None and report.cpu_s_per_call_minute > 0
    # the server's threads by name: the event loop, and the voice that spoke the replies
    assert report.cpu_by_thread["main"] > 0 and report.cpu_by_thread["tts"] > 0
    assert seen and seen[-1] == turns and seen == sorted(seen)
    # each reply's length from the server's record; how it played, where the phone's own
    # buffer shows it (Twilio), for every turn
    assert report.reply_words is not None and report.reply_words.count == turns
    assert report.playback_turns == (turns if transport == "twilio" else 0)
    # the server's records: the second turn cut the first reply short, where it was spoken into
    assert report.cut_turns == (1 if barge_in else 0), report.samples
    # what the latency budget controller chose for each turn, from the server's records
    assert sum(report.plans.values()) == turns, report.plans
    assert all(plan.endswith(" on fast") for plan in report.plans), report.plans
    assert BenchReport.from_json(report.to_json()) == report


@pytest.mark.slow
async def test_a_real_run_with_a_backchannel(server: Server) -> None:
    """One phone call: a turn, then "Okay." 1.5 s into its reply, which plays on."""
    report = await run_bench(server.url, "twilio", calls=1, turns=1, backchannel_after_ms=1500)
    print(f"\n{report.to_json()}")
    assert report.failures == 0, server.log[-40:]
    call = report.samples[0].call_id
    said = [line for line in server.log if call and call in line]
    assert (report.backchannel_stops, report.backchannels) == (0, 1), (report.samples, said)
    assert report.voice_to_voice_ms.count == 1  # the "okay" is no turn of the call
    assert report.barge_in_stop_ms is None


@pytest.mark.slow
def test_the_command_sweeps_loads_on_one_server(server: Server, tmp_path: Path) -> None:
    """`hotline bench --calls 1 --calls 2`: both loads run, a table sets them side by side, and
    the JSON holds both reports."""
    out, hello = tmp_path / "sweep.json", tmp_path / "hello.wav"
    write_wav(hello, utterance("Hello."))  # a short turn: a short reply to wait out
    args = [
        "bench",
        "--url",
        server.url,
        "--transport",
        "twilio",
        "--turns",
        "1",
        "--wav",
        str(hello),
    ]
    sweep = [*args, "--calls", "1", "--calls", "2", "--out", str(out)]
    result = CliRunner().invoke(cli, sweep, env={"COLUMNS": "250"})  # the table on one line
    assert result.exit_code == 0, (result.output, server.log[-40:])
    data = json.loads(out.read_text())
    levels = [BenchReport.from_json(json.dumps(level)) for level in data["levels"]]
    assert [level.calls for level in levels] == [1, 2]
    assert [level.voice_to_voice_ms.count for level in levels] == [1, 2]
    assert data["p95_over_first_p50"] == LoadSweep(levels).ratios()
    assert data["p95_over_first_p50"][0] == 1.0
    assert "load sweep" in result.output and "2 of 2" in result.output
