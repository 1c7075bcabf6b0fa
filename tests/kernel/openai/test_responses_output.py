"""The non-streamed Responses output (``fak.kernel.openai.responses_output.output_items``) reads
the chat door's typed choice (``fak.wire.Choice``); its items are the JSON the dumped choice gave
before, field for field, for text, logprobs (none, empty, some), a refusal and tool calls."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, cast

import pytest

from fak import wire as w
from fak import wire_responses as wr
from fak.kernel.openai.responses_output import item_id, output_items
from fak.kernel.openai.responses_request import Plan

PLAN = cast(Plan, SimpleNamespace(response_id="resp_" + "a" * 24))
TOKEN = w.TokenLogprob(token="hi", logprob=-0.5, bytes=[104, 105],
                       top_logprobs=[w.TopLogprob(token="hi", logprob=-0.5, bytes=None)])
CALL = w.ToolCallOut(id="call_1", function=w.FunctionCallOut(name="get_weather", arguments='{"city": "Oslo"}'))


def _old_items(p: Plan, choice: dict[str, Any]) -> list[wr.OutputMessage | wr.FunctionCallItem]:
    """``output_items`` as it read the dumped choice, before the typed one."""
    msg = choice.get("message") or {}
    text, refusal, calls = msg.get("content") or "", msg.get("refusal"), msg.get("tool_calls") or []
    status = "incomplete" if choice.get("finish_reason") == "length" else "completed"
    lp = choice.get("logprobs")
    logprobs = list(lp.get("content") or []) if isinstance(lp, dict) else None
    items: list[wr.OutputMessage | wr.FunctionCallItem] = []
    parts: list[wr.OutputText | wr.OutputRefusal] = []
    if text or not (calls or refusal):
        parts.append(wr.OutputText(text=text, logprobs=logprobs))
    if refusal:
        parts.append(wr.OutputRefusal(refusal=refusal))
    if parts:
        items.append(wr.OutputMessage(id=item_id(p, "msg", 0), status=status, content=parts))
    for j, call in enumerate(calls):
        fn = call.get("function") or {}
        items.append(wr.FunctionCallItem(id=item_id(p, "fc", j), call_id=call.get("id") or item_id(p, "call", j),
                                         name=fn.get("name", ""), arguments=fn.get("arguments"), status="completed"))
    return items


@pytest.mark.parametrize("choice", [
    w.Choice(message=w.AssistantMessage(content="Hello."), finish_reason="stop"),
    w.Choice(message=w.AssistantMessage(content=None), finish_reason="stop"),
    w.Choice(message=w.AssistantMessage(content="Hel"), finish_reason="length"),
    w.Choice(message=w.AssistantMessage(content="hi"), finish_reason="stop",
             logprobs=w.ChoiceLogprobs(content=[TOKEN, TOKEN])),
    w.Choice(message=w.AssistantMessage(content="hi"), finish_reason="stop", logprobs=w.ChoiceLogprobs(content=None)),
    w.Choice(message=w.AssistantMessage(content="", refusal="denied: send_email"), finish_reason="stop"),
    w.Choice(message=w.AssistantMessage(content=None, tool_calls=[CALL, CALL.model_copy(update={"id": ""})]),
             finish_reason="tool_calls"),
    w.Choice(message=w.AssistantMessage(content="Let me look.", refusal="one call denied", tool_calls=[CALL]),
             finish_reason="tool_calls", logprobs=w.ChoiceLogprobs(content=[TOKEN])),
])
def test_output_items_read_the_typed_choice_as_the_dumped_one_read(choice: w.Choice) -> None:
    new = [x.model_dump(mode="json") for x in output_items(PLAN, choice)]
    old = [x.model_dump(mode="json") for x in _old_items(PLAN, choice.model_dump())]
    assert json.dumps(new) == json.dumps(old)
