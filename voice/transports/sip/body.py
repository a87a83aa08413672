"""The session description in a SIP message's body: the body itself when it is
`application/sdp`, the `application/sdp` part of a `multipart/mixed` one (SIP-I/SIP-T INVITEs
carry SDP and ISUP side by side, RFC 5621 §3 and §4; RFC 3204 for the ISUP part), nothing (b"")
for an empty body or a multipart one without SDP: a late offer (RFC 3261 §13.2.1).

A body is hostile input: the multipart split is linear in its size (`bytes.find` from where the
last boundary ended), the part count and the part headers are bounded, and what we cannot read
is `BodyError`: 415 with the `Accept` and `Accept-Encoding` we take (RFC 3261 §21.4.13, §20.1)
for a Content-Type or Content-Encoding we do not know or a required part we do not understand
(RFC 5621 §9, RFC 3261 §20.11), 400 for a malformed multipart body.
"""

from __future__ import annotations

import re

ACCEPT = "application/sdp, multipart/mixed"
ACCEPT_ENCODING = "identity"
MAX_PARTS = 8
MAX_PART_HEADER_BYTES = 2048

_BOUNDARY = re.compile(r'boundary\s*=\s*(?:"([^"\r\n]{1,70})"|([^;\s"]{1,70}))', re.IGNORECASE)
_ENCODINGS = {"", "identity"}


class BodyError(ValueError):
    """A body we cannot take: `status` 415 (unsupported) or 400 (malformed)."""

    def __init__(self, message: str, status: int = 415) -> None:
        super().__init__(message)
        self.status = status

    @property
    def reason(self) -> str:
        return "Unsupported Media Type" if self.status == 415 else "Bad Request"

    def headers(self) -> list[tuple[str, str]]:
        """The headers of the refusal: what we accept (415), and a Warning saying why."""
        warning = [("Warning", f'399 hotline "{self}"')]
        if self.status != 415:
            return warning
        return [("Accept", ACCEPT), ("Accept-Encoding", ACCEPT_ENCODING), *warning]


def media_type(content_type: str | None) -> str:
    """`type/subtype` of a Content-Type value, lower case ("" if none)."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def session_body(
    body: bytes, content_type: str | None, content_encoding: str | None = None
) -> bytes:
    """The SDP `body` carries (b"" if none: a late offer), or BodyError."""
    encoding = (content_encoding or "").strip().lower()
    if encoding not in _ENCODINGS:
        raise BodyError(f"Content-Encoding {encoding[:40]!r} not supported")
    if not body.strip():
        return b""
    kind = media_type(content_type)
    if kind in ("application/sdp", ""):  # (no Content-Type, §20.15 notwithstanding: SDP)
        return body
    if kind == "multipart/mixed":
        return _sdp_part(body, content_type or "")
    raise BodyError(f"Content-Type {kind[:60] or 'missing'!r} not supported")


def _sdp_part(body: bytes, content_type: str) -> bytes:
    """The first application/sdp part of a multipart/mixed body (RFC 2046 §5.1.1), b"" if
    none; BodyError 415 for a part we must understand but cannot (handling=required)."""
    match = _BOUNDARY.search(content_type)
    if match is None:
        raise BodyError("multipart body without a boundary", 400)
    delimiter = b"--" + (match.group(1) or match.group(2)).encode("latin-1", "replace")
    found = b""
    for headers, content in _parts(body, delimiter):
        kind = media_type(headers.get("content-type") or "text/plain")
        if kind == "application/sdp" and not found:
            if headers.get("content-encoding", "identity").strip().lower() not in _ENCODINGS:
                raise BodyError("the SDP part's Content-Encoding is not supported")
            found = content
        elif kind != "application/sdp" and _required(headers.get("content-disposition", "")):
            raise BodyError(f"a required body part of type {kind[:60]!r} is not supported")
    return found


def _required(disposition: str) -> bool:
    """Content-Disposition handling=required (RFC 3261 §20.11; "required" is the default for
    every disposition but the "session" ones RFC 5621 §5 names, and ISUP is sent optional)."""
    params = [p.strip().lower().replace(" ", "") for p in disposition.split(";")[1:]]
    return "handling=required" in params


def _parts(body: bytes, delimiter: bytes) -> list[tuple[dict[str, str], bytes]]:
    """The parts between `delimiter` lines (the preamble before the first and the epilogue
    after the closing `delimiter--` ignored). One pass: each `find` starts where the last
    delimiter ended. BodyError 400 if there is no closing delimiter or too many parts."""
    start = _delimiter_at(body, delimiter, 0)
    if start < 0:
        raise BodyError("multipart body without its boundary", 400)
    parts: list[tuple[dict[str, str], bytes]] = []
    position = start + len(delimiter)
    while not body.startswith(b"--", position):
        end = _delimiter_at(body, delimiter, position)
        if end < 0:
            raise BodyError("multipart body without its closing boundary", 400)
        if len(parts) == MAX_PARTS:
            raise BodyError(f"more than {MAX_PARTS} body parts", 400)
        line_end = body.find(b"\n", position, end)
        content = body[line_end + 1 if line_end >= 0 else end : end]
        parts.append(_part(content.removesuffix(b"\n").removesuffix(b"\r")))
        position = end + len(delimiter)
    return parts


def _delimiter_at(body: bytes, delimiter: bytes, start: int) -> int:
    """Where the next `delimiter` at the start of a line is (-1 if none)."""
    at = body.find(delimiter, start)
    while at > 0 and body[at - 1 : at] != b"\n":
        at = body.find(delimiter, at + 1)
    return at


def _part(raw: bytes) -> tuple[dict[str, str], bytes]:
    """A body part's headers (lower-case names; none: text/plain, RFC 2046 §5.1) and body."""
    if raw.startswith((b"\r\n", b"\n")):
        return {}, raw.removeprefix(b"\r\n").removeprefix(b"\n")
    ends = [
        (at, size) for at, size in ((raw.find(b"\r\n\r\n"), 4), (raw.find(b"\n\n"), 2)) if at >= 0
    ]
    if not ends:
        raise BodyError("body part without a blank line after its headers", 400)
    split, skip = min(ends)
    if split > MAX_PART_HEADER_BYTES:
        raise BodyError(f"body part headers longer than {MAX_PART_HEADER_BYTES} bytes", 400)
    headers: dict[str, str] = {}
    for line in raw[:split].decode("utf-8", "replace").splitlines():
        name, colon, value = line.partition(":")
        if colon:
            headers.setdefault(name.strip().lower(), value.strip())
    return headers, raw[split + skip :]
