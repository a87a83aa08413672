"""The optional judge: a scenario's rubric and the call's transcript, sent to a real model.

The judge is the LLM the server is configured with (`HOTLINE_LLM__BASE_URL`, `…__API_KEY`,
`…__MODEL`, read from the environment as the server reads them). With only the embedded
simulator there is no model that can judge anything, so the judge is skipped and says why:
the simulator's words are canned, and grading them would only test the grader.
"""

from __future__ import annotations

from typing import Any

import httpx

from pipeline.llm.settings import LLMSettings
from voice.evals.checks import Outcome
from voice.evals.scenario import Scenario

JUDGE_TIMEOUT_S = 60.0
SKIPPED = (
    "skipped: only the embedded simulator is configured; set HOTLINE_LLM__BASE_URL (and "
    "__API_KEY, __MODEL) to a real model to judge"
)
_PROMPT = (
    "You grade a phone call between a caller and a voice agent against a rubric. Answer with "
    "PASS or FAIL on the first line, then one short sentence saying why."
)


def transcript(record: dict[str, Any]) -> str:
    """The call as the history kept it: one line a message, the caller and the agent."""
    lines = []
    for message in record.get("history") or []:
        if isinstance(message, dict) and message.get("role") in ("user", "assistant"):
            who = "Caller" if message["role"] == "user" else "Agent"
            lines.append(f"{who}: {message.get('content') or ''}")
    return "\n".join(lines)


def judge_settings() -> LLMSettings | None:
    """The model to judge with (the server's, from the environment); None: only the
    simulator."""
    from voice.server.settings import Settings

    llm = Settings().llm
    return llm if llm.base_url else None


async def judge(scenario: Scenario, record: dict[str, Any], llm: LLMSettings | None) -> Outcome:
    """The rubric's verdict on the call, or a skip that says why."""
    what = "judge"
    if scenario.judge is None:
        raise ValueError("the scenario has no rubric")
    if llm is None or llm.base_url is None:
        return Outcome(scenario.name, None, what, "skip", SKIPPED)
    body = {
        "model": llm.model,
        "messages": [
            {"role": "system", "content": _PROMPT},
            {
                "role": "user",
                "content": f"Rubric:\n{scenario.judge}\n\nCall:\n{transcript(record)}",
            },
        ],
    }
    headers = {"Authorization": f"Bearer {llm.api_key.get_secret_value()}"}
    url = llm.base_url.rstrip("/") + "/chat/completions"
    try:
        async with httpx.AsyncClient(timeout=JUDGE_TIMEOUT_S) as http:
            response = await http.post(url, json=body, headers=headers)
            response.raise_for_status()
            verdict = str(response.json()["choices"][0]["message"]["content"]).strip()
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        return Outcome(scenario.name, None, what, "fail", f"the judge failed: {exc}")
    passed = verdict.upper().startswith("PASS")
    return Outcome(
        scenario.name, None, what, "pass" if passed else "fail", " ".join(verdict.split())
    )
