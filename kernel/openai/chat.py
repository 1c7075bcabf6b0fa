"""The OpenAI-compatible chat in the core: what ``POST /v1/chat/completions`` does to a
session, apart from HTTP (the contract, for clients: docs/openai.md). This module owns

- the parameters (``chat_parameters``): each OpenAI parameter honoured, or refused with a
  400 naming it (``UnsupportedParameter``); unknown extension fields are listed in
  ``fak.ignored``;
- the messages (``plan_messages``): each validated and turned into one session operation
  before any runs; an assistant's own tool calls rendered in the model's tool-call format;
  ``tool`` messages admitted through the gate (a held call's result refused, a rejected
  call's replaced by a notice: ``fak.kernel.calls.held``);
- the session (``open_chat`` → ``ChatTurn``): ephemeral or the persistent ``fak_session``,
  the request's messages replayed into it, the tools block admitted as content with a ref
  of its own (``fak.kernel.calls.tool_text``), and what the answer reports;
- the answer: ``n`` choices (siblings undone, choice 0 kept), each a ``run_answer``
  (``fak.kernel.openai.answer``: sampling hooks, the grammar, the calls read back and
  decided, the DENY remedy) as one ``chat.completion`` (``complete``) or its
  ``chat.completion.chunk`` objects one model step at a time (``open_stream`` →
  ``ChatStream``);
- held calls: ``decide_held_call`` (approve or reject, audited; the ``approve`` right),
  ``held_calls`` / ``held_call`` (an approver's queue);
- the lifecycle: ``close`` rolls an unfinished turn back and deletes an ephemeral session,
  however the request ended.

The route (``fak.api.routes.openai``) keeps authentication, the worker threads, the SSE
framing and cancellation; the wire models are ``fak.wire``'s (its OpenAI section). The
Responses API (``fak.kernel.openai.responses``) is a translation onto this module. Like
``kernel/operations.py``, this module never imports ``fak.api``. Chat needs the ``agent``
right, the model list ``read``.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Container, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from fak import wire as w
from fak.audit.events import ToolCallApproval
from fak.errors import Conflict, InvalidInput, NotFound
from fak.kernel.calls.formats import CallOut, HermesFormat, ToolFormat, format_for
from fak.kernel.calls.held import MAX_LISTED, HeldCall, HeldCalls, HoldState
from fak.kernel.calls.tool_text import ToolSpec, json_text, render_call, render_tools
from fak.kernel.kv.ledger import SegmentKind, SegmentState
from fak.kernel.openai.answer import Answer, AnswerPlan, plan_answer, run_answer
from fak.kernel.openai.chunks import ChatChunk, ChoiceDelta, Delta, ToolCallDelta
from fak.kernel.openai.forward import ForwardTurn, open_forward
from fak.kernel.openai.history import HistoryItem, new_suffix
from fak.kernel.openai.params import ChatParameters, UnsupportedParameter, chat_parameters
from fak.kernel.session.caller import Caller, Right
from fak.kernel.session.kernel_session import MAX_TEXT_BYTES, remember_approval
from fak.kernel.session.tokens import Stepper, check_context
from fak.types import TOOL_DEFINITIONS, as_id

if TYPE_CHECKING:
    from fak.kernel.facade import Kernel
    from fak.kernel.kv.session import Session
    from fak.kernel.session.kernel_session import KernelSession

STARTED = int(time.time())  # the model cards' ``created``: when the server loaded this module
IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})
__all__ = ["ChatParameters", "ChatStream", "ChatTurn", "UnsupportedContent", "UnsupportedParameter", "complete",
           "decide_held_call", "held_call", "held_calls", "open_chat", "open_stream", "verdict_header"]


class UnsupportedContent(InvalidInput):
    """A message part the text model cannot read (an image, audio, a file)."""

    code = "unsupported_content"


# --- models --------------------------------------------------------------------------
def _cards(k: Kernel) -> list[w.ModelCard]:
    """The kernel's own model, then the deployment's upstreams (``fak_runs: false``)."""
    return [w.ModelCard(id=k.model_id, created=STARTED),
            *(w.ModelCard(id=name, created=STARTED, owned_by="upstream", fak_runs=False)
              for name in k.services.upstreams.names())]


def list_models(k: Kernel, c: Caller) -> w.ModelList:
    """The kernel's model and the upstreams it governs as a gateway."""
    c.require(Right.READ)
    return w.ModelList(data=_cards(k))


def get_model(k: Kernel, c: Caller, model_id: str) -> w.ModelCard:
    c.require(Right.READ)
    for card in _cards(k):
        if card.id == model_id:
            return card
    raise NotFound(f"no model {model_id[:80]!r}")


