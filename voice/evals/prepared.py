"""What a `hotline test` run sets up before its first call (`prepare`): copies of the agent files
whose mocked tools point at the run's endpoint, the signing secret, and for a server of the
run's own what its scenarios need: SIP (over TLS, a certificate made for the run), a stand-in
for Telnyx's and Vonage's call control. `Prepared.server_settings` is that server's settings
(`server_env`, the same as `HOTLINE_*` variables for a `hotline serve` process).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import secrets
import socket
import ssl
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from voice.agents.directory import AgentDirectory, load_agents
from voice.evals.call_control import CallControlApi
from voice.evals.lines import Target
from voice.evals.mocks import MockTools, prepare_agents
from voice.evals.scenario import Scenario

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class SipTls:
    """SIP over TLS for the run's own server: its certificate and key (PEM files), the port
    (a child process's; an in-process server takes any), and a client context trusting it."""

    cert: Path
    key: Path
    port: int
    trusted: ssl.SSLContext


@dataclass
class Prepared:
    """What a run needs besides a server: the agents, the mock endpoint, the signing secret."""

    agents: AgentDirectory
    agents_dir: Path  # the copies the server loads
    mocks: MockTools
    secret: str
    sip_port: int | None = None  # a scenario calls over SIP: the port a server of the run's takes
    call_control: CallControlApi | None = None  # a Telnyx or Vonage scenario: their API, faked
    sip_tls: SipTls | None = None  # a scenario calls over SIP-TLS
    recordings: Path | None = None  # where the run's own server keeps the test calls' audio

    def server_settings(self) -> dict[str, Any]:
        """The settings (as `Settings` takes them) that point a server at the copies and the
        mocks, and for SIP scenarios have it take SIP calls from loopback on `sip_port`."""
        given: dict[str, Any] = {
            "agents": {"dir": str(self.agents_dir), "signing_secret": self.secret}
        }
        if self.recordings is not None and "HOTLINE_RECORDINGS__DIR" not in os.environ:
            given["recordings"] = {"dir": str(self.recordings)}  # gone with the run's scratch
        if self.sip_port is not None:
            sip = {"enabled": True, "host": LOOPBACK, "port": self.sip_port}
            sip["allow"] = ["127.0.0.0/8", "::1/128"]
            if (tls := self.sip_tls) is not None:
                sip.update(
                    tls_port=tls.port, tls_cert_file=str(tls.cert), tls_key_file=str(tls.key)
                )
            given["sip"] = sip
        if self.call_control is not None:
            given["call_control"] = self.call_control.server_settings()
        return given

    def server_env(self) -> dict[str, str]:
        """`server_settings` as the environment of a `hotline serve` process."""
        return dict(_flat("HOTLINE_", self.server_settings()))

    def target(self, url: str) -> Target:
        """The run's own server at `url`, with SIP and call control where this run set them up."""
        target = Target(url, sip_port=self.sip_port) if self.sip_port else Target(url)
        target.call_control, target.own = self.call_control, True
        if self.sip_tls is not None:
            target.sip_tls_port, target.sip_tls = self.sip_tls.port, self.sip_tls.trusted
        return target

    def close(self) -> None:
        """Stop the run's endpoints (the mocks, the call control)."""
        self.mocks.close()
        if self.call_control is not None:
            self.call_control.close()


def _flat(prefix: str, values: dict[str, Any]) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for name, value in values.items():
        key = prefix + name.upper()
        if isinstance(value, dict):
            pairs += _flat(key + "__", value)
        elif isinstance(value, bool):
            pairs.append((key, "true" if value else "false"))
        elif isinstance(value, list):
            pairs.append((key, json.dumps(value)))
        else:
            pairs.append((key, str(value)))
    return pairs


def prepare(
    scenarios: Sequence[Scenario], agents_dir: Path, workdir: Path, lookup_only: bool = False
) -> Prepared:
    """Copies of the agent files in `workdir`, mocks served; raises `AgentFileError` when the
    agents do not load. `lookup_only`: the copies are only read here, for the agents' numbers
    and transfer targets (a server given with --url has agents of its own), so no tool needs
    its headers' environment variables."""
    secret = secrets.token_hex(32)
    mocks = MockTools(secret.encode())
    copies = prepare_agents(agents_dir, list(scenarios), mocks, workdir / "agents", lookup_only)
    try:
        agents = load_agents(copies)
    except Exception:
        mocks.close()
        raise
    own = not lookup_only  # the run starts a server of its own: SIP and call control for it
    sip_calls = [s for s in scenarios if s.transport == "sip"]
    prepared = Prepared(agents, copies, mocks, secret, free_port() if own and sip_calls else None)
    prepared.recordings = workdir / "recordings" if own else None
    if own and any(s.transport in ("telnyx", "vonage") for s in scenarios):
        prepared.call_control = CallControlApi()
    if own and any(s.sip_transport == "tls" for s in sip_calls):
        cert, key, trusted = tls_certificate(workdir)
        prepared.sip_tls = SipTls(cert, key, free_port(), trusted)
    return prepared


def free_port() -> int:
    """A loopback port free for TCP and for UDP (SIP takes both)."""
    for _ in range(100):
        with socket.socket() as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            tcp.bind((LOOPBACK, 0))
            port = int(tcp.getsockname()[1])
            try:
                udp.bind((LOOPBACK, port))
            except OSError:
                continue
            return port
    raise RuntimeError("no loopback port free for both TCP and UDP")


def tls_certificate(directory: Path) -> tuple[Path, Path, ssl.SSLContext]:
    """A self-signed certificate for 127.0.0.1 (a day long) and its key, as PEM files in
    `directory`, and a client context that trusts it alone."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, LOOPBACK)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(LOOPBACK))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert, key_file = directory / "sip-cert.pem", directory / "sip-key.pem"
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.touch(0o600)
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert, key_file, ssl.create_default_context(cafile=str(cert))


def workdir() -> tempfile.TemporaryDirectory[str]:
    """A scratch directory for a run's agent copies and server log."""
    return tempfile.TemporaryDirectory(prefix="hotline-test-")
