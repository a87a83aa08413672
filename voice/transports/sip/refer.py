"""Blind transfer by REFER (RFC 3515): we ask the caller's side to call the target; it answers
202 and then reports how its call goes by NOTIFY, each a `message/sipfrag` status line
("SIP/2.0 100 Trying", "SIP/2.0 200 OK", "SIP/2.0 486 Busy Here")."""

from __future__ import annotations

import asyncio
import logging

from voice.transports.sip.dialog import SipDialog
from voice.transports.sip.endpoint import SipEndpoint, SipError
from voice.transports.sip.message import SipMessage

log = logging.getLogger(__name__)

FINAL_NOTIFY_S = 30.0  # how long the final NOTIFY is waited for


class ReferFailed(Exception):
    """The REFER was refused or unanswered, or the transfer it asked for failed."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def refer_target(target: str, pbx_host: str) -> str:
    """A SIP URI stays as it is; a number is dialled by the caller's side (its PBX)."""
    return target if target.lower().startswith(("sip:", "sips:")) else f"sip:{target}@{pbx_host}"


def sipfrag_status(message: SipMessage) -> tuple[str, int | None]:
    """A NOTIFY's status line and its code (None if the body holds none)."""
    line = message.body.decode("utf-8", "replace").split("\r\n", 1)[0].strip()
    parts = line.split(" ")
    code = int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None
    return line, code


class Refer:
    """One REFER in a dialog and the final status its NOTIFYs report."""

    def __init__(self, endpoint: SipEndpoint, dialog: SipDialog) -> None:
        self.endpoint = endpoint
        self.dialog = dialog
        self._final: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def notified(self, message: SipMessage) -> None:
        """A NOTIFY of this dialog arrived (already answered 200)."""
        line, code = sipfrag_status(message)
        log.info("sip: transfer progress %r", line)
        if code is not None and code >= 200 and not self._final.done():
            self._final.set_result(line)

    async def send(self, target: str) -> str:
        """REFER to `target` (a SIP URI); the final status line. ReferFailed otherwise."""
        headers = [("Refer-To", f"<{target}>"), ("Referred-By", f"<{self.dialog.contact}>")]
        try:
            answer = await self.endpoint.request(
                self.dialog.request("REFER", headers), self.dialog.peer
            )
        except SipError as exc:
            raise ReferFailed(f"REFER: {exc}") from exc
        if not 200 <= (answer.status or 0) < 300:
            raise ReferFailed(
                f"the caller's side refused the transfer: {answer.status} {answer.reason}",
                answer.status,
            )
        log.info("sip: REFER to %s accepted (%s)", target, answer.status)
        try:
            outcome = await asyncio.wait_for(asyncio.shield(self._final), FINAL_NOTIFY_S)
        except TimeoutError:
            return "accepted; no final NOTIFY"
        code = outcome.split(" ")[1] if len(outcome.split(" ")) > 1 else ""
        if not code.startswith("2"):
            raise ReferFailed(f"the transfer failed: {outcome}")
        return outcome
