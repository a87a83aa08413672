"""The refusals a request earns before any handler looks at it, I/O-free (RFC 3261 §8.2):

- `refusal(request)`: a parsed request we will not serve, and the answer it gets: an unknown
  Request-URI scheme 416 (§8.2.2.1), a Request-URI carrying headers 400 (§19.1.1 table 1;
  RFC 4475 §3.1.2.10), a `Require` naming an option we lack 420 with `Unsupported` (§8.2.2.3),
  an `Accept` that excludes SDP on an INVITE or OPTIONS 406 (§8.2.3, §11.2, §21.4.7), what
  the parser lets by but the grammar forbids 400 (RFC 4475 §3.1.2); None if it may go on.
- `malformed_answer(data, error)`: the bytes of a 400 (or 505 for a version other than 2.0,
  §8.2.1) for a datagram that failed to parse but whose Via can still be read (§8.2.6), so
  that its sender stops retransmitting; None when there is nothing to answer (a response, no
  readable Via) or the answer would outgrow what came by more than its own few bytes (a
  reflector that amplifies is of use to nobody but an attacker).

Both are linear in their input and never raise on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from voice.transports.sip.headers import (
    SipParseError,
    canonical_name,
    parse_via,
    read_quoted,
    split_list,
)
from voice.transports.sip.message import MAX_HEADER_LINES, MAX_LINE_BYTES, SipMessage, new_tag
from voice.transports.sip.syntax import UnsupportedVersion, bare_control, reason_phrase

SUPPORTED_OPTIONS = frozenset({"timer"})  # option tags we honour in Require (RFC 4028)
URI_SCHEMES = frozenset({"sip", "sips", "tel"})
_SDP_RANGES = frozenset({"application/sdp", "application/*", "*/*"})
_COPIED = ("Via", "From", "To", "Call-ID", "CSeq")
_SLACK = 64  # the bytes a bare answer may add to what came (its To tag, its status line)
# What cannot stand in an unquoted display name and would change how the value reads (§25.1
# `token` forbids more, "(" and ")" say: those real phones send, and we take).
_SEPARATORS = re.compile(r'[,;"<>\\@]')
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_WARNING_TEXT = re.compile(r"[^ !#-\[\]-~]")  # what cannot stand in a Warning's quoted text


@dataclass(frozen=True)
class Refusal:
    """The final answer to a request refused up front, and why (for the log)."""

    status: int
    why: str
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def reason(self) -> str:
        return reason_phrase(self.status)


def refusal(request: SipMessage) -> Refusal | None:
    """The answer `request` gets before its method is looked at, or None. ACKs get none."""
    method = request.method or ""
    if method == "ACK":
        return None
    try:
        return (
            _uri_refusal(request.uri or "")
            or _syntax_refusal(request)
            or _require_refusal(request, method)
            or (_accept_refusal(request) if method in ("INVITE", "OPTIONS") else None)
        )
    except SipParseError as exc:  # a Require or Accept with an unclosed quote or <
        return Refusal(400, str(exc))


def _uri_refusal(uri: str) -> Refusal | None:
    scheme, _, rest = uri.partition(":")
    if scheme.lower() not in URI_SCHEMES:
        return Refusal(416, f"Request-URI scheme {scheme[:20]!r} is not sip, sips or tel")
    if "?" in rest.rpartition("@")[2]:
        return Refusal(400, "headers in the Request-URI")
    return None


def _syntax_refusal(request: SipMessage) -> Refusal | None:
    """What the parser lets through but the grammar does not (RFC 4475 §3.1.2.11-14): a Date
    not in GMT (§20.17), and in From, To and Contact a bare URI holding `?` (§20.10), white
    space inside <...> or an unquoted display name with a separator in it (§25.1 `name-addr`)."""
    date = request.header("Date")
    if date is not None and not date.rstrip(" \t").endswith(" GMT"):
        return Refusal(400, f"Date not in GMT: {date[:40]!r}")
    for name in ("From", "To", "Contact"):
        for value in request.header_values(name) if name == "Contact" else [request.header(name)]:
            problem = _name_addr_problem(value or "")
            if problem is not None:
                return Refusal(400, f"{name}: {problem}")
    return None


def _name_addr_problem(value: str) -> str | None:
    value = value.strip(" \t")
    if value.startswith('"'):
        end = read_quoted(value, 0)[0]
        display, rest = "", value[end:].lstrip(" \t")
    else:
        lt = value.find("<")
        if lt < 0 or 0 <= value.find('"') < lt:  # a bare URI (or `*`): no `?` in it, unquoted
            uri = value.partition(";")[0]
            return "a URI with headers must be in <...>" if "?" in uri else None
        display, rest = value[:lt], value[lt:]
    words = display.split()
    if any(_SEPARATORS.search(word) for word in words):
        return "a display name with separators must be quoted"
    inner = rest[1 : rest.find(">")] if rest.startswith("<") and ">" in rest else "x"
    if inner[:1] in (" ", "\t") or inner[-1:] in (" ", "\t"):
        return "white space inside <...>"
    return None


def _require_refusal(request: SipMessage, method: str) -> Refusal | None:
    if method == "CANCEL":  # §8.2.2.3: Require is not looked at on a CANCEL
        return None
    unknown = [t for t in request.header_values("Require") if t.lower() not in SUPPORTED_OPTIONS]
    if not unknown:
        return None
    listed = ", ".join(dict.fromkeys(unknown))
    return Refusal(420, f"unsupported Require: {listed[:100]}", (("Unsupported", listed),))


def _accept_refusal(request: SipMessage) -> Refusal | None:
    if request.header("Accept") is None:
        return None
    ranges = [
        item.partition(";")[0].strip(" \t").lower() for item in request.header_values("Accept")
    ]
    if any(media in _SDP_RANGES for media in ranges):
        return None
    if not any(ranges) and request.method == "OPTIONS":  # no body is acceptable: we send none
        return None
    shown = ", ".join(ranges)[:100] or "nothing"
    return Refusal(
        406, f"Accept excludes application/sdp ({shown})", (("Accept", "application/sdp"),)
    )


def malformed_answer(data: bytes, error: Exception) -> bytes | None:
    """The answer to a request that did not parse (see the module's notes), or None."""
    end = _HEAD_END.search(data)
    lines = (data[: end.start()] if end else data).lstrip(b"\r\n").split(b"\n", MAX_HEADER_LINES)
    start = lines[0].rstrip(b"\r")
    if start[:4].upper() == b"SIP/" or start.count(b" ") < 2:
        return None  # a response, or not a SIP request line
    copied = _copied(lines[1:MAX_HEADER_LINES])
    vias = copied.get("Via", [])
    version = isinstance(error, UnsupportedVersion)
    if not vias or not (version or _readable_via(vias[0])):
        return None
    status = 505 if version else 400
    out = [f"SIP/2.0 {status} {reason_phrase(status)}".encode()]
    out.extend(b"Via: " + value for value in vias)
    for name in _COPIED[1:]:
        for value in copied.get(name, [])[:1]:
            if name == "To" and b";tag=" not in value.lower():
                value += f";tag={new_tag()}".encode()
            out.append(name.encode() + b": " + value)
    warning = _WARNING_TEXT.sub("?", str(error))[:120]
    tail = [b"Content-Length: 0", b"", b""]
    reply = b"\r\n".join([*out, f'Warning: 399 hotline "{warning}"'.encode(), *tail])
    if len(reply) > len(data):
        reply = b"\r\n".join([*out, *tail])
    return reply if len(reply) <= len(data) + _SLACK else None


def _copied(lines: list[bytes]) -> dict[str, list[bytes]]:
    """The Via values, and the first From, To, Call-ID and CSeq, as written (unfolded lines
    only; a line with a bare control character or over the limit is left out)."""
    copied: dict[str, list[bytes]] = {}
    for raw in lines:
        line = raw.rstrip(b"\r")
        if len(line) > MAX_LINE_BYTES or line[:1] in (b" ", b"\t") or bare_control(line):
            continue
        name, colon, value = line.partition(b":")
        if not colon or not name.strip(b" \t").isascii():
            continue
        key = canonical_name(name.decode("ascii"))
        if key in _COPIED and (key == "Via" or key not in copied):
            copied.setdefault(key, []).append(value.strip(b" \t"))
    return copied


def _readable_via(value: bytes) -> bool:
    try:
        items = split_list(value.decode("utf-8", "replace"))
        return bool(items) and parse_via(items[0]) is not None
    except SipParseError:
        return False
