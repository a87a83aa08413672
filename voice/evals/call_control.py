"""Telnyx's and Vonage's call control, as the run's own server meets it: a loopback endpoint
that takes their transfer commands, so a Telnyx or Vonage scenario's transfer goes the real path
(`voice.agents.transfer.CallControl` sends the command, the call record keeps the transfer).

The run's server is given credentials of the run's own (a Telnyx API key; a Vonage application
and an RSA key made for the run) with this endpoint as both APIs' URL, so it never reaches a real
provider, whatever the environment holds. The endpoint checks each command's bearer as the
provider would (the key; the JWT's RS256 signature and `application_id`) and answers as the
provider does on success: Telnyx `POST /v2/calls/{id}/actions/transfer` with
`{"data": {"result": "ok"}}`, Vonage `PUT /v1/calls/{uuid}` (`"action": "transfer"`) with 204.
`transferred_to(call_id)` is where a call was put through (the command's `to`, or the NCCO
connect's number or URI), as Twilio's `<Dial>` says it.
"""

from __future__ import annotations

import json
import secrets
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

MAX_BODY_BYTES = 100_000
TELNYX_TRANSFER = ("/v2/calls/", "/actions/transfer")
VONAGE_CALLS = "/v1/calls/"


class CallControlApi:
    """The loopback endpoint, in a thread of its own; its credentials for the server."""

    def __init__(self) -> None:
        self.telnyx_key = "KEY" + secrets.token_hex(16)
        self.vonage_application = str(uuid.uuid4())
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._vonage_public = key.public_key()
        self.vonage_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        self._transfers: dict[str, str] = {}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def server_settings(self) -> dict[str, str]:
        """The settings (`call_control`'s) that point a server's Telnyx and Vonage call control
        here."""
        return {
            "telnyx_api_key": self.telnyx_key,
            "telnyx_api_url": f"{self.url}/v2",
            "vonage_application_id": self.vonage_application,
            "vonage_private_key": self.vonage_pem,
            "vonage_api_url": self.url,
        }

    def transferred_to(self, call_id: str) -> str | None:
        with self._lock:
            return self._transfers.get(call_id)

    def authorised(self, provider: str, bearer: str) -> bool:
        if provider == "telnyx":
            return secrets.compare_digest(bearer, self.telnyx_key)
        try:
            claims = jwt.decode(bearer, self._vonage_public, algorithms=["RS256"])
        except jwt.PyJWTError:
            return False
        return bool(claims.get("application_id") == self.vonage_application)

    def command(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        """A transfer command's status and answer (None: no body)."""
        if (
            method == "POST"
            and path.startswith(TELNYX_TRANSFER[0])
            and path.endswith(TELNYX_TRANSFER[1])
        ):
            call_id = unquote(
                path.removeprefix(TELNYX_TRANSFER[0]).removesuffix(TELNYX_TRANSFER[1])
            )
            target = body.get("to")
            answer: tuple[int, Any] = (200, {"data": {"result": "ok"}})
        elif method == "PUT" and path.startswith(VONAGE_CALLS) and body.get("action") == "transfer":
            call_id = unquote(path.removeprefix(VONAGE_CALLS))
            target = _ncco_target(body)
            answer = (204, None)
        else:
            return 404, {"errors": [{"title": "Not Found", "detail": f"{method} {path}"}]}
        if not isinstance(target, str) or not target:
            return 422, {"errors": [{"title": "Invalid parameter", "detail": "no target"}]}
        with self._lock:
            self._transfers[call_id] = target
        return answer

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _ncco_target(body: dict[str, Any]) -> str | None:
    """The number ("+" put back) or SIP URI of a Vonage transfer's NCCO connect."""
    destination = body.get("destination")
    ncco = destination.get("ncco") if isinstance(destination, dict) else None
    connect = ncco[0] if isinstance(ncco, list) and ncco and isinstance(ncco[0], dict) else {}
    endpoints = connect.get("endpoint")
    endpoint = endpoints[0] if isinstance(endpoints, list) and endpoints else {}
    if not isinstance(endpoint, dict):
        return None
    if endpoint.get("type") == "phone" and endpoint.get("number"):
        return "+" + str(endpoint["number"]).lstrip("+")
    uri = endpoint.get("uri")
    return str(uri) if uri else None


def _handler(api: CallControlApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self._command("telnyx")

        def do_PUT(self) -> None:
            self._command("vonage")

        def _command(self, provider: str) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            if size > MAX_BODY_BYTES:
                self._reply(413, {"title": "Payload Too Large"})
                return
            raw = self.rfile.read(size)
            bearer = self.headers.get("Authorization", "").removeprefix("Bearer ")
            if not api.authorised(provider, bearer):
                self._reply(401, {"title": "Unauthorized", "detail": "bad credentials"})
                return
            try:
                body = json.loads(raw)
            except ValueError:
                self._reply(400, {"title": "Bad Request", "detail": "the body is not JSON"})
                return
            self._reply(
                *api.command(self.command, self.path, body if isinstance(body, dict) else {})
            )

        def _reply(self, status: int, value: Any) -> None:
            data = b"" if value is None else json.dumps(value).encode()
            self.send_response(status)
            if data:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return  # quiet: the call record says what was transferred

    return Handler
