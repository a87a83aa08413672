"""The HTTP app: `create_app` puts together the routes (voice/server/routes/, one module per API
area) and the lifespan that sets up the models, the LLM router and one `Switchboard` a process."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import threadpoolctl
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from pipeline.llm.controller import Controller
from pipeline.llm.routing import TierRouter
from pipeline.speaking import make_filler
from pipeline.stt import SpeechToText
from pipeline.tts import TextToSpeech
from pipeline.turn_taking import model as smart_turn
from voice.agents.directory import AgentDirectory, load_agents
from voice.agents.runtime import Agents
from voice.agents.transfer import CallControl
from voice.campaigns.routes import campaigns_api, campaigns_page
from voice.campaigns.runner import CampaignRunner
from voice.campaigns.status import status_api
from voice.campaigns.store import CampaignStore
from voice.cluster.records import WorkerInfo
from voice.cluster.registry import CallRegistry
from voice.cluster.webhooks import WebhookOutbox
from voice.experiments.arms import load_experiment
from voice.llm_sim.serving import running_simulator
from voice.outbound.dialer import Dialer
from voice.outbound.routes import outbound_api
from voice.outbound.sip import SipCalls
from voice.recordings.calls import CallRecordings
from voice.server import metrics
from voice.server.api import APIError, api_error_response
from voice.server.calls import Switchboard
from voice.server.malloc import release_free_memory
from voice.server.resident import reset_peak_rss
from voice.server.routes.calls import calls_api, calls_live_api
from voice.server.routes.console import console_api
from voice.server.routes.experiments import experiments_api
from voice.server.routes.ops import ops_api
from voice.server.routes.phone import phone_api
from voice.server.routes.recordings import recordings_api
from voice.server.routes.sip import SipService
from voice.server.routes.sip_dial import SipDialing
from voice.server.routes.testing import testing_api
from voice.server.routes.webrtc import webrtc_api
from voice.server.settings import Settings
from voice.server.supervision import Supervision
from voice.server.tracing import TurnTracer
from voice.transports.phone.tokens import StreamTokens
from voice.transports.webrtc import restrict_ice_host_addresses

log = logging.getLogger(__name__)


def _warn_if_exposed(settings: Settings) -> None:
    """Say loudly when a worker listens beyond this machine with nothing to keep callers out,
    and whenever the testing API may change what a call's tools answer."""
    if settings.testing.allow_mocks:
        log.warning(
            "TESTING: HOTLINE_TESTING__ALLOW_MOCKS is on: the API token's holder can fix "
            "what HTTP tools answer on any call in progress (a test server's setting)"
        )
    try:
        loopback = ipaddress.ip_address(settings.host).is_loopback
    except ValueError:
        loopback = settings.host == "localhost"
    if loopback:
        return
    if settings.api_token is None:
        log.warning(
            "SECURITY: listening on %s with no HOTLINE_API_TOKEN: anyone who reaches this port "
            "can place WebRTC calls and read, hang up or speak into every call",
            settings.host,
        )
    if settings.stream_secret() is None:
        log.warning(
            "SECURITY: listening on %s with no stream secret: anyone can place phone calls "
            "through /twilio/stream, /telnyx/stream and /vonage/stream (set "
            "HOTLINE_TELEPHONY__TWILIO_AUTH_TOKEN or HOTLINE_TELEPHONY__STREAM_SECRET)",
            settings.host,
        )


