"""The calls of this process: admission, one `Conversation` per call (with its agent, tools and
what they ask of the call), clean hang-up on shutdown. A call's own state: `call_records`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import Any

from pipeline.answering.screening import Screening
from pipeline.conversation import Conversation
from pipeline.llm.routing import Policy, TierRouter
from pipeline.opening import NOTICE_ATTEMPTS
from pipeline.records import TurnRecord
from pipeline.services import SpeechRecognizer, SpeechSynthesizer
from pipeline.tools import CallAction, Toolbox, ToolSpec, Transfer
from pipeline.transport import Transport
from pipeline.turn_taking.end_of_turn import TurnJudge
from voice.agents.agent import Agent
from voice.agents.mocked_tools import mockable
from voice.agents.runtime import Agents
from voice.agents.transfer import CallControl, CallMover
from voice.cluster.records import RegisteredCall, UnknownCall
from voice.cluster.registry import CallRegistry
from voice.cluster.webhooks import WebhookOutbox
from voice.experiments.arms import ExperimentStore
from voice.recordings.calls import CallRecordings
from voice.server import metrics
from voice.server.after_call import AfterCall
from voice.server.call_actions import CallActions
from voice.server.call_records import Call, CallRecord, CallsFull, valid_call_id
from voice.server.settings import Settings
from voice.server.tracing import TurnTracer

log = logging.getLogger(__name__)

_FINISHED_KEPT = 200  # finished calls' records kept in memory for GET /calls/{id}


class Switchboard:
    """Admits calls, runs one conversation each, and hangs them all up on shutdown."""

    def __init__(
        self,
        settings: Settings,
        *,
        stt: SpeechRecognizer,
        phone_stt: SpeechRecognizer,
        router: TierRouter,
        tts: SpeechSynthesizer,
        sessions: CallRegistry,
        turn_model: TurnJudge | None = None,
        agents: Agents | None = None,
        call_control: CallControl | None = None,
        tracer: TurnTracer | None = None,
        outbox: WebhookOutbox | None = None,
        recordings: CallRecordings | None = None,
    ) -> None:
        """`agents`: who answers which call (None: the built-in agent, `tts`'s voice);
        `call_control`: Telnyx's and Vonage's REST APIs, to transfer calls and press keys;
        `outbox`: the post-call webhook (None: off); `recordings`: None: nothing recorded;
        `turn_model`: the process's one end-of-turn model, shared by every call (None: none)."""
        self.settings = settings
        self.agents = agents
        self.call_control = call_control
        self.tracer = tracer
        self.recordings = recordings
        public_url = settings.telephony.public_url
        self.after_call = AfterCall(sessions, recordings, outbox, public_url)
        self.sessions = sessions
        self.actions = CallActions(settings, sessions, call_control)  # end, transfer, keys
        self.experiments = ExperimentStore(sessions.redis, sessions.settings.key_prefix)
        self.stt = stt
        self.phone_stt = phone_stt
        self.router = router
        self.tts = tts
        self.turn_model = turn_model
        # admitted calls' experiment and arm (or None), until they start
        self._arms: dict[str, tuple[str | None, str | None, Policy]] = {}
        self.active: dict[str, Call] = {}
        self.placing: dict[str, Callable[[str], None]] = {}  # placed, not answered: hang-ups
        self.finished: OrderedDict[str, CallRecord] = OrderedDict()  # oldest first
        self._background: set[asyncio.Task[object]] = set()
        self.draining = False
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def sip_transfers(self) -> CallMover | None:
        """How a SIP call is put through (a REFER), once SIP is on."""
        return self.actions.sip_transfers

    @sip_transfers.setter
    def sip_transfers(self, mover: CallMover | None) -> None:
        self.actions.sip_transfers = mover

    @property
    def full(self) -> bool:
        return len(self.active) >= self.settings.max_calls

    async def refusal(self) -> str | None:
        """Why a call arriving now would be refused (as `admit` would say), or None: this
        worker's drain and limit first, then the cluster's (a look in Redis, nothing reserved)."""
        if self.draining:
            return "draining"
        if self.full:
            return "capacity"
        return await self.sessions.refusal()

    async def admit(
        self,
        transport: str,
        preferred: str | None = None,
        *,
        caller: str | None = None,
        callee: str | None = None,
    ) -> str:
        """Admit a call (this worker's limit and the cluster's, atomically in Redis) and return
        its id; CallsFull with the reason if it may not start. Call `start` or `release` next."""
        reason = "draining" if self.draining else "capacity" if self.full else None
        if preferred and not valid_call_id(preferred):
            reason = "bad_call_id"
        call_id = preferred or uuid.uuid4().hex
        if reason is None and (call_id in self.active or call_id in self.finished):
            reason = "duplicate"
        if reason is None:
            experiment = await self.experiments.running()
            arm = experiment.assign(call_id) if experiment else None
            info = RegisteredCall(call_id, transport, caller=caller, callee=callee)
            if experiment is not None and arm is not None:
                info.experiment, info.arm = experiment.name, arm.name
            admission = await self.sessions.admit(info)
            reason = None if admission.accepted else admission.reason
            policy = arm or self.settings.policy
            self._arms[call_id] = (info.experiment, info.arm, policy)
        if reason is not None:
            self._arms.pop(call_id, None)
            metrics.REFUSED.labels(transport=transport, reason=reason).inc()
            raise CallsFull(reason)
        return call_id

    def release(self, call_id: str, reason: str | None = None) -> None:
        """Give back an admission whose call never started (e.g. its SDP was bad)."""
        self._arms.pop(call_id, None)
        self.sessions.end_call(call_id, "failed", reason)

    def get(self, call_id: str) -> Call | CallRecord | None:
        """A call in progress here, or the record of one that ended here (of the last few)."""
        return self.active.get(call_id) or self.finished.get(call_id)

    def start(
        self,
        call_id: str,
        transport: Transport,
        kind: str,
        *,
        caller: str | None = None,
        callee: str | None = None,
        outbound: tuple[str, dict[str, object]] | None = None,
        answering: Screening | None = None,
    ) -> Call:
        """Run a conversation over `transport` until the call ends, with the agent the call
        reaches (its instructions, greeting, voice, policy and tools). `outbound`: Hotline placed
        the call (voice/outbound/), with this agent and metadata; `answering`: machine detection."""
        experiment, arm, policy = self._arms.pop(call_id, (None, None, self.settings.policy))
        ready = self.agents.for_call(kind, callee) if self.agents is not None else None
        if outbound is not None and self.agents is not None:
            ready = self.agents.named(*outbound) or ready  # its variables rendered
        agent = ready.agent if ready is not None else None
        if agent is not None and agent.policy is not None and arm is None:
            policy = agent.policy  # an experiment's arm still wins: it is what is measured
        toolbox = mockable(ready, self.settings.testing.allow_mocks)  # the testing API's
        llm = self.router.for_call(
            policy,
            experiment,
            arm,
            instructions=agent.instructions if agent is not None else None,
            tools=self._offered_tools(toolbox, kind),
        )
        recording, notice = self._recording_of(agent)
        conversation_settings = self.settings.conversation
        if agent is not None and agent.greeting is not None:
            conversation_settings = conversation_settings.model_copy(
                update={"greeting": agent.greeting}
            )
        conversation = Conversation(
            call_id,
            transport,
            stt=self.stt if kind == "webrtc" else self.phone_stt,
            llm=llm,
            tts=ready.tts if ready is not None else self.tts,
            settings=conversation_settings,
            turn_settings=self.settings.turns,
            sentence_settings=self.settings.sentences,
            on_turn=lambda record: self._on_turn(call_id, record),
            on_key=lambda digit: self._on_key(call_id, digit),
            on_event=lambda event: self._on_event(call_id, event),
            tools=toolbox,
            tool_settings=ready.tool_settings if ready is not None else None,
            on_action=lambda action: self._act(call_id, action),
            caller=caller,
            callee=callee,
            notice=notice,
            turn_model=self.turn_model,
            notice_attempts=self.recordings.settings.notice_attempts
            if self.recordings is not None
            else NOTICE_ATTEMPTS,
            answering=answering,
        )
        call = Call(call_id, kind, conversation, caller=caller, callee=callee)
        call.experiment, call.arm, call.agent = experiment, arm, ready
        placed: dict[str, object] = {}
        if outbound is not None:
            call.direction, call.metadata = "outbound", outbound[1]
            placed = {"direction": "outbound", "metadata": outbound[1]}
        if recording == "on":
            self._record(call)
        self.active[call.call_id] = call
        with contextlib.suppress(UnknownCall):  # the registry let it go (say, Redis lost it)
            name = ready.name if ready else "default"
            self.sessions.update_call(call_id, agent=name, **placed)
        self._idle.clear()
        metrics.ADMITTED.labels(transport=kind).inc()
        metrics.ACTIVE_CALLS.set(n := len(self.active))
        call.task = asyncio.create_task(self._run(call, transport), name=f"call-{call.call_id}")
        in_arm = f", experiment {experiment} arm {arm}" if experiment else ""
        log.info("call %s: admitted (%s, agent %s%s), %d active", call_id, kind, name, in_arm, n)
        return call

    def _offered_tools(self, toolbox: Toolbox | None, kind: str) -> list[ToolSpec]:
        """The tools the model is offered on a call of this kind."""
        specs = list(toolbox.specs()) if toolbox is not None else []
        if self.call_control is not None and self.call_control.supports(kind):
            return specs
        # Keys can be pressed through Telnyx's and Vonage's call control only: elsewhere the
        # model is not offered a tool that would only pretend.
        return [spec for spec in specs if spec.name != "send_dtmf"]

    def _recording_of(self, agent: Agent | None) -> tuple[str, str | None]:
        """The call's recording mode (on, off, announce) and the notice said before it."""
        if self.recordings is None:
            return "off", None
        mode = self.recordings.mode(agent.recording if agent is not None else None)
        if mode != "announce":
            return mode, None
        return mode, self.recordings.notice(agent.recording_notice if agent else None)

    async def _run(self, call: Call, transport: Transport) -> None:
        began = time.monotonic()
        try:
            await call.conversation.run()
        except Exception:
            log.exception("call %s: conversation failed", call.call_id)
        finally:
            lasted_s = time.monotonic() - began
            if call.listeners is not None:
                await call.listeners.close()
            await transport.close()
            call.ended_at = time.time()
            location = await self.after_call.close_recording(call.recorder)
            if location is not None:
                call.recording = location.to_dict()
                with contextlib.suppress(UnknownCall):
                    self.sessions.update_call(call.call_id, recording=call.recording)
            self._note_notice(call)  # also when the caller hung up before hearing it
            self.sessions.end_call(call.call_id, reason=call.conversation.end_reason)
            metrics.observe_call_end(call.transport, call.conversation.end_reason, lasted_s)
            self.active.pop(call.call_id, None)
            metrics.ACTIVE_CALLS.set(len(self.active))
            if not self.active:
                self._idle.set()
            record = call.record()  # not the conversation: see CallRecord
            metrics.observe_answering(record.answered_by)  # its final verdict
            if self.tracer is not None:
                self.tracer.record_call(record)  # also a call that ended before any turn
            self.finished[call.call_id] = record
            while len(self.finished) > _FINISHED_KEPT:
                self.finished.popitem(last=False)
            self.spawn(self._after(record))
            log.info("call %s: ended, %d active", call.call_id, len(self.active))

    def _on_key(self, call_id: str, digit: str) -> bool:
        """Keys the switchboard handles itself; the rest go to the conversation. The person
        key says the human message, then puts the caller through to the agent's default
        transfer target, as `transfer_to_human` does (with none, the call is only flagged)."""
        call = self.active.get(call_id)
        if call is None or digit != self.settings.telephony.human_digit:
            return False
        call.wants_human = True
        with contextlib.suppress(UnknownCall):  # any worker's GET /calls/{id} shows it
            self.sessions.update_call(call_id, wants_human=True)
        log.info("call %s: caller asked for a person", call.call_id)
        call.conversation.transport.send_event({"type": "human_requested"})
        target = call.agent.transfer_target() if call.agent is not None else None
        then = Transfer(target, reason="the caller pressed the person key") if target else None
        self.spawn(call.conversation.say(self.settings.telephony.human_message, then=then))
        return True

    async def _act(self, call_id: str, action: CallAction) -> None:
        """What an agent's tool asked of the call, once the reply before it was heard."""
        call = self.active.get(call_id)
        if call is not None:
            await self.actions.carry_out(call, action)

    def _record(self, call: Call) -> None:
        """Start recording the call (its audio from now on)."""
        assert self.recordings is not None
        if call.recorder is None:
            call.recorder = self.recordings.start(call.call_id)
            call.conversation.transport.taps.add(call.recorder)

    async def _after(self, record: CallRecord) -> None:
        """The ended call's recording copied, its webhook queued; the kept record updated."""
        try:
            record = await self.after_call.finish(record)
        except Exception:
            log.exception("call %s: after the call", record.call_id)
            return
        if record.call_id in self.finished:
            self.finished[record.call_id] = record

    async def webhook_outcome(self, call_id: str) -> dict[str, Any] | None:
        return await self.after_call.webhook_outcome(call_id)

    async def transfer_of(self, call_id: str) -> dict[str, str] | None:
        """Where the agent put `call_id` through, if it did: from this worker's calls, else
        from Redis (the call may have run on another worker). RegistryUnavailable if Redis
        cannot be read."""
        local = self.get(call_id)
        if local is not None and local.transfer is not None:
            return local.transfer
        found = await self.sessions.get_call(call_id)
        return found[0].transfer if found is not None else None

    def _on_event(self, call_id: str, event: dict[str, object]) -> None:
        if event.get("type") == "speculation_discarded":
            metrics.SPECULATIONS.inc()
        elif event.get("type") == "notice_played" and (call := self.active.get(call_id)):
            if event.get("heard_in_full"):
                self._record(call)  # announce: recording starts once the notice was heard
            self._note_notice(call)
        if event.get("type") != "turn":  # append_turn publishes the turn along with storing it
            self.sessions.publish(call_id, event)

    def _note_notice(self, call: Call) -> None:
        """The call's record in Redis says what became of its recording notice (any worker's
        `GET /calls/{id}` shows it)."""
        notice = call.notice()
        if notice is not None:
            with contextlib.suppress(UnknownCall):
                self.sessions.update_call(call.call_id, notice=notice)

    def _on_turn(self, call_id: str, record: TurnRecord) -> None:
        metrics.observe_turn(record)
        if self.tracer is not None and self.tracer.enabled:
            call = self.active.get(call_id)
            agent = call.agent.name if call is not None and call.agent is not None else None
            self.tracer.record(call_id, record, agent=agent)
        self.sessions.append_turn(call_id, record.to_dict())  # never waits on Redis

    def spawn(self, work: Coroutine[Any, Any, object]) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self) -> None:
        """Admit no new calls; wait for calls in progress to end (up to the drain timeout),
        then hang up the rest."""
        if not self.draining:
            self.draining = True
            metrics.DRAINING.set(1)
            await self.sessions.set_draining(True)
            log.info("draining: %d calls in progress, no new calls", len(self.active))
        try:
            await asyncio.wait_for(self._idle.wait(), self.settings.drain_timeout_s)
        except TimeoutError:
            log.warning("drain timeout: hanging up %d calls", len(self.active))
            await self.shutdown()
        log.info("drained")

    async def hang_up(self, call_id: str, reason: str) -> bool:
        call = self.active.get(call_id)
        if call is None or call.task is None:
            return False
        call.conversation.transport.hang_up(reason)
        with contextlib.suppress(asyncio.CancelledError):
            await call.task
        return True

    async def shutdown(self) -> None:
        """Hang up every call and wait for each to close."""
        await asyncio.gather(
            *(self.hang_up(call_id, "server shutdown") for call_id in list(self.active))
        )
