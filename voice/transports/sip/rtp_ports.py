"""Where a call's RTP listens and whom it hears: an even port (RFC 3550 §11) drawn at random
among the free ones of the configured range, so that nobody can tell which port the next call
will get (ports handed out from the bottom of the range let a host that sprays it find a new
call's port first); and the forms of the caller's hosts a socket reports packets from."""

from __future__ import annotations

import errno
import ipaddress
import random
import secrets
import socket

_RANDOM: random.Random = secrets.SystemRandom()
_RANDOM_TRIES = 16  # random draws before walking every port in random order (a full range)


def bind_rtp_socket(
    host: str, port_range: tuple[int, int], rng: random.Random | None = None
) -> socket.socket:
    """A UDP socket bound on `host` to an even port in [low, high), each free one as likely as
    any other (`rng`: the generator, for tests; the system's CSPRNG by default). The socket is
    blocking; OSError if no even port in the range is free."""
    low, high = port_range
    draw = rng or _RANDOM
    ports = range(low + low % 2, high, 2)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    tried: set[int] = set()
    if ports:
        for _ in range(_RANDOM_TRIES):  # rejection sampling: uniform among the free ports
            port = ports[draw.randrange(len(ports))]
            tried.add(port)
            if (sock := _bind(family, host, port)) is not None:
                return sock
        rest = [port for port in ports if port not in tried]
        draw.shuffle(rest)
        for port in rest:
            if (sock := _bind(family, host, port)) is not None:
                return sock
    raise OSError(errno.EADDRINUSE, f"no free even UDP port on {host} in [{low}, {high})")


def _bind(family: socket.AddressFamily, host: str, port: int) -> socket.socket | None:
    """The socket bound to `port`, None if that port is taken; other errors are raised."""
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.bind((host, port))  # here, not in asyncio: its error hides the errno
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            return None
        raise
    return sock


def host_forms(*hosts: str | None) -> frozenset[str]:
    """How a socket names these hosts as a packet's source: the canonical text of each address,
    and for IPv4 also its IPv4-mapped IPv6 form (a dual-stack socket). The unspecified address
    (hold) names nobody; a name that is not an address is kept as it is (it matches nothing)."""
    forms: set[str] = set()
    for host in hosts:
        if not host:
            continue
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            forms.add(host)
            continue
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if address.is_unspecified:
            continue
        forms.add(str(address))
        if isinstance(address, ipaddress.IPv4Address):
            forms.add(f"::ffff:{address}")
    return frozenset(forms)
