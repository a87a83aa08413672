"""What happens once a call has ended: its recording closed (here, before the call's final
record goes to Redis, which then says where the file is), copied to the bucket, and the
post-call webhook queued with the recording's link, in the background.

A webhook document is at most `MAX_BODY_BYTES` (1 MB). A longer call's is sent all the same,
truncated: its turn records and history lose turns from the middle (the first and the last are
kept), and the document says so: `"truncated": true` and a `truncation` object with the size
of the whole, how many of each were left out and after which one, and `url`, where
`GET /calls/{id}` gives the whole record."""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

from voice.cluster.registry import CallRegistry
from voice.cluster.webhook_store import MAX_BODY_BYTES, json_body
from voice.cluster.webhooks import WebhookOutbox
from voice.recordings.calls import CallRecordings, RecordingLocation
from voice.recordings.recorder import CallRecorder
from voice.server import metrics
from voice.server.call_records import CallRecord, recording_view

log = logging.getLogger(__name__)

_KEPT = 200  # webhook deliveries remembered, for GET /calls/{id}
_CUT = ("records", "history")  # the lists of a call's document a long call may lose turns of


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
            location = await self.recordings.close(recorder)
        except Exception:
            log.exception("call %s: the recording could not be closed", recorder.call_id)
            metrics.RECORDINGS.labels(outcome="failed").inc()
            return None
        metrics.RECORDINGS.labels(outcome="empty" if location is None else "written").inc()
        return location

    async def finish(self, record: CallRecord) -> CallRecord:
        """Copy the recording to the bucket (noting its key in Redis), then queue the webhook.
        Returns the record with the recording's final location."""
        location = RecordingLocation.of(record.recording)
        if location is not None and self.recordings is not None:
            copied = await self.recordings.copy(record.call_id, location)
            if self.recordings.store.bucket_configured:
                uploaded = "failed" if copied.s3_key is None else "uploaded"
                metrics.RECORDING_UPLOADS.labels(outcome=uploaded).inc()
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
        whole: dict[str, Any] = {
            "event": "call.ended",
            "call": record.detail(),
            "recording": recording_view(record.call_id, location, self.public_url),
        }
        document = fitted(whole, MAX_BODY_BYTES, call_url(record.call_id, self.public_url))
        if document is not whole:
            truncation = document["truncation"]
            log.warning(
                "call %s: post-call webhook of %d bytes, over %d: sent truncated, without %s",
                record.call_id,
                truncation["bytes"],
                MAX_BODY_BYTES,
                " and ".join(f"{truncation[name]['left_out']} of its {name}" for name in _CUT),
            )
        try:
            delivery = await self.outbox.enqueue(record.call_id, document, wait_s=60.0)
        except Exception:
            log.exception("call %s: the post-call webhook could not be queued", record.call_id)
            metrics.WEBHOOKS.labels(outcome="dropped").inc()
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


def call_url(call_id: str, public_url: str | None = None) -> str:
    """`GET /calls/{id}` (absolute when the public URL is set), as the recording's link is."""
    path = f"/calls/{call_id}"
    return f"{public_url.rstrip('/')}{path}" if public_url else path


def fitted(document: dict[str, Any], limit: int, url: str) -> dict[str, Any]:
    """`document` if its JSON body fits in `limit` bytes; else a copy whose call lost turn
    records and history from the middle until it fits, marked as truncated (see the module's
    docstring). Each item is measured once, so this is linear in the document's size."""
    whole = len(json_body(document))
    if whole <= limit:
        return document
    call = document["call"]
    items = {name: list(call.get(name) or []) for name in _CUT}
    sizes = {name: [len(json_body(item)) + 1 for item in items[name]] for name in _CUT}
    total = sum(map(sum, sizes.values())) or 1

    def cut(keep: dict[str, tuple[int, int]]) -> dict[str, Any]:
        lists: dict[str, list[Any]] = {}
        truncation: dict[str, Any] = {"bytes": whole, "limit": limit, "url": url}
        for name, (head, tail) in keep.items():
            count = len(items[name])
            lists[name] = items[name][:head] + items[name][count - tail :]
            truncation[name] = {"kept": head + tail, "left_out": count - head - tail, "after": head}
        return {**document, "call": {**call, **lists}, "truncated": True, "truncation": truncation}

    empty = cut({name: (0, 0) for name in _CUT})
    budget = limit - len(json_body(empty))
    for _ in range(3):  # the marks' digits can take a few bytes more than the empty ones did
        shares = {name: budget * sum(sizes[name]) / total for name in _CUT}
        truncated = cut({name: _ends(sizes[name], shares[name]) for name in _CUT})
        over = len(json_body(truncated)) - limit
        if over <= 0:
            return truncated
        budget -= over
    return empty  # not even the summary fits (enqueue refuses it then, with a log line)


def _ends(sizes: list[int], budget: float) -> tuple[int, int]:
    """How many items to keep from the start and from the end (taking one from each in turn)
    so that their sizes add up to no more than `budget`."""
    head = tail = 0
    used = 0
    while head + tail < len(sizes):
        from_head = head <= tail
        size = sizes[head] if from_head else sizes[len(sizes) - 1 - tail]
        if used + size > budget:
            break
        used += size
        if from_head:
            head += 1
        else:
            tail += 1
    return head, tail