# --- messages --------------------------------------------------------------------------
@dataclass(frozen=True)
class ChatOp:
    """One request message as the session operation it becomes: ``append`` for system, user
    and assistant text, ``admit`` through the gate for a tool result."""

    index: int  # in the request's messages
    kind: Literal["system", "user", "assistant", "tool"]
    text: str = ""
    tool: str = ""  # a tool result's tool, as the gate sees it
    call_id: str | None = None
    source: str | None = None  # where a tool result came from, when fak fetched it itself (an MCP server)


@dataclass(frozen=True)
class ToolGroup:
    """Tools a server offers that fak runs itself (MCP, ``fak.kernel.openai.responses_mcp``): their
    definitions enter attention as a ref of their own under ``producer`` (``mcp:<label>``, trust per
    server) from ``source``, not in the request's tools block."""

    producer: str
    source: str | None
    names: frozenset[str]  # the group's tools by the names the model is shown


@dataclass(frozen=True)
class Hosted:
    """What a door that runs tools itself adds to a chat request: the servers' tool groups, the
    name each of their tools is governed under (``ToolSpec.governed``), and for the results it
    fetched, by call id, the tool they are admitted under and their source (first-hand)."""

    groups: tuple[ToolGroup, ...] = ()
    governed: Mapping[str, str] = field(default_factory=dict)
    results: Mapping[str, tuple[str, str | None]] = field(default_factory=dict)


def _text(msg: w.ChatMessage, where: str, *, required: bool) -> str:
    content = msg.content
    if content is None:
        if required:
            raise InvalidInput(f"{where}.content: a {msg.role} message needs content")
        return ""
    if isinstance(content, str):
        text = content
    else:
        pieces = []
        for j, part in enumerate(content):
            kind = part.get("type")
            if not isinstance(kind, str):
                raise InvalidInput(f"{where}.content[{j}]: a content part has a string 'type'")
            if kind == "text" and isinstance(part.get("text"), str):
                pieces.append(part["text"])
            elif kind == "refusal" and isinstance(part.get("refusal"), str):
                pieces.append(part["refusal"])
            elif kind in IMAGE_PARTS:
                raise UnsupportedContent(f"{where}.content[{j}]: image parts are not supported: "
                                         "the model reads text only")
            elif kind in ("text", "refusal"):
                raise InvalidInput(f"{where}.content[{j}]: a {kind} part needs a string {kind!r} field")
            else:
                raise UnsupportedContent(f"{where}.content[{j}]: {str(kind)[:40]!r} parts are not supported: "
                                         "the model reads text parts only")
        text = "\n".join(pieces)
    return _bounded(_unicode(text, f"{where}.content"), f"{where}.content")


def _bounded(text: str, where: str) -> str:
    """The size ``KernelSession.append`` allows (UTF-8 bytes), checked before any message is applied."""
    if len(text.encode("utf-8")) > MAX_TEXT_BYTES:
        raise InvalidInput(f"{where}: over {MAX_TEXT_BYTES} bytes")
    return text


def _unicode(text: str, where: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"{where}: not valid Unicode (a lone surrogate)") from None
    return text


def render_tool_call(call: w.ToolCall | w.FunctionCall, where: str) -> tuple[str, str]:
    """(name, text) of one of the assistant's own calls, in the model's tool-call format
    (``fak.kernel.calls.tool_text.render_call``)."""
    if isinstance(call, w.FunctionCall):
        name, text = call.name, render_call(call.name, call.arguments)
    elif call.type == "function" and call.function is not None:
        name, text = call.function.name, render_call(call.function.name, call.function.arguments)
    elif call.type == "custom" and isinstance(call.custom, dict) and isinstance(call.custom.get("name"), str):
        raw = call.custom.get("input", "")
        name = call.custom["name"]
        text = render_call(name, raw if isinstance(raw, str) else json_text(raw), key="input")
    else:
        raise InvalidInput(f"{where}: a tool call is {{'type': 'function', 'function': {{'name', 'arguments'}}}}")
    return _unicode(name, f"{where}.name"), _unicode(text, where)


