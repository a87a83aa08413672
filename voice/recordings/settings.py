"""What `HOTLINE_RECORDINGS__*` can say: whether calls are recorded, where, for how long."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, Field, SecretStr


def _yaml_switch(value: object) -> object:
    # YAML 1.1 reads an unquoted on/off as true/false.
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


RecordingMode = Annotated[Literal["on", "off", "announce"], BeforeValidator(_yaml_switch)]
"""on: every call is recorded; off: none; announce: a notice is said, then recording starts."""


class S3Settings(BaseModel):
    """An S3-compatible bucket (AWS S3, MinIO, Ceph, R2...) each finished recording is copied
    to. Unset bucket: recordings stay in the directory only."""

    bucket: str | None = None
    prefix: str = "recordings/"  # key = prefix + call id + ".ogg"
    endpoint_url: str | None = None  # None: AWS; e.g. http://minio:9000
    region: str | None = None
    # None: boto3's own chain (environment, ~/.aws, instance role)
    access_key_id: SecretStr | None = None
    secret_access_key: SecretStr | None = None
    # Remove the local file once the bucket holds it (the bucket's lifecycle rules then say
    # how long it is kept).
    delete_local: bool = False


class RecordingSettings(BaseModel):
    """Call recordings: one stereo Ogg/Opus file per call (caller left, what the caller heard
    right), written as the call goes."""

    # on: every call; off: none; announce: `notice` is spoken first, recording starts once it
    # has played. An agent file may say otherwise for its calls (`recording:`).
    mode: RecordingMode = "on"
    dir: str = "recordings"
    retention_days: float = Field(default=30.0, gt=0)  # local files older than this are deleted
    # Opus, both channels together. Below about 40 kb/s libopus narrows a wideband stereo image
    # (measured: the bot's speech at -44 dB in the caller's channel at 32 kb/s, enough for
    # Whisper to hear it there; none at 48 kb/s). About 21 MB an hour.
    bitrate: int = Field(default=48_000, ge=40_000, le=256_000)
    notice: str = "This call is recorded."
    # A notice the caller cut short (an interruption, not an "mm-hm") is said again in full at
    # the start of the next reply; after this many tries cut short, the call is not recorded.
    notice_attempts: int = Field(default=2, ge=1, le=10)
    s3: S3Settings = Field(default_factory=S3Settings)
