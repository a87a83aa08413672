"""RecordingStore against moto's real S3 HTTP server on loopback, and a real directory."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from tests.support.s3 import ACCESS_KEY_ID, BUCKET, SECRET, bucket_client, fake_s3
from voice.recordings.settings import RecordingSettings, S3Settings
from voice.recordings.storage import (
    Part,
    RangeNotSatisfiable,
    RecordingMissing,
    RecordingStore,
)

DAY = 86_400.0
LOGGER = "voice.recordings.storage"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    """moto's S3 server on a free loopback port, with the bucket made."""
    with fake_s3(BUCKET) as url:
        yield url


@pytest.fixture
def closed_endpoint() -> Iterator[str]:
    """A loopback port nothing listens on (bound, so no one else takes it: connections are
    refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def _store(directory: Path, endpoint: str | None, **s3: Any) -> RecordingStore:
    """A store on `directory`; a bucket on `endpoint` unless None. Retries are quick."""
    bucket = (
        S3Settings(
            bucket=BUCKET,
            endpoint_url=endpoint,
            region="us-east-1",
            access_key_id=SecretStr(ACCESS_KEY_ID),
            secret_access_key=SecretStr(SECRET),
            **s3,
        )
        if endpoint is not None
        else S3Settings()
    )
    settings = RecordingSettings(dir=str(directory), s3=bucket)
    return RecordingStore(settings, attempts=3, backoff_s=0.01)


def _recording(store: RecordingStore) -> tuple[str, Path, bytes]:
    """A new call id and its recording file (random bytes) in the store's directory."""
    call_id = f"call-{uuid.uuid4().hex}"
    data = os.urandom(70_000)
    path = store.path_for(call_id)
    path.write_bytes(data)
    return call_id, path, data


def _age(path: Path, days: float, now: float) -> None:
    os.utime(path, (now - days * DAY, now - days * DAY), follow_symlinks=False)


def test_paths_and_keys(tmp_path: Path) -> None:
    store = _store(tmp_path / "rec" / "dings", None)
    assert store.directory == tmp_path / "rec" / "dings"
    assert store.local("c1") is None
    path = store.path_for("c1")
    assert path == tmp_path / "rec" / "dings" / "c1.ogg"
    assert path.parent.is_dir()
    assert store.local("c1") is None
    path.write_bytes(b"OggS")
    assert store.local("c1") == path
    assert store.key_for("a.b:c-1") == "recordings/a.b:c-1.ogg"
    for bad in ("../x", "a/b", "", "..", "a b"):
        with pytest.raises(ValueError):
            store.path_for(bad)


async def test_upload_puts_the_file_at_its_key(tmp_path: Path, endpoint: str) -> None:
    store = _store(tmp_path, endpoint)
    assert store.bucket_configured
    call_id, path, data = _recording(store)

    key = await store.upload(call_id, path)

    assert key == f"recordings/{call_id}.ogg"
    stored = bucket_client(endpoint).get_object(Bucket=BUCKET, Key=key)
    assert stored["ContentType"] == "audio/ogg"
    assert stored["Body"].read() == data
    assert path.read_bytes() == data  # delete_local is off


async def test_fetch_returns_the_uploaded_bytes(tmp_path: Path, endpoint: str) -> None:
    store = _store(tmp_path, endpoint)
    call_id, path, data = _recording(store)
    key = await store.upload(call_id, path)
    assert key is not None

    assert await store.fetch(key) == data


async def test_fetch_of_an_unknown_key_is_missing(tmp_path: Path, endpoint: str) -> None:
    store = _store(tmp_path, endpoint)
    with pytest.raises(RecordingMissing):
        await store.fetch(store.key_for("never-recorded"))


async def test_fetch_range_asks_the_bucket_for_the_bytes(tmp_path: Path, endpoint: str) -> None:
    """A ranged GET (moto answers Range as S3 does: 206, Content-Range)."""
    store = _store(tmp_path, endpoint)
    call_id, path, data = _recording(store)
    key = await store.upload(call_id, path)
    assert key is not None

    assert await store.fetch_range(key, "bytes=100-1099") == Part(data[100:1100], 100, len(data))
    assert await store.fetch_range(key, "bytes=-500") == Part(data[-500:], len(data) - 500, 70_000)
    assert await store.fetch_range(key, "bytes=69990-99999") == Part(data[69990:], 69990, 70_000)
    with pytest.raises(RangeNotSatisfiable) as unsatisfiable:
        await store.fetch_range(key, "bytes=70000-")
    assert unsatisfiable.value.size == len(data)
    with pytest.raises(RecordingMissing):
        await store.fetch_range(store.key_for("never-recorded"), "bytes=0-9")


async def test_delete_local_after_upload(tmp_path: Path, endpoint: str) -> None:
    store = _store(tmp_path, endpoint, delete_local=True)
    call_id, path, data = _recording(store)

    key = await store.upload(call_id, path)

    assert key is not None
    assert not path.exists()
    assert store.local(call_id) is None
    assert await store.fetch(key) == data