def plan_messages(messages: list[w.ChatMessage], fmt: ToolFormat | None = None) -> list[ChatOp]:
    """Validate every message and turn it into one session operation (nothing runs yet). An
    assistant's function calls are written in ``fmt``, the model's call syntax (Hermes when
    not given: ``render_tool_call``)."""
    ops: list[ChatOp] = []
    names: dict[str, str] = {}  # tool_call_id -> tool name, from earlier assistant messages
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if msg.role in ("system", "developer", "user"):
            ops.append(ChatOp(i, "user" if msg.role == "user" else "system", _text(msg, where, required=True)))
        elif msg.role == "assistant":
            lines = [t] if (t := _text(msg, where, required=False)) else []
            calls: list[w.ToolCall | w.FunctionCall] = list(msg.tool_calls or [])
            if msg.function_call is not None:
                calls.append(msg.function_call)
            outs: list[CallOut] = []
            for j, call in enumerate(calls):
                name, line = render_tool_call(call, f"{where}.tool_calls[{j}]")
                lines.append(line)
                if isinstance(call, w.ToolCall) and call.id:
                    names[call.id] = name
                fn = call if isinstance(call, w.FunctionCall) else call.function
                if fn is not None:
                    outs.append(CallOut(fn.name, fn.arguments, call.id if isinstance(call, w.ToolCall) else None))
            if fmt is not None and not isinstance(fmt, HermesFormat) and outs and len(outs) == len(calls):
                lines = lines[: len(lines) - len(calls)] + [_unicode(fmt.render_calls(outs), where)]
            ops.append(ChatOp(i, "assistant", _bounded("\n".join(lines), where)))
        else:  # tool, function: through the gate
            text = _text(msg, where, required=False)
            if msg.role == "tool" and not msg.tool_call_id:
                raise InvalidInput(f"{where}.tool_call_id: a tool message names the call it answers")
            tool = _unicode((names.get(msg.tool_call_id or "") or msg.name or "tool")[:128], f"{where}.name")
            _unicode(msg.tool_call_id or "", f"{where}.tool_call_id")
            ops.append(ChatOp(i, "tool", text, tool=tool, call_id=msg.tool_call_id))
    return ops


# --- the turn ------------------------------------------------------------------------
def _hits(ks: KernelSession) -> tuple[Session | None, int]:
    mech = ks.live_session  # the in-memory session; its prefix-cache counter is read only
    return mech, (mech.prefix_hit_tokens if mech is not None else 0)


@dataclass
class ChatTurn:
    """One request's conversation, set up by ``open_chat``: its session, the request's
    messages replayed into it, and what the answer reports. ``close`` when the generation
    is over (or never started)."""

    kernel: Kernel
    session: KernelSession
    ephemeral: bool  # created for this request, deleted by close
    completion_id: str
    plan: AnswerPlan  # what every choice is decoded and decided under
    cached: int = 0  # prompt tokens whose KV was not computed for this request
    admissions: list[w.AdmissionInfo] = field(default_factory=list)
    tools_ref: str | None = None  # the ref of the tools block in attention
    closed: bool = False

    @property
    def parameters(self) -> ChatParameters:
        return self.plan.parameters

    @property
    def model(self) -> str:
        return self.kernel.model_id

    def fingerprint(self) -> str:
        return self.session.fingerprint()

    def close(self) -> None:
        """Delete an ephemeral session (idempotent; the generation must be over)."""
        if self.ephemeral and not self.closed:
            self.closed = True
            with contextlib.suppress(NotFound):
                self.kernel.delete_session(self.session.tenant, self.session.id)

    def answers(self) -> Iterator[tuple[int, Generator[None | str | Answer, None, None]]]:
        """The choices, siblings first (each undone at its end), the kept choice 0 last."""
        for index in [*range(1, self.parameters.n), 0]:
            yield index, run_answer(self.kernel.services, self.session, self.plan, index, keep=index == 0)

    def usage(self, answers: list[Answer]) -> w.Usage:
        """Every token the kept answer attended to before its first sampled token is prompt
        (the turn's opener too); ``cached_tokens`` never exceeds it."""
        kept = next((a for a in answers if a.index == 0), None)
        prompt = kept.context if kept is not None else self.session.tokens
        last = self.session.segments()[-1] if kept is not None and kept.produced else None
        if kept is not None and last is not None and last.kind is SegmentKind.ASSISTANT:
            closing = len(self.kernel.tokenizer.close_turn(kept.produced[-1]))
            prompt += last.length - (len(kept.produced) - 1) - closing
        completion = sum(a.sampled for a in answers)
        return w.Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                       prompt_tokens_details=w.PromptTokensDetails(cached_tokens=min(self.cached, prompt)))

    def info(self, fingerprint: str | None, answers: list[Answer]) -> w.FakInfo:
        return w.FakInfo(session_id=self.session.id, ephemeral=self.ephemeral, fingerprint=fingerprint,
                         admissions=self.admissions, ignored=list(self.parameters.ignored),
                         tool_calls=[v for a in sorted(answers, key=lambda a: a.index) for v in a.verdicts],
                         remedies=[r for a in sorted(answers, key=lambda a: a.index) for r in a.remedies],
                         tools_ref=self.tools_ref, metadata=self.parameters.metadata)


def _fingerprint(turn: Turn, answers: Sequence[Answer]) -> str:
    """The session's fingerprint after the answer: the one the kept choice's turn was committed
    with (``Answer.fingerprint``; hashing the whole KV again costs as much as the commit's
    hash, and grows with the context), else the session's now."""
    kept = next((a.fingerprint for a in answers if a.index == 0 and a.fingerprint), None)
    return kept or turn.fingerprint()


