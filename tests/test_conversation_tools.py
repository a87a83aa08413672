"""Tool calls inside a turn, on scripted timelines (tests/support/conversation.py): the calls a
reply asks for run at once, the turn goes on with their results, a holding phrase fills a long
wait, barge-in cancels what is running, and what a tool asks of the call waits until the reply
before it has been heard. The history keeps every call with its result."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from pipeline.conversation import Conversation
from pipeline.conversation_settings import ConversationSettings
from pipeline.llm.client import ChatMessage
from pipeline.tool_turns import INTERRUPTED, NOT_DONE, ToolSettings
from pipeline.tools import ActionFailed, CallAction, EndCall, ToolCall, Transfer
from pipeline.transport import HangUp, InboundEvent
from tests.support.conversation import (
    PhoneLine,
    ScriptedLLM,
    ScriptedReply,
    ScriptedSTT,
    ScriptedToolbox,
    ToneTTS,
    speak,
    utterance,
)
from tests.support.speech import concat, espeak, silence

ORDER = ToolCall("call_1", "order_status", '{"order_number": "4512"}')
QUIET = ConversationSettings(speculate=False)


def conversation(
    line: PhoneLine,
    llm: ScriptedLLM,
    tools: ScriptedToolbox,
    texts: list[str],
    tool_settings: ToolSettings | None = None,
    on_action: Callable[[CallAction], Awaitable[None]] | None = None,
) -> Conversation:
    return Conversation(
        "c1",
        line,
        stt=ScriptedSTT(texts),
        llm=llm,
        tts=ToneTTS(),
        settings=QUIET,
        tools=tools,
        tool_settings=tool_settings,
        on_action=on_action,
        caller="+15550001",
        callee="+15550002",
    )


async def one_turn(line: PhoneLine) -> AsyncIterator[InboundEvent]:
    async for event in speak(utterance("Where is my order four five one two")):
        yield event
    while line.queued_samples == 0 or line.played_samples < line.queued_samples:
        await line.reached(max(line.queued_samples, 1))  # hear everything, then hang up
    async for event in speak(silence(300)):
        yield event
    yield HangUp("caller hung up")


async def test_a_reply_calls_a_tool_and_the_same_turn_speaks_its_result() -> None:
    line = PhoneLine()
    output = json.dumps({"order": "4512", "status": "shipped"})
    llm = ScriptedLLM([("Let me look that up.", [ORDER]), "Order 4512 has shipped."])
    tools = ScriptedToolbox({"order_status": output})
    call = conversation(line, llm, tools, ["where is order 4512"])
    line.script = one_turn
    await call.run()

    [record] = call.records
    assert record.reply_text == "Let me look that up. Order 4512 has shipped."
    assert [row["name"] for row in record.tools] == ["order_status"]
    assert record.tools[0]["ok"] is True and record.tools[0]["output"] == output
    assert record.tools_ms is not None and record.tools_ms > 0
    # The second request of the turn carried the call and its result.
    second = llm.requests[1]
    assert second[-2].role == "assistant" and second[-2].tool_calls == (ORDER,)
    assert second[-1].role == "tool" and second[-1].tool_call_id == "call_1"
    assert second[-1].content == output
    # The history: the caller's words, the call (with what was heard before it), its result,
    # then what the caller heard after it.
    assert [(m.role, m.content) for m in call.history] == [
        ("user", "where is order 4512"),
        ("assistant", "Let me look that up."),
        ("tool", output),
        ("assistant", "Order 4512 has shipped."),
    ]
    assert call.history[1].tool_calls == (ORDER,)
    # The tool saw the call it runs in.
    [(_, context)] = tools.started
    assert context.call_id == "c1" and context.caller == "+15550001"
    assert context.transcript[-1] == ("user", "where is order 4512")
    # The request after the tools was planned as if they had taken no time.
    assert abs((llm.zeros[1] - llm.zeros[0]) * 1e3 - record.tools_ms) < 1.0
    kinds = [e["type"] for e in line.events]
    assert kinds.index("tool_call") < kinds.index("tool_result")
    # The controller is not taught a first audio that waited on tools ... unless it did not.
    assert "first_audio" in (llm.streams[0].finished_with or {})


async def test_a_slow_tool_is_covered_by_the_holding_phrase_and_a_fast_one_is_not() -> None:
    slow = ToolSettings(holding_phrase="One moment, please.", hold_after_ms=100)
    for delay, held in ((0.6, True), (0.02, False)):
        line = PhoneLine()
        llm = ScriptedLLM([("", [ORDER]), "It has shipped."])
        tools = ScriptedToolbox({"order_status": "{}"}, delay_s={"order_status": delay})
        call = conversation(line, llm, tools, ["where is order 4512"], slow)
        line.script = one_turn
        await call.run()
        [record] = call.records
        expected = "One moment, please. It has shipped." if held else "It has shipped."
        assert record.reply_text == expected
        # First audio waited on the tool: the controller learns the LLM's part only.
        assert "first_audio" not in (llm.streams[0].finished_with or {})
        assert "first_audio" in record.timings_ms


async def test_parallel_calls_run_at_once_and_each_result_is_kept() -> None:
    line = PhoneLine()
    calls = [
        ToolCall("call_a", "order_status", '{"order_number": "4512"}'),
        ToolCall("call_b", "order_status", '{"order_number": "7781"}'),
    ]
    llm = ScriptedLLM([("Let me check both.", calls), "Both have shipped."])
    tools = ScriptedToolbox({"order_status": '{"status": "shipped"}'}, {"order_status": 0.3})
    call = conversation(line, llm, tools, ["orders 4512 and 7781"])
    line.script = one_turn
    await call.run()

    [record] = call.records
    assert [row["arguments"] for row in record.tools] == [c.arguments for c in calls]
    # Both ran at once: each started before the other had finished.
    first, second = tools.results
    assert max(first.started_at, second.started_at) < min(first.ended_at, second.ended_at)
    assert [m.tool_call_id for m in call.history if m.role == "tool"] == ["call_a", "call_b"]


async def test_barge_in_during_a_tool_cancels_it_and_the_history_says_so() -> None:
    line = PhoneLine()
    llm = ScriptedLLM([("", [ORDER]), "Sure, what else?", "Goodbye then."])
    tools = ScriptedToolbox({"order_status": "{}"}, delay_s={"order_status": None})
    no_holding = ToolSettings(holding_phrase="")
    call = conversation(line, llm, tools, ["where is order 4512", "never mind"], no_holding)

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        async for event in speak(utterance("Where is my order four five one two")):
            yield event
        await tools.running.wait()  # the tool never answers; the caller speaks over the wait
        async for event in speak(utterance("Never mind")):
            yield event
        while line.queued_samples == 0 or line.played_samples < line.queued_samples:
            await line.reached(max(line.queued_samples, 1))
        yield HangUp("caller hung up")

    line.script = caller
    await call.run()

    assert tools.cancelled == ["call_1"]
    first = call.records[0]
    assert first.tools[0]["ok"] is False and INTERRUPTED in str(first.tools[0]["output"])
    # The provider would refuse a call without a result: the next request carries both.
    nxt = llm.requests[1]
    roles = [m.role for m in nxt]
    assert roles == ["user", "assistant", "tool", "user"]
    assert INTERRUPTED in nxt[2].content and nxt[2].tool_call_id == "call_1"


async def test_an_action_waits_for_the_reply_to_be_heard_and_is_dropped_if_cut_off() -> None:
    line = PhoneLine()
    bye = ToolCall("call_9", "end_call", '{"reason": "done"}')
    llm = ScriptedLLM([("", [bye]), "Thank you for calling. Goodbye."])
    tools = ScriptedToolbox({"end_call": '{"status": "ending"}'}, actions={"end_call": EndCall()})
    actions: list[CallAction] = []
    heard_when: list[tuple[int, int]] = []

    async def act(action: CallAction) -> None:
        heard_when.append((line.played_samples, line.queued_samples))
        actions.append(action)

    call = conversation(line, llm, tools, ["that's all, bye"], on_action=act)
    line.script = one_turn
    await call.run()
    assert actions == [EndCall()]
    played, queued = heard_when[0]
    assert queued > 0 and played >= queued  # the goodbye had been heard in full

    # Cut off before the goodbye is heard: no hang-up, and the history says it was not done.
    line = PhoneLine()
    llm = ScriptedLLM(
        [("", [bye]), "Thank you for calling and have a lovely day. Goodbye.", "Okay."]
    )
    actions.clear()
    call = conversation(line, llm, tools, ["that's all, bye", "wait"], on_action=act)

    async def interrupts(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        async for event in speak(utterance("That's all, bye")):
            yield event
        while line.queued_samples == 0:
            await line.reached(1)
        async for event in speak(utterance("Wait")):
            yield event
        while line.played_samples < line.queued_samples:
            await line.reached(line.queued_samples)
        yield HangUp("caller hung up")

    line.script = interrupts
    await call.run()
    assert actions == []
    tool_messages = [m for m in call.history if m.role == "tool"]
    assert NOT_DONE in tool_messages[0].content


class OrderLLM(ScriptedLLM):
    """Asks for the order tool for any caller words, then speaks the tool's answer."""

    def __init__(self) -> None:
        super().__init__([], ttft_s=[], tokens_per_s=200)

    def reply(self, history: Sequence[ChatMessage], zero: float) -> ScriptedReply:
        last = history[-1]
        self.replies.append("It has shipped." if last.role == "tool" else ("", [ORDER]))
        self.ttft_s.append(0.02)
        return super().reply(history, zero)


