"""`hotline dial`: place a call through a running server (`POST /calls/outbound`) and print its
call id; the server's refusal in one line otherwise."""

from __future__ import annotations

import json
from typing import Annotated

import httpx
import typer

from voice.cli.client import DEFAULT_URL, TokenOption, UrlOption, auth_headers, one_line_errors


def dial_command(
    to: Annotated[
        str,
        typer.Option("--to", help="The number to call, E.164 (+15551234567); SIP: or a sip: URI"),
    ],
    agent: Annotated[str, typer.Option(help="The agent that talks (an agent file's name)")],
    from_: Annotated[
        str | None,
        typer.Option("--from", help="The caller id: your provider's number (SIP: the trunk's)"),
    ] = None,
    transport: Annotated[str, typer.Option(help="twilio, telnyx, vonage or sip")] = "twilio",
    trunk: Annotated[
        str | None, typer.Option(help="SIP: the trunk to call through (default the first)")
    ] = None,
    ring_timeout: Annotated[
        float | None, typer.Option(help="SIP: seconds to ring before giving up (CANCEL)")
    ] = None,
    metadata: Annotated[
        str | None,
        typer.Option(help="JSON object kept with the call (its record and webhook)"),
    ] = None,
    machine_detection: Annotated[
        bool, typer.Option(help="Greet a person; on an answering machine, leave --voicemail")
    ] = False,
    voicemail: Annotated[
        str | None,
        typer.Option(help="Left after a machine's beep (hang_up: none; default: the agent's)"),
    ] = None,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Place a call: the provider rings --to from --from, and --agent talks once answered."""
    body: dict[str, object] = {"to": to, "agent": agent, "transport": transport}
    optional = {"from": from_, "trunk": trunk, "ring_timeout_s": ring_timeout}
    body.update({name: value for name, value in optional.items() if value is not None})
    if machine_detection:
        body["machine_detection"] = True
    if voicemail is not None:
        body["voicemail"] = voicemail
    if metadata is not None:
        try:
            body["metadata"] = json.loads(metadata)
        except ValueError as exc:
            typer.echo(f"hotline: --metadata is not JSON: {exc}", err=True)
            raise typer.Exit(2) from None
    with one_line_errors(url):
        response = httpx.post(
            f"{url.rstrip('/')}/calls/outbound",
            json=body,
            headers=auth_headers(token),
            timeout=30,
        )
        response.raise_for_status()
    placed = response.json()
    typer.echo(
        f"call {placed['call_id']}: {placed['transport']} rings {placed['to']} from "
        f"{placed['from']} ({placed['status']}), agent {placed['agent']}"
    )
