"""`hotline call`: one scripted caller against a running server, over WebRTC, as Twilio, Telnyx
or Vonage, or over SIP, timed at the caller.

The caller hears out what the server says first (the recording notice, the agent's greeting)
before its first words, as a person does, unless told not to; a server that says nothing
first costs it `OPENING_START_S` of listening. Phone calls come from `--from` to `--to`, so
routing by number (an agent's `numbers`) can be tried from the command line.
"""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlsplit

import typer
from rich.console import Console
from rich.table import Table

from voice.cli.client import DEFAULT_URL, TokenOption, UrlOption, auth_headers, one_line_errors
from voice.cli.logs import setup_logging
from voice.devtools.phone_caller import DEFAULT_CALLEE, DEFAULT_CALLER
from voice.devtools.turns import OPENING_START_S

if TYPE_CHECKING:
    import httpx

    from pipeline.transport import PCM
    from voice.devtools.turns import CallResult

console = Console()
SIP_PORT = 5060


def call_command(
    wav: Annotated[
        list[Path], typer.Option(help="WAV file the caller speaks; repeat for several turns")
    ],
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    twilio: Annotated[
        str | None,
        typer.Option(
            help="Call as Twilio would instead of over WebRTC: the server's base URL (the "
            "voice webhook is asked first) or its ws://…/twilio/stream URL"
        ),
    ] = None,
    sip: Annotated[
        str | None,
        typer.Option(
            help="Call over SIP instead of WebRTC: the server's SIP address, host[:port] "
            f"(port {SIP_PORT}); the calls API is at --url"
        ),
    ] = None,
    telnyx: Annotated[
        bool,
        typer.Option(
            "--telnyx", help="Call as Telnyx would (its media stream, with a stream token)"
        ),
    ] = False,
    vonage: Annotated[
        bool,
        typer.Option("--vonage", help="Call as Vonage would (its websocket, with a stream token)"),
    ] = False,
    to: Annotated[
        str, typer.Option("--to", help="The number called (phone calls): picks the agent")
    ] = DEFAULT_CALLEE,
    from_: Annotated[str, typer.Option("--from", help="The caller's number (phone calls)")] = (
        DEFAULT_CALLER
    ),
    wait_greeting: Annotated[
        bool,
        typer.Option(
            help="Hear out what the server says first (notice, greeting) before speaking, "
            f"as a person does (if nothing begins within {OPENING_START_S:.0f} s, speak)"
        ),
    ] = True,
    dtmf: Annotated[
        str, typer.Option(help="Keys to press after the first reply (phone calls)")
    ] = "",
    auth_token: Annotated[
        str | None, typer.Option(help="Twilio auth token to sign the webhook with (--twilio)")
    ] = None,
    out: Annotated[Path, typer.Option(help="Where to write the reply audio")] = Path("reply.wav"),
    repeat: Annotated[int, typer.Option(help="Place the call this many times")] = 1,
    log_level: Annotated[str, typer.Option()] = "warning",
) -> None:
    """Call a server over WebRTC (or as Twilio, Telnyx or Vonage, or over SIP), play WAVs as
    the caller, time the replies.

    Voice-to-voice latency is measured at the caller: from the last audible frame of each
    utterance sent to the first audible reply frame received. The server's parts of it come
    from its turn records (milliseconds since the end of speech, as the server detected it).
    Phone calls come from --from (+15555550100) to --to (+15555550199, unless given).
    """
    from voice.audio import read_wav
    from voice.server.urls import http_url

    setup_logging(log_level)
    chosen = {"twilio": twilio is not None, "sip": sip is not None, "telnyx": telnyx}
    chosen["vonage"] = vonage
    provider = next((name for name, given in chosen.items() if given), None)
    if sum(chosen.values()) > 1:
        _usage("choose one of --twilio, --sip, --telnyx and --vonage")
    if (to != DEFAULT_CALLEE or from_ != DEFAULT_CALLER) and provider is None:
        _usage("--to and --from are for phone calls (--twilio, --sip, --telnyx, --vonage)")
    utterances = [read_wav(path) for path in wav]
    if twilio is not None:  # the calls API lives on the server that took the Twilio call
        url = http_url(twilio).split("/twilio/")[0]
    wait = OPENING_START_S if wait_greeting else None
    line = _Line(url, token, provider, twilio or sip, to, from_, wait)
    _place_calls(line, utterances, dtmf, auth_token, out, repeat)


def _place_calls(
    line: _Line, utterances: list[PCM], dtmf: str, auth_token: str | None, out: Path, repeat: int
) -> None:
    """Place the call `repeat` times: each call's ending and turn table, then the medians."""
    from voice.audio import write_wav

    measured: dict[int, dict[str, list[float]]] = {}
    for attempt in range(repeat):
        with one_line_errors(line.url):
            result, detail = asyncio.run(line.call(utterances, dtmf, auth_token))
        write_wav(out, result.reply_audio)
        console.print(f"[bold]call {result.call_id}[/] ({attempt + 1}/{repeat}), reply: {out}")
        if detail.get("agent"):
            console.print(f"agent: {detail['agent']}")
        _print_ending(result, detail)
        console.print(_turn_table(result, detail.get("records", []), measured))
    if repeat > 1 and measured:
        stages = list(next(iter(measured.values())))
        table = Table("turn", *(f"{stage} ms" for stage in stages), title=f"medians of {repeat}")
        for index, samples in sorted(measured.items()):
            table.add_row(
                str(index + 1),
                *(f"{statistics.median(samples.get(stage, [0.0])):.0f}" for stage in stages),
            )
        console.print(table)


