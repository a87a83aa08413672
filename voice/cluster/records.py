"""What the cluster registry holds: its settings, worker and call records, admission results
and errors. `voice.cluster.registry` keeps them in Redis."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pydantic import BaseModel

TERMINAL_STATES = frozenset({"ended", "lost", "failed"})


class RegistrySettings(BaseModel):
    """Where the cluster's shared state lives and how long it is kept."""

    # None: an in-process store (one process is the whole cluster). Otherwise redis://,
    # rediss://, or redis+sentinel://[:password@]host:port[,host:port]/[master[/db]].
    redis_url: str | None = None
    cluster: bool = False  # redis_url names a Redis Cluster node
    sentinel_master: str | None = None  # master name when the sentinel URL has none
    key_prefix: str = "hotline"
    heartbeat_s: float = 1.0
    worker_ttl_s: float = 3.0  # a worker silent this long is dead; its calls become `lost`
    retention_s: int = 7 * 24 * 3600  # call records and streams, after their last write
    cluster_limit: int | None = None  # concurrent calls across all workers; None: no limit
    fail_open: bool = False  # admit calls while Redis is unreachable
    socket_timeout_s: float = 1.0  # every Redis command, so an outage never blocks a call
    outbox_limit: int = 10_000  # writes kept in memory during an outage (events dropped first)


@dataclass
class WorkerInfo:
    worker_id: str
    address: str = ""
    capacity: int = 8  # this worker's concurrent-call limit
    active_calls: int = 0
    draining: bool = False
    started_at: float = field(default_factory=time.time)
    heartbeat_at: float = 0.0


@dataclass
class RegisteredCall:
    call_id: str
    transport: str = ""
    worker_id: str = ""
    caller: str | None = None
    callee: str | None = None
    state: str = "active"
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    experiment: str | None = None  # the experiment the call is in, if any
    arm: str | None = None  # its arm
    end_reason: str | None = None  # why it ended (caller hung up, no audio for 10 s, ...)
    # Where the agent put the caller through: {"to", "reason", "summary"}; read by the provider
    # webhook that asks what to do once the bot's stream has ended (Twilio `<Connect action>`).
    transfer: dict[str, str] | None = None
    agent: str | None = None  # the agent that answers
    wants_human: bool = False  # it asked for a person (the key) or was put through to one
    # Where its recording is: {"worker_id", "file", "duration_s", "bytes", "s3_key", ...}
    # (voice.recordings.calls.RecordingLocation), once the call has ended.
    recording: dict[str, object] | None = None
    # What became of the recording notice (voice.server.call_records.notice_view), if it had one.
    notice: dict[str, object] | None = None
    direction: str = "inbound"  # or "outbound": Hotline placed it (voice/outbound/)
    metadata: dict[str, object] | None = None  # an outbound call's, as its request gave it
    # A placed call with machine detection: who answered {"result", "basis", "ms", "beep_ms"}.
    answered_by: dict[str, object] | None = None
    # A call placed over SIP: how its INVITE went {"cause", "sip_status", "sip_reason", "trunk",
    # "progress_ms", "answer_ms", "early_media"} (voice/outbound/sip.py).
    outcome: dict[str, object] | None = None


@dataclass(frozen=True)
class Admission:
    accepted: bool
    reason: str  # ok | draining | duplicate | worker_full | cluster_full | redis_unavailable


class RegistryUnavailable(Exception):
    """Redis could not be reached for a read or a control message."""


class UnknownCall(LookupError):
    """No active call has this id."""


class NoAck(Exception):
    """The worker that owns the call did not acknowledge in time."""
