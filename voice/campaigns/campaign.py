"""A stored campaign as the runner and the API read it (`Campaign`), and what they show of it:
its progress (`progress`: counts by status, and rows one by one) and the `campaign.ended`
webhook's document."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from voice.campaigns.hours import Window
from voice.campaigns.request import CampaignHead
from voice.campaigns.rules import FINAL, IN_FLIGHT, STATUSES
from voice.campaigns.store import CampaignStore
from voice.cluster.webhook_store import MAX_BODY_BYTES, json_body

CAMPAIGN_ENDED = "campaign.ended"
ROWS_SHOWN = 1000  # a progress page's rows, at most
ROWS_IN_WEBHOOK = 2000  # a bigger campaign's campaign.ended has its progress, not its rows


@dataclass(frozen=True)
class Campaign:
    """What does not change in a campaign once created."""

    campaign_id: str
    head: CampaignHead
    voicemail_given: bool
    base_url: str
    window: Window

    @classmethod
    def of(cls, campaign_id: str, meta: dict[str, str]) -> Campaign | None:
        """The campaign its meta hash describes (None while it is being created)."""
        if "spec" not in meta:
            return None
        spec = json.loads(meta["spec"])
        given = bool(spec.pop("voicemail_given", False))
        head = CampaignHead.model_validate(spec)
        window = head.window.window()
        return cls(campaign_id, head, given, meta.get("base_url", ""), window)


def _number(value: str | None) -> float | None:
    return float(value) if value else None


def counts(meta: dict[str, str]) -> dict[str, int]:
    """Rows by status, dials and the calls the provider took, from the meta hash."""
    by_status = {status: max(0, int(meta.get(f"n:{status}", "0"))) for status in STATUSES}
    in_flight = sum(by_status[s] for s in IN_FLIGHT)
    return {
        "rows": int(meta.get("rows", "0")),
        "dialled": int(meta.get("dialled", "0")),
        "attempts": int(meta.get("dials", "0")),
        "in_flight": in_flight,
        "remaining": by_status["queued"] + in_flight,
        **{status: by_status[status] for status in ("queued", *IN_FLIGHT, *FINAL)},
    }


def summary(campaign_id: str, meta: dict[str, str]) -> dict[str, Any]:
    """The campaign without its rows."""
    spec = json.loads(meta.get("spec", "{}"))
    spec.pop("voicemail_given", None)
    return {
        "campaign_id": campaign_id,
        "state": meta.get("state"),
        "ended_as": meta.get("ended_as") or None,
        "created_at": _number(meta.get("created_at")),
        "stopped_at": _number(meta.get("stopped_at")),
        "ended_at": _number(meta.get("ended_at")),
        **{k: spec.get(k) for k in ("name", "agent", "transport", "from", "concurrency")},
        **{k: spec.get(k) for k in ("window", "timezone", "retry", "machine_detection")},
        **({"trunk": spec.get("trunk")} if spec.get("transport") == "sip" else {}),
        "progress": counts(meta),
    }


def row_view(raw: dict[str, str]) -> dict[str, Any]:
    """One row as the API shows it."""
    answered_by = raw.get("answered_by")
    outcomes = raw.get("outcomes", "")
    return {
        "row": int(raw["row"]),
        "to": raw.get("to"),
        "timezone": raw.get("timezone"),
        "variables": json.loads(raw.get("variables") or "{}"),
        "status": raw.get("status"),
        "attempts": int(raw.get("attempts", "0")),
        "outcomes": outcomes.split(",") if outcomes else [],
        "next_at": _number(raw.get("next_at")),
        "waiting": raw.get("waiting") or None,
        "call_id": raw.get("call_id") or None,
        "answered_by": json.loads(answered_by) if answered_by else None,
        "end_reason": raw.get("end_reason") or None,
        "error": raw.get("error") or None,
        "retaken": int(raw.get("retaken", "0")),
        "finished_at": _number(raw.get("finished_at")),
    }


async def progress(
    store: CampaignStore, campaign_id: str, offset: int = 0, limit: int = ROWS_SHOWN
) -> dict[str, Any] | None:
    """The campaign with rows `offset`.. (at most `limit`); None if there is no such one."""
    meta = await store.meta(campaign_id)
    if not meta or "spec" not in meta:
        return None
    count = max(0, min(limit, int(meta.get("rows", "0")) - offset))
    rows = await store.rows(campaign_id, offset, count)
    view = summary(campaign_id, meta)
    return {**view, "offset": offset, "rows": [row_view(r) for r in rows]}


async def ended_document(store: CampaignStore, campaign_id: str, url: str) -> dict[str, Any]:
    """The `campaign.ended` webhook's document: the campaign and every row's outcome (rows
    left out, with `rows_truncated`, beyond `ROWS_IN_WEBHOOK` or a webhook's size: read them
    from `url`)."""
    meta = await store.meta(campaign_id)
    total = int(meta.get("rows", "0"))
    if total > ROWS_IN_WEBHOOK:
        campaign = {**summary(campaign_id, meta), "url": url}
        return {"event": CAMPAIGN_ENDED, "campaign": campaign, "rows": [], "rows_truncated": True}
    rows = [_row_outcome(r) for r in await store.rows(campaign_id, 0, total)]
    document: dict[str, Any] = {
        "event": CAMPAIGN_ENDED,
        "campaign": {**summary(campaign_id, meta), "url": url},
        "rows": rows,
    }
    if len(json_body(document)) > MAX_BODY_BYTES:
        document = {**document, "rows": [], "rows_truncated": True}
    return document


def _row_outcome(raw: dict[str, str]) -> dict[str, Any]:
    view = row_view(raw)
    kept = ("row", "to", "status", "attempts", "outcomes", "call_id", "answered_by", "error")
    return {k: view[k] for k in kept}
