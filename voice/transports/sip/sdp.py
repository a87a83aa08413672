"""SDP offer/answer for G.711 calls, I/O-free: reading an offer (RFC 4566 §5: v=, c=, m=,
a=rtpmap, a=ptime and the direction attributes, §6), choosing PCMU or PCMA and the
telephone-event DTMF codec (RFC 4733 §7.1), and writing the answer (RFC 3264 §6: one m= line for
each offered one, the others refused with port 0, the direction answering the offer's, §6.1).
Hold is an offer of sendonly or inactive (RFC 3264 §8.4) or RFC 2543's c=0.0.0.0.

An offer is hostile input: malformed or over the limits -> `SdpError` (status 400), nothing
usable -> `SdpError` (status 488), never another exception, and work linear in its size.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

from voice.transports.sip.syntax import reason_phrase

MAX_SDP_BYTES = 16 * 1024
MAX_SDP_LINES = 1000

DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")
_ANSWER_DIRECTION = {
    "sendrecv": "sendrecv",
    "sendonly": "recvonly",
    "recvonly": "sendonly",
    "inactive": "inactive",
}
# Static RTP payload types of the audio codecs (RFC 3551 §6), known without an rtpmap.
STATIC_PAYLOAD_TYPES = {
    0: ("PCMU", 8000),
    3: ("GSM", 8000),
    4: ("G723", 8000),
    5: ("DVI4", 8000),
    6: ("DVI4", 16000),
    7: ("LPC", 8000),
    8: ("PCMA", 8000),
    9: ("G722", 8000),
    10: ("L16", 44100),
    11: ("L16", 44100),
    12: ("QCELP", 8000),
    13: ("CN", 8000),
    15: ("G728", 8000),
    16: ("DVI4", 11025),
    17: ("DVI4", 22050),
    18: ("G729", 8000),
}
# A domain name, not an address: a letter somewhere. Linear with fullmatch (the look-ahead runs
# once, from the start); `[…]*[A-Za-z][…]*` backtracked quadratically on "aaaa…!".
_HOST = re.compile(r"(?=[0-9.\-]*[A-Za-z])[A-Za-z0-9.\-]+")
_RTPMAP = re.compile(r"([0-9]{1,3})[ \t]+([A-Za-z0-9\-_.]{1,32})/([0-9]{1,6})(?:/[0-9]{1,2})?")
_NUMBER = re.compile(r"[0-9]{1,5}")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


class SdpError(ValueError):
    """An offer we cannot answer: `status` 400 (malformed) or 488 (nothing acceptable)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status

    @property
    def reason(self) -> str:
        return reason_phrase(self.status)  # 488 "Not Acceptable Here", 400 "Bad Request", ...


@dataclass(frozen=True)
class Codec:
    """An RTP payload type and what it means: `Codec(0, "PCMU", 8000)`."""

    payload_type: int
    name: str
    rate: int


@dataclass(frozen=True)
class MediaLine:
    """One offered m= line, as the answer needs it to refuse the stream."""

    media: str
    port: int
    proto: str
    formats: tuple[str, ...]


@dataclass(frozen=True)
class RemoteMedia:
    """The audio stream of an offer we can take part in (the first RTP/AVP audio m= line with
    a port), and where it sits among the offer's m= lines (`m_lines`, `index`)."""

    address: str
    port: int
    codecs: list[Codec]
    direction: str = "sendrecv"
    ptime: int | None = None
    m_lines: tuple[MediaLine, ...] = ()
    index: int = 0

    @property
    def on_hold(self) -> bool:
        return self.direction in ("sendonly", "inactive") or self.address in ("0.0.0.0", "::")


def _connection_address(value: str) -> str:
    """The address of `c=IN IP4 <address>[/ttl]` or `c=IN IP6 <address>`."""
    parts = value.split()
    if len(parts) != 3 or parts[0] != "IN" or parts[1].upper() not in ("IP4", "IP6"):
        raise SdpError(f"bad c= line {value[:80]!r}")
    address = parts[2].split("/", 1)[0]
    try:
        if parts[1].upper() == "IP4":
            ipaddress.IPv4Address(address)
        else:
            ipaddress.IPv6Address(address)
    except ValueError:
        if _HOST.fullmatch(address) is None:
            raise SdpError(f"bad address in c= line {value[:80]!r}") from None
    return address


def _media_line(value: str) -> MediaLine:
    """`m=<media> <port>[/<count>] <proto> <fmt> ...`."""
    parts = value.split()
    if len(parts) < 4:
        raise SdpError(f"bad m= line {value[:80]!r}")
    port_text = parts[1].split("/", 1)[0]
    if _NUMBER.fullmatch(port_text) is None or int(port_text) > 65535:
        raise SdpError(f"bad port in m= line {value[:80]!r}")
    return MediaLine(parts[0], int(port_text), parts[2], tuple(parts[3:]))


