"""Recordings on live phone calls: two real `hotline serve` workers sharing a real Redis, the
faithful Twilio caller speaking real speech, an S3 bucket on loopback (moto's S3 server).
A call on worker A is recorded in stereo (caller left, what the caller heard right), served
by worker B (which asks A), copied to the bucket and served from there once A's file is gone;
an agent may announce the recording first, or not record at all."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pipeline.stt import SpeechToText
from pipeline.transport import PCM, SAMPLE_RATE
from tests.support.recordings import channels
from tests.support.redis_server import RedisServer
from tests.support.s3 import ACCESS_KEY_ID, BUCKET, SECRET, bucket_client, fake_s3
from tests.support.server import Server, start_server, stop_server
from tests.support.speech import concat, piper, silence
from voice.devtools.twilio_call import place_twilio_call

pytestmark = pytest.mark.slow

TOKEN = "recordings-live-api-token-77aa"
TWILIO_TOKEN = "recordings-live-twilio-auth-token"
RECORDED = "+15552220001"
ANNOUNCED = "+15552220002"
UNRECORDED = "+15552220003"
GREETING = "Welcome to the garden centre."
NOTICE = "Calls to this line are recorded for training."


def agent(name: str, number: str, recording: str) -> str:
    return f"""
name: {name}
numbers: ["{number}"]
greeting: "{GREETING}"
recording: {recording}
recording_notice: "{NOTICE}"
"""


@pytest.fixture(scope="module")
def bucket() -> Iterator[str]:
    with fake_s3(BUCKET) as url:
        yield url


@pytest.fixture(scope="module")
def workers(
    redis_server: RedisServer, bucket: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, Server, Path]]:
    agents = tmp_path_factory.mktemp("agents")
    for name, number, mode in [
        ("recorded", RECORDED, "on"),
        ("announced", ANNOUNCED, "announce"),
        ("unrecorded", UNRECORDED, "off"),
    ]:
        (agents / f"{name}.yaml").write_text(agent(name, number, mode), encoding="utf-8")
    a_dir = tmp_path_factory.mktemp("recordings-a")
    shared = {
        "HOTLINE_REDIS_URL": redis_server.url,
        "HOTLINE_API_TOKEN": TOKEN,
        "HOTLINE_TELEPHONY__TWILIO_AUTH_TOKEN": TWILIO_TOKEN,
        "HOTLINE_AGENTS__DIR": str(agents),
    }
    a = start_server(
        {
            **shared,
            "HOTLINE_RECORDINGS__DIR": str(a_dir),
            "HOTLINE_RECORDINGS__S3__BUCKET": BUCKET,
            "HOTLINE_RECORDINGS__S3__ENDPOINT_URL": bucket,
            "HOTLINE_RECORDINGS__S3__REGION": "us-east-1",
            "HOTLINE_RECORDINGS__S3__ACCESS_KEY_ID": ACCESS_KEY_ID,
            "HOTLINE_RECORDINGS__S3__SECRET_ACCESS_KEY": SECRET,
        }
    )
    try:
        b = start_server(shared)  # no bucket: B must ask A for A's recordings
    except Exception:
        stop_server(a)
        raise
    yield a, b, a_dir
    stop_server(b)
    stop_server(a)


def api(server: Server, path: str, token: str | None = TOKEN) -> httpx.Response:
    """GET `path` (blocking: nothing else runs on the test's loop meanwhile)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(f"{server.url}{path}", headers=headers, timeout=30)


def until(check: Any, within_s: float = 20.0) -> Any:
    """`check()`'s first truthy value, asked until `within_s` has passed."""
    deadline = time.monotonic() + within_s
    while (found := check()) is None or found is False:
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.1)
    return found


def words(pcm: PCM) -> set[str]:
    text = SpeechToText.shared().transcribe_blocking(pcm).text
    return set(re.findall(r"[a-z]+", text.lower()))