async def test_a_speculative_reply_runs_no_tool_before_the_turn_has_ended() -> None:
    """Tools act on the world: the reply begun at the caller's pause asks for one at once, but
    it may run only once the turn has really ended there; the caller went on speaking."""
    line = PhoneLine()
    llm = OrderLLM()
    final = "where is my order for the blue shoes"
    stt = ScriptedSTT(["where is my order", *[final] * 6], delay_s=0.02)
    tools = ScriptedToolbox({"order_status": "{}"})
    call = Conversation(
        "c1", line, stt=stt, llm=llm, tts=ToneTTS(), tools=tools, caller="+15550001"
    )
    speech = concat(
        silence(200), espeak("Where is my order"), silence(150), espeak("for the blue shoes")
    )

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        async for event in speak(concat(speech, silence(700))):
            yield event
        while line.queued_samples == 0 or line.played_samples < line.queued_samples:
            await line.reached(max(line.queued_samples, 1))
        yield HangUp("caller hung up")

    line.script = caller
    await call.run()

    # The pause was answered speculatively (a request for the first words)...
    assert llm.requests[0][-1].content == "where is my order"
    # ...but its tool never ran: every call that ran was for the whole turn.
    assert tools.started and all(ctx.transcript[-1] == ("user", final) for _, ctx in tools.started)
    [record] = call.records
    assert record.caller_text == final and record.reply_text == "It has shipped."


