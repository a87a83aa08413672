"""Recording the calls of this process: which calls are recorded (the agent's choice, else the
server's), a recorder per call, and, when a call ends, its file closed, copied to the bucket if
one is set, and described (`RecordingLocation`) for the call's record in Redis, from which any
worker can find it."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from voice.recordings.recorder import CONTENT_TYPE, CallRecorder, RecordingWriter
from voice.recordings.settings import RecordingMode, RecordingSettings
from voice.recordings.storage import RecordingStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecordingLocation:
    """Where a call's recording is: a file on a worker (`worker_id`, `file` in its recordings
    directory) and, once copied, a key in the bucket."""

    worker_id: str
    file: str
    duration_s: float
    bytes: int
    s3_key: str | None = None
    content_type: str = CONTENT_TYPE

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def of(cls, value: object) -> RecordingLocation | None:
        """From a call record's `recording` field (None if absent or not one)."""
        if not isinstance(value, dict):
            return None
        try:
            return cls(
                worker_id=str(value["worker_id"]),
                file=str(value["file"]),
                duration_s=float(value["duration_s"]),
                bytes=int(value["bytes"]),
                s3_key=str(value["s3_key"]) if value.get("s3_key") else None,
            )
        except (KeyError, TypeError, ValueError):
            return None


class CallRecordings:
    """This process's recordings: one shared writer thread, the directory and the bucket."""

    def __init__(self, settings: RecordingSettings, worker_id: str) -> None:
        self.settings = settings
        self.worker_id = worker_id
        self.store = RecordingStore(settings)
        self.writer = RecordingWriter()

    def mode(self, agent_mode: RecordingMode | None) -> RecordingMode:
        return agent_mode if agent_mode is not None else self.settings.mode

    def notice(self, agent_notice: str | None) -> str:
        return agent_notice if agent_notice is not None else self.settings.notice

    def start(self, call_id: str) -> CallRecorder:
        """A recorder for `call_id` (a valid call id), writing to the recordings directory."""
        path = self.store.path_for(call_id)
        return CallRecorder(call_id, path, self.writer, bitrate=self.settings.bitrate)

    async def close(self, recorder: CallRecorder) -> RecordingLocation | None:
        """Close the call's file (off the event loop); None: nothing could be recorded."""
        info = await recorder.close()
        if info.bytes == 0:
            return None
        log.info(
            "call %s: recorded %.1f s (%d bytes)", recorder.call_id, info.duration_s, info.bytes
        )
        return RecordingLocation(
            self.worker_id, info.path.name, round(info.duration_s, 2), info.bytes
        )

    async def copy(self, call_id: str, location: RecordingLocation) -> RecordingLocation:
        """Copy the recording to the bucket, if one is set: the location with its key."""
        if not self.store.bucket_configured:
            return location
        key = await self.store.upload(call_id, self.store.directory / location.file)
        return location if key is None else replace(location, s3_key=key)

    def path(self, location: RecordingLocation) -> Path | None:
        """The recording's file, if it is on this worker."""
        if location.worker_id != self.worker_id or Path(location.file).name != location.file:
            return None
        path = self.store.directory / location.file
        return path if path.is_file() else None

    def shutdown(self) -> None:
        """Wait for the writer thread to finish what it was given."""
        self.writer.shutdown()
