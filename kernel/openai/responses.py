"""The OpenAI Responses API in the core: what ``POST /v1/responses`` does, apart from HTTP,
built on the chat door (``fak.kernel.openai.chat``, whose notes hold for everything not
said here). A request becomes one ``fak.wire.ChatCompletionRequest``; its answer (or its
stream of chunks) is translated back into a ``response`` object (or the Responses events).
Like the chat core, this module never imports ``fak.api``. Creating needs the ``agent``
right, reading the ``read`` right; a response is visible to its own tenant only.

**Input.** ``input`` is a string (one user message) or a list of items: messages (``role``
user, system, developer or assistant; ``content`` a string or ``input_text``/``output_text``/
``refusal`` parts; image, file and audio parts are refused with ``unsupported_content``),
``function_call`` items (``call_id``, ``name``, ``arguments``: consecutive ones, and those
right after an assistant message, become one assistant message with ``tool_calls``) and
``function_call_output`` items (``call_id``, ``output``: a ``tool`` message, admitted through
the gate as the chat door does, under the name of the call it answers: a ``function_call``
item of the same input, or a call of the previous response). ``reasoning`` items are
skipped (the model emits none); any other item type is a 400. ``instructions`` become a
system message first, on a new chain only (see below).

**Parameters.** ``tools`` (function tools only: a hosted tool such as ``web_search`` is a
400 ``unsupported_parameter`` naming it), ``tool_choice``, ``parallel_tool_calls``,
``temperature``, ``top_p``, ``max_output_tokens``, ``text.format`` and ``seed`` (extension)
are mapped to their chat forms, and the chat core decides what it honours (a refusal there
is reported with the Responses name, e.g. ``text.format``). ``include`` with
``message.output_text.logprobs`` asks the chat core for logprobs (``top_logprobs``); other
``include`` values, ``reasoning``, ``truncation``, ``service_tier``, ``prompt_cache_key``,
``safety_identifier`` and unknown fields are accepted and ignored (named in ``fak.ignored``);
``user``, ``metadata`` (both echoed) and the chat door's extension ``fak_held_calls`` go to
the chat core as they are. ``background: true``, ``conversation``, ``prompt``,
``max_tool_calls`` and ``context_management`` are refused (``unsupported_parameter``).

**Chains and sessions.** A response's conversation lives in one persistent fak session,
so a follow-up sends only its new items and nothing is resent or admitted again:

- a response without ``previous_response_id`` starts a chain: with ``store`` (the default,
  true) its session is created for it, named ``resp-<hex>`` after the response
  ``resp_<hex>``, and kept; with ``store: false`` it runs in an ephemeral session, deleted
  after it, and is not kept (no GET, no follow-up);
- ``previous_response_id`` continues that response's session: 404 if no stored response of
  the tenant has that id (or its session was deleted), 409 if it is not the latest
  response of its chain (its session already holds the later turns: fak keeps one linear
  session per chain and never forks one), or still in progress. The chain is linear by
  construction: a unique index on (tenant, previous response) in ``fak_responses``
  lets only one of two racing follow-ups claim a response;
- ``instructions`` are part of the chain's session from its first response. A follow-up
  may repeat the same instructions (the Agents SDK sends them on every call) or leave them
  out: either way nothing is added and the response echoes the chain's instructions.
  Different instructions are a 409 ``conflict``: they cannot replace what the session's
  KV already holds (OpenAI would swap them; start a new chain instead);
- a follow-up with ``store: false`` runs in the chain's session (the session keeps the
  turn), but is not kept: it ends the chain for follow-ups (it cannot be named as
  ``previous_response_id``, and its predecessor is no longer the latest).

A response that fails, or whose stream the client drops, leaves no record when its session
is as it was before (the chain continues from its predecessor); a new chain's session is
deleted. When the failure happened after its input entered the session (e.g. the
generation failed), it is kept as a ``failed`` response whose input the session holds, and
the chain continues from it. ``DELETE /v1/responses/{id}`` keeps a tombstone (the chain
stays linear) and deletes the chain's session once every response of it is deleted.

**Persistence.** ``fak_responses`` (``fak.state.schema.ResponseRow``): tenant, id, the
chain's session, the previous response, the chain's instructions, state and the response
body as JSON. A body generated while tool content was live in the session (any ref in a
live segment's content provenance, or in the content provenance of any attempt whose text
the body keeps: a streamed body keeps the text a denied call's attempt already sent, though
``evict_and_retry`` evicted that turn and its refs) may repeat it, so it is kept like such a
segment (``fak.state.seal``): sealed under the data keys of those refs, so a forget of any
of them makes it unreadable (GET answers 410 ``forgotten``) in every copy of the database.
Other bodies (and failed ones, which have no output) are kept in the clear. The tenant erase
deletes the rows.

**Output.** The ``response`` object: a ``message`` item with an ``output_text`` part (when
the answer has text, or nothing else) and a ``refusal`` part (when fak refused, e.g. a
denied call), then one ``function_call`` item per tool call of the chat answer (``call_id``
is the chat tool call's id), ``status`` ``completed`` or ``incomplete``
(``max_output_tokens`` reached), ``usage`` from the chat usage
(``input_tokens_details.cached_tokens`` as the chat's ``cached_tokens``), the echoed request
settings, and ``fak``: the chat turn's extension (session, fingerprint, admissions, ignored
fields). **Streaming** yields the Responses events (``response.created``,
``response.in_progress``, ``response.output_item.added``, ``response.content_part.added``,
``response.output_text.delta``..., ``response.refusal.delta``, their ``done`` events,
``response.function_call_arguments.delta``/``.done`` for a call, then ``response.completed``
or ``response.incomplete``), each with its ``sequence_number``; the final response equals
the non-streamed one's shape.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from fak import wire as w
from fak import wire_responses as wr
from fak.errors import Conflict, FakError, InvalidInput, NotFound
from fak.kernel.kv.ledger import SegmentState
from fak.kernel.openai import chat
from fak.kernel.openai.chat import UnsupportedContent, UnsupportedParameter
from fak.kernel.session.caller import Caller, Right, reads_content
from fak.state.schema import ResponseRow
from fak.state.seal import Plain, needs_seal, seal, unseal
from fak.state.store import now_us

if TYPE_CHECKING:
    from fak.kernel.facade import Kernel

KEPT = ("completed", "incomplete", "failed")  # the states of a stored response (GET, follow-ups)
TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
LOGPROBS = "message.output_text.logprobs"
HELD_CALLS = "fak_held_calls"
REFUSED = ("background", "conversation", "prompt", "max_tool_calls", "context_management")
IGNORED = ("reasoning", "truncation", "include", "stream_options")
# the chat core's parameter names, as a Responses client knows them
CHAT_NAMES = {"response_format.json_schema.schema": "text.format.schema", "response_format": "text.format",
              "max_completion_tokens": "max_output_tokens", "logprobs": "include (message.output_text.logprobs)"}
CHAT_TOOL = re.compile(r"tools\[(\d+)\]\.function\.")  # a chat tool's field; a Responses tool has it at top level


# --- the request -----------------------------------------------------------------------
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
        else:
            raise UnsupportedContent(f"{where}.type: {str(kind)[:40]!r} items are not supported (messages, "
                                     "function_call and function_call_output are)")
    return out


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses function tools in their chat form; any other tool type is refused."""
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
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
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

    @property
    def claimed(self) -> bool:
        """A row in ``fak_responses`` marks this response (any response of a kept session)."""
        return self.chain.session_id is not None

    def response(self, status: str, output: list[wr.OutputMessage | wr.FunctionCallItem],
                 usage: wr.ResponseUsage | None = None, fak: dict[str, Any] | None = None,
                 error: wr.ResponseError | None = None) -> wr.ResponseObject:
        b = self.body
        if fak is not None:
            fak = {**fak, "ignored": sorted({*fak.get("ignored", []), *self.ignored})}
        return wr.ResponseObject(
            id=self.response_id, created_at=self.created_at,
            completed_at=int(time.time()) if status in ("completed", "incomplete") else None,
            status=status, model=self.model, output=output, usage=usage,
            previous_response_id=self.chain.previous, instructions=self.chain.instructions,
            tools=b.tools or [], tool_choice=b.tool_choice or "auto",
            parallel_tool_calls=True if b.parallel_tool_calls is None else b.parallel_tool_calls,
            text=b.text or {"format": {"type": "text"}}, reasoning=b.reasoning,
            temperature=1.0 if b.temperature is None else b.temperature,
            top_p=1.0 if b.top_p is None else b.top_p, max_output_tokens=b.max_output_tokens,
            truncation=b.truncation or "disabled",
            incomplete_details=wr.IncompleteDetails(reason="max_output_tokens") if status == "incomplete" else None,
            error=error, metadata=b.metadata or {}, user=b.user, store=self.store, fak=fak)


