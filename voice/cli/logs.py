"""Logging for every `hotline` command: one line per record, control characters escaped, and
secrets redacted from every line (uvicorn's access log included, since it reaches the same
handler)."""

from __future__ import annotations

import logging
import re
import sys

from rich.console import Console
from rich.logging import RichHandler

_CONTROL = {c: f"\\x{c:02x}" for c in (*range(32), 127)}

REDACTED = "[redacted]"
# A query (or form) parameter whose value is a secret: `token=…`, `access_token=…`,
# `X-Amz-Signature=…`, `client_secret=…`, also percent-encoded (`token%3D…`, a URL inside a
# URL). The name is a whole word ending in one of these; the value runs to the next separator.
# Linear: a name can start only where a word starts (the look-behind), the word is scanned once
# and given back at most once, and the value is one character class.
_SECRET_NAMES = (
    r"token|secret|password|passwd|pwd|signature|sig|credential|api_?key|apikey|auth"
    r"|session_?id|jwt"
)
_SECRET_PARAMETER = re.compile(
    rf"(?<![\w.-])([\w.-]*(?:{_SECRET_NAMES}))(=|%3[dD])[^&\s\"'<>#;,]*", re.IGNORECASE
)
# An HTTP credential quoted in a line: `Bearer …`, `Basic …` followed by 8 or more token
# characters (so that prose, "wrong bearer token", stays as it is).
_CREDENTIAL = re.compile(
    r"(?<![\w-])(bearer|basic)(\s+)(?=[\w.~+/=-]{8})[\w.~+/=-]+", re.IGNORECASE
)


def redact(line: str) -> str:
    """`line` with the values of secret parameters and HTTP credentials replaced by
    `[redacted]`. Linear in the line's length."""
    line = _SECRET_PARAMETER.sub(rf"\1\2{REDACTED}", line)
    return _CREDENTIAL.sub(rf"\1\2{REDACTED}", line)


class OneLineFormatter(logging.Formatter):
    """Each record's message on one line: control characters a caller sent (a call id with a
    newline, a URL with %0A) are escaped, so nobody can forge a log line. Tracebacks, added
    after the message, keep their lines. Secrets are redacted from the whole of it (`redact`):
    message, arguments, traceback."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return super().formatMessage(record).translate(_CONTROL)

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def setup_logging(level: str, console: Console | None = None) -> None:
    """Rich output on a terminal, one plain line per record otherwise (logs, CI, tests).
    `console`: the one a command also draws on (a progress bar), so log lines do not tear it.
    Every record of the process (uvicorn's, the access log's, libraries') reaches this one
    handler, so every line is redacted."""
    handler: logging.Handler
    if console is not None or sys.stderr.isatty():
        handler = RichHandler(console=console or Console(stderr=True), show_path=False)
        fmt = "%(name)s: %(message)s"
    else:
        handler = logging.StreamHandler()
        fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handler.setFormatter(OneLineFormatter(fmt))
    logging.basicConfig(level=level.upper(), handlers=[handler])
