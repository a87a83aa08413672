"""SDP offer/answer (voice/transports/sip/sdp.py): offers as baresip, linphone, Asterisk and a
carrier trunk send them, hold, refused and extra streams, the answer's exact lines, and
malformed offers, which must only ever raise SdpError."""

from __future__ import annotations

import random
import textwrap
import time

import pytest

from voice.transports.sip.sdp import (
    MAX_SDP_BYTES,
    Codec,
    RemoteMedia,
    SdpError,
    answer,
    choose,
    parse_sdp,
)


def sdp(text: str, newline: str = "\r\n") -> str:
    return newline.join(textwrap.dedent(text).strip("\n").split("\n")) + newline


PCMU, PCMA = Codec(0, "PCMU", 8000), Codec(8, "PCMA", 8000)

BARESIP = sdp(
    """
    v=0
    o=- 3897195034 2416913486 IN IP4 192.0.2.20
    s=-
    c=IN IP4 192.0.2.20
    t=0 0
    m=audio 10164 RTP/AVP 0 8 9 96 101
    b=AS:128
    a=rtpmap:0 PCMU/8000
    a=rtpmap:8 PCMA/8000
    a=rtpmap:9 G722/8000
    a=rtpmap:96 opus/48000/2
    a=fmtp:96 stereo=1;sprop-stereo=1
    a=rtpmap:101 telephone-event/8000
    a=fmtp:101 0-15
    a=sendrecv
    a=label:1
    a=ssrc:1906441716 cname:2c3d4e5f-a1b2-c3d4-e5f6-a7b8c9d0e1f2
    a=rtcp-rsize
    a=ptime:20
    """
)

LINPHONE = sdp(
    """
    v=0
    o=bob 3213 1064 IN IP4 192.0.2.30
    s=Talk
    c=IN IP4 192.0.2.30
    t=0 0
    a=rtcp-xr:rcvr-rtt=all:10000 stat-summary=loss,dup,jitt,TTL voip-metrics
    a=record:off
    m=audio 7078 RTP/AVP 96 97 98 0 8 18 100 101
    a=rtpmap:96 opus/48000/2
    a=fmtp:96 useinbandfec=1
    a=rtpmap:97 speex/16000
    a=fmtp:97 vbr=on
    a=rtpmap:98 speex/8000
    a=fmtp:98 vbr=on
    a=fmtp:18 annexb=yes
    a=rtpmap:100 telephone-event/48000
    a=rtpmap:101 telephone-event/8000
    a=rtcp-fb:* trr-int 1000
    a=rtcp-fb:* ccm tmmbr
    """
)

ASTERISK = sdp(
    """
    v=0
    o=- 1936384052 1936384052 IN IP4 192.0.2.2
    s=Asterisk
    c=IN IP4 192.0.2.2
    t=0 0
    m=audio 17826 RTP/AVP 0 8 101
    a=rtpmap:0 PCMU/8000
    a=rtpmap:8 PCMA/8000
    a=rtpmap:101 telephone-event/8000
    a=fmtp:101 0-16
    a=ptime:20
    a=maxptime:140
    a=sendrecv
    """
)

CARRIER_IPV6 = sdp(
    """
    v=0
    o=SBC 71849 71849 IN IP6 2001:db8:1::5
    s=SIP Media Capabilities
    c=IN IP6 2001:db8:1::20
    t=0 0
    m=audio 31000 RTP/AVP 8 0 18 101
    a=rtpmap:8 PCMA/8000
    a=rtpmap:0 PCMU/8000
    a=rtpmap:18 G729/8000
    a=fmtp:18 annexb=no
    a=rtpmap:101 telephone-event/8000
    a=fmtp:101 0-15
    a=sendrecv
    a=maxptime:20
    """
)


def test_baresip_offer_and_the_exact_answer() -> None:
    remote = parse_sdp(BARESIP.encode())
    assert (remote.address, remote.port, remote.direction, remote.ptime) == (
        "192.0.2.20", 10164, "sendrecv", 20,
    )  # fmt: skip
    assert remote.codecs == [
        PCMU, PCMA, Codec(9, "G722", 8000), Codec(96, "opus", 48000),
        Codec(101, "telephone-event", 8000),
    ]  # fmt: skip
    assert not remote.on_hold
    codec, dtmf = choose(remote)
    assert (codec, dtmf) == (PCMU, Codec(101, "telephone-event", 8000))
    text = answer(
        remote, address="192.0.2.10", port=40000, codec=codec, dtmf=dtmf, session_id=7, version=1
    )
    assert text == (
        "v=0\r\n"
        "o=hotline 7 1 IN IP4 192.0.2.10\r\n"
        "s=Hotline\r\n"
        "c=IN IP4 192.0.2.10\r\n"
        "t=0 0\r\n"
        "m=audio 40000 RTP/AVP 0 101\r\n"
        "a=rtpmap:0 PCMU/8000\r\n"
        "a=rtpmap:101 telephone-event/8000\r\n"
        "a=fmtp:101 0-15\r\n"
        "a=ptime:20\r\n"
        "a=sendrecv\r\n"
    )
    # Our answer reads back as what we chose.
    ours = parse_sdp(text)
    assert (ours.address, ours.port, ours.codecs) == ("192.0.2.10", 40000, [codec, dtmf])