def _refused(body: wr.ResponseCreateRequest) -> None:
    extra = body.model_extra or {}
    for name in REFUSED:
        value = extra.get(name)
        if value is not None and value is not False:
            raise UnsupportedParameter(f"{name}: not supported by fak's Responses door"
                                       + (" (use previous_response_id)" if name == "conversation" else ""),
                                       param=name)


def _ignored(body: wr.ResponseCreateRequest) -> list[str]:
    extra = body.model_extra or {}
    named = {n for n in IGNORED if getattr(body, n, None) not in (None, [])}
    if body.include and set(body.include) == {LOGPROBS}:
        named.discard("include")
    return sorted(named | {n[:64] for n, v in extra.items() if v is not None and n not in (*REFUSED, HELD_CALLS)})


def _chain(k: Kernel, c: Caller, body: wr.ResponseCreateRequest, hexid: str, store: bool) -> Chain:
    prev = body.previous_response_id
    if prev is None:
        return Chain("resp-" + hexid if store else None, True, None, body.instructions)
    row = k.state.response(c.tenant, prev)
    if row is None or row.state not in (*KEPT, "in_progress"):
        raise NotFound(f"no stored response {prev[:80]!r}")
    if row.state == "in_progress" and row.created_us < k.opened_us:
        # cut by the end of the process that ran it (one process owns the data directory): the
        # session holds what its ledger committed, so the chain continues from it as failed
        k.state.update_response(c.tenant, prev, "failed")
        row = k.state.response(c.tenant, prev) or row
    if row.state == "in_progress":
        raise Conflict(f"response {prev} is still in progress: continue from it once it has completed")
    follower = k.state.response_follower(c.tenant, prev)
    if follower is not None:
        raise Conflict(f"response {prev} is not the latest of its chain: {follower} follows it, and the chain's "
                       f"session {row.session_id} already holds that later turn (fak keeps one linear session per "
                       "chain); continue from the latest response, or start a new chain")
    instructions = row.instructions
    if body.instructions is not None and body.instructions != instructions:
        raise Conflict(f"instructions differ from those of the chain of {prev}: its session already holds them; "
                       "send the same instructions or none, or start a new chain")
    try:
        fingerprint = k.session(c.tenant, row.session_id).fingerprint()
    except NotFound:
        raise NotFound(f"the session {row.session_id} of response {prev}'s chain was deleted") from None
    return Chain(row.session_id, False, prev, instructions, fingerprint, _calls(k, c, row))