def verdict_header(info: w.FakInfo) -> str:
    """The ``fak-tool-calls`` header: each call's id, verdict and whether it is held, for
    frameworks that drop unknown body fields (``call_…=ALLOW, call_held_…=CONFIRM;held``)."""
    return ", ".join(f"{v.id}={v.verdict}" + (";held" if v.held else "") + ("" if v.returned else ";withheld")
                     for v in info.tool_calls)


def _chat_session(k: Kernel, c: Caller, body: w.ChatCompletionRequest, completion_id: str) -> tuple[KernelSession, bool]:
    """(session, ephemeral): a new one named by the completion id, or ``fak_session``, created on first use."""
    if body.fak_session is None:
        return k.create_session(c.tenant, completion_id), True
    try:
        return k.session(c.tenant, body.fak_session), False
    except NotFound:
        try:
            return k.create_session(c.tenant, body.fak_session), False
        except Conflict:  # created meanwhile by a concurrent request
            return k.session(c.tenant, body.fak_session), False


def _principal(c: Caller, user: str | None) -> str:
    """The decisions' principal: the API key, and the end user the request names (OpenAI's ``user``)."""
    return as_id(c.principal + (f"/user={user}" if user else ""))


Turn = ChatTurn | ForwardTurn  # fak's own model, or an upstream it forwards to (``fak.kernel.openai.forward``)


def open_turn(k: Kernel, c: Caller, body: w.ChatCompletionRequest, hosted: Hosted | None = None) -> Turn:
    """The request's turn: forwarded when ``model`` names one of the deployment's upstreams
    (docs/gateway.md), else on fak's own model (which answers to any other name). ``hosted``: the
    tools fak runs itself (MCP), on fak's own model only."""
    up = k.services.upstreams.find(body.model)
    if up is None:
        return open_chat(k, c, body, hosted)
    c.require(Right.AGENT)
    if hosted is not None:
        raise UnsupportedParameter(f"tools: MCP tools run on fak's own model, not yet on the upstream {body.model!r}",
                                   param="tools")
    ops = _settled(k, c, body, plan_messages(body.messages))
    return open_forward(k, c, body, up, ops, _principal(c, body.user))


def _settled(k: Kernel, c: Caller, body: w.ChatCompletionRequest, ops: list[ChatOp]) -> list[ChatOp]:
    """The ops with each tool message under the tool of the call it answers, and a held or
    rejected call's result refused or replaced (``_tool_op``)."""
    holds = k.services.holds
    answered = {op.index: _answered_call(body.messages, op) for op in ops if op.kind == "tool"}
    held_forms = holds.forms_held(c.tenant, [a for a in answered.values() if a is not None])  # one query
    return [_tool_op(holds, c.tenant, op, body.messages, answered[op.index], held_forms) if op.kind == "tool" else op
            for op in ops]


def open_chat(k: Kernel, c: Caller, body: w.ChatCompletionRequest, hosted: Hosted | None = None) -> ChatTurn:
    """Validate, get the session, replay the messages into it (the tools block after the
    leading system messages). Nothing is created when validation fails; an ephemeral session
    is deleted when a later step fails. ``hosted``: tools fak runs itself (``Hosted``)."""
    c.require(Right.AGENT)
    parameters = chat_parameters(body)
    hosted = hosted or Hosted()
    if hosted.governed:
        parameters = replace(parameters, tools=tuple(replace(t, governed=hosted.governed.get(t.name))
                                                     for t in parameters.tools))
    principal = _principal(c, parameters.user)
    calls = parameters.choice.mode != "none"
    plan = plan_answer(k.tokenizer, parameters, principal, calls=calls)  # grammar and bias: a 400 before any effect
    ops = _settled(k, c, body, plan_messages(body.messages, format_for(k.tokenizer)))
    ops = [replace(op, tool=hosted.results[op.call_id][0], source=hosted.results[op.call_id][1])
           if op.kind == "tool" and op.call_id is not None and op.call_id in hosted.results else op for op in ops]
    grouped = frozenset(n for g in hosted.groups for n in g.names)
    own = [t for t in parameters.tools if t.name not in grouped]
    blocks = _blocks(k, own, [(g, [t for t in parameters.tools if t.name in g.names]) for g in hosted.groups])
    tools_text = "".join(text for _, text, _ in blocks) if blocks else None
    # the leading system messages are rendered knowing the tools (a template whose system header
    # depends on them: Llama 3's "Environment: ipython"); the tools block follows them
    definitions = [spec.definition() for spec in parameters.tools] if tools_text is not None else None
    completion_id = "chatcmpl-" + uuid.uuid4().hex[:24]
    ks, ephemeral = _chat_session(k, c, body, completion_id)
    turn = ChatTurn(k, ks, ephemeral, completion_id, plan)
    try:
        before = ks.tokens
        if not ephemeral and ks.segments():  # a resent history appends only its new suffix
            ops = ops[new_suffix(ks, [HistoryItem(op.kind, op.text, op.tool) for op in ops]):]
        check_context(k, [op.text for op in ops] + [tools_text or ""], "these messages")
        mech0, hits0 = _hits(ks)
        lead = next((i for i, op in enumerate(ops) if op.kind != "system"), len(ops))
        refused: set[str] = set()  # tools whose definitions the gate kept out: the model may not call them
        for i, op in enumerate(ops):
            if i == lead:
                refused |= _add_blocks(turn, blocks, hosted.groups, own)
            if op.kind == "tool":
                turn.admissions.append(_admit(ks, op))
            else:
                ks.append(op.kind, op.text, tools=definitions if i < lead else None)
        if lead == len(ops):
            refused |= _add_blocks(turn, blocks, hosted.groups, own)
        if calls and refused:
            kept = tuple(t for t in parameters.tools if t.name not in refused)
            turn.plan = plan_answer(k.tokenizer, replace(parameters, tools=kept), principal, calls=bool(kept))
        mech1, hits1 = _hits(ks)
        turn.cached = before + (hits1 - hits0 if mech1 is mech0 else hits1)
    except BaseException:
        turn.close()
        raise
    return turn


