"""`hotline campaign run FILE.csv | status ID | pause ID | resume ID | stop ID`: a campaign on
a running server (`POST /campaigns` and friends).

The CSV has a header row: `to` (the number) is required, `timezone` (IANA) is optional, and
every other column is a variable the agent's instructions, greeting and voicemail may use as
`{column}`. A failed request is told in one line (the server's reason), exit status 1; a file
that cannot be read, 2."""

from __future__ import annotations

import csv
import io
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from voice.cli.client import DEFAULT_URL, TokenOption, UrlOption, auth_headers, one_line_errors

campaign_app = typer.Typer(help="Campaigns: many placed calls, paced and retried.")
_FIXED = ("to", "timezone")
_CSV_BYTES = 20 * 1024 * 1024
_PAGE = 1000  # rows a request, as the server gives them


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The campaign's rows from a CSV file (typer.Exit(2) with a message if it is not one)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        typer.echo(f"hotline: cannot read {path}: {exc.strerror}", err=True)
        raise typer.Exit(2) from None
    if len(raw) > _CSV_BYTES:
        typer.echo(f"hotline: {path} is larger than {_CSV_BYTES // 2**20} MB", err=True)
        raise typer.Exit(2)
    reader = csv.DictReader(io.StringIO(raw.decode("utf-8-sig", "replace")))
    columns = [c.strip() for c in reader.fieldnames or []]
    if "to" not in columns:
        typer.echo(f"hotline: {path}: the header has no 'to' column ({columns})", err=True)
        raise typer.Exit(2)
    rows = []
    for line in reader:
        cells = {str(k).strip(): (v or "").strip() for k, v in line.items() if k is not None}
        row: dict[str, Any] = {"to": cells.get("to", "")}
        if cells.get("timezone"):
            row["timezone"] = cells["timezone"]
        row["variables"] = {k: v for k, v in cells.items() if k not in _FIXED}
        rows.append(row)
    return rows


@campaign_app.command("run")
def run_command(
    file: Annotated[Path, typer.Argument(help="CSV: to, timezone, and variables as columns")],
    agent: Annotated[str, typer.Option(help="The agent that talks (an agent file's name)")],
    from_: Annotated[
        str | None,
        typer.Option("--from", help="The caller id: your provider's number (SIP: the trunk's)"),
    ] = None,
    transport: Annotated[
        str, typer.Option(help="The provider: twilio, telnyx, vonage, or sip")
    ] = "twilio",
    trunk: Annotated[
        str | None, typer.Option(help="SIP: the trunk (HOTLINE_SIP__TRUNKS; the first)")
    ] = None,
    name: Annotated[str, typer.Option(help="A label for people")] = "",
    concurrency: Annotated[int, typer.Option(help="Calls at once, cluster-wide")] = 5,
    window: Annotated[str, typer.Option(help="Calling hours, the callee's: HH:MM-HH:MM")] = (
        "09:00-20:00"
    ),
    timezone: Annotated[str, typer.Option(help="For rows without one (IANA)")] = "UTC",
    retry_busy: Annotated[int, typer.Option(help="Attempts at most after busy")] = 3,
    retry_no_answer: Annotated[int, typer.Option(help="…after no answer")] = 2,
    retry_machine: Annotated[int, typer.Option(help="…after a machine answered")] = 1,
    backoff: Annotated[float, typer.Option(help="Seconds before a retry (doubling)")] = 300.0,
    machine_detection: Annotated[bool, typer.Option(help="Tell people from machines")] = False,
    voicemail: Annotated[str | None, typer.Option(help="Left on machines (hang_up: none)")] = None,
    wait: Annotated[bool, typer.Option(help="Follow the campaign until it ends")] = False,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Start a campaign: every row of FILE is called by --agent, within --window."""
    start, _, end = window.partition("-")
    body: dict[str, Any] = {
        "name": name,
        "agent": agent,
        "transport": transport,
        "concurrency": concurrency,
        "window": {"start": start.strip(), "end": end.strip()},
        "timezone": timezone,
        "retry": {
            "busy": retry_busy,
            "no_answer": retry_no_answer,
            "machine": retry_machine,
            "backoff_s": backoff,
        },
        "machine_detection": machine_detection,
        "rows": read_rows(file),
    }
    optional = {"from": from_, "trunk": trunk, "voicemail": voicemail}
    body |= {key: value for key, value in optional.items() if value is not None}
    with one_line_errors(url):
        response = _api("POST", url, "/campaigns", token, body)
    made = response.json()
    typer.echo(
        f"campaign {made['campaign_id']}: {made['rows']} rows "
        f"({made['waiting_for_hours']} outside their calling hours now)"
    )
    if wait:
        _follow(url, token, made["campaign_id"])


def _api(
    method: str, url: str, path: str, token: str | None, body: object = None
) -> httpx.Response:
    response = httpx.request(
        method, f"{url.rstrip('/')}{path}", json=body, headers=auth_headers(token), timeout=60
    )
    return response.raise_for_status()


def progress_line(campaign: dict[str, Any]) -> str:
    """One line of a campaign's progress."""
    p = campaign["progress"]
    ended = f" ({campaign['ended_as']})" if campaign.get("ended_as") else ""
    return (
        f"campaign {campaign['campaign_id']}: {campaign['state']}{ended}; {p['rows']} rows: "
        f"{p['dialled']} calls placed, {p['answered']} answered, {p['machine']} machines, "
        f"{p['busy']} busy, {p['no_answer']} not answered, {p['failed']} failed, "
        f"{p['dnc']} on the do-not-call list, {p['stopped']} stopped; "
        f"{p['in_flight']} in flight, {p['remaining']} remaining"
    )


def _follow(url: str, token: str | None, campaign_id: str) -> None:
    last = ""
    while True:
        with one_line_errors(url):
            campaign = _api("GET", url, f"/campaigns/{campaign_id}?limit=1", token).json()
        line = progress_line(campaign)
        if line != last:
            typer.echo(line)
            last = line
        if campaign["state"] == "ended":
            return
        time.sleep(2.0)  # a person watching: every 2 s is plenty


@campaign_app.command("status")
def status_command(
    campaign_id: Annotated[str, typer.Argument(help="The campaign's id")],
    rows: Annotated[bool, typer.Option(help="Also each row's status")] = False,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """A campaign's progress (and, with --rows, each row's status)."""
    path = f"/campaigns/{campaign_id}"
    with one_line_errors(url):
        campaign = _api("GET", url, f"{path}?limit=1", token).json()
    typer.echo(progress_line(campaign))
    offset = 0
    while rows and offset < campaign["progress"]["rows"]:
        with one_line_errors(url):
            page = _api("GET", url, f"{path}?offset={offset}&limit={_PAGE}", token).json()
        for row in page["rows"]:
            outcomes = ",".join(row["outcomes"]) or "-"
            typer.echo(f"  {row['row']:>5} {row['to']:<16} {row['status']:<10} {outcomes}")
        offset += _PAGE


def _change(what: str) -> Any:
    def command(
        campaign_id: Annotated[str, typer.Argument(help="The campaign's id")],
        url: UrlOption = DEFAULT_URL,
        token: TokenOption = None,
    ) -> None:
        with one_line_errors(url):
            changed = _api("POST", url, f"/campaigns/{campaign_id}/{what}", token).json()
        typer.echo(f"campaign {changed['campaign_id']}: {changed['state']}")

    command.__doc__ = f"{what.capitalize()} a campaign (calls in progress go on)."
    return command


for _what in ("pause", "resume", "stop"):
    campaign_app.command(_what)(_change(_what))
