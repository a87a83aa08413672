"""Server settings: environment variables `HOTLINE_*` (nested with `__`); offline defaults.

Examples: `HOTLINE_PORT=9000`, `HOTLINE_LLM__BASE_URL=https://api.openai.com/v1`,
`HOTLINE_STT__MODEL=base`, `HOTLINE_WEBRTC__ICE_HOST_ADDRESSES='["127.0.0.1"]'`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from aiortc import RTCIceServer
from pydantic import AfterValidator, BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from pipeline.conversation_settings import ConversationSettings
from pipeline.llm.routing import Policy
from pipeline.llm.settings import ControllerSettings, LLMSettings
from pipeline.sentences import SentenceSettings
from pipeline.stt import STTSettings
from pipeline.tts import TTSSettings
from pipeline.turns import TurnSettings
from voice.agents.transfer import CallControlSettings
from voice.campaigns.settings import CampaignSettings
from voice.cluster.records import RegistrySettings
from voice.cluster.webhooks import WebhookSettings
from voice.llm_sim.simulator import SimulatorSettings
from voice.outbound.settings import OutboundSettings
from voice.recordings.settings import RecordingSettings
from voice.server.tracing import TracingSettings
from voice.transports.sip.limits import SipLimits
from voice.transports.sip.trunk import SipTrunk, unique_names


class IceServer(BaseModel):
    """A STUN or TURN server, as in the browser's RTCIceServer."""

    urls: str | list[str]
    username: str | None = None
    credential: str | None = None


class WebRTCSettings(BaseModel):
    """ICE options for the server's peer connections."""

    # Local addresses offered as ICE host candidates; empty = every interface but loopback
    # (aioice's default). Set ["127.0.0.1"] for calls from this machine only.
    ice_host_addresses: list[str] = Field(default_factory=list)
    # STUN/TURN servers: URLs ("stun:stun.example.org:3478") or objects with credentials
    # ({"urls": "turn:turn.example.org:3478", "username": …, "credential": …}); none by default.
    ice_servers: list[str | IceServer] = Field(default_factory=list)
    # A caller whose media has not connected this long after the offer is hung up.
    connect_timeout_s: float = 20.0
    # A caller whose audio stops this long is hung up (a browser that vanished without a word:
    # RTP comes every 20 ms, silence included, while a caller is there).
    media_idle_timeout_s: float = 10.0

    def rtc_ice_servers(self) -> list[RTCIceServer]:
        """`ice_servers` as aiortc takes them."""
        return [
            RTCIceServer(urls=server)
            if isinstance(server, str)
            else RTCIceServer(server.urls, server.username, server.credential)
            for server in self.ice_servers
        ]


class TelephonySettings(BaseModel):
    """Phone calls through a provider's media websocket (Twilio, Telnyx, Vonage)."""

    # Twilio account auth token: when set, every webhook's X-Twilio-Signature is checked.
    twilio_auth_token: SecretStr | None = None
    # The server's public base URL as the provider sees it (e.g. https://voice.example.com),
    # used for signatures and the stream URL; by default taken from the request's headers.
    public_url: str | None = None
    # Key of the media streams' admission tokens (voice/transports/phone/tokens.py); shared by every
    # worker. Unset: derived from the API token, else from the Twilio auth token; with none of
    # the three, streams need no token (local development only: anyone may place calls).
    stream_secret: SecretStr | None = None
    stream_token_ttl_s: float = 60.0  # the provider connects the stream at once
    # A stream that sends no audio this long is hung up (providers send 20 ms frames without
    # pause, silence included): a silent or vanished client must not hold a line.
    media_idle_timeout_s: float = 10.0
    # Reply audio sent ahead of the phone's playback; a `clear` silences at most this much.
    lead_ms: int = 200
    # Digit that asks for a person instead of the bot ("" to let the LLM handle every key).
    human_digit: str = "0"
    human_message: str = "Sure, I will get a person for you. Please stay on the line."
    busy_message: str = "Sorry, all our lines are busy right now. Please call again later."
    transfer_failed_message: str = "Sorry, I couldn't put you through right now."


