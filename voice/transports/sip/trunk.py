"""The trunks and PBXs Hotline places SIP calls through (`HOTLINE_SIP__TRUNKS`), and how a call
through one is addressed: the Request-URI (a number becomes `sip:<number>@<trunk>`, a SIP URI
goes as it is), our From (the caller id at the trunk's domain) and what a request may ask to call.

Every INVITE goes to the trunk itself (RFC 3261 §8.1.2: the trunk is the outbound proxy), and so
do the requests inside the call, as for calls that come in from a PBX."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from voice.transports.sip.message import SipParseError, parse_uri

NUMBER = re.compile(r"\+?[0-9*#]{1,32}")  # E.164, or an extension a PBX dials
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_DOMAIN = re.compile(r"[A-Za-z0-9.-]{1,253}")


class SipTrunk(BaseModel):
    """One trunk or PBX to place calls through (UDP; digest credentials if it challenges)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str  # what a request's `trunk` names it by
    host: str  # host[:port] (5060 if none), a name or an address ([v6] in brackets)
    transport: Literal["udp"] = "udp"  # TCP and TLS: not done (README)
    # Digest credentials, for a trunk that answers our INVITE with 401 or 407 (never logged).
    username: str | None = None
    password: SecretStr | None = None
    from_number: str | None = None  # the caller id when a request gives none
    from_domain: str | None = None  # the host of our From URI (default: the trunk's host)
    ring_timeout_s: float = Field(default=30.0, gt=0, le=600)  # then CANCEL: no answer

    @field_validator("name")
    @classmethod
    def _token(cls, name: str) -> str:
        if _NAME.fullmatch(name) is None:
            raise ValueError(f"{name!r}: letters, digits, _ . - (at most 64)")
        return name

    @field_validator("host")
    @classmethod
    def _hostport(cls, host: str) -> str:
        try:
            parse_uri(f"sip:{host}")
        except SipParseError as exc:
            raise ValueError(f"{host!r} is not host[:port]: {exc}") from None
        return host

    @field_validator("from_number")
    @classmethod
    def _number(cls, number: str | None) -> str | None:
        if number is not None and NUMBER.fullmatch(number) is None:
            raise ValueError(f"{number!r} is not a number")
        return number

    @field_validator("from_domain")
    @classmethod
    def _domain(cls, domain: str | None) -> str | None:
        if domain is not None and _DOMAIN.fullmatch(domain) is None:
            raise ValueError(f"{domain!r} is not a domain")
        return domain

    @property
    def address(self) -> tuple[str, int]:
        """Where its INVITEs go: (host, port) before name resolution."""
        uri = parse_uri(f"sip:{self.host}")
        return uri.host, uri.port or 5060

    @property
    def credentials(self) -> tuple[str, str] | None:
        """(user, password) for a digest challenge; None: the trunk has none."""
        if self.username is None or self.password is None:
            return None
        return self.username, self.password.get_secret_value()


def unique_names(trunks: list[SipTrunk]) -> list[SipTrunk]:
    """The trunks, each name once (a validator of the settings' list)."""
    names = [trunk.name for trunk in trunks]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"trunk names given twice: {', '.join(twice)}")
    return trunks


def target_problem(to: str) -> str | None:
    """Why `to` cannot be called over SIP (None: it can): a number, or a sip: URI (not sips:,
    which needs TLS all the way: our trunks are UDP)."""
    if NUMBER.fullmatch(to) is not None:
        return None
    if not to.lower().startswith("sip:"):
        return f"{to!r} is neither a number nor a sip: URI"
    try:
        uri = parse_uri(to)
    except SipParseError as exc:
        return f"{to!r} is not a SIP URI: {exc}"
    return None if uri.host else f"{to!r} has no host"


def request_uri(to: str, trunk: SipTrunk) -> str:
    """The INVITE's Request-URI: a SIP URI as given, a number at the trunk."""
    return to if to.lower().startswith("sip:") else f"sip:{to}@{trunk.host}"


def from_uri(number: str | None, trunk: SipTrunk) -> str:
    """Our From URI: the caller id (the request's, else the trunk's, else `hotline`) at the
    trunk's domain."""
    user = number or trunk.from_number or "hotline"
    host = trunk.address[0]
    return f"sip:{user}@{trunk.from_domain or (f'[{host}]' if ':' in host else host)}"