async def test_a_call_is_recorded_in_stereo_and_served_by_any_worker(
    workers: tuple[Server, Server, Path], bucket: str, tmp_path: Path
) -> None:
    a, b, a_dir = workers
    # the caller waits out the greeting, then speaks
    speech = concat(silence(3000), piper("I would like to buy some tulip bulbs."), silence(200))
    result = await place_twilio_call(
        a.url, [speech], parameters={"to": RECORDED}, auth_token=TWILIO_TOKEN, quiet_s=1.5
    )
    assert result.rejected is None and not result.violations
    call_id = result.call_id
    detail = until(lambda: (d := api(a, f"/calls/{call_id}").json()).get("recording") and d)
    recording = detail["recording"]
    assert recording["url"] == f"/calls/{call_id}/recording"
    assert recording["content_type"] == "audio/ogg" and recording["bytes"] > 1000
    # the file is on A; B has no bucket and no file: it asks A
    on_a = a_dir / f"{call_id}.ogg"
    assert on_a.is_file()
    served = api(b, recording["url"])
    assert served.status_code == 200 and served.headers["content-type"] == "audio/ogg"
    assert served.content == on_a.read_bytes()
    left, right = channels(served.content)
    assert abs(left.size / SAMPLE_RATE - recording["duration_s"]) < 0.5
    # left: what the caller said; right: what the caller heard (greeting, then the reply)
    said, heard = words(left), words(right)
    print(f"\nleft: {sorted(said)}\nright: {sorted(heard)}")
    assert {"buy", "tulip", "bulbs"} & said, said  # tiny.en at 8 kHz: "some fewer balls"
    assert {"welcome", "garden"} & heard, heard
    assert not {"welcome", "garden"} & said
    # copied to the bucket; the call's record in Redis says so (B reads it there)
    key = until(lambda: (api(b, f"/calls/{call_id}").json().get("recording") or {}).get("s3_key"))
    stored = bucket_client(bucket).get_object(Bucket=BUCKET, Key=key)
    assert stored["Body"].read() == on_a.read_bytes()
    assert stored["ContentType"] == "audio/ogg"
    # A's file gone (retention, a disk replaced): A serves the bucket's copy
    on_a.unlink()
    again = api(a, recording["url"])
    assert again.status_code == 200 and again.content == served.content


async def test_announce_says_the_notice_then_records(
    workers: tuple[Server, Server, Path], tmp_path: Path
) -> None:
    a, _, _ = workers
    speech = concat(silence(6000), piper("Do you sell roses?"), silence(200))
    result = await place_twilio_call(
        a.url, [speech], parameters={"to": ANNOUNCED}, auth_token=TWILIO_TOKEN, quiet_s=1.5
    )
    assert result.rejected is None
    detail = until(lambda: (d := api(a, f"/calls/{result.call_id}").json()).get("recording") and d)
    # the caller heard the notice first, whole (tiny.en on the 8 kHz line mishears it: the
    # server's record of what was played says so) ...
    assert detail["history"][:2] == [
        {"role": "assistant", "content": NOTICE},
        {"role": "assistant", "content": GREETING},
    ]
    url = detail["recording"]["url"]
    left, right = channels(api(a, url).content)
    # ... and the recording began after it: the greeting is in it, the notice is not
    heard = words(right)
    assert {"welcome", "garden"} & heard, heard
    assert not {"recorded", "training"} & heard
    assert {"sell", "roses"} & words(left)


async def test_an_agent_may_record_nothing(workers: tuple[Server, Server, Path]) -> None:
    a, b, a_dir = workers
    speech = concat(silence(300), piper("Are you open on Sunday?"), silence(200))
    result = await place_twilio_call(
        a.url, [speech], parameters={"to": UNRECORDED}, auth_token=TWILIO_TOKEN, quiet_s=1.0
    )
    assert result.rejected is None
    detail = until(
        lambda: (d := api(b, f"/calls/{result.call_id}").json())["state"] == "ended" and d
    )
    assert detail["recording"] is None
    assert not (a_dir / f"{result.call_id}.ogg").exists()
    missing = api(b, f"/calls/{result.call_id}/recording")
    assert missing.status_code == 404 and "no recording" in missing.json()["error"]
    unauthorized = api(b, f"/calls/{result.call_id}/recording", token=None)
    assert unauthorized.status_code == 401