def _answered_call(messages: list[w.ChatMessage], op: ChatOp) -> tuple[str, Any] | None:
    """(tool, arguments) of the call a tool message answers, as the request's assistant
    messages carry it: the latest call with its id before it, or for a legacy ``function``
    message without one, the function call of the assistant message before it."""
    for msg in reversed(messages[: op.index]):
        if msg.role != "assistant":
            continue
        if op.call_id is None:
            fn = msg.function_call
            return (fn.name, fn.arguments) if fn is not None else None
        for call in msg.tool_calls or []:
            if call.id != op.call_id:
                continue
            if call.function is not None:
                return call.function.name, call.function.arguments
            if isinstance(call.custom, dict) and isinstance(call.custom.get("name"), str):
                raw = call.custom.get("input", "")
                return call.custom["name"], raw if isinstance(raw, str) else json_text(raw)
    return None


def _tool_op(holds: HeldCalls, tenant: str, op: ChatOp, messages: list[w.ChatMessage],
             answered: tuple[str, Any] | None, held_forms: Container[str]) -> ChatOp:
    """A tool result as the gate should see it: under the tool of the call it answers (a call
    the door returned earlier, when the request does not carry it) and what the model may read
    of it: a held call's result is refused and a rejected one's replaced by a notice, matched
    by the call's id, or, when the request carries the call it answers under an id fak did not
    give it, by the call's form (tool and canonical arguments: ``HeldCalls.result_for``;
    ``held_forms``: the forms of the request's calls that some held call has)."""
    call_id = op.call_id
    if call_id is None:
        return op if answered is None else replace(op, text=holds.result_for(tenant, "", *answered, op.text,
                                                                               held_forms=held_forms))
    issued = holds.tool_of(tenant, call_id)
    if issued is not None and op.tool != issued:
        # the server's record of the call it returned wins: a result is never admitted under
        # another tool's name (and trust) because the request carries one
        carried = any(call.id == call_id and call.function is not None and call.function.name != issued
                      for m in messages if m.role == "assistant" for call in m.tool_calls or [])
        if carried or messages[op.index].name not in (None, issued):
            raise InvalidInput(f"tool message {op.index} answers call {call_id}, which fak returned as a call to "
                               f"{issued!r}; it names another tool")
    tool = issued or op.tool
    text = (holds.result_text(tenant, call_id, op.text) if answered is None
            else holds.result_for(tenant, call_id, *answered, op.text, held_forms=held_forms))
    return replace(op, tool=tool, text=text)


def _tools_text(k: Kernel, specs: list[ToolSpec]) -> str:
    """The tools block: as the model's own template writes a request's tools, where it does
    (``ChatTokenizer.tools_text``), else fak's Hermes block (``render_tools``). Either is a
    function of the tools alone: the same tools, the same bytes, ref and tokens."""
    own = k.tokenizer.tools_text([s.definition() for s in specs]) if k.tokenizer.renders_tools else None
    return own if own is not None else render_tools(specs)


