"""Where finished call recordings are kept: `<dir>/<call_id>.ogg` on local disk, and a copy in
an S3-compatible bucket when `HOTLINE_RECORDINGS__S3__BUCKET` is set.

Local retention: `sweep()` (run periodically by `run_retention()`) deletes `*.ogg` files in the
directory older than `retention_days`.

Bucket retention is *not* handled here: Hotline only writes objects under `s3.prefix` and never
deletes them. How long the bucket keeps them is its lifecycle rules' business, e.g. an
expiration rule on the prefix (AWS `put-bucket-lifecycle-configuration`, MinIO
`mc ilm rule add --expire-days 30 ALIAS/BUCKET --prefix recordings/`).

boto3 is imported only once a bucket is used, so the server runs without it (`pip install
'hotline[s3]'` adds it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from voice.recordings.settings import RecordingSettings

log = logging.getLogger(__name__)

T = TypeVar("T")

SUFFIX = ".ogg"
CONTENT_TYPE = "audio/ogg"
_CALL_ID = re.compile(r"[A-Za-z0-9._:-]+")
# Throttling answers some S3-compatible stores give with a 4xx status.
_RETRYABLE_CODES = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "TooManyRequests"}
)
_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_CONTENT_RANGE = re.compile(r"bytes ([0-9]+)-([0-9]+)/([0-9]+)")


class RecordingMissing(LookupError):
    """No such recording (in the directory, or in the bucket)."""


class RangeNotSatisfiable(LookupError):
    """The bucket has no byte of the object in the range asked for; `size`: the object's."""

    def __init__(self, key: str, size: int) -> None:
        super().__init__(f"{key}: no byte of {size} in the range asked for")
        self.size = size


@dataclass(frozen=True)
class Part:
    """Bytes `start` to `start + len(body)` of an object of `size` bytes."""

    body: bytes
    start: int
    size: int


