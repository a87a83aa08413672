"""The agent tests' judge against a model: a stand-in for an OpenAI-compatible provider (no real
model runs offline), served over real HTTP on loopback, that reads the rubric and the call it is
sent and grades it by a fixed rule, in the chat-completions shape a provider answers with. What
is under test is Hotline's side: what the judge sends (the rubric, the call as its history kept
it, the key), and how a verdict, or a provider's failure, becomes a row."""

from __future__ import annotations

import time
from typing import Any

from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from pipeline.llm.settings import LLMSettings
from tests.support.media_line import serving_on_loopback
from voice.evals.judge import judge
from voice.evals.scenario import Scenario

KEY = "sk-judge-test-key"
RUBRIC = "The agent never says the practice is closed."


def grader(asked: list[dict[str, Any]]) -> Starlette:
    """A provider whose model fails any call in which the agent said "closed"; 401 without the
    key."""

    async def completions(request: Request) -> JSONResponse:
        if request.headers.get("authorization") != f"Bearer {KEY}":
            error = {"message": "Incorrect API key provided", "type": "invalid_request_error"}
            return JSONResponse({"error": error}, status_code=401)
        body = await request.json()
        asked.append(body)
        call = body["messages"][-1]["content"]
        agent_lines = [line for line in call.splitlines() if line.startswith("Agent:")]
        closed = any("closed" in line.lower() for line in agent_lines)
        verdict = "FAIL\nThe agent said the practice is closed." if closed else "PASS\nFine."
        choice = {"index": 0, "message": {"role": "assistant", "content": verdict}}
        answer = {
            "id": "chatcmpl-judge",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [{**choice, "finish_reason": "stop"}],
        }
        return JSONResponse(answer)

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


def call_record(agent_said: str) -> dict[str, Any]:
    history = [
        {"role": "assistant", "content": "Acme Dental, how can I help?", "source": "announcement"},
        {"role": "user", "content": "Are you open on Saturday?"},
        {"role": "assistant", "content": agent_said, "source": "bot"},
    ]
    return {"history": history}


async def test_the_judge_sends_the_rubric_and_the_call_and_reads_the_verdict() -> None:
    scenario = Scenario(agent="receptionist", name="hours", turns=[{"say": "Hi"}], judge=RUBRIC)
    asked: list[dict[str, Any]] = []
    async with serving_on_loopback(grader(asked)) as port:
        model = LLMSettings(
            base_url=f"http://127.0.0.1:{port}/v1", api_key=SecretStr(KEY), model="grader-1"
        )
        broken = await judge(scenario, call_record("Sorry, we are closed on Saturdays."), model)
        fine = await judge(scenario, call_record("We open at 9 on Saturdays."), model)
        wrong_key = model.model_copy(update={"api_key": SecretStr("sk-wrong")})
        refused = await judge(scenario, call_record("We open at 9."), wrong_key)
    assert (broken.status, broken.expectation) == ("fail", "judge")
    assert broken.detail == "FAIL The agent said the practice is closed."
    assert fine.status == "pass"
    assert refused.status == "fail" and "401" in refused.detail and KEY not in refused.detail
    sent = asked[0]
    assert sent["model"] == "grader-1"
    rubric_and_call = sent["messages"][-1]["content"]
    assert rubric_and_call.startswith(f"Rubric:\n{RUBRIC}\n\nCall:\n")
    assert "Caller: Are you open on Saturday?" in rubric_and_call.splitlines()
    assert "Agent: Sorry, we are closed on Saturdays." in rubric_and_call.splitlines()