def _blocks(k: Kernel, own: list[ToolSpec], groups: list[tuple[ToolGroup, list[ToolSpec]]]
            ) -> list[tuple[str, str, str | None]]:
    """The tools blocks as (producer, text, source). Without servers' tools, one block: the
    model's own template's, else fak's Hermes block. With them, fak's Hermes block for every
    model (the request's tools, however few, and the instructions: ``TOOL_DEFINITIONS``), then
    each server's tools in ``<tools>`` tags as a ref of their own: a description is the server's
    content, never the request's, and holds nothing of fak's instructions (which a detector
    would read as an injection)."""
    if not any(specs for _, specs in groups):
        return [(TOOL_DEFINITIONS, _tools_text(k, own), None)] if own else []
    out: list[tuple[str, str, str | None]] = [(TOOL_DEFINITIONS, render_tools(own), None)]
    return out + [(g.producer, "\n<tools>\n" + "\n".join(t.line() for t in specs) + "\n</tools>", g.source)
                  for g, specs in groups if specs]


def _add_blocks(turn: ChatTurn, blocks: list[tuple[str, str, str | None]], groups: tuple[ToolGroup, ...],
                own: list[ToolSpec]) -> set[str]:
    """Each tools block into attention (the request's, then each server's); the names of the
    tools whose block the gate kept out."""
    refused: set[str] = set()
    by_producer = {g.producer: g.names for g in groups}
    for producer, text, source in blocks:
        if not _add_tools(turn, text, producer, source):  # the request's block kept out: no call at all
            refused |= by_producer.get(producer, {t.name for t in own} | {n for g in groups for n in g.names})
    return refused


def _add_tools(turn: ChatTurn, text: str, producer: str = TOOL_DEFINITIONS, source: str | None = None) -> bool:
    """A tools block into attention, through the gate as content of its own (producer
    ``fak.tool_definitions``, or a server's ``mcp:<label>``: its descriptions are content with
    the server's trust), unless the session already holds it live; whether it is in attention."""
    ks, data = turn.session, text.encode("utf-8")
    ref = turn.kernel.store.digest_of(data, ks.tenant)
    if any(x.ref == ref and x.state is SegmentState.LIVE for x in ks.segments()):
        turn.tools_ref = turn.tools_ref or ref
        return True
    a = ks.admit(producer, data, role=turn.kernel.tokenizer.tools_role, source=source)
    turn.admissions.append(w.AdmissionInfo(message_index=-1, tool=producer, tool_call_id=None,
                                           verdict=a.verdict.kind.value, rule_id=a.verdict.rule_id, ref=a.ref,
                                           admitted_ref=a.admitted_ref, admitted=a.admitted,
                                           segment_id=a.segment.id, audit_index=a.audit_index))
    if a.admitted:
        turn.tools_ref = turn.tools_ref or a.admitted_ref
    return bool(a.admitted)


def _admit(ks: KernelSession, op: ChatOp) -> w.AdmissionInfo:
    """A tool message through the gate (a quarantined or denied one never enters attention).
    Bytes this session holds live as an MCP tool's result admitted first-hand (the MCP gateway,
    producer ``mcp:<label>/<tool>``: docs/mcp.md) are matched by their keyed digest, not
    admitted again under the client's word for them."""
    data = op.text.encode("utf-8", "surrogatepass")
    ref = ks.services.store.digest_of(data, ks.tenant)
    held = next((x for x in ks.segments() if x.ref == ref and x.state is SegmentState.LIVE), None)
    first = next((p[0] for p in ks.call_context().producers.get(ref, ()) if p[0].startswith("mcp:") and "/" in p[0]),
                 None) if held is not None else None
    if held is not None and first is not None:
        return w.AdmissionInfo(message_index=op.index, tool=op.tool, tool_call_id=op.call_id,
                               verdict=held.verdict.value if held.verdict is not None else "ALLOW",
                               rule_id=held.rule or "", ref=ref, admitted_ref=ref, admitted=True,
                               segment_id=held.id, audit_index=None, matched=first)
    a = ks.admit(op.tool, data, source=op.source)
    return w.AdmissionInfo(message_index=op.index, tool=op.tool, tool_call_id=op.call_id,
                           verdict=a.verdict.kind.value, rule_id=a.verdict.rule_id, ref=a.ref,
                           admitted_ref=a.admitted_ref, admitted=a.admitted, segment_id=a.segment.id,
                           audit_index=a.audit_index)


def _choice(a: Answer) -> w.Choice:
    return w.Choice(index=a.index, message=w.AssistantMessage(content=a.content, refusal=a.refusal,
                                                              tool_calls=a.tool_calls or None),
                    finish_reason=a.finish, logprobs=a.logprobs)


@dataclass(frozen=True)
class Completed:
    """A ``chat.completion`` and the refs whose bytes its choices may carry (the union of each
    choice's ``Answer.provenance``): what a copy of it kept is sealed under (a stored response)."""

    completion: w.ChatCompletion
    provenance: frozenset[str]