def _internal_url(host: str, port: int) -> str:
    """How the other workers reach this one, unless HOTLINE_INTERNAL_URL says."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    return f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"


def agent_directory(settings: Settings) -> AgentDirectory:
    """The agent files of `HOTLINE_AGENTS__DIR` (AgentFileError names each bad field), or the
    built-in agent alone."""
    if settings.agents.dir is None:
        return AgentDirectory({})
    return load_agents(Path(settings.agents.dir), settings.agents.default)


async def _warm_up(models: list[Any], gap_filler: str) -> None:
    """Run each model once (each one once, however many settings share it), and make each
    voice's `gap_filler` (said into a loaded voice's gaps), so the first caller does not pay
    for first-use setup."""
    distinct = {id(model): model for model in models}.values()
    await asyncio.gather(*(asyncio.to_thread(model.warm_up) for model in distinct))
    voices = [model for model in distinct if isinstance(model, TextToSpeech)]
    await asyncio.gather(*(asyncio.to_thread(make_filler, v, gap_filler) for v in voices))
    await asyncio.to_thread(release_free_memory)  # what loading and warming up freed
    reset_peak_rss()  # /healthz's peak: the calls', not the loading's


async def _llm_router(settings: Settings, stack: contextlib.AsyncExitStack) -> TierRouter:
    """The tiers' clients, on the configured provider or else the embedded simulator."""
    base_url = settings.llm.base_url
    if base_url is None:
        base_url = await stack.enter_async_context(running_simulator(settings.simulator))
        log.warning(
            "LLM replies are SIMULATED by Hotline's tier simulator at %s. For a real provider "
            "set HOTLINE_LLM__BASE_URL, HOTLINE_LLM__API_KEY and HOTLINE_LLM__MODEL.",
            base_url,
        )
    controller = Controller(settings.controller, clock=time.monotonic)
    router = TierRouter(settings.llm, controller, base_url=base_url)
    stack.push_async_callback(router.aclose)
    # A connection per tier before the first caller needs one (`pipeline.llm.connections`); not
    # awaited: a provider that does not answer does not hold up the startup.
    connecting = asyncio.gather(*(client.connect() for client in router.clients.values()))
    stack.callback(connecting.cancel)
    return router


async def _call_registry(
    settings: Settings, stack: contextlib.AsyncExitStack
) -> tuple[CallRegistry, WorkerInfo]:
    """This worker in the cluster's Redis (or the embedded one), and the registry of calls."""
    worker = WorkerInfo(
        f"{socket.gethostname()}-{os.getpid()}",
        address=settings.internal_url or _internal_url(settings.host, settings.port),
        capacity=settings.max_calls,
    )
    sessions = await CallRegistry.open(settings.session_settings(), worker)
    await sessions.start()
    stack.push_async_callback(sessions.close)
    return sessions, worker


def _recordings(
    settings: Settings, worker_id: str, stack: contextlib.AsyncExitStack
) -> CallRecordings:
    """Call recording, and its retention task."""
    recordings = CallRecordings(settings.recordings, worker_id)
    stack.callback(recordings.shutdown)  # after the calls: their files are closed first
    retention = asyncio.create_task(recordings.store.run_retention(), name="retention")
    stack.callback(retention.cancel)
    return recordings


def _webhook_outbox(
    settings: Settings,
    sessions: CallRegistry,
    client: httpx.AsyncClient,
    worker_id: str,
    stack: contextlib.AsyncExitStack,
) -> WebhookOutbox | None:
    """The post-call webhook's outbox and its delivery task, when a webhook URL is set."""
    if settings.webhook.url is None:
        return None
    outbox = WebhookOutbox(
        sessions.redis,
        settings.session_settings().key_prefix,
        settings.webhook,
        client,
        worker_id,
        on_outcome=metrics.count_webhook,
    )
    deliveries = asyncio.create_task(outbox.run(), name="webhooks")
    stack.callback(deliveries.cancel)
    return outbox


async def _serve_sip_and_calls_out(
    app: FastAPI,
    stack: contextlib.AsyncExitStack,
    switchboard: Switchboard,
    client: httpx.AsyncClient,
    worker_id: str,
    outbox: WebhookOutbox | None,
) -> None:
    """Direct SIP (when on), placed calls (`POST /calls/outbound`, over SIP too) and the
    campaign runner every worker runs for the cluster."""
    settings: Settings = app.state.settings
    sessions = switchboard.sessions
    app.state.dialer = dialer = Dialer(settings, client, sessions)
    if settings.sip.enabled:
        sip = SipService(switchboard, settings.sip, settings.host)
        await sip.start()
        stack.push_async_callback(sip.close)
        switchboard.sip_transfers = sip
        app.state.sip = sip
        dialer.sip = SipCalls(switchboard, SipDialing(sip), settings.sip.trunks)
        stack.push_async_callback(dialer.sip.close)  # first: CANCELs while SIP is up
    app.state.campaigns = CampaignRunner(
        CampaignStore(sessions.redis, settings.session_settings().key_prefix),
        dialer,
        switchboard,
        settings.campaigns,
        worker_id,
        outbox,
        settings.telephony.public_url,
    )
    campaigning = asyncio.create_task(app.state.campaigns.run(), name="campaigns")
    stack.callback(campaigning.cancel)


