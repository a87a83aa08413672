"""What an agent's tools do to a call: end it, put the caller through to a person (the
provider's call control, a SIP REFER, or Twilio's after-stream dial), press keys."""

from __future__ import annotations

import logging

from pipeline.tools import ActionFailed, CallAction, EndCall, SendDigits, Transfer
from voice.agents.transfer import CallControl, CallControlError, CallMover
from voice.cluster.registry import CallRegistry
from voice.server import metrics
from voice.server.call_records import Call
from voice.server.settings import Settings

log = logging.getLogger("voice.server.calls")


class CallActions:
    """Carries out a call's actions for the switchboard (`Switchboard.actions`)."""

    def __init__(
        self, settings: Settings, sessions: CallRegistry, call_control: CallControl | None
    ) -> None:
        self.settings, self.sessions, self.call_control = settings, sessions, call_control
        self.sip_transfers: CallMover | None = None  # set when SIP is on

    async def carry_out(self, call: Call, action: CallAction) -> None:
        """What an agent's tool asked of the call, once the reply before it was heard."""
        call_id = call.call_id
        transport = call.conversation.transport
        if isinstance(action, EndCall):
            transport.hang_up(f"ended by the agent: {action.reason}".rstrip(": "))
        elif isinstance(action, Transfer):
            await self.transfer(call, action)
        elif isinstance(action, SendDigits):
            control = self.call_control
            if control is None or not control.supports(call.transport):
                log.warning(
                    "call %s: pressing keys is not supported on %s", call_id, call.transport
                )
                return
            try:
                await control.send_digits(call.transport, call_id, action.digits)
            except CallControlError as exc:
                log.error("call %s: the keys could not be pressed: %s", call_id, exc)

    async def transfer(self, call: Call, action: Transfer) -> None:
        """Put the caller through to a person: recorded (here and in Redis, for whichever
        worker the provider asks next), shown to the caller's screen, then the bot leaves the
        call. Twilio: closing the stream makes Twilio ask /twilio/after-stream, which dials;
        Telnyx and Vonage: their call control API transfers the call first (if it fails:
        ActionFailed, the caller is told and the call goes on with the bot). Every target is
        a person: the call is flagged `wants_human`, whoever asked; a warm agent's summary is
        added when the tool did not make one."""
        call.wants_human = True
        if call.agent is not None:
            action = call.agent.handed_over(action, call.conversation.history)
        outcome = None
        if call.transport not in ("twilio", "webrtc"):
            # Telnyx, Vonage: the provider's call control moves the caller; SIP: a REFER (the
            # caller's side dials, then says how it went); then the bot leaves.
            control: CallMover | None = (
                self.sip_transfers if call.transport == "sip" else self.call_control
            )
            failure = None
            if control is None or not control.supports(call.transport):
                failure = f"no {call.transport} call control credentials are configured"
            else:
                try:
                    outcome = await control.transfer(call.transport, call.call_id, action)
                except CallControlError as exc:
                    failure = str(exc)
            if failure is not None:
                log.error("call %s: transfer failed: %s", call.call_id, failure)
                raise ActionFailed(failure, self.settings.telephony.transfer_failed_message)
        call.transfer = {"to": action.target, "reason": action.reason, "summary": action.summary}
        if outcome is not None:
            call.transfer["outcome"] = outcome
        metrics.TRANSFERS.labels(transport=call.transport).inc()
        self.sessions.update_call(call.call_id, transfer=call.transfer, wants_human=True)
        if not await self.sessions.flush(timeout_s=2.0):
            log.warning("call %s: the transfer may not have reached Redis", call.call_id)
        event: dict[str, object] = {
            "type": "transfer",
            "to": action.target,
            "reason": action.reason,
        }
        call.conversation.transport.send_event(event)
        self.sessions.publish(call.call_id, event)
        log.info("call %s: transferred to %s (%s)", call.call_id, action.target, action.reason)
        call.conversation.transport.hang_up(f"transferred to {action.target}")
