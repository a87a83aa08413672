"""SIP messages, I/O-free (RFC 3261 §7): parsing a datagram (`parse_message`, §7.1–7.5, §18.3),
framing a byte stream (`StreamFramer`, §18.3 and the CRLF keep-alives of RFC 5626 §3.5.1),
writing a message back (`SipMessage.to_bytes`), a UAS's responses (`response_to`, §8.2.6) and
fresh tags, branches and Call-IDs (§19.3, §8.1.1.7, §8.1.1.4).

Input is hostile: anything malformed or over the limits raises `SipParseError` and nothing
else, and the work done is linear in the input. Header names are stored in their full form and
usual spelling ("i" -> "Call-ID"); values without surrounding whitespace, folded lines joined by
one space (§7.3.1). Header values are UTF-8 (bytes that are not become U+FFFD); control
characters but tab are refused unless escaped in a quoted string (§25.1). The values (URIs,
name-addr, Via, digest parameters) are parsed by `voice.transports.sip.headers`, re-exported.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

from voice.transports.sip.headers import (
    LIST_HEADERS,
    NameAddr,
    SipParseError,
    SipUri,
    Via,
    canonical_name,
    is_token,
    parse_auth_params,
    parse_name_addr,
    parse_params,
    parse_uri,
    parse_via,
    split_list,
)
from voice.transports.sip.syntax import UnsupportedVersion, bare_control

__all__ = [
    "MAX_HEADER_LINES", "MAX_LINE_BYTES", "MAX_MESSAGE_BYTES", "NameAddr", "SipMessage",
    "SipParseError", "SipUri", "StreamFramer", "Via", "canonical_name", "new_branch",
    "new_call_id", "new_tag", "parse_auth_params", "parse_message", "parse_name_addr",
    "parse_params", "parse_uri", "parse_via", "response_to", "split_list",
]  # fmt: skip

MAX_MESSAGE_BYTES = 65_535  # a larger datagram, or a larger message on a stream, is refused
MAX_HEADER_LINES = 200
MAX_LINE_BYTES = 8192

_REQUIRED = ("Via", "From", "To", "Call-ID", "CSeq")
_SINGLE = ("From", "To", "Call-ID", "CSeq", "Content-Length")
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_NAME = re.compile(rb"[A-Za-z0-9\-.!%*_+`'~]+")
_REQUEST_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:[!-~]+")
_CSEQ = re.compile(r"([0-9]{1,10})[ \t]+([A-Za-z0-9\-.!%*_+`'~]+)")


@dataclass
class SipMessage:
    """A request (`method`, `uri`) or a response (`status`, `reason`), its headers in order
    (full names, usual spelling) and its body."""

    method: str | None = None
    uri: str | None = None
    status: int | None = None
    reason: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    @property
    def is_request(self) -> bool:
        return self.method is not None

    def header(self, name: str) -> str | None:
        """The value of the first header line of that name (any spelling, compact forms
        included), whole: a comma-separated list stays one string (see `header_values`)."""
        key = canonical_name(name)
        for have, value in self.headers:
            if canonical_name(have) == key:
                return value
        return None

    def header_values(self, name: str) -> list[str]:
        """Every value of a header; a line holding a comma-separated list (Via, Route,
        Contact, Allow, ...) is split into its items. SipParseError on an unclosed `"` or `<`."""
        key = canonical_name(name)
        values: list[str] = []
        for have, value in self.headers:
            if canonical_name(have) == key:
                values.extend(split_list(value) if key in LIST_HEADERS else [value])
        return values

    def set_header(self, name: str, value: str) -> None:
        """Replace every header of that name by one, where the first was (else at the end)."""
        key = _checked(name, value)
        headers: list[tuple[str, str]] = []
        placed = False
        for have, old in self.headers:
            if canonical_name(have) != key:
                headers.append((have, old))
            elif not placed:
                headers.append((key, value))
                placed = True
        if not placed:
            headers.append((key, value))
        self.headers = headers

    def add_header(self, name: str, value: str) -> None:
        self.headers.append((_checked(name, value), value))

    def remove_header(self, name: str) -> None:
        key = canonical_name(name)
        self.headers = [
            (have, value) for have, value in self.headers if canonical_name(have) != key
        ]

    def to_bytes(self) -> bytes:
        """The message on the wire; Content-Length always says len(body). ValueError if a part
        would break the framing (a line break in a value, a space in the method or URI)."""
        if self.method is not None:
            if not is_token(self.method) or _REQUEST_URI.fullmatch(self.uri or "") is None:
                raise ValueError(f"bad request line: {self.method!r} {self.uri!r}")
            lines = [f"{self.method} {self.uri} SIP/2.0"]
        else:
            if self.status is None or not 100 <= self.status <= 699:
                raise ValueError(f"bad status {self.status!r}")
            lines = [f"SIP/2.0 {self.status} {self.reason}"]
        length_written = False
        for name, value in self.headers:
            key = canonical_name(name)
            if key == "Content-Length":
                if length_written:
                    continue
                value, length_written = str(len(self.body)), True
            lines.append(f"{key}: {value}")
        if not length_written:
            lines.append(f"Content-Length: {len(self.body)}")
        for line in lines:
            if bare_control(line):
                raise ValueError(f"control character in {line[:80]!r}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + self.body

    @property
    def call_id(self) -> str:
        value = self.header("Call-ID")
        if not value:
            raise SipParseError("missing Call-ID")
        return value

    @property
    def cseq(self) -> tuple[int, str]:
        """(sequence number, method) of the CSeq header."""
        return _parse_cseq(self.header("CSeq"))

    @property
    def branch(self) -> str | None:
        """The branch parameter of the top Via."""
        vias = self.header_values("Via")
        return parse_via(vias[0]).branch if vias else None


def _checked(name: str, value: str) -> str:
    key = canonical_name(name)
    if not is_token(key):
        raise ValueError(f"bad header name {name!r}")
    if bare_control(value):
        raise ValueError(f"control character in the value of {key}")
    return key


def _parse_cseq(value: str | None) -> tuple[int, str]:
    if value is None:
        raise SipParseError("missing CSeq")
    match = _CSEQ.fullmatch(value)
    if match is None or int(match.group(1)) >= 2**31:
        raise SipParseError(f"bad CSeq {value[:40]!r}")
    return int(match.group(1)), match.group(2)


def _parse_content_length(value: str) -> int:
    if not (value.isascii() and value.isdigit() and len(value) <= 10):
        raise SipParseError(f"bad Content-Length {value[:20]!r}")
    return int(value)


def _parse_start_line(line: bytes, message: SipMessage) -> None:
    text = line.decode("utf-8", "replace")
    if text[:4].upper() == "SIP/":
        version, _, rest = text.partition(" ")
        code, _, reason = rest.partition(" ")
        if version.upper() != "SIP/2.0":
            raise UnsupportedVersion(f"unsupported SIP version {version[:20]!r}")
        if not (len(code) == 3 and code.isascii() and code.isdigit() and "100" <= code <= "699"):
            raise SipParseError(f"bad status code {code[:20]!r}")
        message.status, message.reason = int(code), reason.strip(" \t")
        return
    parts = text.split(" ")
    if len(parts) != 3:
        raise SipParseError(f"bad request line {text[:80]!r}")
    method, uri, version = parts
    if not is_token(method):
        raise SipParseError(f"bad method {method[:20]!r}")
    if _REQUEST_URI.fullmatch(uri) is None:
        raise SipParseError(f"bad Request-URI {uri[:80]!r}")
    if version.upper() != "SIP/2.0":
        raise UnsupportedVersion(f"unsupported SIP version {version[:20]!r}")
    message.method, message.uri = method, uri


def _parse_head(head: bytes) -> SipMessage:
    """The start line and headers (everything before the empty line), checked; no body."""
    lines = head.split(b"\n")
    if len(lines) > MAX_HEADER_LINES + 1:
        raise SipParseError(f"more than {MAX_HEADER_LINES} header lines")
    message = SipMessage()
    headers: list[list[str]] = []
    for number, raw in enumerate(lines):
        line = raw[:-1] if raw.endswith(b"\r") else raw
        if len(line) > MAX_LINE_BYTES:
            raise SipParseError(f"line {number + 1} longer than {MAX_LINE_BYTES} bytes")
        if bare_control(line):
            raise SipParseError(f"control character in line {number + 1}")
        if number == 0:
            _parse_start_line(line, message)
        elif line[:1] in (b" ", b"\t"):
            if not headers:
                raise SipParseError("continuation line before the first header")
            folded = line.decode("utf-8", "replace").strip(" \t")
            headers[-1][1] = " ".join(part for part in (headers[-1][1], folded) if part)
        else:
            name, colon, value = line.partition(b":")
            name = name.rstrip(b" \t")
            if not colon or _NAME.fullmatch(name) is None:
                raise SipParseError(f"bad header line {line[:40]!r}")
            text = value.decode("utf-8", "replace").strip(" \t")
            headers.append([canonical_name(name.decode("ascii")), text])
    message.headers = [(name, value) for name, value in headers]
    _check_headers(message)
    return message


def _check_headers(message: SipMessage) -> None:
    """The headers every request and response needs, once each where only one may be, and
    well formed: CSeq, Via, From, To, Content-Length."""
    names = [name for name, _ in message.headers]
    for name in _REQUIRED:
        if name not in names:
            raise SipParseError(f"missing {name} header")
    for name in _SINGLE:
        if names.count(name) > 1:
            raise SipParseError(f"more than one {name} header")
    method = message.cseq[1]
    if message.method is not None and method != message.method:
        raise SipParseError(f"CSeq method {method!r} is not the request's {message.method!r}")
    if not message.call_id or any(ch in message.call_id for ch in " \t"):
        raise SipParseError("bad Call-ID")
    vias = message.header_values("Via")
    if not vias:
        raise SipParseError("missing Via header")
    for via in vias:
        parse_via(via)
    for name in ("From", "To"):
        parse_name_addr(message.header(name) or "")
    length = message.header("Content-Length")
    if length is not None:
        _parse_content_length(length)


def parse_message(data: bytes) -> SipMessage:
    """One complete message, such as a UDP datagram. The body is Content-Length bytes (the rest
    of the datagram if there is no Content-Length; bytes beyond it are dropped, §18.3)."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise SipParseError(f"message longer than {MAX_MESSAGE_BYTES} bytes")
    data = bytes(data).lstrip(b"\r\n")
    if not data:
        raise SipParseError("empty message")
    end = _HEAD_END.search(data)
    if end is None:
        raise SipParseError("no empty line after the headers")
    message = _parse_head(data[: end.start()])
    rest = data[end.end() :]
    length = message.header("Content-Length")
    if length is None:
        message.body = rest
        message.headers.append(("Content-Length", str(len(rest))))
        return message
    size = _parse_content_length(length)
    if size > len(rest):
        raise SipParseError(f"Content-Length {size} but only {len(rest)} bytes of body")
    message.body = rest[:size]
    message.set_header("Content-Length", str(size))
    return message


