"""The Responses door's request translation (the notes of ``fak.kernel.openai.responses``,
"Input" and "Parameters"): input items as chat messages, function tools, ``tool_choice`` and
``text.format`` in their chat forms, the parameters refused or ignored, the chat core's
refusals renamed to the Responses names; and the ``Plan`` a validated request becomes (its
chain, its chat request, and the ``response`` object it is answered with)."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from fak import wire as w
from fak import wire_responses as wr
from fak.errors import InvalidInput
from fak.kernel.openai.chat import UnsupportedContent, UnsupportedParameter
from fak.kernel.openai.responses_mcp_plan import McpPlan

TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
LOGPROBS = "message.output_text.logprobs"
HELD_CALLS = "fak_held_calls"
REFUSED = ("background", "conversation", "prompt", "max_tool_calls", "context_management")
IGNORED = ("reasoning", "truncation", "include", "stream_options")
# the chat core's parameter names, as a Responses client knows them
CHAT_NAMES = {"response_format.json_schema.schema": "text.format.schema", "response_format": "text.format",
              "max_completion_tokens": "max_output_tokens", "logprobs": "include (message.output_text.logprobs)"}
CHAT_TOOL = re.compile(r"tools\[(\d+)\]\.function\.")  # a chat tool's field; a Responses tool has it at top level


def _part_text(part: Any, where: str) -> str:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise InvalidInput(f"{where}: a content part is an object with a string 'type'")
    kind = part["type"]
    if kind in TEXT_PARTS and isinstance(part.get("text"), str):
        return str(part["text"])
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return str(part["refusal"])
    if kind in TEXT_PARTS or kind == "refusal":
        raise InvalidInput(f"{where}: a {kind} part needs a string {'refusal' if kind == 'refusal' else 'text'!r}")
    raise UnsupportedContent(f"{where}: {kind[:40]!r} parts are not supported: the model reads text only")


def _content(value: Any, where: str, *, required: bool = True) -> str | None:
    """An item's content as text (parts joined with ``"\\n"``, as the chat core joins them)."""
    if value is None and not required:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(_part_text(p, f"{where}[{j}]") for j, p in enumerate(value))
    raise InvalidInput(f"{where}: a string or a list of text parts")


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value and key != "arguments":
        raise InvalidInput(f"{where}.{key}: a non-empty string is required")
    return value


def chat_messages(items: list[dict[str, Any]], instructions: str | None,
                  called: dict[str, str] | None = None) -> list[w.ChatMessage]:
    """Input items as chat messages (``instructions``, if given, first as a system message).
    ``called``: call id -> function name of the previous response's calls, so that an output
    answering one is admitted under its tool's name (the gate's policy is per tool)."""
    out: list[w.ChatMessage] = []
    if instructions is not None:
        out.append(w.ChatMessage(role="system", content=instructions))
    calls_open = False  # the last message is an assistant message that takes more tool calls
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidInput(f"{where}: an input item is an object")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise InvalidInput(f"{where}.role: one of user, system, developer, assistant")
            out.append(w.ChatMessage(role=role, content=_content(item.get("content"), f"{where}.content")))
            calls_open = role == "assistant"
        elif kind == "function_call":
            call = w.ToolCall(id=_string(item, "call_id", where), type="function",
                              function=w.FunctionCall(name=_string(item, "name", where),
                                                      arguments=_string(item, "arguments", where)))
            last = out[-1] if out else None
            if calls_open and last is not None:
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                out.append(w.ChatMessage(role="assistant", content=None, tool_calls=[call]))
                calls_open = True
        elif kind == "function_call_output":
            output = _content(item.get("output"), f"{where}.output")
            call_id = _string(item, "call_id", where)
            out.append(w.ChatMessage(role="tool", tool_call_id=call_id, content=output,
                                     name=(called or {}).get(call_id)))
            calls_open = False
        elif kind == "reasoning":
            continue  # the model emits no reasoning; a client resending one loses nothing
        elif kind in ("mcp_list_tools", "mcp_approval_request", "mcp_approval_response"):
            continue  # listed again, and approvals answered, by fak.kernel.openai.responses_mcp
        elif kind == "mcp_call":  # a resent MCP call: the call, and its output as the result it answers
            call = w.ToolCall(id=_string(item, "id", where), type="function",
                              function=w.FunctionCall(name=_string(item, "name", where),
                                                      arguments=_string(item, "arguments", where)))
            out.append(w.ChatMessage(role="assistant", content=None, tool_calls=[call]))
            out.append(w.ChatMessage(role="tool", tool_call_id=call.id, content=_mcp_output(item, where)))
            calls_open = False
        else:
            raise UnsupportedContent(f"{where}.type: {str(kind)[:40]!r} items are not supported (messages, "
                                     "function_call and function_call_output are)")
    return out


