"""The Responses door's output (the notes of ``fak.kernel.openai.responses``, "Output"): a chat
choice as Responses output items (a ``message`` with its ``output_text`` and ``refusal``
parts, one ``function_call`` item per call), the usage and status in their Responses forms,
the output items' ids, and the ``withheld`` view of a response for a caller that does not
read content."""

from __future__ import annotations

from typing import Any

from fak import wire as w
from fak import wire_responses as wr
from fak.kernel.openai.responses_request import Plan


def usage_of(usage: w.Usage | None) -> wr.ResponseUsage | None:
    """The chat usage in its Responses form (``cached_tokens`` as ``input_tokens_details``)."""
    if usage is None:
        return None
    return wr.ResponseUsage(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
                            total_tokens=usage.total_tokens,
                            input_tokens_details=wr.InputTokensDetails(
                                cached_tokens=usage.prompt_tokens_details.cached_tokens),
                            output_tokens_details=wr.OutputTokensDetails())


def status_of(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def _logprobs(choice: w.Choice) -> list[dict[str, Any]] | None:
    """The choice's token logprobs as the stream sends them (``[]`` for logprobs with no content)."""
    lp = choice.logprobs
    return [t.model_dump() for t in lp.content or []] if lp is not None else None


def output_items(p: Plan, choice: w.Choice, index: int = 0) -> list[wr.OutputMessage | wr.FunctionCallItem]:
    """A chat completion's choice as Responses output items (``index``: the items before them,
    in a response of several turns: their ids stay unique)."""
    msg = choice.message
    text, refusal, calls = msg.content or "", msg.refusal, msg.tool_calls or []
    status = status_of(choice.finish_reason)
    items: list[wr.OutputMessage | wr.FunctionCallItem] = []
    parts: list[wr.OutputText | wr.OutputRefusal] = []
    if text or not (calls or refusal):
        parts.append(wr.OutputText(text=text, logprobs=_logprobs(choice)))
    if refusal:
        parts.append(wr.OutputRefusal(refusal=refusal))
    if parts:
        items.append(wr.OutputMessage(id=item_id(p, "msg", index), status=status, content=parts))
    for j, call in enumerate(calls, start=index):
        items.append(wr.FunctionCallItem(id=item_id(p, "fc", j), call_id=call.id or item_id(p, "call", j),
                                         name=call.function.name, arguments=call.function.arguments,
                                         status="completed"))
    return items


def item_id(p: Plan, prefix: str, index: int) -> str:
    return f"{prefix}_{p.response_id[5:]}{index:02d}"


def withheld(r: wr.ResponseObject) -> wr.ResponseObject:
    """``r`` without its content, for a caller that reads decisions only: the generated text and
    its logprobs, each call's arguments and the chain's instructions emptied; ids, names,
    statuses, usage, fak's own refusals and ``fak`` (verdicts, findings, refs, audit indexes:
    what the log holds) kept, and ``fak.content_withheld`` set. The call's keyed arguments
    digest is in its ``tool_call_decision`` entry (``fak.tool_calls[].audit_index``)."""
    def item(o: wr.OutputItem) -> wr.OutputItem:
        if isinstance(o, wr.FunctionCallItem | wr.McpApprovalRequestItem):
            return o.model_copy(update={"arguments": ""})
        if isinstance(o, wr.McpCallItem):
            return o.model_copy(update={"arguments": "", "output": None, "error": o.error and {"type": o.error["type"]}})
        if isinstance(o, wr.McpListToolsItem):
            return o
        return o.model_copy(update={"content": [p.model_copy(update={"text": "", "logprobs": None})
                                                if isinstance(p, wr.OutputText) else p for p in o.content]})

    info = r.fak.model_copy(update={"content_withheld": True}) if r.fak is not None else None
    return r.model_copy(update={"output": [item(o) for o in r.output], "instructions": None, "fak": info})