def test_linphone_offer_many_codecs_and_two_telephone_events() -> None:
    remote = parse_sdp(LINPHONE)
    assert [c.payload_type for c in remote.codecs] == [96, 97, 98, 0, 8, 18, 100, 101]
    assert remote.codecs[5] == Codec(18, "G729", 8000)  # static: no rtpmap needed
    assert remote.ptime is None
    codec, dtmf = choose(remote)
    assert codec == PCMU and dtmf == Codec(101, "telephone-event", 8000)  # not the 48 kHz one
    assert choose(remote, ("PCMA", "PCMU"))[0] == PCMA


def test_asterisk_offer() -> None:
    remote = parse_sdp(ASTERISK)
    assert remote.codecs == [PCMU, PCMA, Codec(101, "telephone-event", 8000)]
    assert (remote.ptime, remote.direction, remote.port) == (20, "sendrecv", 17826)


def test_carrier_ipv6_offer_our_preference_wins() -> None:
    remote = parse_sdp(CARRIER_IPV6)
    assert remote.address == "2001:db8:1::20" and remote.codecs[0] == PCMA
    codec, dtmf = choose(remote)
    assert codec == PCMU and dtmf is not None and dtmf.payload_type == 101
    text = answer(
        remote, address="2001:db8::10", port=40002, codec=codec, dtmf=None, session_id=1, version=2
    )
    assert "o=hotline 1 2 IN IP6 2001:db8::10\r\n" in text
    assert "c=IN IP6 2001:db8::10\r\nt=0 0\r\nm=audio 40002 RTP/AVP 0\r\n" in text
    assert "telephone-event" not in text and "fmtp" not in text


def test_static_payload_types_without_rtpmap_and_lf_endings() -> None:
    remote = parse_sdp(
        sdp(
            """
            v=0
            o=- 1 1 IN IP4 198.51.100.7
            s=-
            c=IN IP4 198.51.100.7
            t=0 0
            m=audio 5004 RTP/AVP 8 0 13 120
            """,
            newline="\n",
        )
    )
    assert remote.codecs == [PCMA, PCMU, Codec(13, "CN", 8000)]  # 120: dynamic, no rtpmap
    assert choose(remote) == (PCMU, None)


@pytest.mark.parametrize(
    ("session", "media", "direction", "on_hold", "answered"),
    [
        ("", "a=sendonly", "sendonly", True, "recvonly"),
        ("", "a=inactive", "inactive", True, "inactive"),
        ("", "a=recvonly", "recvonly", False, "sendonly"),
        ("a=sendonly", "", "sendonly", True, "recvonly"),  # session level
        ("a=sendonly", "a=sendrecv", "sendrecv", False, "sendrecv"),  # media level wins
    ],
)
def test_hold_directions(
    session: str, media: str, direction: str, on_hold: bool, answered: str
) -> None:
    offer = ASTERISK.replace("t=0 0\r\n", f"t=0 0\r\n{session}\r\n" if session else "t=0 0\r\n")
    offer = offer.replace("a=sendrecv\r\n", f"{media}\r\n" if media else "")
    remote = parse_sdp(offer)
    assert (remote.direction, remote.on_hold) == (direction, on_hold)
    text = answer(remote, address="192.0.2.10", port=4000, codec=PCMU, dtmf=None,
                  session_id=1, version=1)  # fmt: skip
    assert text.endswith(f"a={answered}\r\n")


def test_hold_with_zero_address_and_direction_override() -> None:
    remote = parse_sdp(ASTERISK.replace("c=IN IP4 192.0.2.2", "c=IN IP4 0.0.0.0"))
    assert remote.address == "0.0.0.0" and remote.on_hold and remote.direction == "sendrecv"
    text = answer(remote, address="192.0.2.10", port=4000, codec=PCMU, dtmf=None, session_id=1,
                  version=3, direction="inactive", ptime=30)  # fmt: skip
    assert text.endswith("a=ptime:30\r\na=inactive\r\n")
    with pytest.raises(ValueError):
        answer(remote, address="192.0.2.10", port=4000, codec=PCMU, dtmf=None, session_id=1,
               version=1, direction="sideways")  # fmt: skip
    with pytest.raises(ValueError):
        answer(remote, address="192.0.2.10\r\na=x", port=4000, codec=PCMU, dtmf=None,
               session_id=1, version=1)  # fmt: skip