class StreamFramer:
    """Cuts a TCP byte stream into messages (RFC 3261 §18.3: Content-Length is mandatory).
    CRLFs between messages are skipped; `keepalives` counts the double-CRLF pings among them
    (RFC 5626 §4.4.1: each deserves a single CRLF back). After a SipParseError the stream
    cannot be trusted: every later `feed` raises it again, and the connection should close."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._searched = 0  # bytes of the buffer already searched for the end of the head
        self._head: tuple[SipMessage, int, int] | None = None  # message, body start, length
        self._crlfs = 0
        self._error: SipParseError | None = None
        self.keepalives = 0

    @property
    def incomplete(self) -> bool:
        """Whether part of a message has come: its first bytes, not yet its last."""
        buffer = self._buffer  # CRLFs before a message are skipped; a lone CR may wait
        return self._head is not None or len(buffer) > 1 or (len(buffer) == 1 and buffer[0] != 13)

    def feed(self, data: bytes) -> list[SipMessage]:
        """Take the next bytes; return the messages they complete, in order."""
        if self._error is not None:
            raise self._error
        self._buffer += data
        messages: list[SipMessage] = []
        try:
            while (message := self._next()) is not None:
                messages.append(message)
        except SipParseError as exc:
            self._error = exc
            self._buffer.clear()
            raise
        return messages

    def _skip_crlfs(self) -> None:
        buffer = self._buffer
        start = 0
        while start < len(buffer):
            if buffer[start] == 0x0A:
                start += 1
            elif buffer[start] == 0x0D and start + 1 < len(buffer) and buffer[start + 1] == 0x0A:
                start += 2
            else:
                break
            self._crlfs += 1
            if self._crlfs == 2:
                self.keepalives += 1
                self._crlfs = 0
        del buffer[:start]
        if buffer and buffer[0] != 0x0D:
            self._crlfs = 0

    def _next(self) -> SipMessage | None:
        if self._head is None:
            self._skip_crlfs()
            if not self._buffer or self._buffer == b"\r":
                return None
            end = _HEAD_END.search(self._buffer, max(0, self._searched - 3))
            if end is None or end.end() > MAX_MESSAGE_BYTES:
                if len(self._buffer) > MAX_MESSAGE_BYTES:
                    raise SipParseError(f"headers longer than {MAX_MESSAGE_BYTES} bytes")
                self._searched = len(self._buffer)
                return None
            message = _parse_head(bytes(self._buffer[: end.start()]))
            length = message.header("Content-Length")
            if length is None:
                raise SipParseError("missing Content-Length (required on a stream)")
            size = _parse_content_length(length)
            if end.end() + size > MAX_MESSAGE_BYTES:
                raise SipParseError(f"message longer than {MAX_MESSAGE_BYTES} bytes")
            message.set_header("Content-Length", str(size))
            self._head = (message, end.end(), size)
        message, start, size = self._head
        if len(self._buffer) < start + size:
            return None
        message.body = bytes(self._buffer[start : start + size])
        del self._buffer[: start + size]
        self._head, self._searched = None, 0
        return message


def response_to(
    request: SipMessage,
    status: int,
    reason: str,
    *,
    to_tag: str | None = None,
    headers: Sequence[tuple[str, str]] = (),
    body: bytes = b"",
    content_type: str | None = None,
) -> SipMessage:
    """A response to `request` (RFC 3261 §8.2.6.2): every Via in order, From, To (with
    `;tag=to_tag` added if it has no tag yet), Call-ID and CSeq copied; then `headers`, then
    Content-Type (needed with a body) and Content-Length."""
    if not request.is_request:
        raise ValueError("response_to needs a request")
    if not 100 <= status <= 699:
        raise ValueError(f"bad status {status}")
    response = SipMessage(status=status, reason=reason)
    for name, value in request.headers:
        if canonical_name(name) == "Via":
            response.add_header("Via", value)
    for name in ("From", "To", "Call-ID", "CSeq"):
        copied = request.header(name)
        if copied is None:
            raise SipParseError(f"missing {name} header")
        if name == "To" and to_tag is not None and "tag" not in parse_name_addr(copied).params:
            copied = f"{copied};tag={to_tag}"
        response.add_header(name, copied)
    for name, value in headers:
        response.add_header(name, value)
    if content_type is not None:
        response.set_header("Content-Type", content_type)
    if body and response.header("Content-Type") is None:
        raise ValueError("a body needs a Content-Type")
    response.set_header("Content-Length", str(len(body)))
    response.body = body
    return response


def new_tag() -> str:
    """A From/To tag with 64 random bits (RFC 3261 §19.3 asks for at least 32)."""
    return secrets.token_hex(8)


def new_branch() -> str:
    """A Via branch: the RFC 3261 magic cookie and 80 random bits (§8.1.1.7)."""
    return "z9hG4bK" + secrets.token_hex(10)


def new_call_id(host: str) -> str:
    """A Call-ID, 128 random bits `@host` (§8.1.1.4)."""
    local = secrets.token_hex(16)
    host = host.strip()
    if any(ch.isspace() for ch in host):
        raise ValueError(f"bad host {host!r}")
    return f"{local}@{host}" if host else local
