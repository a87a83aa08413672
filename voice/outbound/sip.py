"""Placing calls over SIP (`"transport": "sip"`): through a trunk or PBX of `HOTLINE_SIP__TRUNKS`
(the request's `trunk`, default the first), by Hotline's own SIP user agent
(voice/server/routes/sip_dial.py). No provider rings the number for us, so the call is
admitted here at once (this worker's and the cluster's limits, as every call: it holds its place
while it rings), answered 202 with its id, and rung in the background.

Its record (`GET /calls/{id}`, Redis) says how it goes: `state` ringing, then active (the
conversation, as for a call that came in: agent, metadata, answering-machine detection,
recording, webhook) or failed; `outcome` {cause, sip_status, sip_reason, trunk, progress_ms
(post-dial delay: to the first ringing or session progress), answer_ms, early_media}; a
failed call's end reason says why ("never connected: busy (486 Busy Here)") and its post-call
webhook is sent like any call's. `POST /calls/{id}/hangup` before the answer CANCELs it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any

from voice.cluster.records import UnknownCall
from voice.outbound.answered import screening_of
from voice.outbound.dials import Dial
from voice.outbound.placed import PlacedCall
from voice.outbound.request import BadRequest, OutboundRequest
from voice.server.call_records import CallRecord
from voice.server.calls import Switchboard
from voice.server.routes.sip_dial import Ringing, SipDialing
from voice.transports.sip.outbound import Outcome
from voice.transports.sip.trunk import SipTrunk

log = logging.getLogger(__name__)

_SAID = {
    "busy": "busy",
    "no_answer": "no answer",
    "rejected": "rejected",
    "failed": "failed",
    "unreachable": "unreachable",
    "cancelled": "cancelled",
}
_CLOSE_WAIT_S = 2.0  # at shutdown, for the CANCELs of calls still ringing


def end_reason(outcome: Outcome, hung_up: str | None) -> str:
    """A call that never connected, as its record's end reason says it."""
    if outcome.cause == "cancelled" and hung_up:
        return f"{hung_up} before the answer"  # "hung up through the API before the answer"
    return f"never connected: {_SAID.get(outcome.cause, outcome.cause)} ({outcome.describe()})"


def outcome_view(outcome: Outcome, ringing: Ringing) -> dict[str, Any]:
    """The record's `outcome` of a placed SIP call."""
    early = ringing.early_media
    return {
        "cause": outcome.cause,
        "sip_status": outcome.status,
        "sip_reason": outcome.reason or None,
        "trunk": ringing.trunk.name,
        "progress_ms": ringing.ms_since_invite(ringing.progress_at),
        "answer_ms": ringing.ms_since_invite(ringing.answered_at),
        "early_media": bool(early is not None and early.started_at is not None),
    }