def complete(k: Kernel, c: Caller, body: w.ChatCompletionRequest) -> w.ChatCompletion:
    """The whole answer as one ``chat.completion``; the turn is closed however this ends."""
    return completed(k, c, body).completion


def completed(k: Kernel, c: Caller, body: w.ChatCompletionRequest, hosted: Hosted | None = None) -> Completed:
    """``complete``, with the content provenance of what it returns (``hosted``: ``open_chat``'s)."""
    turn = open_turn(k, c, body, hosted)
    answers: list[Answer] = []
    try:
        for _, run in turn.answers():
            for step in run:
                if isinstance(step, Answer):
                    answers.append(step)
        usage = turn.usage(answers)
        fingerprint = _fingerprint(turn, answers)
    finally:
        turn.close()
    completion = w.ChatCompletion(id=turn.completion_id, created=int(time.time()), model=turn.model,
                                  choices=[_choice(a) for a in sorted(answers, key=lambda a: a.index)],
                                  usage=usage, fak=turn.info(fingerprint, answers))
    return Completed(completion, frozenset(r for a in answers for r in a.provenance))


# --- streaming -----------------------------------------------------------------------
class ChatStream:
    """A streamed answer as ``chat.completion.chunk`` objects (``ChatChunk``: typed, see
    ``fak.kernel.openai.chunks``), one model step per ``next_chunks`` call, None after the last. The first step runs when the stream
    is opened (``open_stream``), so a busy session or a refused parameter fails before any
    chunk. Content is sent as it is decoded, except what may still become a tool call or a
    stop string; a choice's tool calls follow once the model has finished them and fak has
    decided them, as one tool-call delta each. ``close`` however the stream ended: it rolls an
    unfinished turn back and closes the turn (safe from another thread)."""

    def __init__(self, turn: Turn, *, include_usage: bool) -> None:
        self.turn = turn
        self._runs = turn.answers()
        self._stepper: Stepper[list[ChatChunk]] = Stepper(self._steps())
        self._include_usage = include_usage
        self._answers: list[Answer] = []
        self._ended = False
        self._pending: list[ChatChunk] = []

    def _steps(self) -> Generator[list[ChatChunk], None, None]:
        """Every step's chunks, choice after choice, then the tail; closing it mid-way closes
        the running answer (which rolls its turn back)."""
        for index, run in self._runs:
            yield [self._delta(index, Delta(role="assistant", content=""))]
            try:
                for step in run:
                    if isinstance(step, Answer):
                        self._answers.append(step)
                        yield self._choice_end(step)
                    else:
                        yield [self._delta(index, Delta(content=step))] if step else []
            finally:
                run.close()
        yield self._last()

    @property
    def provenance(self) -> frozenset[str]:
        """The refs whose bytes what this stream sent so far may carry: each finished choice's
        content provenance, and that of every retried attempt whose text it sent (a denied
        call's turn: its text stays sent, though the session evicted the turn)."""
        return frozenset(r for a in self._answers for r in a.provenance | a.sent_provenance)

    def start(self) -> None:
        """Run the first model step now (errors before the 200)."""
        role: list[ChatChunk] = self._stepper.step() or []  # the role chunk of the first choice
        self._pending = role + (self._stepper.step() or [])

    def next_chunks(self) -> list[ChatChunk] | None:
        """The chunks of the next model step, None once the stream is over."""
        if self._pending:
            out, self._pending = self._pending, []
            return out
        if self._ended:
            return None
        chunks = self._stepper.step()
        if chunks is None:
            self._ended = True
            return None
        return chunks

    def _choice_end(self, a: Answer) -> list[ChatChunk]:
        out: list[ChatChunk] = []
        final = a.content or ""
        if final.startswith(a.streamed) and len(final) > len(a.streamed):
            out.append(self._delta(a.index, Delta(content=final[len(a.streamed):])))
        if a.refusal:
            out.append(self._delta(a.index, Delta(refusal=a.refusal)))
        if a.tool_calls:
            out.append(self._delta(a.index, Delta(tool_calls=tuple(
                ToolCallDelta(j, call.id, call.function.name, call.function.arguments)
                for j, call in enumerate(a.tool_calls)))))
        # the kept choice comes last: its fak field carries every choice's verdicts
        info = self.turn.info(_fingerprint(self.turn, self._answers), self._answers) if a.index == 0 else None
        out.append(self._chunk((ChoiceDelta(a.index, Delta(), a.finish, a.logprobs),), fak=info))
        return out

    def _last(self) -> list[ChatChunk]:
        """The usage chunk, if asked."""
        if not self._include_usage:
            return []
        return [self._chunk((), usage=self.turn.usage(self._answers))]

    def _chunk(self, choices: tuple[ChoiceDelta, ...], *, usage: w.Usage | None = None,
               fak: w.FakInfo | None = None) -> ChatChunk:
        return ChatChunk(id=self.turn.completion_id, created=int(time.time()), model=self.turn.model,
                         choices=choices, usage=usage, fak=fak)

    def _delta(self, index: int, delta: Delta) -> ChatChunk:
        return self._chunk((ChoiceDelta(index, delta),))

    def close(self) -> None:
        try:
            if not self._stepper.done:  # the client went away: roll the turn back
                self._stepper.close()
        finally:  # an ephemeral session goes even if the rollback failed
            self.turn.close()