def test_media_level_connection_overrides_session_level() -> None:
    offer = ASTERISK.replace("a=ptime:20\r\n", "c=IN IP4 203.0.113.9\r\na=ptime:20\r\n")
    assert parse_sdp(offer).address == "203.0.113.9"
    no_session_c = offer.replace("c=IN IP4 192.0.2.2\r\n", "")
    assert parse_sdp(no_session_c).address == "203.0.113.9"
    with pytest.raises(SdpError) as missing:
        parse_sdp(ASTERISK.replace("c=IN IP4 192.0.2.2\r\n", ""))
    assert missing.value.status == 400


def test_no_common_codec_is_488() -> None:
    offer = BARESIP.replace("m=audio 10164 RTP/AVP 0 8 9 96 101", "m=audio 10164 RTP/AVP 9 96 101")
    remote = parse_sdp(offer)
    with pytest.raises(SdpError) as refused:
        choose(remote)
    assert refused.value.status == 488 and refused.value.reason == "Not Acceptable Here"
    # PCMA offered at another rate is not PCMA/8000.
    odd = parse_sdp(ASTERISK.replace("m=audio 17826 RTP/AVP 0 8 101", "m=audio 17826 RTP/AVP 97")
                    .replace("a=rtpmap:0 PCMU/8000", "a=rtpmap:97 PCMA/16000"))  # fmt: skip
    with pytest.raises(SdpError):
        choose(odd)


def test_refused_first_stream_and_extra_streams_are_answered_with_port_0() -> None:
    offer = sdp(
        """
        v=0
        o=- 5 5 IN IP4 192.0.2.40
        s=-
        c=IN IP4 192.0.2.40
        t=0 0
        m=audio 0 RTP/AVP 0
        m=audio 6000 RTP/SAVP 0 8
        a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:WVNfX19zZW1jdGwgKCkgewkyMjA7fQp9CnVubGVz
        m=audio 6002 RTP/AVP 8 101
        a=rtpmap:101 telephone-event/8000
        a=sendonly
        m=video 6004 RTP/AVP 96
        a=rtpmap:96 VP8/90000
        """
    )
    remote = parse_sdp(offer)
    assert (remote.port, remote.index, remote.direction) == (6002, 2, "sendonly")
    assert [line.media for line in remote.m_lines] == ["audio", "audio", "audio", "video"]
    codec, dtmf = choose(remote)
    assert codec == PCMA
    text = answer(remote, address="192.0.2.10", port=7000, codec=codec, dtmf=dtmf, session_id=9,
                  version=9)  # fmt: skip
    assert text.split("\r\n")[5:] == [
        "m=audio 0 RTP/AVP 0",
        "m=audio 0 RTP/SAVP 0 8",
        "m=audio 7000 RTP/AVP 8 101",
        "a=rtpmap:8 PCMA/8000",
        "a=rtpmap:101 telephone-event/8000",
        "a=fmtp:101 0-15",
        "a=ptime:20",
        "a=recvonly",
        "m=video 0 RTP/AVP 96",
        "",
    ]
    # A RemoteMedia made by hand (no m_lines) answers with its one stream.
    plain = RemoteMedia("192.0.2.1", 4000, [PCMU], "sendrecv", None)
    assert "m=audio 5000 RTP/AVP 0\r\n" in answer(
        plain, address="192.0.2.10", port=5000, codec=PCMU, dtmf=None, session_id=1, version=1
    )


@pytest.mark.parametrize(
    "offer",
    [
        ASTERISK.replace("m=audio 17826", "m=audio 0"),  # every audio stream refused
        ASTERISK.replace("m=audio", "m=video"),  # no audio at all
        ASTERISK.replace("RTP/AVP", "RTP/SAVP"),  # SRTP only
        sdp("v=0\no=- 1 1 IN IP4 192.0.2.1\ns=-\nc=IN IP4 192.0.2.1\nt=0 0"),  # no m= line
    ],
)
def test_nothing_usable_is_488(offer: str) -> None:
    with pytest.raises(SdpError) as refused:
        parse_sdp(offer)
    assert refused.value.status == 488


