"""Latency experiments on live calls: named experiments, their arms, assignment and storage.

An experiment has arms; each arm is a `Policy` (adaptive within a budget, or a fixed effort
and tier) with a weight. Every new call is assigned an arm by a hash of the experiment name and
the call id (deterministic: the same call id always gets the same arm, on any worker), and the
call's record and every turn record carry the experiment and arm.

Experiments come from a file (``HOTLINE_EXPERIMENT_FILE``, YAML or JSON, activated at start-up)
or from the API (``PUT /experiments/{name}``). They live in Redis, so every worker assigns calls
to the same running experiment. Keys (prefix `p`):
  {p}:experiments              set of experiment names
  {p}:experiment:active        the running experiment's name (absent: none running)
  p:experiment:{<name>}:config JSON of the experiment
  p:experiment:{<name>}:calls  sorted set: call ids by start time (written with the call record)
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import redis.asyncio as aioredis
import yaml
from pydantic import BaseModel, Field, model_validator

from pipeline.llm.routing import Policy
from voice.cluster.records import RegisteredCall
from voice.cluster.store import REDIS_UNREACHABLE, call_keys, decode, experiment_keys, text

log = logging.getLogger(__name__)


class Arm(Policy):
    """One arm: a policy, its name and its share of the calls."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    weight: float = Field(default=1.0, gt=0, description="Relative share of new calls.")


class Experiment(BaseModel):
    """A named experiment with at least one arm."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str = ""
    arms: list[Arm] = Field(min_length=1)

    @model_validator(mode="after")
    def _arm_names_unique(self) -> Experiment:
        if self.name == "active":
            raise ValueError(
                "'active' is reserved (DELETE /experiments/active stops the running one)"
            )
        names = [arm.name for arm in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"arm names must be unique: {names}")
        return self

    def arm(self, name: str) -> Arm:
        return next(arm for arm in self.arms if arm.name == name)

    def assign(self, call_id: str) -> Arm:
        """The call's arm: weighted, and the same for the same call id everywhere."""
        digest = hashlib.sha256(f"{self.name}\0{call_id}".encode()).digest()
        point = int.from_bytes(digest[:8], "big") / 2**64 * sum(a.weight for a in self.arms)
        for arm in self.arms:
            point -= arm.weight
            if point < 0:
                return arm
        return self.arms[-1]


def load_experiment(path: str | Path) -> Experiment:
    """An experiment from a YAML or JSON file (ValueError saying what is wrong)."""
    file = Path(path)
    try:
        data = yaml.safe_load(file.read_text("utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read experiment file {file}: {exc}") from exc
    return Experiment.model_validate(data)


class ExperimentStore:
    """Experiments in the cluster's Redis; keeps the last running one read, for outages."""

    def __init__(self, redis: aioredis.Redis, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix
        self._names = f"{{{prefix}}}:experiments"
        self._active = f"{{{prefix}}}:experiment:active"
        self._running: Experiment | None = None

    async def save(self, experiment: Experiment, *, activate: bool = True) -> None:
        """Store (or replace) an experiment; by default it becomes the running one."""
        config, _ = experiment_keys(self.prefix, experiment.name)
        await self.redis.set(config, experiment.model_dump_json())
        await self.redis.sadd(self._names, experiment.name)
        if activate:
            await self.redis.set(self._active, experiment.name)
            self._running = experiment
            log.info("experiment %s running: arms %s", experiment.name, _arms(experiment))

    async def stop(self) -> str | None:
        """No experiment runs after this (new calls get the default policy); the one stopped."""
        name = await self.redis.get(self._active)
        await self.redis.delete(self._active)
        self._running = None
        return text(name) if name is not None else None

    async def get(self, name: str) -> Experiment | None:
        data = await self.redis.get(experiment_keys(self.prefix, name)[0])
        return None if data is None else Experiment.model_validate_json(text(data))

    async def names(self) -> list[str]:
        return sorted(text(n) for n in await self.redis.smembers(self._names))

    async def active_name(self) -> str | None:
        name = await self.redis.get(self._active)
        return None if name is None else text(name)

    async def running(self) -> Experiment | None:
        """The running experiment; with Redis unreachable, the last one read."""
        try:
            name = await self.active_name()
            self._running = None if name is None else await self.get(name)
        except REDIS_UNREACHABLE as exc:
            log.warning("experiments: Redis unreachable (%s); using the last one read", exc)
        return self._running

    async def call_ids(self, name: str) -> list[str]:
        ids = await self.redis.zrange(experiment_keys(self.prefix, name)[1], 0, -1)
        return [text(c) for c in cast(list[bytes | str], ids)]


async def experiment_records(store: ExperimentStore, name: str) -> list[dict[str, Any]]:
    """Every turn record of the experiment's calls, oldest call first, each with its call id,
    experiment and arm (calls past retention are gone)."""
    records: list[dict[str, Any]] = []
    ids = await store.call_ids(name)
    for start in range(0, len(ids), 100):
        batch = ids[start : start + 100]
        async with store.redis.pipeline(transaction=False) as pipe:
            for call_id in batch:
                record_key, turns_key, _ = call_keys(store.prefix, call_id)
                pipe.hgetall(record_key)
                pipe.xrange(turns_key)
            replies = await pipe.execute()
        for i, call_id in enumerate(batch):
            record, turns = replies[2 * i], replies[2 * i + 1]
            if not record:
                continue
            info = decode(RegisteredCall, record, call_id=call_id)
            for _id, data in turns or []:
                turn = json.loads(text(data.get(b"data", data.get("data", b"{}"))))
                records.append(
                    {"call_id": call_id, **turn, "experiment": info.experiment, "arm": info.arm}
                )
    return records


def to_jsonl(records: Sequence[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)


def _arms(experiment: Experiment) -> str:
    return ", ".join(f"{a.name} ({a.weight:g})" for a in experiment.arms)
