"""The tier simulator's tool calling: what it says of tool results and which numbers it hears
(pure functions), and its wire shapes as the real `openai` SDK parses them, over real HTTP on
127.0.0.1, for Chat Completions and the Responses API."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageFunctionToolCall
from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall
from openai.types.responses import (
    FunctionTool,
    ResponseCompletedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseTextDeltaEvent,
)

from pipeline.tools import ToolSpec
from voice.llm_sim.requests import OfferedTool
from voice.llm_sim.serving import running_simulator
from voice.llm_sim.simulator import (
    SimulatorSettings,
    TierProfile,
    create_simulator_app,
)
from voice.llm_sim.tools import ToolOutput, result_sentence, spoken_numbers, tool_reply

LOOKUP = ToolSpec(
    "lookup_order",
    "Find an order.",
    {
        "type": "object",
        "properties": {"customer": {"type": "string"}, "order_id": {"type": "string"}},
        "required": ["order_id"],
    },
)
TRANSFER = ToolSpec("transfer_to_human", "Put the caller through to a person.")
TOOLS = [LOOKUP, TRANSFER]
CHAT_TOOLS: Any = [t.chat() for t in TOOLS]
RESPONSES_TOOLS: Any = [t.responses() for t in TOOLS]
ORDERS: Any = [{"role": "user", "content": "Where are orders 4512 and 7781?"}]


# ---------------------------------------------------------------- what it says and hears


@pytest.mark.parametrize(
    ("tool", "output", "said"),
    [
        (
            "get_order",
            '{"order": "4512", "status": "shipped", "eta": "Friday"}',
            "Order 4512: status shipped, eta Friday.",
        ),
        ("get_order", '{"error": "no such order."}', "Sorry, I couldn't get order: no such order."),
        ("transfer_to_human", '{"ok": true}', "I'm putting you through to a person now."),
        ("end_call", "{}", "Thank you for calling. Goodbye."),
        (
            "end_call",
            '{"error": "the line is busy"}',
            "Sorry, I couldn't end call: the line is busy.",
        ),
        ("check_stock", '{"in_stock": true}', "In stock yes."),
        ("check_stock", '{"sizes": ["S", "M"], "left": 3}', "Sizes S, M: left 3."),
        ("check_stock", "{}", "Check stock: done."),
        ("get_weather", "sunny and warm", "Get weather: sunny and warm."),
        ("get_weather", '"rain"', "Get weather: rain."),
        ("count", "42", "Count: 42."),
    ],
)
def test_a_tool_result_is_said_in_one_sentence(tool: str, output: str, said: str) -> None:
    assert result_sentence(tool, output) == said


@pytest.mark.parametrize(
    ("heard", "numbers"),
    [
        ("Where are orders 4512 and 7781?", ["4512", "7781"]),
        ("order four five one two", ["4512"]),
        ("Order 4 5 1 2, please.", ["4512"]),
        ("It's 4,512.", ["4512"]),
        ("order 4-5-1-2 and 12,345,678", ["4512", "12345678"]),
        ("Four oh five and double seven eight", ["405", "778"]),
        ("Oh, it's 1, 2, 3.", ["123"]),
        ("Two orders: 4512. And 7781", ["2", "4512", "7781"]),
        ("no numbers here", []),
    ],
)
def test_numbers_are_heard_however_they_were_written(heard: str, numbers: list[str]) -> None:
    assert spoken_numbers(heard) == numbers


def offered(*specs: ToolSpec) -> list[OfferedTool]:
    return [OfferedTool(s.name, dict(s.parameters)) for s in specs]


def test_the_tool_reply_follows_the_callers_words() -> None:
    tools = offered(LOOKUP, TRANSFER, ToolSpec("end_call", "Hang up."))
    human = tool_reply("Can I speak to a REPRESENTATIVE", tools, [])
    assert human is not None and human.text == ""
    assert [(c.name, json.loads(c.arguments)) for c in human.calls] == [
        ("transfer_to_human", {"reason": "Can I speak to a REPRESENTATIVE"})
    ]
    bye = tool_reply("ok bye", tools, [])
    assert bye is not None and [c.name for c in bye.calls] == ["end_call"]
    orders = tool_reply("order 4512 and 4512 and 12", tools, [])  # once each, 3+ digits
    assert orders is not None and orders.text == "Let me look that up."
    assert [json.loads(c.arguments) for c in orders.calls] == [{"order_id": "4512"}]
    one = tool_reply("orders 4512 and 7781", tools, [], parallel=False)
    assert one is not None and len(one.calls) == 1
    assert tool_reply("what time do you open", tools, []) is None
    assert tool_reply("get me a person", offered(LOOKUP), []) is None  # no transfer offered
    said = tool_reply("order 4512", tools, [ToolOutput("lookup_order", '{"status": "lost"}')])
    assert said is not None and said.calls == [] and said.text == "Status lost."


def test_a_number_goes_in_the_first_required_argument_else_the_first_listed() -> None:
    listed = OfferedTool("order_lookup", {"properties": {"ref": {}, "note": {}}})
    assert listed.argument() == "ref"
    assert OfferedTool("order_lookup", {}).argument() == "order_number"
    assert offered(LOOKUP)[0].argument() == "order_id"


# ---------------------------------------------------------------- over HTTP, through the SDK


@pytest_asyncio.fixture
async def client() -> AsyncIterator[AsyncOpenAI]:
    profiles = {
        "fast": TierProfile(ttft_ms=5, tokens_per_s=20_000, reported_as="priority"),
        "standard": TierProfile(ttft_ms=10, tokens_per_s=5_000, reported_as="default"),
    }
    app = create_simulator_app(SimulatorSettings(profiles=profiles, seed=5))
    async with running_simulator(app=app) as url:
        sdk = AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=0)
        try:
            yield sdk
        finally:
            await sdk.close()


async def test_chat_streams_parallel_calls_as_typed_fragments(client: AsyncOpenAI) -> None:
    chunks = await client.chat.completions.create(
        model="m",
        messages=ORDERS,
        tools=CHAT_TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, fragments, finish, usage = "", list[ChoiceDeltaToolCall](), None, None
    async for chunk in chunks:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            fragments += choice.delta.tool_calls or []
            finish = choice.finish_reason or finish
    assert text == "Let me look that up."
    assert all(isinstance(f, ChoiceDeltaToolCall) for f in fragments)
    firsts = [f for f in fragments if f.id is not None]
    assert [(f.index, f.type) for f in firsts] == [(0, "function"), (1, "function")]
    assert all(f.function and f.function.name == "lookup_order" for f in firsts)
    assert all(f.function and f.function.arguments == "" for f in firsts)
    arguments = ["", ""]
    for f in fragments:
        arguments[f.index] += f.function.arguments or "" if f.function else ""
    assert [json.loads(a) for a in arguments] == [{"order_id": "4512"}, {"order_id": "7781"}]
    assert finish == "tool_calls"
    assert usage is not None and usage.completion_tokens == 5 + len(fragments)

    reply = await client.chat.completions.create(
        model="m",
        messages=ORDERS,
        tools=CHAT_TOOLS,
    )
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls"
    assert message.content == "Let me look that up."
    calls = [
        c for c in message.tool_calls or [] if isinstance(c, ChatCompletionMessageFunctionToolCall)
    ]
    assert len(calls) == len(message.tool_calls or [])
    assert [json.loads(c.function.arguments) for c in calls] == [
        {"order_id": "4512"},
        {"order_id": "7781"},
    ]


async def test_responses_stream_the_function_call_events(client: AsyncOpenAI) -> None:
    events = await client.responses.create(
        model="m",
        input=[{"role": "user", "content": "Transfer me to an operator"}],
        tools=RESPONSES_TOOLS,
        reasoning={"effort": "low"},
        stream=True,
    )
    seen = [event async for event in events]
    added = [e for e in seen if isinstance(e, ResponseOutputItemAddedEvent)]
    calls = [e.item for e in added if isinstance(e.item, ResponseFunctionToolCall)]
    assert [(c.name, c.arguments, c.status) for c in calls] == [
        ("transfer_to_human", "", "in_progress")
    ]
    item_id, call_id = calls[0].id, calls[0].call_id
    assert item_id is not None and item_id.startswith("fc_") and call_id.startswith("call_")
    deltas = [e for e in seen if isinstance(e, ResponseFunctionCallArgumentsDeltaEvent)]
    assert {(e.item_id, e.output_index) for e in deltas} == {(item_id, 1)}  # after reasoning
    arguments = "".join(e.delta for e in deltas)
    assert json.loads(arguments) == {"reason": "Transfer me to an operator"}
    done = [e for e in seen if isinstance(e, ResponseFunctionCallArgumentsDoneEvent)]
    assert [e.arguments for e in done] == [arguments]
    finished = [e.item for e in seen if isinstance(e, ResponseOutputItemDoneEvent)]
    assert isinstance(finished[-1], ResponseFunctionToolCall)
    assert (finished[-1].arguments, finished[-1].status) == (arguments, "completed")
    assert not any(isinstance(e, ResponseTextDeltaEvent) for e in seen)
    completed = seen[-1]
    assert isinstance(completed, ResponseCompletedEvent)
    output = completed.response.output
    assert [o.type for o in output] == ["reasoning", "function_call"]
    assert output[1] == finished[-1]
    echoed = completed.response.tools
    assert [t.name for t in echoed if isinstance(t, FunctionTool)] == [t.name for t in TOOLS]
    assert [e.sequence_number for e in seen] == list(range(len(seen)))

    response = await client.responses.create(
        model="m",
        input=ORDERS,
        tools=RESPONSES_TOOLS,
    )
    assert response.output_text == "Let me look that up."
    items = [o for o in response.output if isinstance(o, ResponseFunctionToolCall)]
    assert [json.loads(o.arguments) for o in items] == [{"order_id": "4512"}, {"order_id": "7781"}]


async def test_a_token_cap_cuts_a_call_short(client: AsyncOpenAI) -> None:
    capped = await client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "get me a human"}],
        tools=CHAT_TOOLS,
        max_completion_tokens=3,
    )
    assert capped.choices[0].finish_reason == "length"
    events = await client.responses.create(
        model="m",
        input="get me a human",
        tools=RESPONSES_TOOLS,
        max_output_tokens=3,
        stream=True,
    )
    last = [event async for event in events][-1]
    assert isinstance(last, ResponseIncompleteEvent)
    cut = last.response.output[0]
    assert isinstance(cut, ResponseFunctionToolCall) and cut.status == "incomplete"


async def test_parallel_calls_can_be_turned_off(client: AsyncOpenAI) -> None:
    reply = await client.chat.completions.create(
        model="m",
        messages=ORDERS,
        tools=CHAT_TOOLS,
        parallel_tool_calls=False,
    )
    assert len(reply.choices[0].message.tool_calls or []) == 1


def chat_call(call_id: str) -> dict[str, Any]:
    function = {"name": "lookup_order", "arguments": '{"order_id": "4512"}'}
    return {"id": call_id, "type": "function", "function": function}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/chat/completions", {"tools": {"type": "function"}}, "tools"),
        ("/chat/completions", {"tools": [{"type": "function", "name": "flat"}]}, "tools"),
        ("/responses", {"tools": [{"type": "function", "function": {"name": "x"}}]}, "tools"),
        ("/responses", {"tools": [{"type": "function", "name": "bad name!"}]}, "tools"),
        ("/chat/completions", {"tools": [{"type": "web_search"}]}, "tools"),
        (
            "/chat/completions",
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": None, "tool_calls": [chat_call("call_a")]},
                    {"role": "user", "content": "hello?"},
                ]
            },
            "messages[1].role",
        ),
        (
            "/chat/completions",
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "tool", "tool_call_id": "call_x", "content": "{}"},
                ]
            },
            "messages[1].role",
        ),
        (
            "/chat/completions",
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_a"}]},
                ]
            },
            "messages[1].tool_calls[0]",
        ),
        (
            "/responses",
            {
                "input": [
                    {"role": "user", "content": "hi"},
                    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                    {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c1", "output": "{}"},
                ]
            },
            "input",
        ),
        (
            "/responses",
            {
                "input": [
                    {"role": "user", "content": "hi"},
                    {"type": "function_call_output", "call_id": "c9", "output": "{}"},
                ]
            },
            "input",
        ),
    ],
    ids=[
        "tools-not-a-list",
        "chat-tool-in-responses-shape",
        "responses-tool-in-chat-shape",
        "bad-tool-name",
        "not-a-function",
        "chat-call-unanswered",
        "chat-result-for-no-call",
        "chat-call-malformed",
        "responses-call-unanswered",
        "responses-result-for-no-call",
    ],
)
async def test_malformed_tools_and_tool_messages_are_openai_400s(
    client: AsyncOpenAI, path: str, body: dict[str, Any], param: str
) -> None:
    field = "messages" if path == "/chat/completions" else "input"
    request = {"model": "m", field: [{"role": "user", "content": "hi"}], **body}
    async with httpx.AsyncClient(base_url=str(client.base_url)) as http:
        answer = await http.post(path, json=request)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"]) == ("invalid_request_error", param)


async def test_the_sdk_raises_a_bad_request_for_an_unanswered_responses_call(
    client: AsyncOpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(
            model="m",
            input=[
                {"role": "user", "content": "hi"},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            ],
        )
    assert "c1" in raised.value.message
