"""Logging for every `hotline` command: one line per record, control characters escaped."""

from __future__ import annotations

import logging
import sys

from rich.console import Console
from rich.logging import RichHandler

_CONTROL = {c: f"\\x{c:02x}" for c in (*range(32), 127)}


class OneLineFormatter(logging.Formatter):
    """Each record's message on one line: control characters a caller sent (a call id with a
    newline, a URL with %0A) are escaped, so nobody can forge a log line. Tracebacks, added
    after the message, keep their lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return super().formatMessage(record).translate(_CONTROL)


def setup_logging(level: str, console: Console | None = None) -> None:
    """Rich output on a terminal, one plain line per record otherwise (logs, CI, tests).
    `console`: the one a command also draws on (a progress bar), so log lines do not tear it."""
    handler: logging.Handler
    if console is not None or sys.stderr.isatty():
        handler = RichHandler(console=console or Console(stderr=True), show_path=False)
        fmt = "%(name)s: %(message)s"
    else:
        handler = logging.StreamHandler()
        fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handler.setFormatter(OneLineFormatter(fmt))
    logging.basicConfig(level=level.upper(), handlers=[handler])