def open_stream(k: Kernel, c: Caller, body: w.ChatCompletionRequest) -> ChatStream:
    """Open the turn and run its first model step; on any failure the turn is closed here."""
    turn = open_turn(k, c, body)
    stream = ChatStream(turn, include_usage=bool(body.stream_options and body.stream_options.include_usage))
    try:
        stream.start()
    except BaseException:
        stream.close()
        raise
    return stream


# --- held calls ------------------------------------------------------------------------
def decide_held_call(k: Kernel, c: Caller, call_id: str, *, approve: bool) -> w.ToolCallApprovalOut:
    """A person approves or rejects a held call (audited ``ToolCallApproval``, naming who).
    An approved call's result may then enter the conversation; a rejected one's never. Needs
    the ``approve`` right (an approver or admin key, a person in the console, never an agent
    key), and the principal whose request produced the call may not approve it."""
    c.require(Right.APPROVE)
    return _decide_held(k, c, call_id, approve=approve)


def decline_held_call(k: Kernel, c: Caller, call_id: str) -> w.ToolCallApprovalOut:
    """The agent declines a call held for it (a Responses ``mcp_approval_response`` with
    ``approve: false``): declining runs nothing, so the ``agent`` right suffices; it is logged
    as a rejection naming the agent's key, like a person's."""
    c.require(Right.AGENT)
    return _decide_held(k, c, call_id, approve=False)


def _decide_held(k: Kernel, c: Caller, call_id: str, *, approve: bool) -> w.ToolCallApprovalOut:
    def log(held: HeldCall) -> int:
        return k.audit.append(ToolCallApproval(
            tenant=c.tenant, session_id=held.session_id, call_id=as_id(call_id), tool=as_id(held.tool),
            args_digest=held.args_digest, approved=approve, decision_index=held.decision_index,
            principal=as_id(c.principal)))

    held = k.services.holds.decide(c.tenant, call_id, "approved" if approve else "rejected", c.principal, log)
    if approve and held.approval_key and held.approval_index is not None:
        # kept in the state database: honoured on the replica the session runs on, after a restart
        remember_approval(k.services, c.tenant, held.session_id, held.approval_key, held.approval_index, held.call_id)
    return w.ToolCallApprovalOut(id=held.call_id, state="approved" if approve else "rejected",
                                 session_id=held.session_id, tool_call=_call_out(held),
                                 decided_by=held.decided_by or c.principal, audit_index=held.approval_index)


def _call_out(held: HeldCall) -> w.ToolCallOut:
    return w.ToolCallOut(id=held.call_id, function=w.FunctionCallOut(
        name=held.tool, arguments=json.dumps(held.arguments, ensure_ascii=False)))


def held_call_out(held: HeldCall) -> w.HeldCallOut:
    """A held call as an approver reads it."""
    return w.HeldCallOut(id=held.call_id, state=held.state, session_id=held.session_id, tool_call=_call_out(held),
                         rule_id=held.rule_id, offending=list(held.offending), findings=list(held.findings),
                         decision_audit_index=held.decision_index, produced_by=held.producer,
                         created=int(held.created), decided_by=held.decided_by, audit_index=held.approval_index)


def held_calls(k: Kernel, c: Caller, state: HoldState = "pending", limit: int = MAX_LISTED) -> w.HeldCallList:
    """The tenant's held calls in ``state``, oldest first: an approver's queue (``approve`` right)."""
    c.require(Right.APPROVE)
    if state not in ("pending", "approved", "rejected"):
        raise InvalidInput("state is one of pending, approved, rejected")
    if not 1 <= limit <= MAX_LISTED:
        raise InvalidInput(f"limit is between 1 and {MAX_LISTED}")
    return w.HeldCallList(data=[held_call_out(x) for x in k.services.holds.listed(c.tenant, state, limit)])


def held_call(k: Kernel, c: Caller, call_id: str) -> w.HeldCallOut:
    """One held call of the tenant (``approve`` right)."""
    c.require(Right.APPROVE)
    found = k.services.holds.get(c.tenant, call_id)
    if found is None:
        raise NotFound(f"no held tool call {call_id[:80]!r} (unknown, expired, or its record fails its check)")
    return held_call_out(found)
