"""The process's agents, ready for calls: each agent's toolbox and voice are built once at
start-up and shared by all its calls (a tool keeps no state of its own between calls)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import httpx

from pipeline.llm.client import ChatMessage
from pipeline.tool_turns import ToolSettings
from pipeline.tools import Transfer
from pipeline.tts import TextToSpeech, TTSSettings
from voice.agents.agent import Agent
from voice.agents.builtin import builtin_tools, warm_summary
from voice.agents.directory import AgentDirectory
from voice.agents.http_tools import HttpTool
from voice.agents.toolbox import CallTool, CallToolbox
from voice.agents.variables import personalised

log = logging.getLogger(__name__)


class AgentSetupError(ValueError):
    """The agents cannot run with these settings (e.g. HTTP tools but no signing secret)."""


@dataclass(frozen=True)
class ReadyAgent:
    """An agent with what its calls share: its toolbox (None: no tools), its voice and how it
    fills a wait on tools."""

    agent: Agent
    toolbox: CallToolbox | None
    tts: TextToSpeech
    tool_settings: ToolSettings

    @property
    def name(self) -> str:
        return self.agent.name

    def transfer_target(self, name: str | None = None) -> str | None:
        """The number or SIP URI of the target `name` (default: the agent's default target)."""
        transfers = self.agent.transfer
        if not transfers.targets:
            return None
        chosen = name or transfers.default or next(iter(transfers.targets))
        target = transfers.targets.get(chosen)
        return target.to if target is not None else None

    def handed_over(self, action: Transfer, history: Sequence[ChatMessage]) -> Transfer:
        """`action` with what the person is told when the agent's transfers are warm: the
        summary `transfer_to_human` makes, here of the call's `history` so far, for transfers
        asked otherwise (the person key, the calls API, the console). One already made is
        kept."""
        if action.summary or not self.agent.transfer.warm:
            return action
        transcript = [
            (m.role, m.content) for m in history if m.role in ("user", "assistant") and m.content
        ]
        return replace(action, summary=warm_summary(action.reason, transcript))


class Agents:
    """Every agent of the directory, ready; `for_call` picks the one a call reaches."""

    def __init__(
        self,
        directory: AgentDirectory,
        *,
        tts: TextToSpeech,
        tts_settings: TTSSettings,
        client: httpx.AsyncClient | None,
        signing_secret: bytes | None,
    ) -> None:
        self.directory = directory
        check_agents(directory, signing_secret)
        self._ready: dict[str, ReadyAgent] = {}
        for agent in [directory.default, *directory.agents.values()]:
            if agent.http_tools and client is None:
                raise AgentSetupError(f"agent {agent.name!r} declares HTTP tools: no HTTP client")
            self._ready[agent.name] = _ready(agent, tts, tts_settings, client, signing_secret)

    def voices(self) -> list[TextToSpeech]:
        """Each distinct voice the agents speak with (to warm up once)."""
        return list({id(r.tts): r.tts for r in self._ready.values()}.values())

    def named(self, name: str, metadata: Mapping[str, object] | None = None) -> ReadyAgent | None:
        """The agent called `name` (a file's, or the built-in default's), if there is one; with
        a placed call's `metadata`, its words rendered with the call's variables
        (`voice.agents.variables`)."""
        ready = self._ready.get(name)
        if ready is None or metadata is None:
            return ready
        agent = personalised(ready.agent, metadata)
        return ready if agent is ready.agent else replace(ready, agent=agent)

    def for_call(self, kind: str, callee: str | None) -> ReadyAgent:
        """The agent a call reaches: the softphone's for WebRTC, else the called number's."""
        agent = (
            self.directory.for_webrtc() if kind == "webrtc" else self.directory.for_number(callee)
        )
        return self._ready[agent.name]


def check_agents(directory: AgentDirectory, signing_secret: bytes | None) -> None:
    """AgentSetupError if the agents cannot run with these settings."""
    for agent in [directory.default, *directory.agents.values()]:
        if agent.http_tools and signing_secret is None:
            raise AgentSetupError(
                f"agent {agent.name!r} declares HTTP tools, and every tool request is "
                "signed: set HOTLINE_AGENTS__SIGNING_SECRET"
            )


def _ready(
    agent: Agent,
    tts: TextToSpeech,
    tts_settings: TTSSettings,
    client: httpx.AsyncClient | None,
    secret: bytes | None,
) -> ReadyAgent:
    tools: list[CallTool] = []
    transfers = agent.transfer
    targets = {name: (t.to, t.description) for name, t in transfers.targets.items()}
    tools += builtin_tools(agent.builtin_tools, targets, transfers.default, transfers.warm)
    if secret is not None and client is not None:
        tools += [HttpTool(config, secret, client) for config in agent.http_tools]
    voice = tts
    if agent.voice is not None and agent.voice != tts_settings.voice:
        voice = TextToSpeech.shared(tts_settings.model_copy(update={"voice": agent.voice}))
    holding = agent.holding
    tool_settings = (
        ToolSettings(holding_phrase=holding.phrase, hold_after_ms=round(holding.after_ms))
        if holding is not None
        else ToolSettings(holding_phrase="")
    )
    if tools:
        log.info("agent %s: tools %s", agent.name, ", ".join(t.spec.name for t in tools))
    return ReadyAgent(agent, CallToolbox(tools) if tools else None, voice, tool_settings)