def _prepare(app: FastAPI, settings: Settings) -> None:
    """What the settings decide before any model loads: stream tokens, the warning for a
    server exposed without a token, the ICE addresses, numpy's threads."""
    secret = settings.stream_secret()
    ttl_s = settings.telephony.stream_token_ttl_s
    app.state.stream_tokens = StreamTokens(secret, ttl_s) if secret is not None else None
    _warn_if_exposed(settings)
    if settings.webrtc.ice_host_addresses:
        restrict_ice_host_addresses(settings.webrtc.ice_host_addresses)
    # numpy's BLAS on one thread: its matrices here are small (faster-whisper's mel filter bank),
    # and OpenBLAS's idle threads spin, which doubled the CPU of every transcription (70 ms).
    threadpoolctl.threadpool_limits(1, user_api="blas")


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    directory = agent_directory(settings)  # bad agent files stop the server before anything
    _prepare(app, settings)
    stt = SpeechToText.shared(settings.stt)
    phone_stt = SpeechToText.shared(settings.phone_stt)
    tts = TextToSpeech.shared(settings.tts)
    # Smart Turn: one model for every call of every transport (None: the policy has it off).
    turns = smart_turn.shared_if_installed() if settings.turns.policy.model else None
    async with contextlib.AsyncExitStack() as stack:
        tool_client = await stack.enter_async_context(httpx.AsyncClient())
        app.state.http = tool_client  # also how workers ask each other for recordings
        signing = settings.agents.signing_secret
        agents = Agents(
            directory,
            tts=tts,
            tts_settings=settings.tts,
            client=tool_client,
            signing_secret=signing.get_secret_value().encode() if signing is not None else None,
        )
        if settings.warm_up:
            models = [stt, phone_stt, *agents.voices(), *([turns] if turns else [])]
            await _warm_up(models, settings.conversation.gap_filler)
        router = await _llm_router(settings, stack)
        sessions, worker = await _call_registry(settings, stack)
        outbox = _webhook_outbox(settings, sessions, tool_client, worker.worker_id, stack)
        metrics.watch_queues(
            [stt.scheduler, phone_stt.scheduler], [voice.scheduler for voice in agents.voices()]
        )
        recordings = _recordings(settings, worker.worker_id, stack)
        tracer = TurnTracer(settings.tracing)
        stack.push_async_callback(asyncio.to_thread, tracer.shutdown)
        switchboard = Switchboard(
            settings,
            stt=stt,
            phone_stt=phone_stt,
            router=router,
            tts=tts,
            turn_model=turns,
            sessions=sessions,
            agents=agents,
            call_control=CallControl(settings.call_control, tool_client),
            tracer=tracer,
            outbox=outbox,
            recordings=recordings,
        )
        if settings.experiment_file:
            await switchboard.experiments.save(load_experiment(settings.experiment_file))
        control = asyncio.create_task(Supervision(switchboard).serve(), name="control")
        await _serve_sip_and_calls_out(
            app, stack, switchboard, tool_client, worker.worker_id, outbox
        )
        app.state.switchboard = switchboard
        log.info("Hotline ready: worker %s, %d calls at most", worker.worker_id, settings.max_calls)
        try:
            yield
        finally:
            control.cancel()
            await switchboard.shutdown()


def create_app(settings: Settings | None = None) -> FastAPI:
    """The Hotline server app."""
    app = FastAPI(title="Hotline", lifespan=_lifespan)
    app.state.settings = settings or Settings()

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return JSONResponse({"error": "internal error"}, status_code=500)

    app.add_exception_handler(APIError, api_error_response)
    app.include_router(ops_api)
    app.include_router(webrtc_api)
    app.include_router(phone_api)
    app.include_router(outbound_api)  # before calls_api: /calls/outbound is not a call id
    app.include_router(campaigns_api)
    app.include_router(campaigns_page)
    app.include_router(status_api)  # Twilio's and Telnyx's call ends for campaign calls
    app.include_router(calls_api)
    app.include_router(calls_live_api)
    app.include_router(recordings_api)
    app.include_router(console_api)
    app.include_router(experiments_api)
    app.include_router(testing_api)  # 404 unless HOTLINE_TESTING__ALLOW_MOCKS
    return app