def _lines(body: str | bytes) -> list[tuple[str, str]]:
    raw = body.encode("utf-8", "replace") if isinstance(body, str) else bytes(body)
    if len(raw) > MAX_SDP_BYTES:
        raise SdpError(f"SDP longer than {MAX_SDP_BYTES} bytes")
    items: list[tuple[str, str]] = []
    for line in raw.decode("utf-8", "replace").split("\n"):
        line = line.rstrip("\r \t")
        if not line:
            continue
        if len(line) < 2 or line[1] != "=" or not ("a" <= line[0] <= "z"):
            raise SdpError(f"bad SDP line {line[:80]!r}")
        if _CONTROL.search(line) is not None:
            raise SdpError(f"control character in SDP line {line[:80]!r}")
        items.append((line[0], line[2:]))
        if len(items) > MAX_SDP_LINES:
            raise SdpError(f"more than {MAX_SDP_LINES} SDP lines")
    if not items or items[0] != ("v", "0"):
        raise SdpError("SDP does not start with v=0")
    return items


def parse_sdp(body: str | bytes) -> RemoteMedia:
    """The audio stream of an offer (or answer): the first RTP/AVP audio m= line whose port is
    not 0. SdpError 400 if the SDP is malformed, 488 if it has no such stream."""
    sections: list[list[tuple[str, str]]] = [[]]  # the session part, then one per m= line
    for kind, value in _lines(body):
        if kind == "m":
            sections.append([])
        sections[-1].append((kind, value))
    session_address: str | None = None
    session_direction = "sendrecv"
    for kind, value in sections[0]:
        if kind == "c":
            session_address = _connection_address(value)
        elif kind == "a" and value in DIRECTIONS:
            session_direction = value
    m_lines = tuple(_media_line(section[0][1]) for section in sections[1:])
    for kind, value in (item for section in sections[1:] for item in section):
        if kind == "c":
            _connection_address(value)
    for index, line in enumerate(m_lines):
        if line.media.lower() == "audio" and line.port and line.proto.upper() == "RTP/AVP":
            return _audio(sections[index + 1], m_lines, index, session_address, session_direction)
    raise SdpError("no audio stream offered", 488)


def _audio(
    section: list[tuple[str, str]],
    m_lines: tuple[MediaLine, ...],
    index: int,
    address: str | None,
    direction: str,
) -> RemoteMedia:
    """The chosen audio m= section: its address, codecs in the offer's order, attributes (an
    a=rtpmap we cannot read is left out: its payload type stays unknown)."""
    payload_types: list[int] = []
    for fmt in m_lines[index].formats:
        if _NUMBER.fullmatch(fmt) is None or int(fmt) > 127:
            raise SdpError(f"bad RTP payload type {fmt[:10]!r}")
        payload_types.append(int(fmt))
    rtpmap: dict[int, tuple[str, int]] = {}
    ptime: int | None = None
    for kind, value in section[1:]:
        if kind == "c":
            address = _connection_address(value)
        elif kind != "a":
            continue
        elif value in DIRECTIONS:
            direction = value
        elif value.startswith("rtpmap:"):
            match = _RTPMAP.fullmatch(value[7:].strip())
            if match is not None:
                rtpmap.setdefault(int(match.group(1)), (match.group(2), int(match.group(3))))
        elif value.startswith("ptime:") and _NUMBER.fullmatch(value[6:].strip()):
            ptime = int(value[6:].strip()) or None
    if address is None:
        raise SdpError("no c= line for the audio stream")
    codecs: list[Codec] = []
    for pt in payload_types:
        known = rtpmap.get(pt) or STATIC_PAYLOAD_TYPES.get(pt)
        if known is not None:
            codecs.append(Codec(pt, known[0], known[1]))
    port = m_lines[index].port
    return RemoteMedia(address, port, codecs, direction, ptime, m_lines, index)


def choose(
    remote: RemoteMedia, preferred: Sequence[str] = ("PCMU", "PCMA")
) -> tuple[Codec, Codec | None]:
    """The audio codec to use (the first of `preferred` the offer has at 8000 Hz) and the
    offer's telephone-event/8000 codec if any. SdpError 488 if the offer has none we take."""
    for name in preferred:
        for codec in remote.codecs:
            if codec.name.upper() == name.upper() and codec.rate == 8000:
                dtmf = next(
                    (
                        c
                        for c in remote.codecs
                        if c.name.lower() == "telephone-event" and c.rate == 8000
                    ),
                    None,
                )
                return codec, dtmf
    offered = ", ".join(f"{c.name}/{c.rate}" for c in remote.codecs) or "none"
    raise SdpError(f"no common codec (offered: {offered[:200]})", 488)


