"""What the client commands (`call`, `bench`, `soak`, `experiments`) share: the server's URL and
API token options, and a failed request told in one line, never a traceback."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Annotated

import httpx
import typer

DEFAULT_URL = "http://127.0.0.1:8080"
UrlOption = Annotated[str, typer.Option("--url", "--server", help="The server's base URL")]
TokenOption = Annotated[
    str | None,
    typer.Option(
        help="The server's API token (HOTLINE_API_TOKEN)",
        envvar="HOTLINE_API_TOKEN",
        show_default=False,
        show_envvar=False,  # help never shows a token from the environment
    ),
]


def auth_headers(token: str | None) -> dict[str, str]:
    """The Authorization header for the API token; none without one."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def explain(exc: httpx.HTTPError, url: str) -> str:
    """A failed request as one line: what was asked, what the server said, and what to do."""
    if isinstance(exc, httpx.HTTPStatusError):
        response = exc.response
        request = response.request
        reason = _reason(response)
        line = f"{request.method} {request.url.path}: HTTP {response.status_code}: {reason}"
        if response.status_code == 401:
            line += " (give the server's API token: --token or HOTLINE_API_TOKEN)"
        return line
    return f"cannot reach the server at {url}: {exc.__class__.__name__}: {exc}"


def _reason(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:200] or response.reason_phrase
    if isinstance(body, dict) and isinstance(body.get("error") or body.get("detail"), str):
        return str(body.get("error") or body.get("detail"))
    return response.text.strip()[:200]


@contextlib.contextmanager
def one_line_errors(url: str, code: int = 1) -> Iterator[None]:
    """A request that fails inside ends the command with one line on stderr and exit `code`."""
    try:
        yield
    except httpx.HTTPError as exc:
        typer.echo(f"hotline: {explain(exc, url)}", err=True)
        raise typer.Exit(code) from None