class SipCalls:
    """This worker's SIP calls placed through its trunks."""

    def __init__(self, board: Switchboard, dialing: SipDialing, trunks: list[SipTrunk]) -> None:
        self.board = board
        self.dialing = dialing
        self.trunks = {trunk.name: trunk for trunk in trunks}
        self.ringing: dict[str, Ringing] = {}  # by call id, until answered or failed
        self._tasks: set[asyncio.Task[None]] = set()

    def trunk(self, name: str | None) -> SipTrunk:
        """The trunk a request names (None: the first); BadRequest if there is none such."""
        if not self.trunks:
            raise BadRequest("trunk: no SIP trunk configured (HOTLINE_SIP__TRUNKS)")
        if name is None:
            return next(iter(self.trunks.values()))
        if name not in self.trunks:
            known = ", ".join(self.trunks)
            raise BadRequest(f"trunk: no trunk {name!r} (known: {known})")
        return self.trunks[name]

    async def place(
        self, order: OutboundRequest, trunk: SipTrunk, voicemail: str | None
    ) -> PlacedCall:
        """Admit the call (CallsFull if it may not start) and ring it in the background."""
        caller = order.from_ or trunk.from_number
        board = self.board
        call_id = await board.admit("sip", caller=caller, callee=order.to)
        dial = Dial("sip", order.to, caller or "", order.agent, dict(order.metadata))
        if order.machine_detection:
            message = order.voicemail_message(voicemail)
            dial = dataclasses.replace(dial, machine_detection=True, voicemail=message)
        settings = board.settings.outbound.answering
        answering = screening_of(dial, call_id, board.phone_stt, settings, board.sessions)
        timeout_s = order.ring_timeout_s or trunk.ring_timeout_s
        placed = ((order.agent, dict(order.metadata)), answering)
        ringing = Ringing(call_id, trunk, order.to, caller, timeout_s, placed)
        with contextlib.suppress(UnknownCall):  # the registry let it go (say, Redis lost it)
            board.sessions.update_call(
                call_id,
                state="ringing",
                agent=order.agent,
                direction="outbound",
                metadata=dict(order.metadata),
                outcome={"cause": "ringing", "trunk": trunk.name},
            )
        self.ringing[call_id] = ringing
        board.placing[call_id] = ringing.hang_up
        task = asyncio.create_task(self._ring(ringing, order), name=f"sip-dial-{call_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        log.info(
            "outbound call %s: sip trunk %s rings %s from %s (agent %s, ring %g s)",
            call_id,
            trunk.name,
            order.to,
            caller,
            order.agent,
            timeout_s,
        )
        return PlacedCall("sip", call_id, "calling", caller=caller, trunk=trunk.name)

    async def _ring(self, ringing: Ringing, order: OutboundRequest) -> None:
        try:
            outcome = await self.dialing.ring(ringing)
        except asyncio.CancelledError:
            self._failed(ringing, order, Outcome("failed", reason="server shutdown"))
            raise
        except Exception:
            log.exception("sip: call %s: placing it failed", ringing.call_id)
            outcome = Outcome("failed", reason="internal error")
        finally:
            self.ringing.pop(ringing.call_id, None)
            self.board.placing.pop(ringing.call_id, None)
        view = outcome_view(outcome, ringing)
        if outcome.cause == "answered" and ringing.call is not None:
            ringing.call.outcome = view
            with contextlib.suppress(UnknownCall):
                self.board.sessions.update_call(ringing.call_id, state="active", outcome=view)
            log.info(
                "sip: call %s answered (%s): ringing after %s ms, answered after %s ms",
                ringing.call_id,
                outcome.describe(),
                view["progress_ms"],
                view["answer_ms"],
            )
            return
        self._failed(ringing, order, outcome)

    def _failed(self, ringing: Ringing, order: OutboundRequest, outcome: Outcome) -> None:
        """A call that never connected: its record ended (failed, with why) and its webhook."""
        board, call_id = self.board, ringing.call_id
        view = outcome_view(outcome, ringing)
        reason = end_reason(outcome, ringing.hung_up)
        with contextlib.suppress(UnknownCall):
            board.sessions.update_call(call_id, outcome=view)
        board.release(call_id, reason)
        log.info("sip: call %s to %s: %s", call_id, ringing.to, reason)
        record = CallRecord(
            call_id=call_id,
            transport="sip",
            caller=ringing.caller,
            callee=ringing.to,
            started_at=time.time() - (time.monotonic() - ringing.started_at),
            ended_at=time.time(),
            wants_human=False,
            experiment=None,
            arm=None,
            end_reason=reason,
            records=(),
            history=(),
            agent=order.agent,
            direction="outbound",
            metadata=dict(order.metadata),
            outcome=view,
        )
        board.spawn(board.after_call.finish(record))

    async def close(self) -> None:
        """Shutdown: the calls still ringing are cancelled (CANCEL), then let go."""
        for ringing in list(self.ringing.values()):
            ringing.hang_up("server shutdown")
        if self._tasks:
            _, pending = await asyncio.wait(list(self._tasks), timeout=_CLOSE_WAIT_S)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