class SipSettings(BaseModel):
    """Direct SIP: calls from a PBX, an SBC or a carrier's SIP trunk (voice/transports/sip/)."""

    enabled: bool = False  # listen for SIP (UDP and TCP)
    host: str | None = None  # where to listen; default: HOTLINE_HOST
    port: int = 5060  # 0: any free port (logged)
    # SIP over TLS (Python's ssl, the system's OpenSSL; TLS 1.2 at least) on this port when a
    # certificate and its key are given (PEM files).
    tls_port: int = 5061
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    # The address put in SDP and Contact (a NAT's public address); default: the listening host.
    public_address: str | None = None
    rtp_ports: tuple[int, int] = (20000, 30000)  # RTP on even ports in [low, high)
    # Sources allowed to place calls (trunks, PBXs), as addresses or CIDR networks; others get
    # 403. Default: this machine only.
    allow: list[str] = Field(default_factory=lambda: ["127.0.0.0/8", "::1/128"])
    # PBXs that authenticate instead (user -> password, digest): a source not on `allow` is
    # challenged (401) when this is set, and refused (403) when its answer is wrong.
    users: dict[str, SecretStr] = Field(default_factory=dict)
    realm: str = "hotline"
    codecs: tuple[Literal["PCMU", "PCMA"], ...] = ("PCMU", "PCMA")  # in order of preference
    # Ring this long (180 Ringing) before answering; 0 answers at once.
    answer_after_ms: int = Field(default=0, ge=0, le=60_000)
    # A call whose RTP stops this long (not on hold) is hung up.
    media_timeout_s: float = 30.0
    # Session timers (RFC 4028), when the caller asks: the smallest interval accepted (422 and
    # Min-SE below it); a call not refreshed within its interval is hung up.
    min_session_expires_s: int = Field(default=90, ge=1)
    # What one source may cost a worker: messages a second (counted before parsing), TCP/TLS
    # connections, header and idle timeouts (`SipLimits`; README "Security"), each settable,
    # e.g. HOTLINE_SIP__LIMITS__STRANGER_RATE=50.
    limits: SipLimits = Field(default_factory=SipLimits)
    # Trunks and PBXs that calls are placed through (POST /calls/outbound, transport sip), e.g.
    # '[{"name": "pbx", "host": "pbx.example.com:5060", "username": "hotline", "password": "…",
    # "from_number": "+15551110000"}]' (`SipTrunk`; the first is the default).
    trunks: Annotated[list[SipTrunk], AfterValidator(unique_names)] = Field(default_factory=list)


class AgentSettings(BaseModel):
    """Who answers calls: agent files (voice/agents/, README "Agents and tools")."""

    # A directory of agent YAML files, each mapping called numbers (and maybe the softphone
    # page) to instructions, greeting, voice, policy, tools and transfer targets. Unset: one
    # built-in agent with the settings above and no tools.
    dir: str | None = None
    # The agent for numbers no file claims (and the softphone, unless a file has webrtc: true);
    # unset: the built-in agent.
    default: str | None = None
    # Key of the HMAC signature on every HTTP tool request (X-Hotline-Signature). Required when
    # an agent declares HTTP tools; shared by every worker, so the tool can verify any of them.
    signing_secret: SecretStr | None = None


class TestingSettings(BaseModel):
    """What `hotline test` may do to this server's calls (README "Testing an agent")."""

    # Let the API token's holder fix what an HTTP tool answers on one call in progress
    # (`PUT /calls/{id}/mocks`): for staging servers that `hotline test --url` runs against.
    # Needs HOTLINE_API_TOKEN; off, the route answers 404.
    allow_mocks: bool = False