MALFORMED = {
    "empty": "",
    "whitespace": " \r\n\r\n",
    "no v=": ASTERISK.replace("v=0\r\n", ""),
    "v=1": ASTERISK.replace("v=0", "v=1"),
    "not SDP": "hello world",
    "line without =": ASTERISK.replace("t=0 0", "t 0 0"),
    "upper-case type": ASTERISK.replace("t=0 0", "T=0 0"),
    "m= too short": ASTERISK.replace("m=audio 17826 RTP/AVP 0 8 101", "m=audio 17826 RTP/AVP"),
    "m= port not a number": ASTERISK.replace("m=audio 17826", "m=audio abc"),
    "m= port too big": ASTERISK.replace("m=audio 17826", "m=audio 99999"),
    "m= negative port": ASTERISK.replace("m=audio 17826", "m=audio -1"),
    "payload type 200": ASTERISK.replace("RTP/AVP 0 8 101", "RTP/AVP 0 8 200"),
    "payload type not a number": ASTERISK.replace("RTP/AVP 0 8 101", "RTP/AVP 0 x 101"),
    "c= IP5": ASTERISK.replace("c=IN IP4", "c=IN IP5"),
    "c= missing address": ASTERISK.replace("c=IN IP4 192.0.2.2", "c=IN IP4"),
    "c= bad IPv4": ASTERISK.replace("192.0.2.2\r\nt=", "300.1.2.3\r\nt="),
    "c= IPv6 as IP4": ASTERISK.replace("c=IN IP4 192.0.2.2", "c=IN IP4 2001:db8::1"),
    "c= bad IPv6": ASTERISK.replace("c=IN IP4 192.0.2.2", "c=IN IP6 2001:db8:::1:x"),
    "c= not IN": ASTERISK.replace("c=IN IP4", "c=ATM IP4"),
    "bad c= in another stream": ASTERISK + "m=video 0 RTP/AVP 96\r\nc=IN IP4 nope!\r\n",
    "control character": ASTERISK.replace("s=Asterisk", "s=Aster\x00isk"),
    "bare CR inside": ASTERISK.replace("s=Asterisk", "s=Aster\risk"),
    "too long": ASTERISK + "a=x-pad:" + "a" * MAX_SDP_BYTES + "\r\n",
    "too many lines": ASTERISK + "a=x\r\n" * 1000,
}


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_sdp_is_400(name: str) -> None:
    with pytest.raises(SdpError) as bad:
        parse_sdp(MALFORMED[name])
    assert bad.value.status == 400 and bad.value.reason == "Bad Request"
    with pytest.raises(SdpError):
        parse_sdp(MALFORMED[name].encode())


def test_binary_garbage_is_sdp_error() -> None:
    for data in (bytes(range(256)), b"\xff\xfe" * 100, b"v=0\r\n\xc3\x28\r\nm=audio"):
        with pytest.raises(SdpError):
            parse_sdp(data)


def test_fuzzed_offers_only_raise_sdp_error() -> None:
    rng = random.Random(4566)
    junk = ["\r\n", " ", "=", "/", ":", "0", "99999", "IP6", "m=audio 1 RTP/AVP 0\r\n", "\x00"]
    samples = [BARESIP, LINPHONE, ASTERISK, CARRIER_IPV6]
    parsed = 0
    for _ in range(3000):
        text = list(rng.choice(samples))
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(text) + 1)
            op = rng.randrange(3)
            if op == 0:
                del text[pos : pos + rng.randint(1, 12)]
            elif op == 1:
                text[pos:pos] = list(rng.choice(junk))
            elif text:
                text[min(pos, len(text) - 1)] = chr(rng.randrange(256))
        try:
            remote = parse_sdp("".join(text))
            codec, dtmf = choose(remote)
        except SdpError:
            continue
        parsed += 1
        answer(remote, address="192.0.2.10", port=4000, codec=codec, dtmf=dtmf, session_id=1,
               version=1)  # fmt: skip
    assert parsed > 100


def _parse_seconds(offer: str) -> float:
    """The fastest of several parses of `offer` (it is refused): noise only ever adds time."""
    best = float("inf")
    for _ in range(7):
        started = time.perf_counter()
        with pytest.raises(SdpError):
            parse_sdp(offer)
        best = min(best, time.perf_counter() - started)
    return best


def test_a_pathological_host_name_costs_linear_time() -> None:
    """`c=IN IP4 aaaa…!` (letters, then one character no host has): four times the letters
    cost about four times as much, not sixteen (the old host check backtracked quadratically:
    0.8 s of the event loop at 16 KB)."""

    def offer(letters: int) -> str:
        return ASTERISK.replace("c=IN IP4 192.0.2.2\r\n", f"c=IN IP4 {'a' * letters}!\r\n")

    assert "c=IN IP4 aaaa!" in offer(4)
    small, large = _parse_seconds(offer(2_000)), _parse_seconds(offer(8_000))
    assert large < 8 * small, f"{small * 1e6:.0f} µs at 2 000 letters, {large * 1e6:.0f} at 8 000"
