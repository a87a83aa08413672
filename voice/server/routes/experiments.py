"""The experiments API, on every worker (experiments live in Redis). Bearer token when set.

GET    /experiments                 the running experiment's name and every stored one
PUT    /experiments/{name}          store an experiment (body: arms, description) and run it
DELETE /experiments/active          stop: new calls get the default policy
GET    /experiments/{name}          one experiment
GET    /experiments/{name}/records  its turn records, one JSON object a line
GET    /experiments/{name}/report   its report as text (`hotline experiments report`)
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import ValidationError

from voice.cluster.store import REDIS_UNREACHABLE
from voice.experiments.arms import Experiment, ExperimentStore, experiment_records, to_jsonl
from voice.experiments.report import build_report, render_report
from voice.server.api import error, read_json_body
from voice.server.auth import require_token
from voice.server.routes import switchboard

log = logging.getLogger(__name__)

experiments_api = APIRouter(dependencies=[Depends(require_token)])


def _store(request: Request) -> ExperimentStore:
    store: ExperimentStore = switchboard(request).experiments
    return store


def _unavailable(exc: BaseException) -> JSONResponse:
    return error(503, f"experiment store unavailable: {exc}")


@experiments_api.get("/experiments", response_model=None)
async def list_experiments(request: Request) -> dict[str, object] | JSONResponse:
    store = _store(request)
    try:
        names, running = await store.names(), await store.active_name()
        found = [await store.get(name) for name in names]
    except REDIS_UNREACHABLE as exc:
        return _unavailable(exc)
    experiments = [e.model_dump(mode="json") for e in found if e is not None]
    return {"running": running, "experiments": experiments}


@experiments_api.put("/experiments/{name}", response_model=None)
async def put_experiment(name: str, request: Request) -> dict[str, object] | JSONResponse:
    """Store the experiment and make it the one new calls are assigned to."""
    data = await read_json_body(request, request.app.state.settings.max_body_bytes)
    if data.setdefault("name", name) != name:
        return error(400, f"the body names experiment {data['name']!r}, the URL {name!r}")
    try:
        experiment = Experiment.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()
        )
        return error(400, f"invalid experiment: {problems}")
    try:
        await _store(request).save(experiment)
    except REDIS_UNREACHABLE as exc:
        return _unavailable(exc)
    return {"running": experiment.name, "experiment": experiment.model_dump(mode="json")}


@experiments_api.delete("/experiments/active", response_model=None)
async def stop_experiment(request: Request) -> dict[str, object] | JSONResponse:
    try:
        stopped = await _store(request).stop()
    except REDIS_UNREACHABLE as exc:
        return _unavailable(exc)
    log.info("experiment %s stopped", stopped)
    return {"stopped": stopped}


@experiments_api.get("/experiments/{name}", response_model=None)
async def get_experiment(name: str, request: Request) -> dict[str, object] | JSONResponse:
    try:
        experiment = await _store(request).get(name)
    except REDIS_UNREACHABLE as exc:
        return _unavailable(exc)
    if experiment is None:
        return error(404, f"no experiment {name!r}")
    return experiment.model_dump(mode="json")


async def _records(request: Request, name: str) -> list[dict[str, Any]] | Response:
    """The experiment's turn records, or the error response to send instead."""
    try:
        return await experiment_records(_store(request), name)
    except REDIS_UNREACHABLE as exc:
        return _unavailable(exc)


@experiments_api.get("/experiments/{name}/records", response_model=None)
async def experiment_turns(name: str, request: Request) -> Response:
    records = await _records(request, name)
    if isinstance(records, Response):
        return records
    return PlainTextResponse(to_jsonl(records), media_type="application/x-ndjson")


@experiments_api.get("/experiments/{name}/report", response_model=None)
async def experiment_report(name: str, request: Request) -> Response:
    records = await _records(request, name)
    if isinstance(records, Response):
        return records
    try:
        report = build_report(records, name)
    except ValueError as exc:
        return error(404, str(exc))
    return PlainTextResponse(render_report(report))