class Settings(BaseSettings):
    """Everything `hotline serve` can be told."""

    model_config = SettingsConfigDict(
        env_prefix="HOTLINE_", env_nested_delimiter="__", extra="ignore"
    )

    host: str = "127.0.0.1"
    port: int = 8080
    max_calls: int = 8  # concurrent calls this process admits; 503 beyond
    max_body_bytes: int = 64 * 1024  # largest accepted offer body
    # Bearer token required on /offer, the calls API and the admin API when set.
    api_token: SecretStr | None = None
    # On SIGTERM or POST /admin/drain: stop admitting calls, let calls in progress go on this
    # long at most, then hang up what is left and exit.
    drain_timeout_s: float = 60.0
    # How the other workers reach this one (they fetch recordings from it), e.g.
    # http://10.0.0.5:8080; default http://HOST:PORT (this machine's name for 0.0.0.0).
    internal_url: str | None = None
    warm_up: bool = True  # load and run every model once before accepting calls

    stt: STTSettings = Field(default_factory=STTSettings)  # WebRTC calls
    # Phone calls (8 kHz μ-law). tiny.en by measurement: on natural speech the phone line costs
    # it nothing, and base's gain on robotic voices is worth less than its +400 ms a turn
    # (README, "Telephone speech recognition"). Set model "base" for hard lines.
    phone_stt: STTSettings = Field(default_factory=STTSettings)
    tts: TTSSettings = Field(default_factory=TTSSettings)
    llm: LLMSettings = Field(default_factory=LLMSettings)
    # The latency budget controller (budget, quantile, learning rate, hedging, fillers).
    controller: ControllerSettings = Field(default_factory=ControllerSettings)
    # How calls that are in no experiment choose tier and effort (default: adaptive, within
    # the controller's budget). E.g. HOTLINE_POLICY='{"policy": "fixed", "effort": "low"}'.
    policy: Policy = Field(default_factory=Policy)
    # An experiment to run from start-up (YAML or JSON; see voice/experiments/arms.py and README).
    experiment_file: str | None = None
    simulator: SimulatorSettings = Field(default_factory=SimulatorSettings)
    turns: TurnSettings = Field(default_factory=TurnSettings)
    sentences: SentenceSettings = Field(default_factory=SentenceSettings)
    conversation: ConversationSettings = Field(default_factory=ConversationSettings)
    webrtc: WebRTCSettings = Field(default_factory=WebRTCSettings)
    telephony: TelephonySettings = Field(default_factory=TelephonySettings)
    agents: AgentSettings = Field(default_factory=AgentSettings)
    # Direct SIP from a PBX or trunk (HOTLINE_SIP__ENABLED=true; README "SIP trunks and PBXs").
    sip: SipSettings = Field(default_factory=SipSettings)
    # Telnyx and Vonage REST credentials: how an agent puts a call through to a person (or
    # presses keys) on those providers (Twilio needs none: TwiML, /twilio/after-stream); and
    # Twilio's, Telnyx's and Vonage's for placing calls (voice/outbound/).
    call_control: CallControlSettings = Field(default_factory=CallControlSettings)
    # Placing calls (POST /calls/outbound, `hotline dial`): calls per second per provider, how
    # long a placed call may ring (voice/outbound/). Twilio's credentials are in call_control.
    outbound: OutboundSettings = Field(default_factory=OutboundSettings)
    # Campaigns (POST /campaigns, `hotline campaign run`): rows, leases, the runner's tick and
    # the clock that decides calling hours (voice/campaigns/).
    campaigns: CampaignSettings = Field(default_factory=CampaignSettings)
    # OpenTelemetry: a trace per call, a span per turn and its stages, exported by OTLP/HTTP when
    # HOTLINE_TRACING__OTLP_ENDPOINT is set (off, at no cost, otherwise).
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    # Post-call webhook: when a call ends, its record (turns, transcript as heard, transfer)
    # is POSTed to HOTLINE_WEBHOOK__URL, signed with HOTLINE_WEBHOOK__SECRET, from an outbox in
    # Redis that survives worker crashes and receiver outages (voice/cluster/webhooks.py).
    webhook: WebhookSettings = Field(default_factory=WebhookSettings)
    # Call recordings: stereo Ogg/Opus (caller left, what the caller heard right) in
    # HOTLINE_RECORDINGS__DIR, kept HOTLINE_RECORDINGS__RETENTION_DAYS, copied to an S3 bucket
    # if HOTLINE_RECORDINGS__S3__BUCKET is set; mode on, off or announce (voice/recordings/).
    recordings: RecordingSettings = Field(default_factory=RecordingSettings)
    # Redis shared by every worker (HOTLINE_REDIS_URL); unset: an in-process store, one worker.
    redis_url: str | None = None
    sessions: RegistrySettings = Field(default_factory=RegistrySettings)
    # Test-only powers (HOTLINE_TESTING__ALLOW_MOCKS=true), all off by default.
    testing: TestingSettings = Field(default_factory=TestingSettings)

    def stream_secret(self) -> bytes | None:
        """The key of stream tokens: its own setting, else the API token, else Twilio's."""
        for secret in (self.telephony.stream_secret, self.api_token):
            if secret is not None:
                return secret.get_secret_value().encode()
        token = self.telephony.twilio_auth_token
        return None if token is None else token.get_secret_value().encode()

    def session_settings(self) -> RegistrySettings:
        """The sessions settings, with HOTLINE_REDIS_URL applied."""
        if self.redis_url is None:
            return self.sessions
        return self.sessions.model_copy(update={"redis_url": self.redis_url})
