"""Small lexical rules of SIP shared by the parser, the writer and the refusals, I/O-free:
where a control character may stand (only escaped inside a quoted string, RFC 3261 §25.1
`quoted-pair`), the error for a version we do not speak (§8.2.1 and §21.5.7: 505), and the
reason phrase of each status code we send (§21), so that a code and its phrase never disagree,
and the user part of a URI as routing reads it (`uri_user`: percent-decoded, §19.1.2).
"""

from __future__ import annotations

import re
import urllib.parse

from voice.transports.sip.headers import SipParseError, parse_uri

# The characters that decide: a backslash and what it escapes, a quote, a control character
# (tab aside). Everything else is skipped by the regex, so the scan is linear.
_SPECIAL = re.compile(rb'\\[\x00-\xff]|\\$|"|[\x00-\x08\x0a-\x1f\x7f]')
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_USER = re.compile(r"[!#-;=?-~]+")  # a URI's user part as `headers` reads it
_NOT_ESCAPABLE = (0x0A, 0x0D)  # quoted-pair = "\" (%x00-09 / %x0B-0C / %x0E-7F)

REASON_PHRASES = {
    100: "Trying", 180: "Ringing", 183: "Session Progress", 200: "OK", 202: "Accepted",
    400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 406: "Not Acceptable", 408: "Request Timeout",
    413: "Request Entity Too Large", 415: "Unsupported Media Type",
    416: "Unsupported URI Scheme", 420: "Bad Extension", 421: "Extension Required",
    422: "Session Interval Too Small", 480: "Temporarily Unavailable",
    481: "Call/Transaction Does Not Exist", 482: "Loop Detected", 486: "Busy Here",
    487: "Request Terminated", 488: "Not Acceptable Here", 491: "Request Pending",
    500: "Server Internal Error", 501: "Not Implemented", 503: "Service Unavailable",
    505: "Version Not Supported", 513: "Message Too Large", 603: "Decline",
    606: "Not Acceptable",
}  # fmt: skip


class UnsupportedVersion(SipParseError):
    """A request in a SIP version other than 2.0: answered 505 (RFC 3261 §8.2.1)."""


def reason_phrase(status: int) -> str:
    """The RFC 3261 §21 reason phrase of `status` (its class's if the code is not listed)."""
    return REASON_PHRASES.get(status) or REASON_PHRASES.get(status // 100 * 100, "Unknown")


def bare_control(line: bytes | str) -> bool:
    """Whether `line` holds a control character (tab aside) that is not escaped inside a quoted
    string. RFC 4475 §3.1.1.2 (`intmeth`) puts `\\<NUL>`, `\\<BEL>` and `\\<DEL>` in a display
    name: valid. Linear in the length of the line."""
    data = line.encode("utf-8", "surrogateescape") if isinstance(line, str) else line
    if _CONTROL.search(data) is None:
        return False  # the usual case, in C
    quoted = False
    for match in _SPECIAL.finditer(data):
        token = match.group()
        if token == b'"':
            quoted = not quoted
        elif token[:1] == b"\\":
            escaped = token[1:]
            if not escaped:
                continue
            if escaped[0] in _NOT_ESCAPABLE or (not quoted and _CONTROL.match(escaped)):
                return True
            if not quoted and escaped == b'"':
                quoted = True  # outside quotes a backslash is an ordinary character
        else:
            return True
    return False


def uri_user(uri: str) -> str | None:
    """The user part of a sip:, sips: or tel: URI, percent-decoded (RFC 3261 §19.1.2, §25.1
    `escaped`: `sip:%2B15551230000@host` is the number +15551230000); kept as written if it
    decodes to something unprintable. A URI whose parameters our parser refuses (baresip over
    TLS writes `;transport=tls` twice) still yields its user."""
    try:
        user = parse_uri(uri).user
    except SipParseError:
        scheme, _, rest = uri.strip(" \t").partition(":")
        if scheme.lower() not in ("sip", "sips", "tel"):
            return None
        user, at, _ = rest.partition(";") if scheme.lower() == "tel" else rest.partition("@")
        if (not at and scheme.lower() != "tel") or _USER.fullmatch(user) is None:
            return None
    decoded = urllib.parse.unquote(user, errors="replace") if user else ""
    return (decoded if decoded.isprintable() else user) or None
