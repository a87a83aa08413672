"""Per-call variables in an agent's words: `{name}` in its instructions, greeting or voicemail
is replaced by the call's value of `name` (a placed call's `metadata.variables`, e.g. a
campaign row's columns); `{name|there}` falls back to "there" when the call has no `name`.

Only `{identifier}` and `{identifier|default}` are placeholders: any other brace (JSON in the
instructions, `{0}`, `{a.b}`) is left as written, and so is a placeholder the call has no value
and no default for. There is no attribute access, indexing or format spec (unlike
`str.format`), and one pass of a regular expression does it: linear in the text's length."""

from __future__ import annotations

import re
from collections.abc import Mapping

from voice.agents.agent import Agent

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]{0,63})(?:\|([^{}\n]{0,200}))?\}")
VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")  # whole string: a usable name
VALUE_CHARS = 500  # of one value, as put into the text
_LINE_BREAKS = re.compile(r"[\r\n\t\x00-\x08\x0b-\x1f\x7f]+")


def render(text: str, variables: Mapping[str, object]) -> str:
    """`text` with each placeholder replaced by its variable (else its default, else as is)."""

    def value(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in variables and variables[name] is not None:
            return clean(variables[name])
        return default if default is not None else match.group(0)

    return PLACEHOLDER.sub(value, text)


def clean(value: object) -> str:
    """A variable's value as text fit for a prompt or speech: one line, at most VALUE_CHARS."""
    return _LINE_BREAKS.sub(" ", str(value)).strip()[:VALUE_CHARS]


def variables_of(metadata: Mapping[str, object] | None) -> dict[str, object]:
    """The variables a placed call's metadata carries (`metadata["variables"]`), if any."""
    found = metadata.get("variables") if metadata is not None else None
    if not isinstance(found, Mapping):
        return {}
    return {str(k): v for k, v in found.items() if VARIABLE_NAME.fullmatch(str(k))}


def personalised(agent: Agent, metadata: Mapping[str, object] | None) -> Agent:
    """`agent` with its instructions, greeting and voicemail rendered with the call's variables
    (the agent itself when the call has none)."""
    variables = variables_of(metadata)
    if not variables:
        return agent
    changes = {
        name: render(text, variables)
        for name in ("instructions", "greeting", "voicemail")
        if (text := getattr(agent, name)) is not None
    }
    return agent.model_copy(update=changes) if changes else agent