def answer(
    remote: RemoteMedia,
    *,
    address: str,
    port: int,
    codec: Codec,
    dtmf: Codec | None,
    session_id: int,
    version: int,
    direction: str | None = None,
    ptime: int = 20,
) -> str:
    """Our SDP answer to `remote`: one audio stream at `address:port` with `codec` (and `dtmf`),
    every other offered m= line refused with port 0; the direction answers the offer's unless
    `direction` is given. CRLF line endings."""
    if direction is None:
        direction = _ANSWER_DIRECTION.get(remote.direction, "sendrecv")
    if direction not in DIRECTIONS:
        raise ValueError(f"bad direction {direction!r}")
    if not 0 <= port <= 65535 or session_id < 0 or version < 0 or ptime <= 0:
        raise ValueError("bad port, session id, version or ptime")
    lines = _session_lines(session_id, version, address)
    audio = _audio_lines(port, [codec], dtmf, ptime, direction)
    if not remote.m_lines:
        lines += audio
    for index, line in enumerate(remote.m_lines):
        if index == remote.index:
            lines += audio
        else:
            lines.append(f"m={line.media} 0 {line.proto} {' '.join(line.formats)}")
    return "\r\n".join(lines) + "\r\n"


# -- we offer: a late offer's 200 (RFC 3261 §13.2.1), an offerless re-INVITE's (§14.2) --------

_G711_PAYLOAD_TYPES = {"PCMU": 0, "PCMA": 8}
DTMF_PAYLOAD_TYPE = 101  # dynamic (RFC 4733 §7.1): the one most phones and trunks use


def our_codecs(names: Sequence[str]) -> tuple[list[Codec], Codec]:
    """The audio codecs we offer (G.711 `names`, in order) and our telephone-event codec."""
    audio = [Codec(_G711_PAYLOAD_TYPES[n], n, 8000) for n in names if n in _G711_PAYLOAD_TYPES]
    if not audio:
        raise ValueError(f"no G.711 codec among {list(names)!r}")
    return audio, Codec(DTMF_PAYLOAD_TYPE, "telephone-event", 8000)


def offer(
    *,
    address: str,
    port: int,
    codecs: Sequence[str],
    session_id: int,
    version: int,
    direction: str = "sendrecv",
) -> str:
    """Our SDP offer (RFC 3264 §5): one audio stream at `address:port` with every codec of
    `codecs` we have (in that order) and telephone-event/8000."""
    audio, dtmf = our_codecs(codecs)
    if direction not in DIRECTIONS or not 0 <= port <= 65535 or min(session_id, version) < 0:
        raise ValueError("bad direction, port, session id or version")
    lines = _session_lines(session_id, version, address)
    return "\r\n".join([*lines, *_audio_lines(port, audio, dtmf, 20, direction)]) + "\r\n"


def _session_lines(session_id: int, version: int, address: str) -> list[str]:
    """v=, o=, s=, c= and t= of our SDP, at `address` (ValueError if it is not one token)."""
    if not address or any(ch.isspace() or not ch.isprintable() for ch in address):
        raise ValueError(f"bad address {address!r}")
    family = "IP6" if ":" in address else "IP4"
    return [
        "v=0",
        f"o=hotline {session_id} {version} IN {family} {address}",
        "s=Hotline",
        f"c=IN {family} {address}",
        "t=0 0",
    ]


def _audio_lines(
    port: int, codecs: Sequence[Codec], dtmf: Codec | None, ptime: int, direction: str
) -> list[str]:
    """Our audio m= line and its attributes: `codecs` in order, then telephone-event."""
    formats = [*codecs] if dtmf is None else [*codecs, dtmf]
    lines = [f"m=audio {port} RTP/AVP {' '.join(str(c.payload_type) for c in formats)}"]
    lines += [f"a=rtpmap:{c.payload_type} {c.name}/{c.rate}" for c in formats]
    if dtmf is not None:
        lines.append(f"a=fmtp:{dtmf.payload_type} 0-15")
    return [*lines, f"a=ptime:{ptime}", f"a={direction}"]


def answered(remote: RemoteMedia, codecs: Sequence[str]) -> tuple[Codec, Codec | None]:
    """The codec an answer to our offer picked (RFC 3264 §6.1: the answerer's first listed
    format we offered) and its telephone-event codec. SdpError 488 if it picked none of ours."""
    ours = {name.upper() for name in codecs}
    for codec in remote.codecs:
        if codec.name.upper() in ours and codec.rate == 8000:
            return choose(remote, [codec.name])
    picked = ", ".join(f"{c.name}/{c.rate}" for c in remote.codecs) or "none"
    raise SdpError(f"the answer picked no codec we offered ({picked[:200]})", 488)