class RecordingStore:
    """The recordings directory and, if configured, the bucket each recording is copied to."""

    def __init__(
        self, settings: RecordingSettings, *, attempts: int = 4, backoff_s: float = 0.5
    ) -> None:
        """`attempts`: tries per bucket request; `backoff_s`: wait before the second try,
        doubled before each further one."""
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        self._settings = settings
        self._directory = Path(settings.dir).expanduser()
        self._attempts = attempts
        self._backoff_s = backoff_s
        self._client_lock = threading.Lock()
        self._s3_client: Any = None

    @property
    def directory(self) -> Path:
        """Where recordings are written."""
        return self._directory

    @property
    def bucket_configured(self) -> bool:
        """Whether recordings are copied to a bucket."""
        return self._settings.s3.bucket is not None

    def path_for(self, call_id: str) -> Path:
        """Where a call's recording goes; creates the directory."""
        path = self._file(call_id)
        self._directory.mkdir(parents=True, exist_ok=True)
        return path

    def local(self, call_id: str) -> Path | None:
        """The call's recording in the directory, if there is one (a regular file, no link)."""
        path = self._file(call_id)
        return path if path.is_file() and not path.is_symlink() else None

    def key_for(self, call_id: str) -> str:
        """The call's object key in the bucket."""
        return f"{self._settings.s3.prefix}{_checked(call_id)}{SUFFIX}"

    async def upload(self, call_id: str, path: Path) -> str | None:
        """Copy a finished recording to the bucket; its key, or None (no bucket, or every try
        failed: logged). With `s3.delete_local`, the local file goes once the bucket has it.

        Raises only when the bucket settings can't work at all (no boto3: RuntimeError)."""
        bucket = self._settings.s3.bucket
        if bucket is None:
            return None
        key = self.key_for(call_id)
        await asyncio.to_thread(self._client)  # a missing boto3 is an error, not a failed try
        try:
            await self._with_retries(f"upload of {key}", self._put, bucket, key, path)
        except Exception as exc:
            log.error(
                "recording %s not copied to bucket %s as %s: %s",
                call_id,
                bucket,
                key,
                _describe(exc),
            )
            return None
        log.info("recording %s copied to bucket %s as %s", call_id, bucket, key)
        if self._settings.s3.delete_local:
            try:
                await asyncio.to_thread(path.unlink, missing_ok=True)
            except OSError as exc:
                log.warning("recording %s: local copy %s not deleted: %s", call_id, path, exc)
        return key

    async def fetch(self, key: str) -> bytes:
        """An object's bytes from the bucket. RecordingMissing: no bucket, or no such key."""
        bucket = self._settings.s3.bucket
        if bucket is None:
            raise RecordingMissing(key)
        await asyncio.to_thread(self._client)
        return await self._with_retries(f"fetch of {key}", self._get, bucket, key)

    async def fetch_range(self, key: str, byte_range: str) -> Part:
        """Part of an object, by a ranged GET: `byte_range` as in an HTTP Range header
        ("bytes=0-99", "bytes=-500"). A store that ignores it sends the whole object (a Part
        from 0). RecordingMissing: no bucket, or no such key; RangeNotSatisfiable: no byte of
        the object is in the range."""
        bucket = self._settings.s3.bucket
        if bucket is None:
            raise RecordingMissing(key)
        await asyncio.to_thread(self._client)
        what = f"fetch of {key} ({byte_range})"
        return await self._with_retries(what, self._get_range, bucket, key, byte_range)

    async def sweep(self, now: float | None = None) -> int:
        """Delete local recordings older than `retention_days`; how many were deleted."""
        cutoff = (time.time() if now is None else now) - self._settings.retention_days * 86_400
        deleted = await asyncio.to_thread(self._delete_older_than, cutoff)
        if deleted:
            log.info(
                "deleted %d recording(s) older than %g days from %s",
                deleted,
                self._settings.retention_days,
                self._directory,
            )
        return deleted

    async def run_retention(self, every_s: float = 3600.0) -> None:
        """sweep() now and then every `every_s` seconds, until cancelled."""
        while True:
            try:
                await self.sweep()
            except Exception:
                log.exception("recording retention sweep of %s failed", self._directory)
            await asyncio.sleep(every_s)

    # -- local files

    def _file(self, call_id: str) -> Path:
        return self._directory / f"{_checked(call_id)}{SUFFIX}"

    def _delete_older_than(self, cutoff: float) -> int:
        """Delete regular `*.ogg` files directly in the directory last modified before `cutoff`;
        links and subdirectories are left alone."""
        try:
            entries = list(os.scandir(self._directory))
        except FileNotFoundError:
            return 0
        deleted = 0
        for entry in entries:
            if not entry.name.endswith(SUFFIX):
                continue
            try:
                if not entry.is_file(follow_symlinks=False):
                    continue
                if entry.stat(follow_symlinks=False).st_mtime >= cutoff:
                    continue
                os.unlink(entry.path)
            except FileNotFoundError:
                continue  # gone meanwhile
            except OSError as exc:
                log.warning("old recording %s not deleted: %s", entry.path, exc)
                continue
            deleted += 1
        return deleted

    # -- bucket (these run in a worker thread)

    def _client(self) -> Any:
        """The boto3 S3 client, made on first use."""
        with self._client_lock:
            if self._s3_client is None:
                self._s3_client = self._make_client()
            return self._s3_client

    def _make_client(self) -> Any:
        try:
            import boto3  # type: ignore[import-untyped]
            from botocore.config import Config  # type: ignore[import-untyped]
        except ImportError as exc:
            raise RuntimeError(
                "HOTLINE_RECORDINGS__S3__BUCKET is set but boto3 is not installed: "
                "pip install 'hotline[s3]'"
            ) from exc
        s3 = self._settings.s3
        options: dict[str, Any] = {}
        if s3.endpoint_url is not None:
            options["endpoint_url"] = s3.endpoint_url
        if s3.region is not None:
            options["region_name"] = s3.region
        if s3.access_key_id is not None:
            options["aws_access_key_id"] = s3.access_key_id.get_secret_value()
        if s3.secret_access_key is not None:
            options["aws_secret_access_key"] = s3.secret_access_key.get_secret_value()
        config: dict[str, Any] = {"retries": {"total_max_attempts": 1}}  # we retry ourselves
        if s3.endpoint_url is not None:
            # Not every S3-compatible store takes the checksums botocore >= 1.36 adds by default.
            config["request_checksum_calculation"] = "when_required"
            config["response_checksum_validation"] = "when_required"
        # A session of its own: boto3's default session is not safe to share between threads.
        session = boto3.session.Session()
        return session.client("s3", config=Config(**config), **options)

    def _put(self, bucket: str, key: str, path: Path) -> None:
        with path.open("rb") as body:
            self._client().put_object(Bucket=bucket, Key=key, Body=body, ContentType=CONTENT_TYPE)

    def _get(self, bucket: str, key: str) -> bytes:
        from botocore.exceptions import ClientError  # type: ignore[import-untyped]

        try:
            answer = self._client().get_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            if _error_code(exc) in _MISSING_CODES:
                raise RecordingMissing(key) from exc
            raise
        return _read(answer["Body"])

    def _get_range(self, bucket: str, key: str, byte_range: str) -> Part:
        from botocore.exceptions import ClientError

        try:
            answer = self._client().get_object(Bucket=bucket, Key=key, Range=byte_range)
        except ClientError as exc:
            code = _error_code(exc)
            if code in _MISSING_CODES:
                raise RecordingMissing(key) from exc
            if code == "InvalidRange":
                raise RangeNotSatisfiable(key, self._size(exc, bucket, key)) from exc
            raise
        body = _read(answer["Body"])
        found = _CONTENT_RANGE.fullmatch(answer.get("ContentRange") or "")
        if found is None:
            return Part(body, 0, len(body))  # the whole object
        return Part(body, int(found[1]), int(found[3]))

    def _size(self, invalid_range: Any, bucket: str, key: str) -> int:
        """The object's size: S3 says it in its InvalidRange error; else asked for."""
        said = invalid_range.response.get("Error", {}).get("ActualObjectSize")
        if said is not None and str(said).isdigit():
            return int(said)
        return int(self._client().head_object(Bucket=bucket, Key=key)["ContentLength"])

    async def _with_retries(self, what: str, call: Callable[..., T], *args: Any) -> T:
        """`call(*args)` in a thread, tried again after a transient failure."""
        for attempt in range(1, self._attempts + 1):
            try:
                return await asyncio.to_thread(call, *args)
            except Exception as exc:
                if attempt == self._attempts or not _transient(exc):
                    raise
                delay = self._backoff_s * 2 ** (attempt - 1)
                log.warning(
                    "%s failed (try %d of %d), again in %gs: %s",
                    what,
                    attempt,
                    self._attempts,
                    delay,
                    _describe(exc),
                )
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")


def _checked(call_id: str) -> str:
    """The call id, if it is one (the caller validates; this only keeps paths safe)."""
    if not _CALL_ID.fullmatch(call_id) or call_id.strip(".") == "":
        raise ValueError(f"not a call id: {call_id!r}")
    return call_id


def _read(body: Any) -> bytes:
    """All of a get_object answer's streaming body, closed after."""
    try:
        data: bytes = body.read()
    finally:
        body.close()
    return data


def _error_code(exc: Any) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


def _transient(exc: BaseException) -> bool:
    """Whether trying a bucket request again may help: connection trouble, 5xx, throttling."""
    from botocore.exceptions import ClientError, ConnectionError, HTTPClientError

    if isinstance(exc, ConnectionError | HTTPClientError):
        return True
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return int(status) >= 500 or int(status) == 429 or _error_code(exc) in _RETRYABLE_CODES
    return False


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