def _usage(message: str) -> None:
    typer.echo(f"hotline call: {message}", err=True)
    raise typer.Exit(2)


class _Line:
    """Where and how `hotline call` calls: the transport (None: WebRTC) and the address its
    option gave, the numbers, the greeting wait."""

    def __init__(
        self,
        url: str,
        token: str | None,
        provider: str | None,
        address: str | None,
        to: str,
        from_: str,
        opening_wait_s: float | None,
    ) -> None:
        self.url, self.token, self.provider, self.address = url, token, provider, address
        self.to, self.from_, self.opening_wait_s = to, from_, opening_wait_s

    async def call(
        self, utterances: list[PCM], dtmf: str, auth_token: str | None
    ) -> tuple[CallResult, dict[str, Any]]:
        """One call, then its record from the calls API (both with the API token).
        httpx.HTTPError when the server refuses either."""
        import httpx

        async with httpx.AsyncClient(
            base_url=self.url, headers=auth_headers(self.token), timeout=10
        ) as http:
            result = await self._place(http, utterances, dtmf, auth_token)
            response = await http.get(f"/calls/{result.call_id}")
            return result, response.raise_for_status().json()

    async def _place(
        self, http: httpx.AsyncClient, utterances: list[PCM], dtmf: str, auth_token: str | None
    ) -> CallResult:
        wait = self.opening_wait_s
        if self.provider == "sip":
            return await self._place_sip(http, utterances, dtmf)
        if self.provider in ("telnyx", "vonage"):
            from voice.devtools.provider_phones import place_provider_call

            return await place_provider_call(
                self.url,
                "telnyx" if self.provider == "telnyx" else "vonage",
                utterances,
                caller=self.from_,
                callee=self.to,
                headers=auth_headers(self.token),
                dtmf=dtmf,
                opening_wait_s=wait,
            )
        if self.provider is None:
            from voice.devtools.webrtc_caller import place_call

            return await place_call(self.url, utterances, token=self.token, opening_wait_s=wait)
        from voice.devtools.twilio_call import place_twilio_call

        assert self.address is not None
        phone = await place_twilio_call(
            self.address,
            utterances,
            dtmf=dtmf,
            auth_token=auth_token,
            parameters={"from": self.from_, "to": self.to},
            opening_wait_s=wait,
        )
        if phone.rejected is not None:
            typer.echo(f"hotline: call rejected: {phone.rejected}", err=True)
            raise typer.Exit(1)
        return phone

    async def _place_sip(
        self, http: httpx.AsyncClient, utterances: list[PCM], dtmf: str
    ) -> CallResult:
        from voice.devtools.bench import sip_call_id, sip_calls
        from voice.devtools.sip_caller import place_sip_call

        where = urlsplit(f"sip://{self.address}")
        host, port = where.hostname or "127.0.0.1", where.port or SIP_PORT
        earlier = await sip_calls(http, self.from_)  # the same number may have called before
        result = await place_sip_call(
            host,
            port,
            utterances,
            number=self.to,
            caller=self.from_,
            dtmf=dtmf,
            opening_wait_s=self.opening_wait_s,
        )
        if result.rejected is not None:
            typer.echo(f"hotline: SIP call rejected: {result.rejected}", err=True)
            raise typer.Exit(1)
        result.call_id = await sip_call_id(http, self.from_, known=earlier) or result.call_id
        return result


def _print_ending(result: CallResult, detail: dict[str, Any]) -> None:
    """Where the call went (a transfer) and why it ended, as the caller and the server saw it."""
    from voice.devtools.phone_caller import PhoneCallResult

    if isinstance(result, PhoneCallResult) and result.transferred_to is not None:
        console.print(f"[bold]Twilio put the caller through to {result.transferred_to}[/]")
    elif isinstance(result, PhoneCallResult) and result.after_stream is not None:
        console.print(f"after the stream, Twilio was told: {result.after_stream}")
    for event in result.events:
        if event.get("type") == "transfer":
            console.print(f"[bold]put through to {event.get('to')}[/] ({event.get('reason')})")
    if detail.get("end_reason"):
        console.print(f"the call ended: {detail['end_reason']}")


def _turn_table(
    result: CallResult, records: list[dict[str, Any]], measured: dict[int, dict[str, list[float]]]
) -> Table:
    """One call's turns, as the caller heard them and as the server recorded them; their
    timings are added to `measured` (turn index -> part -> ms) for the medians."""
    table = Table(
        "turn", "caller said", "bot replied", "voice-to-voice ms", "server parts ms", "LLM"
    )
    for index, turn in enumerate(result.turns):
        record = records[index] if index < len(records) else {}
        parts: dict[str, float] = record.get("timings_ms", {})
        v2v = turn.voice_to_voice_ms
        if v2v is not None:
            samples = measured.setdefault(index, {})
            samples.setdefault("voice_to_voice", []).append(v2v)
            for stage, ms in parts.items():
                samples.setdefault(stage, []).append(ms)
        table.add_row(
            str(index + 1),
            str(record.get("caller_text", "")),
            str(record.get("reply_text", "")),
            "-" if v2v is None else f"{v2v:.0f}",
            " ".join(f"{k}={v:.0f}" for k, v in parts.items()),
            _decision(record.get("decision")),
        )
    return table


def _decision(decision: dict[str, Any] | None) -> str:
    """The controller's choice for a turn, in a few words."""
    if not decision:
        return ""
    taken = "" if decision.get("taken") == "planned" else f" ({decision.get('taken')})"
    return f"{decision.get('effort')} on {decision.get('tier')}{taken}"