def _calls(k: Kernel, c: Caller, row: ResponseRow) -> dict[str, str]:
    """Call id -> name of a response's function calls (none if its body no longer opens, or it
    has none: a response cut by a crash)."""
    if row.body is None and row.sealed is None:
        return {}
    try:
        previous = _opened(k, c, row)
    except FakError:  # forgotten content: its calls' outputs are admitted under the name "tool"
        return {}
    return {o.call_id: o.name for o in previous.output if isinstance(o, wr.FunctionCallItem)}


def plan(k: Kernel, c: Caller, body: wr.ResponseCreateRequest, *, stream: bool = False) -> Plan:
    """Validate the request and resolve its chain (nothing is created yet)."""
    c.require(Right.AGENT)
    _refused(body)
    items = body.items()
    if not items:
        raise InvalidInput("input: at least one item", param="input")
    if len(items) > wr.MAX_INPUT_ITEMS:
        raise InvalidInput(f"input: at most {wr.MAX_INPUT_ITEMS} items", param="input")
    hexid = uuid.uuid4().hex
    store = body.store is not False
    chain = _chain(k, c, body, hexid, store)
    messages = chat_messages(items, body.instructions if chain.new else None, chain.called)
    fields: dict[str, Any] = {
        "model": body.model, "messages": messages, "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature, "top_p": body.top_p, "seed": body.seed, "fak_session": chain.session_id,
        "stream": stream, "stream_options": {"include_usage": True} if stream else None,
        "user": body.user, "metadata": body.metadata,
    }
    if body.tools:
        fields["tools"] = chat_tools(body.tools)
    if body.tool_choice is not None:
        fields["tool_choice"] = chat_tool_choice(body.tool_choice)
    if body.parallel_tool_calls is not None:
        fields["parallel_tool_calls"] = body.parallel_tool_calls
    if body.text is not None and (fmt := chat_response_format(body.text)) is not None:
        fields["response_format"] = fmt
    if (held := (body.model_extra or {}).get(HELD_CALLS)) is not None:
        fields[HELD_CALLS] = held  # the chat door's extension: CONFIRM calls withheld or returned held
    if body.include and LOGPROBS in body.include:
        fields["logprobs"] = True
        fields["top_logprobs"] = body.top_logprobs or 0
    try:
        chat_body = w.ChatCompletionRequest.model_validate({k_: v for k_, v in fields.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "input"
        raise InvalidInput(f"{where} (as a chat request): {first.get('msg', 'invalid')}"[:300], param="input") from None
    return Plan("resp_" + hexid, int(time.time()), k.model_id, chain, store, body, chat_body, _ignored(body))


def _renamed(exc: InvalidInput) -> InvalidInput:
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


# --- the chain's records ---------------------------------------------------------------
def claim(k: Kernel, c: Caller, p: Plan) -> None:
    """Record the response as in progress (a follow-up claims its predecessor: one wins a race)."""
    if p.claimed:
        assert p.chain.session_id is not None
        k.state.claim_response(ResponseRow(tenant=c.tenant, id=p.response_id, session_id=p.chain.session_id,
                                           previous_id=p.chain.previous, created_us=now_us(),
                                           state="in_progress", instructions=p.chain.instructions))


def finish(k: Kernel, c: Caller, p: Plan, response: wr.ResponseObject, provenance: frozenset[str]) -> None:
    """Keep the response (its body only with ``store``): sealed under the data keys of the
    refs live in its session and of ``provenance``, the content provenance of every attempt
    whose text the body keeps (a streamed body keeps a denied attempt's text, whose turn and
    refs the session evicted), else in the clear. A ref among them forgotten meanwhile fails
    it (``Forgotten``): the body is never kept readable past the forget of what it may quote."""
    if not p.claimed:
        return
    sid = p.chain.session_id
    assert sid is not None
    if not p.store:
        k.state.update_response(c.tenant, p.response_id, "unstored")
        return
    body = response.model_dump_json()
    views = k.session(c.tenant, sid).segments()
    refs = sorted({r for v in views if v.state is SegmentState.LIVE for r in v.content_provenance} | provenance)
    keys = k.store.content_keys(c.tenant, refs) if refs else {}
    if needs_seal(keys):
        sealed = seal(keys, c.tenant, sid, p.response_id, Plain([], "response", body))
        k.state.update_response(c.tenant, p.response_id, response.status, sealed=sealed, content=json.dumps(refs))
    else:
        k.state.update_response(c.tenant, p.response_id, response.status, body=body)


def abandon(k: Kernel, c: Caller, p: Plan, exc: BaseException | None) -> None:
    """A response that did not complete: undo its claim when it left no trace (a new chain's
    session is deleted), else keep it as ``failed`` (its input is in the session)."""
    if not p.claimed:
        return  # an ephemeral session: the chat turn deleted it
    sid = p.chain.session_id
    assert sid is not None
    if p.chain.new:
        with contextlib.suppress(NotFound):
            k.delete_session(c.tenant, sid)
        k.state.drop_response(c.tenant, p.response_id)
        return
    try:
        unchanged = k.session(c.tenant, sid).fingerprint() == p.chain.fingerprint
    except NotFound:
        unchanged = True
    if unchanged:
        k.state.drop_response(c.tenant, p.response_id)
        return
    code = exc.code if isinstance(exc, FakError) else ("client_disconnected" if exc is None else "server_error")
    message = str(exc)[:500] if exc is not None else "the client went away before the response completed"
    failed = p.response("failed", [], error=wr.ResponseError(code=code, message=message))
    if p.store:  # no output: nothing derived from tool content, kept in the clear
        k.state.update_response(c.tenant, p.response_id, "failed", body=failed.model_dump_json())
    else:
        k.state.update_response(c.tenant, p.response_id, "unstored")


# --- the answer ------------------------------------------------------------------------
def _usage(usage: dict[str, Any] | None) -> wr.ResponseUsage | None:
    if usage is None:
        return None
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return wr.ResponseUsage(input_tokens=usage["prompt_tokens"], output_tokens=usage["completion_tokens"],
                            total_tokens=usage["total_tokens"],
                            input_tokens_details=wr.InputTokensDetails(cached_tokens=cached),
                            output_tokens_details=wr.OutputTokensDetails())


def _status(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def _logprobs(choice: dict[str, Any]) -> list[dict[str, Any]] | None:
    lp = choice.get("logprobs")
    return list(lp.get("content") or []) if isinstance(lp, dict) else None


def output_items(p: Plan, choice: dict[str, Any]) -> list[wr.OutputMessage | wr.FunctionCallItem]:
    """A chat choice (dumped) as Responses output items."""
    msg = choice.get("message") or {}
    text, refusal, calls = msg.get("content") or "", msg.get("refusal"), msg.get("tool_calls") or []
    status = "incomplete" if choice.get("finish_reason") == "length" else "completed"
    items: list[wr.OutputMessage | wr.FunctionCallItem] = []
    parts: list[wr.OutputText | wr.OutputRefusal] = []
    if text or not (calls or refusal):
        parts.append(wr.OutputText(text=text, logprobs=_logprobs(choice)))
    if refusal:
        parts.append(wr.OutputRefusal(refusal=refusal))
    if parts:
        items.append(wr.OutputMessage(id=_item_id(p, "msg", 0), status=status, content=parts))
    for j, call in enumerate(calls):
        fn = call.get("function") or {}
        items.append(wr.FunctionCallItem(id=_item_id(p, "fc", j), call_id=call.get("id") or _item_id(p, "call", j),
                                         name=fn.get("name", ""), arguments=_arguments(fn.get("arguments")),
                                         status="completed"))
    return items


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value if value is not None else {}, ensure_ascii=False)


def _item_id(p: Plan, prefix: str, index: int) -> str:
    return f"{prefix}_{p.response_id[5:]}{index:02d}"


def _run(p: Plan, k: Kernel, c: Caller, start: Callable[[], Any]) -> Any:
    """Claim, then run the chat step; a failure abandons the response."""
    claim(k, c, p)
    try:
        return start()
    except InvalidInput as exc:
        abandon(k, c, p, exc)
        raise _renamed(exc) from None
    except BaseException as exc:
        abandon(k, c, p, exc)
        raise


def create(k: Kernel, c: Caller, body: wr.ResponseCreateRequest) -> wr.ResponseObject:
    """One response, not streamed."""
    p = plan(k, c, body)
    done: chat.Completed = _run(p, k, c, lambda: chat.completed(k, c, p.chat_body))
    d = done.completion.model_dump()
    choice = d["choices"][0]
    response = p.response(_status(choice.get("finish_reason")), output_items(p, choice), _usage(d.get("usage")),
                          d.get("fak"))
    try:
        finish(k, c, p, response, done.provenance)
    except BaseException as exc:
        abandon(k, c, p, exc)
        raise
    return response


def get(k: Kernel, c: Caller, response_id: str) -> wr.ResponseObject:
    """A stored response of the caller's tenant; a sealed one opens with the current data
    keys of its refs (``Forgotten``, 410, once one of them was forgotten). A caller that does
    not read content (``fak.kernel.session.caller.reads_content``: an auditor) gets it ``withheld``."""
    c.require(Right.READ)
    row = k.state.response(c.tenant, response_id)
    if row is None or row.state not in KEPT:
        raise NotFound(f"no stored response {response_id[:80]!r}")
    response = _opened(k, c, row)
    return response if reads_content(c) else withheld(response)


def withheld(r: wr.ResponseObject) -> wr.ResponseObject:
    """``r`` without its content, for a caller that reads decisions only: the generated text and
    its logprobs, each call's arguments and the chain's instructions emptied; ids, names,
    statuses, usage, fak's own refusals and ``fak`` (verdicts, findings, refs, audit indexes:
    what the log holds) kept, and ``fak.content_withheld`` set. The call's keyed arguments
    digest is in its ``tool_call_decision`` entry (``fak.tool_calls[].audit_index``)."""
    def item(o: wr.OutputMessage | wr.FunctionCallItem) -> wr.OutputMessage | wr.FunctionCallItem:
        if isinstance(o, wr.FunctionCallItem):
            return o.model_copy(update={"arguments": ""})
        return o.model_copy(update={"content": [p.model_copy(update={"text": "", "logprobs": None})
                                                if isinstance(p, wr.OutputText) else p for p in o.content]})

    info = r.fak.model_copy(update={"content_withheld": True}) if r.fak is not None else None
    return r.model_copy(update={"output": [item(o) for o in r.output], "instructions": None, "fak": info})


def _opened(k: Kernel, c: Caller, row: ResponseRow) -> wr.ResponseObject:
    if row.sealed is not None:
        keys = k.store.content_keys(c.tenant, json.loads(row.content or "[]"))
        text = unseal(keys, c.tenant, row.session_id, row.id, row.sealed).text or ""
    elif row.body is None:  # cut by the end of the process that ran it: what is known of it
        return wr.ResponseObject(
            id=row.id, created_at=row.created_us // 1_000_000, status="failed", model=k.model_id, output=[],
            usage=None, previous_response_id=row.previous_id, instructions=row.instructions, tools=[],
            tool_choice="auto", parallel_tool_calls=True, text={"format": {"type": "text"}}, temperature=None,
            top_p=None, max_output_tokens=None, metadata={}, store=True,
            error=wr.ResponseError(code="server_error", message="the server stopped while this response ran; its "
                                   "session holds what was committed, and the chain continues from it"))
    else:
        text = row.body
    return wr.ResponseObject.model_validate_json(text)


def delete(k: Kernel, c: Caller, response_id: str) -> wr.ResponseDeleted:
    """Delete a stored response (a tombstone stays: the chain remains linear); the chain's
    session goes with its last response."""
    c.require(Right.AGENT)
    row = k.state.response(c.tenant, response_id)
    if row is None or row.state not in KEPT:
        raise NotFound(f"no stored response {response_id[:80]!r}")
    k.state.update_response(c.tenant, response_id, "deleted")
    if k.state.live_responses(c.tenant, row.session_id) == 0:
        with contextlib.suppress(NotFound):
            k.delete_session(c.tenant, row.session_id)
    return wr.ResponseDeleted(id=response_id)


# --- streaming -------------------------------------------------------------------------
@dataclass
class _Item:
    """An output item being streamed: a message (its text part, then a refusal part, each
    opened when it first has content) or a function call (its arguments)."""

    index: int
    kind: str  # message | function_call
    item_id: str
    call_id: str = ""
    name: str = ""
    text: str = ""  # the message's text, or the call's arguments
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    refusal: str | None = None
    parts: list[str] = field(default_factory=list)  # the message's parts, in order: text, refusal

    def content(self) -> list[wr.OutputText | wr.OutputRefusal]:
        return [wr.OutputText(text=self.text, logprobs=self.logprobs or None) if kind == "text"
                else wr.OutputRefusal(refusal=self.refusal or "") for kind in self.parts]


class ResponseStream:
    """A streamed response as Responses events (JSON-ready dicts with ``type`` and
    ``sequence_number``), one chat step per ``next_events`` call, None after the last.
    ``close`` however the stream ended (a dropped stream is abandoned: see the notes)."""

    def __init__(self, k: Kernel, c: Caller, p: Plan, stream: chat.ChatStream) -> None:
        self.kernel, self.caller, self.plan, self.stream = k, c, p, stream
        self._seq = 0
        self._started = False
        self._done = False
        self._closed = False
        self._items: list[_Item] = []
        self._open: _Item | None = None
        self._calls: dict[int, _Item] = {}
        self._finish: str | None = None
        self._usage: dict[str, Any] | None = None
        self._fak: dict[str, Any] | None = None
        self.response: wr.ResponseObject | None = None

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def next_events(self) -> list[dict[str, Any]] | None:
        if self._done:
            return None
        out: list[dict[str, Any]] = []
        if not self._started:
            self._started = True
            skeleton = self.plan.response("in_progress", []).model_dump(mode="json")
            out += [self._event("response.created", response=skeleton),
                    self._event("response.in_progress", response=skeleton)]
        chunks = self.stream.next_chunks()
        for chunk in chunks or []:
            self._fak = chunk.get("fak", self._fak)
            self._usage = chunk.get("usage") or self._usage
            for choice in chunk.get("choices") or []:
                if choice.get("index", 0) == 0:  # one choice: fak's Responses door never asks for n
                    out += self._delta(choice)
        if chunks is None:  # the chat stream's last chunks (finish, usage) came in the call before
            out += self._end()
        return out

    def _message(self) -> tuple[_Item, list[dict[str, Any]]]:
        """The open message item, opened now if the open item is none or a call."""
        if self._open is not None and self._open.kind == "message":
            return self._open, []
        out = self._close_open()
        item = _Item(len(self._items), "message", _item_id(self.plan, "msg", len(self._items)))
        return item, out + self._add(item)

    def _part(self, item: _Item, kind: str) -> list[dict[str, Any]]:
        """Open the message's ``kind`` part (text or refusal) if it is not open yet."""
        if kind in item.parts:
            return []
        item.parts.append(kind)
        part = wr.OutputText(text="") if kind == "text" else wr.OutputRefusal(refusal="")
        return [self._event("response.content_part.added", item_id=item.item_id, output_index=item.index,
                            content_index=item.parts.index(kind), part=part.model_dump(mode="json"))]

    def _delta(self, choice: dict[str, Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        delta = choice.get("delta") or {}
        if content := delta.get("content"):
            item, opened = self._message()
            out += opened + self._part(item, "text")
            item.text += content
            out.append(self._event("response.output_text.delta", item_id=item.item_id, output_index=item.index,
                                   content_index=item.parts.index("text"), delta=content, logprobs=[]))
        if refusal := delta.get("refusal"):
            item, opened = self._message()
            out += opened + self._part(item, "refusal")
            item.refusal = (item.refusal or "") + refusal
            out.append(self._event("response.refusal.delta", item_id=item.item_id, output_index=item.index,
                                   content_index=item.parts.index("refusal"), delta=refusal))
        if (logprobs := _logprobs(choice)) and (target := self._last_message()) is not None:
            target.logprobs += logprobs  # the chat stream sends a choice's logprobs with its finish chunk
        for call in delta.get("tool_calls") or []:
            index = int(call.get("index", 0))
            fn = call.get("function") or {}
            if index not in self._calls:
                out += self._close_open()
                item = _Item(len(self._items), "function_call", _item_id(self.plan, "fc", index),
                             call_id=call.get("id") or _item_id(self.plan, "call", index), name=fn.get("name") or "")
                self._calls[index] = item
                out += self._add(item)
            item = self._calls[index]
            if args := fn.get("arguments"):
                item.text += _arguments(args)
                out.append(self._event("response.function_call_arguments.delta", item_id=item.item_id,
                                       output_index=item.index, delta=_arguments(args)))
        if choice.get("finish_reason") is not None:
            self._finish = choice["finish_reason"]
        return out

    def _last_message(self) -> _Item | None:
        return next((i for i in reversed(self._items) if i.kind == "message"), None)

    def _add(self, item: _Item) -> list[dict[str, Any]]:
        self._items.append(item)
        self._open = item
        return [self._event("response.output_item.added", output_index=item.index,
                            item=self._model(item, "in_progress").model_dump(mode="json"))]

    def _model(self, item: _Item, status: str) -> wr.OutputMessage | wr.FunctionCallItem:
        if item.kind == "message":
            return wr.OutputMessage(id=item.item_id, status=status, content=item.content())
        return wr.FunctionCallItem(id=item.item_id, call_id=item.call_id, name=item.name, arguments=item.text,
                                   status=status)

    def _status(self, item: _Item) -> str:
        return "incomplete" if self._finish == "length" and item.kind == "message" else "completed"

    def _close_open(self) -> list[dict[str, Any]]:
        """The done events of the open item (the message's parts in order, or the call's arguments)."""
        item, self._open = self._open, None
        if item is None:
            return []
        out = []
        if item.kind == "message":
            for index, (kind, part) in enumerate(zip(item.parts, item.content(), strict=True)):
                if kind == "text":
                    out.append(self._event("response.output_text.done", item_id=item.item_id,
                                           output_index=item.index, content_index=index, text=item.text,
                                           logprobs=item.logprobs))
                else:
                    out.append(self._event("response.refusal.done", item_id=item.item_id, output_index=item.index,
                                           content_index=index, refusal=item.refusal or ""))
                out.append(self._event("response.content_part.done", item_id=item.item_id, output_index=item.index,
                                       content_index=index, part=part.model_dump(mode="json")))
        else:
            out.append(self._event("response.function_call_arguments.done", item_id=item.item_id,
                                   output_index=item.index, name=item.name, arguments=item.text))
        out.append(self._event("response.output_item.done", output_index=item.index,
                               item=self._model(item, self._status(item)).model_dump(mode="json")))
        return out

    def _end(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if not self._items:  # no text, refusal or call: an empty message, as the non-streamed output has
            item, out = self._message()
            out += self._part(item, "text")
        out += self._close_open()
        status = _status(self._finish)
        output = [self._model(i, self._status(i)) for i in self._items]
        response = self.plan.response(status, output, _usage(self._usage), self._fak)
        finish(self.kernel, self.caller, self.plan, response, self.stream.provenance)
        self.response = response
        self._done = True
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return out + [self._event(kind, response=response.model_dump(mode="json"))]

    def close(self) -> None:
        """Give the chat stream up (an unfinished turn is rolled back); a response that did not
        complete is abandoned. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.stream.close()
        finally:
            if self.response is None:
                abandon(self.kernel, self.caller, self.plan, None)


def open_stream(k: Kernel, c: Caller, body: wr.ResponseCreateRequest) -> ResponseStream:
    """Validate, claim and open the chat stream (its first token sampled): errors come before any event."""
    p = plan(k, c, body, stream=True)
    stream: chat.ChatStream = _run(p, k, c, lambda: chat.open_stream(k, c, p.chat_body))
    return ResponseStream(k, c, p, stream)
