"""The non-streamed Responses output (``fak.kernel.openai.responses_output.output_items``): a
chat choice (``fak.wire.Choice``) as output items, case by case: text, an empty answer, a cut
answer, logprobs (some, none asked, asked but empty), a refusal, tool calls (one without an id)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from fak import wire as w
from fak.kernel.openai.responses_output import output_items
from fak.kernel.openai.responses_request import Plan

PLAN = cast(Plan, SimpleNamespace(response_id="resp_" + "a" * 24))
TOKEN = w.TokenLogprob(token="hi", logprob=-0.5, bytes=[104, 105],
                       top_logprobs=[w.TopLogprob(token="hi", logprob=-0.5, bytes=None)])
CALL = w.ToolCallOut(id="call_1", function=w.FunctionCallOut(name="get_weather", arguments='{"city": "Oslo"}'))


def items(choice: w.Choice) -> list[dict[str, Any]]:
    return [x.model_dump(mode="json") for x in output_items(PLAN, choice)]


def test_text_is_one_message_completed_or_incomplete_when_cut() -> None:
    [msg] = items(w.Choice(message=w.AssistantMessage(content="Hello."), finish_reason="stop"))
    assert msg["type"] == "message" and msg["id"] == "msg_" + "a" * 24 + "00" and msg["status"] == "completed"
    assert [(p["type"], p["text"], p["logprobs"]) for p in msg["content"]] == [("output_text", "Hello.", None)]
    [cut] = items(w.Choice(message=w.AssistantMessage(content="Hel"), finish_reason="length"))
    assert cut["status"] == "incomplete"
    [empty] = items(w.Choice(message=w.AssistantMessage(content=None), finish_reason="stop"))
    assert [p["text"] for p in empty["content"]] == [""]  # an empty answer is still one message


def test_logprobs_are_the_tokens_an_empty_list_when_asked_for_none_and_absent_unasked() -> None:
    [msg] = items(w.Choice(message=w.AssistantMessage(content="hi"), finish_reason="stop",
                           logprobs=w.ChoiceLogprobs(content=[TOKEN, TOKEN])))
    assert msg["content"][0]["logprobs"] == [TOKEN.model_dump(mode="json")] * 2
    [asked] = items(w.Choice(message=w.AssistantMessage(content="hi"), finish_reason="stop",
                             logprobs=w.ChoiceLogprobs(content=None)))
    assert asked["content"][0]["logprobs"] == []


def test_a_refusal_is_its_own_part_and_calls_are_items_after_the_message() -> None:
    [refused] = items(w.Choice(message=w.AssistantMessage(content="", refusal="denied: send_email"),
                               finish_reason="stop"))
    assert [(p["type"], p.get("refusal")) for p in refused["content"]] == [("refusal", "denied: send_email")]
    both = items(w.Choice(message=w.AssistantMessage(content="Let me look.", refusal="one call denied",
                                                     tool_calls=[CALL]), finish_reason="tool_calls"))
    assert [x["type"] for x in both] == ["message", "function_call"]
    assert [p["type"] for p in both[0]["content"]] == ["output_text", "refusal"]
    calls = items(w.Choice(message=w.AssistantMessage(content=None, tool_calls=[CALL, CALL.model_copy(update={"id": ""})]),
                           finish_reason="tool_calls"))
    assert [x["type"] for x in calls] == ["function_call", "function_call"]  # no empty message before them
    assert [(x["id"], x["call_id"], x["name"], x["arguments"], x["status"]) for x in calls] == [
        ("fc_" + "a" * 24 + "00", "call_1", "get_weather", '{"city": "Oslo"}', "completed"),
        ("fc_" + "a" * 24 + "01", "call_" + "a" * 24 + "01", "get_weather", '{"city": "Oslo"}', "completed")]