async def test_one_turn_may_take_several_rounds_and_stops_asking_after_the_cap() -> None:
    line = PhoneLine()
    find = ToolCall("call_a", "find_customer", '{"phone": "+15550001"}')
    order = ToolCall("call_b", "order_status", '{"order_number": "4512"}')
    again = ToolCall("call_c", "order_status", '{"order_number": "4512"}')
    llm = ScriptedLLM([("", [find]), ("", [order]), ("", [again]), "Never heard."])
    tools = ScriptedToolbox({"find_customer": '{"id": 7}', "order_status": '{"status": "ok"}'})
    capped = ToolSettings(holding_phrase="", max_rounds=2)
    call = conversation(line, llm, tools, ["my last order"], capped)
    line.script = one_turn
    await call.run()

    # Round one's result went into round two's request, and so on, in one turn.
    assert [c.name for c, _ in tools.started] == ["find_customer", "order_status"]
    assert [m.tool_call_id for m in llm.requests[2] if m.role == "tool"] == ["call_a", "call_b"]
    [record] = call.records
    assert [row["name"] for row in record.tools] == ["find_customer", "order_status"]
    # The third request asked for a tool again: past the cap it is not run, and the turn ends
    # with the apology rather than silence.
    assert len(llm.requests) == 3 and llm.replies == ["Never heard."]
    assert record.reply_text == call.settings.apology


async def test_an_action_that_fails_is_told_and_the_history_no_longer_says_it_happened() -> None:
    line = PhoneLine()
    put_through = ToolCall("call_t", "transfer_to_human", '{"reason": "asked"}')
    llm = ScriptedLLM([("", [put_through]), "I'm putting you through now."])
    transfer = Transfer("+15551230001", reason="asked")
    tools = ScriptedToolbox(
        {"transfer_to_human": '{"status": "transferring"}'}, actions={"transfer_to_human": transfer}
    )
    failed = asyncio.Event()

    async def act(action: CallAction) -> None:
        failed.set()
        raise ActionFailed("the provider refused (HTTP 422)", "Sorry, I couldn't put you through.")

    call = conversation(line, llm, tools, ["a person please"], on_action=act)

    async def caller(line: PhoneLine) -> AsyncIterator[InboundEvent]:
        async for event in speak(utterance("A person please")):
            yield event
        await failed.wait()
        async for event in speak(silence(1500)):  # still on the line while the bot explains
            yield event
        await line.reached(line.queued_samples)
        yield HangUp("caller hung up")

    line.script = caller
    await call.run()

    result = next(m for m in call.history if m.role == "tool")
    assert result.tool_call_id == "call_t"
    assert json.loads(result.content) == {"error": "not done: the provider refused (HTTP 422)"}
    assert call.history[-1] == ChatMessage("assistant", "Sorry, I couldn't put you through.")