def _mcp_output(item: dict[str, Any], where: str) -> str:
    """What a resent ``mcp_call`` item's result was: its output, or its error as text."""
    if isinstance(item.get("output"), str):
        return str(item["output"])
    error = item.get("error")
    if error is not None:
        return f"[the MCP call failed: {str(error)[:2000]}]"
    raise InvalidInput(f"{where}: an mcp_call item has an output or an error")


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses function tools in their chat form (``mcp`` tools are
    ``fak.kernel.openai.responses_mcp``'s); any other tool type is refused."""
    tools = [t for t in tools if t.get("type") != "mcp"]
    others = sorted({str(t.get("type"))[:40] for t in tools if t.get("type") != "function"})
    if others:
        raise UnsupportedParameter(f"tools: only function tools are supported, not {', '.join(others)}",
                                   param="tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise InvalidInput(f"tools[{i}].name: a function tool has a name", param=f"tools[{i}].name")
        fn = {key: tool[key] for key in ("name", "description", "parameters", "strict") if tool.get(key) is not None}
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise InvalidInput("tool_choice: auto, none, required or {'type': 'function', 'name': ...}",
                               param="tool_choice")
        return choice
    if choice.get("type") in ("function", "mcp") and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    if choice.get("type") == "mcp":  # any tool of the server
        return "required"
    raise UnsupportedParameter(f"tool_choice: {str(choice.get('type'))[:40]!r} is not supported "
                               "(auto, none, required or a function by name)", param="tool_choice")


def chat_response_format(text: dict[str, Any]) -> dict[str, Any] | None:
    """``text.format`` in the chat form (None for plain text)."""
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise InvalidInput("text.format: {'type': 'text' | 'json_object' | 'json_schema', ...}", param="text.format")
    if fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    schema = {key: fmt[key] for key in ("name", "description", "schema", "strict") if fmt.get(key) is not None}
    return {"type": "json_schema", "json_schema": schema}


@dataclass(frozen=True)
class Chain:
    """Where a response runs: the chain's session (None: an ephemeral one), whether the
    response starts the chain, the response it follows, the chain's instructions, and the
    session's fingerprint before it (a follow-up)."""

    session_id: str | None
    new: bool
    previous: str | None
    instructions: str | None
    fingerprint: str | None = None
    called: dict[str, str] = field(default_factory=dict)  # the previous response's calls: id -> name


@dataclass
class Plan:
    """A validated request: its id, chain, the chat request it becomes and what the response echoes."""

    response_id: str
    created_at: int
    model: str  # the kernel's (a request may name any model, as at the chat door)
    chain: Chain
    store: bool
    body: wr.ResponseCreateRequest
    chat_body: w.ChatCompletionRequest
    ignored: list[str] = field(default_factory=list)
    mcp: McpPlan | None = None  # the request's MCP servers and their tools listed now (None: no mcp tool)

    @property
    def claimed(self) -> bool:
        """A row in ``fak_responses`` marks this response (any response of a kept session)."""
        return self.chain.session_id is not None

    def response(self, status: str, output: Sequence[wr.OutputItem],
                 usage: wr.ResponseUsage | None = None, fak: dict[str, Any] | None = None,
                 error: wr.ResponseError | None = None) -> wr.ResponseObject:
        b = self.body
        if fak is not None:
            fak = {**fak, "ignored": sorted({*fak.get("ignored", []), *self.ignored})}
        return wr.ResponseObject(
            id=self.response_id, created_at=self.created_at,
            completed_at=int(time.time()) if status in ("completed", "incomplete") else None,
            status=status, model=self.model, output=list(output), usage=usage,
            previous_response_id=self.chain.previous, instructions=self.chain.instructions,
            tools=b.tools or [], tool_choice=b.tool_choice or "auto",
            parallel_tool_calls=True if b.parallel_tool_calls is None else b.parallel_tool_calls,
            text=b.text or {"format": {"type": "text"}}, reasoning=b.reasoning,
            temperature=1.0 if b.temperature is None else b.temperature,
            top_p=1.0 if b.top_p is None else b.top_p, max_output_tokens=b.max_output_tokens,
            truncation=b.truncation or "disabled",
            incomplete_details=wr.IncompleteDetails(reason="max_output_tokens") if status == "incomplete" else None,
            error=error, metadata=b.metadata or {}, user=b.user, store=self.store, fak=fak)


def refused(body: wr.ResponseCreateRequest) -> None:
    extra = body.model_extra or {}
    for name in REFUSED:
        value = extra.get(name)
        if value is not None and value is not False:
            raise UnsupportedParameter(f"{name}: not supported by fak's Responses door"
                                       + (" (use previous_response_id)" if name == "conversation" else ""),
                                       param=name)


def ignored_fields(body: wr.ResponseCreateRequest) -> list[str]:
    extra = body.model_extra or {}
    named = {n for n in IGNORED if getattr(body, n, None) not in (None, [])}
    if body.include and set(body.include) == {LOGPROBS}:
        named.discard("include")
    return sorted(named | {n[:64] for n, v in extra.items() if v is not None and n not in (*REFUSED, HELD_CALLS)})


def input_items(body: wr.ResponseCreateRequest) -> list[dict[str, Any]]:
    """The request's input items, once its refused parameters are ruled out (400s before any
    chain is looked up)."""
    refused(body)
    items = body.items()
    if not items:
        raise InvalidInput("input: at least one item", param="input")
    if len(items) > wr.MAX_INPUT_ITEMS:
        raise InvalidInput(f"input: at most {wr.MAX_INPUT_ITEMS} items", param="input")
    return items


def chat_request(body: wr.ResponseCreateRequest, items: list[dict[str, Any]], chain: Chain, *,
                 stream: bool, hosted_tools: list[dict[str, Any]] | None = None) -> w.ChatCompletionRequest:
    """The chat request the response runs as, in ``chain``'s session (``instructions`` first
    on a new chain only; a call output admitted under the name of the call it answers).
    ``hosted_tools``: the MCP servers' tools, as chat function tools (their calls come back
    held or allowed for ``fak.kernel.openai.responses_mcp`` to run or ask about)."""
    messages = chat_messages(items, body.instructions if chain.new else None, chain.called)
    fields: dict[str, Any] = {
        "model": body.model, "messages": messages, "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature, "top_p": body.top_p, "seed": body.seed, "fak_session": chain.session_id,
        "stream": stream, "stream_options": {"include_usage": True} if stream else None,
        "user": body.user, "metadata": body.metadata,
    }
    if body.tools:
        fields["tools"] = chat_tools(body.tools) + (hosted_tools or [])
        if hosted_tools:
            fields[HELD_CALLS] = "return"  # a held MCP call becomes an mcp_approval_request
    if body.tool_choice is not None:
        fields["tool_choice"] = chat_tool_choice(body.tool_choice)
    if body.parallel_tool_calls is not None:
        fields["parallel_tool_calls"] = body.parallel_tool_calls
    if body.text is not None and (fmt := chat_response_format(body.text)) is not None:
        fields["response_format"] = fmt
    if (held := (body.model_extra or {}).get(HELD_CALLS)) is not None and not hosted_tools:
        fields[HELD_CALLS] = held  # the chat door's extension: CONFIRM calls withheld or returned held
    if body.include and LOGPROBS in body.include:
        fields["logprobs"] = True
        fields["top_logprobs"] = body.top_logprobs or 0
    answers_only = bool(hosted_tools) and not messages  # only approvals answered: their results come at run time
    if answers_only:
        fields["messages"] = [w.ChatMessage(role="user", content="")]
    try:
        chat_body = w.ChatCompletionRequest.model_validate({k_: v for k_, v in fields.items() if v is not None})
        if answers_only:
            chat_body = chat_body.model_copy(update={"messages": []})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "input"
        raise InvalidInput(f"{where} (as a chat request): {first.get('msg', 'invalid')}"[:300], param="input") from None
    return chat_body


def renamed(exc: InvalidInput) -> InvalidInput:
    """The chat core's refusal, naming the Responses parameter (in its text and ``param``)."""

    def rename(name: str) -> str:
        for chat_name, ours in CHAT_NAMES.items():  # the longer names first
            if name == chat_name or name.startswith((chat_name + ":", chat_name + ".")):
                return ours + name[len(chat_name):]
        return CHAT_TOOL.sub(r"tools[\1].", name, count=1) if CHAT_TOOL.match(name) else name

    text, param = rename(str(exc)), exc.param
    if text == str(exc):
        return exc
    param = text.split(":")[0] if param is None or rename(param) == param else rename(param)
    return type(exc)(text, param=param.split(" ")[0])
