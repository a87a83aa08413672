"""SIP header field values, I/O-free: header names and their compact forms (RFC 3261 §7.3.1,
§7.3.3, §20), comma-separated lists (§7.3.1), generic parameters (§25.1 `generic-param`),
SIP, SIPS and tel URIs (§19.1, RFC 3966), name-addr values of From, To, Contact and Refer-To
(§20.10, §20.20, §20.39; RFC 3515), Via (§20.42) and digest credentials and challenges
(§22.4, §25.1 `auth-param`; RFC 7616).

Everything here raises `SipParseError` on malformed input and does work linear in its length:
values come from the network. Parameter values are kept as written (a quoted value keeps its
quotes, so that it is written back the same); hosts are kept without IPv6 brackets.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field


class SipParseError(ValueError):
    """A malformed SIP message or header value; the message says what is wrong."""


Params = dict[str, str | None]

_TOKEN = r"[A-Za-z0-9\-.!%*_+`'~]+"
_TOKEN_RE = re.compile(_TOKEN)
_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
_PARAM_VALUE_RE = re.compile(r"[!#-+\--:=?-~]+")  # printable ASCII but `"` `,` `;` `<` `>`
_HOST_RE = re.compile(r"[A-Za-z0-9_\-.]+")
_USER_RE = re.compile(r"[!#-;=?-~]+")  # printable ASCII but `"` `<` `>` (`@` ends it)
_URI_TEXT_RE = re.compile(r"[!#-;=?-~]+")  # an absoluteURI inside <...>: no space, quote, <, >
_AUTH_VALUE_RE = re.compile(r"[!#-+\--~]+")  # printable ASCII but `"` `,`
_TEL_RE = re.compile(r"[0-9A-Za-z*#+\-.()]+")
_VIA_RE = re.compile(r"SIP[ \t]*/[ \t]*2\.0[ \t]*/[ \t]*(" + _TOKEN + r")[ \t]+", re.IGNORECASE)

COMPACT_FORMS = {
    "i": "Call-ID",
    "f": "From",
    "t": "To",
    "v": "Via",
    "m": "Contact",
    "l": "Content-Length",
    "c": "Content-Type",
    "k": "Supported",
    "s": "Subject",
    "e": "Content-Encoding",
    "o": "Event",
    "r": "Refer-To",
    "b": "Referred-By",
    "u": "Allow-Events",
    "x": "Session-Expires",
    "a": "Accept-Contact",
    "j": "Reject-Contact",
    "d": "Request-Disposition",
    "y": "Identity",
}

# Names whose usual spelling is not plain Title-Case-Per-Word.
_SPELLINGS = {
    name.lower(): name
    for name in (
        "Call-ID", "CSeq", "WWW-Authenticate", "MIME-Version", "Min-SE", "RSeq", "RAck",
        "SIP-ETag", "SIP-If-Match", "P-Asserted-Identity", "P-Preferred-Identity",
        "P-Charging-Vector", "P-Access-Network-Info", "P-Called-Party-ID",
    )
}  # fmt: skip

# Headers whose grammar is a comma-separated list (RFC 3261 §7.3.1); Authorization and
# WWW-Authenticate are not (their parameters are separated by commas).
LIST_HEADERS = frozenset(
    {
        "Via", "Route", "Record-Route", "Contact", "Allow", "Supported", "Require",
        "Proxy-Require", "Unsupported", "Allow-Events", "Accept", "Accept-Encoding",
        "Accept-Language", "Content-Encoding", "Content-Language", "Path", "Service-Route",
        "P-Asserted-Identity", "P-Preferred-Identity", "Reason", "History-Info", "Diversion",
    }
)  # fmt: skip


def canonical_name(name: str) -> str:
    """A header name in its full form and usual spelling: "i" -> "Call-ID", "cseq" -> "CSeq",
    "x-my-header" -> "X-My-Header"."""
    lower = name.strip().lower()
    if len(lower) == 1 and lower in COMPACT_FORMS:
        return COMPACT_FORMS[lower]
    known = _SPELLINGS.get(lower)
    if known is not None:
        return known
    return "-".join(part[:1].upper() + part[1:] for part in lower.split("-"))


def is_token(text: str) -> bool:
    return _TOKEN_RE.fullmatch(text) is not None


def read_quoted(text: str, start: int) -> tuple[int, str]:
    """The quoted string starting at `text[start]` (a `"`): (index after it, its content with
    backslash escapes resolved)."""
    out: list[str] = []
    i = start + 1
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            if i + 1 >= n:
                break
            out.append(text[i + 1])
            i += 2
        elif ch == '"':
            return i + 1, "".join(out)
        else:
            out.append(ch)
            i += 1
    raise SipParseError(f"unterminated quoted string in {text[:80]!r}")


def _split(text: str, separator: str, *, angles: bool) -> list[str]:
    """`text` cut at each `separator` outside quoted strings (and outside <...> if `angles`)."""
    items: list[str] = []
    start = i = 0
    n = len(text)
    in_angle = False
    while i < n:
        ch = text[i]
        if ch == '"' and not in_angle:
            i = read_quoted(text, i)[0]
            continue
        if angles and ch == "<" and not in_angle:
            in_angle = True
        elif angles and ch == ">" and in_angle:
            in_angle = False
        elif ch == separator and not in_angle:
            items.append(text[start:i])
            start = i + 1
        i += 1
    if in_angle:
        raise SipParseError(f"unterminated < in {text[:80]!r}")
    items.append(text[start:])
    return items


def split_list(value: str) -> list[str]:
    """The items of a comma-separated header value, respecting quotes and <...>."""
    return [item.strip(" \t") for item in _split(value, ",", angles=True) if item.strip(" \t")]


def parse_params(text: str) -> Params:
    """`;name=value;flag` (the leading `;` optional) -> {name in lower case: value or None}.
    Values stay as written (quotes included); a parameter given twice is an error."""
    params: Params = {}
    for item in _split(text, ";", angles=False):
        name, eq, value = item.partition("=")
        name = name.strip(" \t")
        value = value.strip(" \t")
        if not name and not eq:
            continue  # `;;`, a trailing `;` or the text before the first `;`
        if not is_token(name):
            raise SipParseError(f"bad parameter name {name[:40]!r}")
        if eq and not value:
            raise SipParseError(f"parameter {name!r} has no value")
        if value.startswith('"'):
            if read_quoted(value, 0)[0] != len(value):
                raise SipParseError(f"bad quoted value of parameter {name!r}")
        elif eq and _PARAM_VALUE_RE.fullmatch(value) is None:
            raise SipParseError(f"bad value of parameter {name!r}: {value[:40]!r}")
        key = name.lower()
        if key in params:
            raise SipParseError(f"parameter {name!r} given twice")
        params[key] = value if eq else None
    return params


def format_params(params: Params) -> str:
    return "".join(f";{k}" if v is None else f";{k}={v}" for k, v in params.items())


def _parse_hostport(text: str) -> tuple[str, int | None]:
    """`host`, `host:port`, `[v6]` or `[v6]:port` -> (host without brackets, port)."""
    text = text.strip(" \t")
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise SipParseError(f"unterminated [ in host {text[:60]!r}")
        host, rest = text[1:end], text[end + 1 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise SipParseError(f"bad IPv6 address {host[:60]!r}") from None
        if rest and not rest.startswith(":"):
            raise SipParseError(f"bad host {text[:60]!r}")
        port_text = rest[1:] if rest else None
    else:
        host, colon, port_text_or_empty = text.partition(":")
        host = host.rstrip(" \t")
        port_text = port_text_or_empty if colon else None
        if _HOST_RE.fullmatch(host) is None:
            raise SipParseError(f"bad host {text[:60]!r}")
    if port_text is None:
        return host, None
    port_text = port_text.strip(" \t")
    if not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5):
        raise SipParseError(f"bad port {port_text[:20]!r}")
    port = int(port_text)
    if port > 65535:
        raise SipParseError(f"port {port} out of range")
    return host, port


def _format_host(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"


@dataclass(frozen=True)
class SipUri:
    """A sip:, sips: or tel: URI (RFC 3261 §19.1.1, RFC 3966). A tel URI keeps its number in
    `user` and has an empty `host`; `headers` is the part after `?`, as written."""

    scheme: str
    user: str | None
    host: str
    port: int | None = None
    params: Params = field(default_factory=dict)
    headers: str = ""

    def __str__(self) -> str:
        if self.scheme == "tel":
            return f"tel:{self.user or ''}{format_params(self.params)}"
        user = f"{self.user}@" if self.user is not None else ""
        text = f"{self.scheme}:{user}{_format_host(self.host, self.port)}"
        text += format_params(self.params)
        return f"{text}?{self.headers}" if self.headers else text


def parse_uri(text: str) -> SipUri:
    """Parse a sip:, sips: or tel: URI; anything else is a SipParseError."""
    text = text.strip(" \t")
    scheme, colon, rest = text.partition(":")
    scheme = scheme.lower()
    if not colon or scheme not in ("sip", "sips", "tel"):
        raise SipParseError(f"not a sip, sips or tel URI: {text[:80]!r}")
    if scheme == "tel":
        number, _, param_text = rest.partition(";")
        if _TEL_RE.fullmatch(number) is None:
            raise SipParseError(f"bad tel URI {text[:80]!r}")
        return SipUri("tel", number, "", None, parse_params(param_text))
    user: str | None = None
    at = rest.find("@")
    if at >= 0:
        user, rest = rest[:at], rest[at + 1 :]
        if _USER_RE.fullmatch(user) is None:
            raise SipParseError(f"bad user part in {text[:80]!r}")
    rest, _, headers = rest.partition("?")
    if headers and _URI_TEXT_RE.fullmatch(headers) is None:
        raise SipParseError(f"bad URI headers in {text[:80]!r}")
    hostport, _, param_text = rest.partition(";")
    host, port = _parse_hostport(hostport)
    return SipUri(scheme, user, host, port, parse_params(param_text), headers)


def _check_uri_text(uri: str, whole: str) -> str:
    if _URI_TEXT_RE.fullmatch(uri) is None or _SCHEME_RE.match(uri) is None:
        raise SipParseError(f"bad URI in {whole[:80]!r}")
    return uri


@dataclass(frozen=True)
class NameAddr:
    """A From, To, Contact or Refer-To value: display name (unquoted), URI, header params."""

    display: str | None
    uri: str
    params: Params = field(default_factory=dict)

    @property
    def tag(self) -> str | None:
        return self.params.get("tag")

    def __str__(self) -> str:
        display = ""
        if self.display is not None:
            escaped = self.display.replace("\\", "\\\\").replace('"', '\\"')
            display = f'"{escaped}" '
        return f"{display}<{self.uri}>{format_params(self.params)}"


def parse_name_addr(text: str) -> NameAddr:
    """`"Alice" <sip:a@b>;tag=x`, `Alice <sip:a@b>`, `<sip:a@b>` or a bare `sip:a@b;tag=x`
    (whose `;` parameters are header parameters, RFC 3261 §20.10)."""
    value = text.strip(" \t")
    display: str | None = None
    if value.startswith('"'):
        end, display = read_quoted(value, 0)
        rest = value[end:].lstrip(" \t")
        if not rest.startswith("<"):
            raise SipParseError(f"display name without <URI> in {value[:80]!r}")
    elif (lt := value.find("<")) >= 0 and not 0 <= value.find('"') < lt:
        # an unquoted display name, if any (a `"` before the `<` means a bare URI whose
        # parameters hold a quoted `<`)
        words = value[:lt].split()
        if any(">" in word for word in words):
            raise SipParseError(f"bad display name in {value[:80]!r}")
        display = " ".join(words) or None
        rest = value[lt:]
    else:
        uri, _, param_text = value.partition(";")
        return NameAddr(None, _check_uri_text(uri.strip(" \t"), value), parse_params(param_text))
    gt = rest.find(">")
    if gt < 0:
        raise SipParseError(f"unterminated < in {value[:80]!r}")
    uri = _check_uri_text(rest[1:gt].strip(" \t"), value)
    after = rest[gt + 1 :].lstrip(" \t")
    if after and not after.startswith(";"):
        raise SipParseError(f"unexpected text after > in {value[:80]!r}")
    return NameAddr(display, uri, parse_params(after))


@dataclass(frozen=True)
class Via:
    """One Via value (RFC 3261 §20.42): `SIP/2.0/UDP host:port;branch=...;rport`."""

    transport: str
    host: str
    port: int | None = None
    params: Params = field(default_factory=dict)

    @property
    def branch(self) -> str | None:
        return self.params.get("branch")

    def __str__(self) -> str:
        return f"SIP/2.0/{self.transport} {_format_host(self.host, self.port)}" + format_params(
            self.params
        )


def parse_via(text: str) -> Via:
    """Parse one Via value (a header line holding several: split it with `split_list`)."""
    value = text.strip(" \t")
    match = _VIA_RE.match(value)
    if match is None:
        raise SipParseError(f"bad Via {value[:80]!r}")
    sent_by, _, param_text = value[match.end() :].partition(";")
    host, port = _parse_hostport(sent_by)
    return Via(match.group(1).upper(), host, port, parse_params(param_text))


def parse_auth_params(value: str) -> tuple[str, dict[str, str]]:
    """`Digest realm="x", nonce="y", qop=auth` -> ("Digest", {"realm": "x", ...}): a challenge
    (WWW-Authenticate, Proxy-Authenticate) or credentials (Authorization, Proxy-Authorization).
    Names in lower case, quoted values unquoted; a parameter given twice is an error."""
    text = value.strip(" \t")
    match = _TOKEN_RE.match(text)
    if match is None or (match.end() < len(text) and text[match.end()] not in " \t"):
        raise SipParseError(f"bad authentication scheme in {text[:80]!r}")
    scheme = match.group()
    params: dict[str, str] = {}
    pos, n = match.end(), len(text)
    while True:
        while pos < n and text[pos] in " \t,":
            pos += 1
        if pos >= n:
            return scheme, params
        name_match = _TOKEN_RE.match(text, pos)
        if name_match is None:
            raise SipParseError(f"bad authentication parameter at {text[pos : pos + 40]!r}")
        pos = name_match.end()
        while pos < n and text[pos] in " \t":
            pos += 1
        if pos >= n or text[pos] != "=":
            raise SipParseError(f"authentication parameter {name_match.group()!r} has no value")
        pos += 1
        while pos < n and text[pos] in " \t":
            pos += 1
        if pos < n and text[pos] == '"':
            pos, item = read_quoted(text, pos)
        else:
            value_match = _AUTH_VALUE_RE.match(text, pos)
            if value_match is None:
                raise SipParseError(f"bad authentication value at {text[pos : pos + 40]!r}")
            pos, item = value_match.end(), value_match.group()
        name = name_match.group().lower()
        if name in params:
            raise SipParseError(f"authentication parameter {name!r} given twice")
        params[name] = item
        while pos < n and text[pos] in " \t":
            pos += 1
        if pos < n and text[pos] != ",":
            raise SipParseError(f"expected , at {text[pos : pos + 40]!r}")
