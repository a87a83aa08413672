"""What people do to calls (the calls API, the supervisor console): hang up, say, transfer and
listen in. Any worker may send the command (through Redis, `voice.cluster.control`); the worker
that owns the call carries it out here and acks with the result."""

from __future__ import annotations

import logging
from typing import Any

from pipeline.opening import OPERATOR
from pipeline.tools import Transfer
from voice.agents.agent import destination
from voice.agents.mocked_tools import set_mocks
from voice.server.call_records import Call
from voice.server.calls import Switchboard
from voice.transports.listen_in import Listeners

log = logging.getLogger(__name__)

Result = dict[str, Any]


class Supervision:
    """Carries out commands for the calls of one switchboard."""

    def __init__(self, board: Switchboard) -> None:
        self.board = board

    async def serve(self) -> None:
        """Carry out the commands sent to this worker's calls, from any worker, until cancelled."""
        async for control in self.board.sessions.control_commands():
            call = self.board.active.get(control.call_id)
            if call is None:
                await control.ack(self._not_answered(control.call_id, control.command))
                continue
            try:
                result = await self.command(call, control.command, control.args)
            except Exception:
                log.exception("call %s: %s failed", call.call_id, control.command)
                result = {"ok": False, "error": f"{control.command} failed"}
            await control.ack(result)

    def _not_answered(self, call_id: str, command: str) -> Result:
        """A command for a call not in progress here: a call being placed (voice/outbound/sip.py)
        may be hung up before its answer (its INVITE cancelled); nothing else."""
        hang_up = self.board.placing.get(call_id)
        if hang_up is None:
            return {"ok": False, "error": "unknown call"}
        if command != "hangup":
            return {"ok": False, "error": "the call is not answered yet", "code": 409}
        hang_up("hung up through the API")
        return {"ok": True, "status": "cancelling"}

    async def command(self, call: Call, command: str, args: dict[str, Any]) -> Result:
        if command == "hangup":
            self.board.spawn(self.board.hang_up(call.call_id, "hung up through the API"))
            return {"ok": True, "status": "hung up"}
        if command == "say" and isinstance(args.get("text"), str):
            await call.conversation.say(str(args["text"]), source=OPERATOR)
            return {"ok": True, "status": "speaking"}
        if command == "transfer":
            return await self._transfer(call, args)
        if command == "listen" and isinstance(args.get("sdp"), str):
            return await self._listen(call, str(args["sdp"]))
        if command == "mocks":  # the testing API (voice/server/routes/testing.py)
            return set_mocks(call.call_id, call.conversation.tools, args.get("mocks"))
        return {"ok": False, "error": f"bad command {command!r}", "code": 400}

    async def _transfer(self, call: Call, args: dict[str, Any]) -> Result:
        """Put the call through: to the agent's target of that name, or a number or SIP URI,
        or the agent's default target; the caller is told first (the human message)."""
        asked = args.get("target")
        target = call.agent.transfer_target(asked) if call.agent is not None else None
        if target is None and isinstance(asked, str):
            try:
                target = destination(asked)
            except ValueError as exc:
                log.warning("call %s: transfer refused: %s", call.call_id, exc)
                return {"ok": False, "error": str(exc), "code": 400}
        if target is None:
            return {
                "ok": False,
                "error": "no transfer target: give a number or SIP URI",
                "code": 409,
            }
        reason = str(args.get("reason") or "put through by a supervisor")
        message = self.board.settings.telephony.human_message
        await call.conversation.say(message, then=Transfer(target, reason=reason))
        log.info("call %s: transfer to %s asked through the API", call.call_id, target)
        return {"ok": True, "status": "transferring", "to": target}

    async def _listen(self, call: Call, offer_sdp: str) -> Result:
        """A supervisor's WebRTC offer: answered here, where the call's audio is."""
        if call.listeners is None:
            webrtc = self.board.settings.webrtc
            taps = call.conversation.transport.taps
            call.listeners = Listeners(call.call_id, taps, webrtc.rtc_ice_servers())
        try:
            answer = await call.listeners.add(offer_sdp)
        except ValueError as exc:
            log.warning("call %s: listen-in refused: %s", call.call_id, exc)
            return {"ok": False, "error": str(exc), "code": 400}
        return {"ok": True, "sdp": answer, "type": "answer"}