async def test_unreachable_bucket_keeps_the_file_and_logs_no_secret(
    tmp_path: Path, closed_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    store = _store(tmp_path, closed_endpoint, delete_local=True)
    call_id, path, data = _recording(store)

    assert await store.upload(call_id, path) is None

    assert path.read_bytes() == data
    ours = [r for r in caplog.records if r.name == LOGGER]
    assert [r.levelno for r in ours] == [logging.WARNING, logging.WARNING, logging.ERROR]
    assert call_id in ours[-1].getMessage()
    assert SECRET not in caplog.text
    assert all(SECRET not in r.getMessage() for r in caplog.records)


async def test_client_error_is_not_retried(
    tmp_path: Path, endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    settings = RecordingSettings(
        dir=str(tmp_path),
        s3=S3Settings(
            bucket="no-such-bucket",
            endpoint_url=endpoint,
            region="us-east-1",
            access_key_id=SecretStr(ACCESS_KEY_ID),
            secret_access_key=SecretStr(SECRET),
            delete_local=True,
        ),
    )
    store = RecordingStore(settings, attempts=3, backoff_s=0.01)
    call_id, path, _ = _recording(store)

    assert await store.upload(call_id, path) is None

    assert path.exists()
    ours = [r for r in caplog.records if r.name == LOGGER]
    assert [r.levelno for r in ours] == [logging.ERROR]
    assert "NoSuchBucket" in ours[0].getMessage()


async def test_no_bucket_needs_no_boto3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # `import boto3` now fails
    store = _store(tmp_path, None)
    assert not store.bucket_configured
    call_id, path, _ = _recording(store)

    assert await store.upload(call_id, path) is None
    assert path.exists()
    with pytest.raises(RecordingMissing):
        await store.fetch(store.key_for(call_id))


async def test_bucket_without_boto3_says_what_to_install(
    tmp_path: Path, endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)
    store = _store(tmp_path, endpoint)
    call_id, path, _ = _recording(store)

    with pytest.raises(RuntimeError, match=r"pip install 'hotline\[s3\]'"):
        await store.upload(call_id, path)


async def test_sweep_deletes_only_old_recordings(tmp_path: Path) -> None:
    directory = tmp_path / "recordings"
    outside = tmp_path / "outside.ogg"
    store = _store(directory, None)  # retention_days = 30
    now = time.time()
    old, new, other = store.path_for("old"), store.path_for("new"), directory / "old.txt"
    for path in (old, new, other, outside):
        path.write_bytes(b"OggS")
    (directory / "sub.ogg").mkdir()
    link = directory / "link.ogg"
    link.symlink_to(outside)
    for path in (old, other, outside, link, directory / "sub.ogg"):
        _age(path, 31, now)
    _age(new, 29, now)

    assert await store.sweep(now=now) == 1

    assert not old.exists()
    assert new.exists() and other.exists() and outside.exists()
    assert link.is_symlink() and (directory / "sub.ogg").is_dir()
    assert await store.sweep(now=now) == 0
    assert await store.sweep(now=now + 2 * DAY) == 1  # `new` is now 31 days old
    assert not new.exists()


async def test_sweep_of_a_missing_directory(tmp_path: Path) -> None:
    assert await _store(tmp_path / "nowhere", None).sweep() == 0


class _ObservedStore(RecordingStore):
    """Counts sweeps and says when one has finished; the first `failures` sweeps fail."""

    def __init__(self, settings: RecordingSettings, failures: int = 0) -> None:
        super().__init__(settings)
        self.sweeps = 0
        self.failures = failures
        self.swept = asyncio.Event()

    async def sweep(self, now: float | None = None) -> int:
        self.sweeps += 1
        if self.sweeps <= self.failures:
            raise OSError("disk on fire")
        deleted = await super().sweep(now)
        self.swept.set()
        return deleted


async def test_run_retention_deletes_an_old_recording(tmp_path: Path) -> None:
    store = _ObservedStore(RecordingSettings(dir=str(tmp_path)))
    old = store.path_for("old")
    old.write_bytes(b"OggS")
    _age(old, 31, time.time())

    task = asyncio.create_task(store.run_retention(every_s=3600))
    try:
        await asyncio.wait_for(store.swept.wait(), timeout=10)
        assert not old.exists()
        assert store.sweeps == 1
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_run_retention_goes_on_after_a_failed_sweep(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = _ObservedStore(RecordingSettings(dir=str(tmp_path)), failures=1)
    old = store.path_for("old")
    old.write_bytes(b"OggS")
    _age(old, 31, time.time())

    task = asyncio.create_task(store.run_retention(every_s=0))
    try:
        await asyncio.wait_for(store.swept.wait(), timeout=10)
        assert not old.exists()
        assert store.sweeps >= 2  # every_s=0: a third may have started
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    failed = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.ERROR]
    assert len(failed) == 1 and failed[0].exc_info is not None
