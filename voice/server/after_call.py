"""What happens once a call has ended: its recording closed (here, before the call's final
record goes to Redis, which then says where the file is), copied to the bucket, and the
post-call webhook queued with the recording's link, in the background."""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

from voice.cluster.registry import CallRegistry
from voice.cluster.webhooks import WebhookOutbox
from voice.recordings.calls import CallRecordings, RecordingLocation
from voice.recordings.recorder import CallRecorder
from voice.server.call_records import CallRecord, recording_view

log = logging.getLogger(__name__)

_KEPT = 200  # webhook deliveries remembered, for GET /calls/{id}


class AfterCall:
    """The ended call's recording and webhook (either may be off: None)."""

    def __init__(
        self,
        sessions: CallRegistry,
        recordings: CallRecordings | None,
        outbox: WebhookOutbox | None,
        public_url: str | None = None,
    ) -> None:
        self.sessions = sessions
        self.recordings = recordings
        self.outbox = outbox
        self.public_url = public_url
        self.webhook_deliveries: OrderedDict[str, str] = OrderedDict()  # call id -> delivery

    async def close_recording(self, recorder: CallRecorder | None) -> RecordingLocation | None:
        """Close the call's recording file; its location (None: not recorded)."""
        if recorder is None or self.recordings is None:
            return None
        try:
            return await self.recordings.close(recorder)
        except Exception:
            log.exception("call %s: the recording could not be closed", recorder.call_id)
            return None

    async def finish(self, record: CallRecord) -> CallRecord:
        """Copy the recording to the bucket (noting its key in Redis), then queue the webhook.
        Returns the record with the recording's final location."""
        location = RecordingLocation.of(record.recording)
        if location is not None and self.recordings is not None:
            copied = await self.recordings.copy(record.call_id, location)
            if copied.s3_key is not None:
                await self.sessions.flush(timeout_s=5.0)  # the final record first: then add
                try:
                    await self.sessions.annotate(record.call_id, recording=copied.to_dict())
                except Exception as exc:
                    log.warning("call %s: the bucket key is not in Redis: %s", record.call_id, exc)
                record = record.with_recording(copied.to_dict())
            location = copied
        if self.outbox is not None:
            await self._post_call(record, location)
        return record

    async def _post_call(self, record: CallRecord, location: RecordingLocation | None) -> None:
        """Hand the ended call's document to the webhook outbox (in Redis: from there it is
        delivered, retried and its outcome kept, whatever happens to this worker)."""
        assert self.outbox is not None
        document = {
            "event": "call.ended",
            "call": record.detail(),
            "recording": recording_view(record.call_id, location, self.public_url),
        }
        try:
            delivery = await self.outbox.enqueue(record.call_id, document, wait_s=60.0)
        except Exception:
            log.exception("call %s: the post-call webhook could not be queued", record.call_id)
            return
        self.webhook_deliveries[record.call_id] = delivery
        while len(self.webhook_deliveries) > _KEPT:
            self.webhook_deliveries.popitem(last=False)
        log.info("call %s: post-call webhook queued (%s)", record.call_id, delivery)

    async def webhook_outcome(self, call_id: str) -> dict[str, Any] | None:
        """The post-call webhook's delivery state for a call that ended here (None: none
        queued here, or Redis cannot say right now)."""
        delivery = self.webhook_deliveries.get(call_id)
        if self.outbox is None or delivery is None:
            return None
        try:
            return await self.outbox.outcome(delivery)
        except Exception as exc:
            log.warning("call %s: webhook outcome unavailable: %s", call_id, exc)
            return None
