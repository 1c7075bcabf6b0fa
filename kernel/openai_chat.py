"""The OpenAI-compatible chat in the core: what ``POST /v1/chat/completions`` does to a
session, apart from HTTP. This module owns

- the parameters (``chat_parameters``): which are honoured (sampling), refused
  (``UnsupportedParameter``) or accepted and ignored;
- the messages (``plan_messages``): each validated and turned into one session operation
  before any runs; an assistant's own tool calls rendered as text; ``tool`` messages
  admitted through the gate;
- the session (``open_chat`` → ``ChatTurn``): ephemeral or the persistent ``fak_session``,
  the request's messages replayed into it, and what the answer reports (usage with
  ``cached_tokens``, the ``fak`` extension, the finish reason);
- the answer: a ``chat.completion`` (``complete``), or its ``chat.completion.chunk`` objects
  one model step at a time (``open_stream`` → ``ChatStream``);
- the lifecycle: ``close`` rolls an unfinished turn back and deletes an ephemeral session,
  however the request ended.

The route (``fak.api.routes.openai``) keeps authentication, the worker threads, the SSE
framing and cancellation; the wire models are ``fak.wire``'s (its OpenAI section). What
this door learns next (the tool calls the model emits, the Responses API, structured
output) belongs here. Like ``kernel/operations.py``, this module never imports ``fak.api``.
Authentication: the Bearer API key names the tenant (the ``Caller``); chat needs the
``agent`` right, the model list ``read``.

**Sessions.** By default a request runs in an *ephemeral* session of the caller's tenant,
created for the request (its id is the completion id, ``chatcmpl-…``) and deleted after
it, streaming or not, however the request ends. Resent history stays cheap: every
session's KV lands in the tenant's exact prefix cache, so the next request's messages,
rendered to the same tokens, are served from it instead of prefilled again (reported as
``usage.prompt_tokens_details.cached_tokens``; another tenant never hits them). The
tool messages of a resent history go through the gate again on every request (the same
bytes get the same ref and verdict; each admission is audited).

The extension field ``fak_session`` (top level of the body; with the official client,
``extra_body={"fak_session": "trip-42"}``) names a *persistent* session instead, created
on first use (the id grammar of ``POST /v1/sessions``). The session then holds the
conversation: send only the messages that are new since the last call (the user's next
message, the tool results), and the generated answer is kept in the session as the next
assistant turn. The kernel stays the one source of truth for that history, so an eviction,
a late quarantine or a forget is never undone by a client resending the bytes. A request
that starts with a ``system``/``developer`` message against a session that already holds
history is refused (409 ``conflict``): that is the mark of a client resending the whole
history, which would duplicate it. Messages are validated before anything is appended;
each append or admission is then atomic on its own. The OpenAI ``user`` field is *not*
used to pick a session (it identifies an end user, and many clients send one constant
value): it is accepted and ignored.

**Messages.** ``system`` (and ``developer``, the same thing for newer clients), ``user``
and ``assistant`` messages are appended as text; ``content`` is a string or a list of
text parts (joined with ``"\\n"``; ``refusal`` parts count as text). Image, audio and file
parts are refused with a 400 ``unsupported_content`` problem: the model reads text only.
``tool`` messages (and legacy ``function`` messages) go through the admission gate as
``admit(tool, content UTF-8 bytes)``, the tool being the ``function.name`` of the
earlier assistant ``tool_calls`` entry whose ``id`` equals the message's ``tool_call_id``
(else the message's ``name``, else ``"tool"``). A tool message the gate quarantines or
denies never enters attention: the answer is the never-saw answer. A tool message whose
bytes are a ref of the tenant already quarantined (late detection) is not admitted again
either, whatever the gate would say now: the Kernel records it as ``QUARANTINE`` with rule
``ref_quarantined`` (an audited admission like any other).

**An assistant's own tool calls** (``tool_calls`` on an assistant message, or the legacy
``function_call``) are rendered into the assistant text deterministically: the message's
text content (if any), then one line per call, in order::

    <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>

``arguments`` is parsed as JSON and written back with sorted keys and ``json.dumps``'s
default separators, non-ASCII kept (a string that is not valid JSON is written as a JSON
string); a ``custom`` tool call writes ``"input"`` (its raw string) instead of
``"arguments"``; call ids are not rendered (tool results are rendered without them too).
The text is encoded with special-token strings taken literally, like every content.

**Parameters.** ``max_completion_tokens`` (or the older ``max_tokens``; default 256, at
most 4096), ``temperature`` (default 1.0 as OpenAI's; 0 is greedy), ``top_p`` (0 means
greedy), ``seed`` and ``min_tokens`` (vLLM's extension) are honoured. ``n`` must be 1;
``stop`` is not supported (accepted only when empty); ``logprobs: true``, a
``response_format`` other than text and audio output are not supported: each is a 400
``unsupported_parameter`` problem. ``tools``, ``tool_choice`` and ``functions`` are
accepted and ignored for generation: the default model (SmolLM2-135M, and the tiny test
models) does not do function calling, so the answer is always text and
``finish_reason`` is ``stop`` (an end-of-turn token) or ``length`` (``max_tokens`` reached).
Every other parameter (penalties, ``logit_bias``, ``user``, ``metadata``, ``store``, any
unknown one) is accepted and ignored; the response's ``fak.ignored`` names those a
request sent. ``model`` is any string; responses name the kernel's model.

**Response.** The OpenAI ``chat.completion`` shape. ``usage.prompt_tokens`` counts every
token the answer attended to before its first sampled token (the session's context plus
the assistant-turn opener), ``completion_tokens`` the sampled tokens (the end-of-turn
token included), and ``prompt_tokens_details.cached_tokens`` the prompt tokens whose KV was
not computed for this request: served from the tenant's prefix cache (whole prefill
chunks) or, in a persistent session, already in the session. The extension field ``fak``
carries ``session_id``, ``ephemeral``, the session's KV ``fingerprint`` after the answer,
the ``admissions`` of the request's tool messages (``message_index``, ``tool``,
``tool_call_id``, ``verdict``, ``rule_id``, ``ref``, ``admitted_ref``, ``admitted``,
``segment_id``, ``audit_index``) and ``ignored``.

**Streaming.** ``chat.completion.chunk`` events: a first chunk with
``delta.role = "assistant"``, content deltas (text decoded incrementally, an incomplete
UTF-8 character held back until it completes), a last chunk with an empty delta, the
``finish_reason`` and the ``fak`` field, then, with ``stream_options.include_usage``, a
usage chunk whose ``choices`` is empty (as OpenAI sends it), then ``data: [DONE]``. The
streamed text equals the non-streamed text of the same request. A client that disconnects
mid-stream leaves the session as it was before the generation (the partial turn is rolled
back; an ephemeral session is deleted). Errors found before the first token (bad
messages, a busy session, a refused parameter) are problem+json responses, never a
stream.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from fak import wire as w
from fak.errors import Conflict, InvalidInput, NotFound
from fak.kernel.agent_session import MAX_TEXT_BYTES
from fak.kernel.kv.ledger import SegmentKind
from fak.kernel.operations import Caller, Right, Stepper, TextDecoder, check_context

if TYPE_CHECKING:
    from fak.kernel.agent_session import KernelSession
    from fak.kernel.facade import Kernel
    from fak.kernel.kv.session import Session

DEFAULT_MAX_TOKENS = 256
STARTED = int(time.time())  # the model cards' ``created``: when the server loaded this module
IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})
IGNORED = ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call", "user",
           "presence_penalty", "frequency_penalty", "logit_bias", "top_logprobs", "metadata", "store",
           "service_tier", "reasoning_effort", "prediction", "web_search_options")


class UnsupportedParameter(InvalidInput):
    """A chat-completions parameter fak does not implement (n > 1, stop, logprobs, ...)."""

    code = "unsupported_parameter"


class UnsupportedContent(InvalidInput):
    """A message part the text model cannot read (an image, audio, a file)."""

    code = "unsupported_content"


# --- models --------------------------------------------------------------------------
def list_models(k: Kernel, c: Caller) -> w.ModelList:
    """The kernel's one model."""
    c.require(Right.READ)
    return w.ModelList(data=[w.ModelCard(id=k.model_id, created=STARTED)])


def get_model(k: Kernel, c: Caller, model_id: str) -> w.ModelCard:
    c.require(Right.READ)
    if model_id != k.model_id:
        raise NotFound(f"no model {model_id[:80]!r}")
    return w.ModelCard(id=k.model_id, created=STARTED)


# --- parameters ----------------------------------------------------------------------
@dataclass(frozen=True)
class ChatParameters:
    """What the kernel honours of a request (its sampling) and the names of the parameters
    the request sent that were accepted and ignored (the response's ``fak.ignored``)."""

    max_tokens: int
    min_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    ignored: tuple[str, ...]

    def sampling(self) -> dict[str, Any]:
        """The keyword arguments of ``KernelSession.generate``."""
        return {"max_tokens": self.max_tokens, "min_tokens": self.min_tokens, "temperature": self.temperature,
                "top_p": self.top_p, "seed": self.seed}


def chat_parameters(body: w.ChatCompletionRequest) -> ChatParameters:
    """Refuse what fak does not implement (``UnsupportedParameter``), map the rest."""
    if body.n not in (None, 1):
        raise UnsupportedParameter("n: fak returns one choice per request; n must be 1")
    stop = body.stop
    if (isinstance(stop, str) and stop) or (isinstance(stop, list) and any(stop)):
        raise UnsupportedParameter("stop: stop sequences are not supported (the model's own end-of-turn tokens "
                                   "end an answer); leave stop out or empty")
    if body.logprobs:
        raise UnsupportedParameter("logprobs: log probabilities are not returned; leave logprobs out or false")
    if body.response_format is not None and body.response_format.get("type", "text") != "text":
        raise UnsupportedParameter("response_format: only {'type': 'text'} is supported (no JSON mode)")
    if body.modalities is not None and set(body.modalities) - {"text"}:
        raise UnsupportedParameter("modalities: the model writes text only")
    extra = body.model_extra or {}
    if extra.get("audio") is not None:
        raise UnsupportedParameter("audio: the model writes text only")
    max_tokens = body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS
    temperature = 1.0 if body.temperature is None else body.temperature
    top_p = 1.0 if body.top_p is None else body.top_p
    if top_p == 0:  # the nucleus shrinks to the most probable token
        temperature, top_p = 0.0, 1.0
    ignored = sorted({name for name in body.model_fields_set if name in IGNORED and getattr(body, name) is not None}
                     | {name[:64] for name, value in extra.items() if value is not None})
    return ChatParameters(max_tokens=max_tokens, min_tokens=min(body.min_tokens or 0, max_tokens),
                          temperature=temperature, top_p=top_p,
                          seed=None if body.seed is None else body.seed % 2**64, ignored=tuple(ignored))


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


def _json_text(value: str | dict[str, Any]) -> str:
    raw = value if isinstance(value, str) else None
    try:
        return json.dumps(json.loads(raw) if raw is not None else value, ensure_ascii=False, sort_keys=True)
    except (ValueError, RecursionError):  # not JSON (or absurdly deep): written as a JSON string
        return json.dumps(raw if raw is not None else str(value), ensure_ascii=False)


def render_tool_call(call: w.ToolCall | w.FunctionCall, where: str) -> tuple[str, str]:
    """(name, rendered line) of one of the assistant's own calls (see the module notes)."""
    if isinstance(call, w.FunctionCall):
        name, body = call.name, '"arguments": ' + _json_text(call.arguments)
    elif call.type == "function" and call.function is not None:
        name, body = call.function.name, '"arguments": ' + _json_text(call.function.arguments)
    elif call.type == "custom" and isinstance(call.custom, dict) and isinstance(call.custom.get("name"), str):
        raw = call.custom.get("input", "")
        name, body = call.custom["name"], '"input": ' + json.dumps(raw if isinstance(raw, str) else _json_text(raw),
                                                                   ensure_ascii=False)
    else:
        raise InvalidInput(f"{where}: a tool call is {{'type': 'function', 'function': {{'name', 'arguments'}}}}")
    line = '<tool_call>{"name": ' + json.dumps(name, ensure_ascii=False) + ", " + body + "}</tool_call>"
    return _unicode(name, f"{where}.name"), _unicode(line, where)


def plan_messages(messages: list[w.ChatMessage]) -> list[ChatOp]:
    """Validate every message and turn it into one session operation (nothing runs yet)."""
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
            for j, call in enumerate(calls):
                name, line = render_tool_call(call, f"{where}.tool_calls[{j}]")
                lines.append(line)
                if isinstance(call, w.ToolCall) and call.id:
                    names[call.id] = name
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
    parameters: ChatParameters
    cached: int = 0  # prompt tokens whose KV was not computed for this request
    context: int = 0  # tokens in the session before generation
    admissions: list[w.AdmissionInfo] = field(default_factory=list)
    closed: bool = False

    def close(self) -> None:
        """Delete an ephemeral session (idempotent; the generation must be over)."""
        if self.ephemeral and not self.closed:
            self.closed = True
            with contextlib.suppress(NotFound):
                self.kernel.delete_session(self.session.tenant, self.session.id)

    def generate(self) -> Stepper:
        """The assistant turn, driven one token at a time (``Stepper.close`` gives it up)."""
        return Stepper(self.session.generate(**self.parameters.sampling()))

    def usage(self, produced: list[int]) -> w.Usage:
        """Every token the answer attended to before its first sampled token is prompt (the
        turn's opener too); ``cached_tokens`` never exceeds it."""
        prompt = self.context
        last = self.session.segments()[-1] if produced else None
        if last is not None and last.kind is SegmentKind.ASSISTANT:  # the turn's opener is prompt too
            closing = len(self.kernel.tokenizer.close_turn(produced[-1]))
            prompt += last.length - (len(produced) - 1) - closing
        return w.Usage(prompt_tokens=prompt, completion_tokens=len(produced), total_tokens=prompt + len(produced),
                       prompt_tokens_details=w.PromptTokensDetails(cached_tokens=min(self.cached, prompt)))

    def info(self, fingerprint: str | None) -> w.FakInfo:
        return w.FakInfo(session_id=self.session.id, ephemeral=self.ephemeral, fingerprint=fingerprint,
                         admissions=self.admissions, ignored=list(self.parameters.ignored))

    def finish_reason(self, produced: list[int]) -> Literal["stop", "length"]:
        return "stop" if produced and produced[-1] in self.kernel.tokenizer.stop_token_ids else "length"


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


def open_chat(k: Kernel, c: Caller, body: w.ChatCompletionRequest) -> ChatTurn:
    """Validate, get the session, replay the messages into it. Nothing is created when
    validation fails; an ephemeral session is deleted when a later step fails."""
    c.require(Right.AGENT)
    parameters = chat_parameters(body)
    ops = plan_messages(body.messages)
    completion_id = "chatcmpl-" + uuid.uuid4().hex[:24]
    ks, ephemeral = _chat_session(k, c, body, completion_id)
    turn = ChatTurn(k, ks, ephemeral, completion_id, parameters)
    try:
        before = ks.tokens
        if before and ops[0].kind == "system":
            raise Conflict(f"session {ks.id} already holds a conversation: send only the new messages "
                           "(a system message first means a resent history)")
        check_context(k, [op.text for op in ops], "these messages")
        mech0, hits0 = _hits(ks)
        for op in ops:
            if op.kind == "tool":
                turn.admissions.append(_admit(ks, op))
            else:
                ks.append(op.kind, op.text)
        mech1, hits1 = _hits(ks)
        turn.cached = before + (hits1 - hits0 if mech1 is mech0 else hits1)
        turn.context = ks.tokens
    except BaseException:
        turn.close()
        raise
    return turn


def _admit(ks: KernelSession, op: ChatOp) -> w.AdmissionInfo:
    """A tool message through the gate (a quarantined or denied one never enters attention)."""
    a = ks.admit(op.tool, op.text.encode("utf-8", "surrogatepass"))
    return w.AdmissionInfo(message_index=op.index, tool=op.tool, tool_call_id=op.call_id,
                           verdict=a.verdict.kind.value, rule_id=a.verdict.rule_id, ref=a.ref,
                           admitted_ref=a.admitted_ref, admitted=a.admitted, segment_id=a.segment.id,
                           audit_index=a.audit_index)


def complete(k: Kernel, c: Caller, body: w.ChatCompletionRequest) -> w.ChatCompletion:
    """The whole answer as one ``chat.completion``; the turn is closed however this ends."""
    turn = open_chat(k, c, body)
    try:
        produced = list(turn.session.generate(**turn.parameters.sampling()))
        text = k.tokenizer.decode_turn(produced)
        usage = turn.usage(produced)
        fingerprint = turn.session.fingerprint()
    finally:
        turn.close()
    return w.ChatCompletion(id=turn.completion_id, created=int(time.time()), model=k.model_id,
                            choices=[w.Choice(message=w.AssistantMessage(content=text),
                                              finish_reason=turn.finish_reason(produced))],
                            usage=usage, fak=turn.info(fingerprint))


# --- streaming -----------------------------------------------------------------------
class ChatStream:
    """A streamed answer as ``chat.completion.chunk`` objects (JSON-ready dicts), one model
    step per ``next_chunks`` call, None after the last. The first token is sampled when the
    stream is opened (``open_stream``), so a busy session or a refused parameter fails before
    any chunk. ``close`` however the stream ended: it rolls an unfinished turn back and
    closes the turn (safe from another thread: it waits for a running step)."""

    def __init__(self, turn: ChatTurn, stepper: Stepper, first: int | None, *, include_usage: bool) -> None:
        self.turn = turn
        self._stepper = stepper
        self._first: int | None = first
        self._include_usage = include_usage
        self._decoder = TextDecoder(turn.kernel.tokenizer)
        self._produced: list[int] = []
        self._started = False
        self._ended = False

    def next_chunks(self) -> list[dict[str, Any]] | None:
        """The chunks of the next step: the role chunk first, a content delta per token that
        completes text (an incomplete UTF-8 character is held back), then the tail, the
        ``finish_reason`` chunk with the ``fak`` field and, if asked, the usage chunk."""
        if self._ended:
            return None
        out: list[dict[str, Any]] = []
        if not self._started:
            self._started = True
            out.append(self._delta({"role": "assistant", "content": ""}))
            token = self._first
        else:
            token = self._stepper.step()
        if token is not None:
            self._produced.append(token)
            if piece := self._decoder.push(token):
                out.append(self._delta({"content": piece}))
            return out
        self._ended = True
        return out + self._last()

    def _last(self) -> list[dict[str, Any]]:
        turn, produced, out = self.turn, self._produced, []
        full = turn.kernel.tokenizer.decode_turn(produced)
        if len(full) > len(self._decoder.emitted):  # a held-back tail (an incomplete character at the end)
            out.append(self._delta({"content": full[len(self._decoder.emitted):]}))
        usage = turn.usage(produced)
        fingerprint = turn.session.fingerprint()
        out.append(self._delta({}, turn.finish_reason(produced), fak=turn.info(fingerprint).model_dump()))
        if self._include_usage:
            out.append(self._chunk([], usage=usage.model_dump()))
        return out

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"id": self.turn.completion_id, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": self.turn.kernel.model_id, "system_fingerprint": None, "choices": choices} | extra

    def _delta(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        return self._chunk([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], **extra)

    def close(self) -> None:
        try:
            if not self._stepper.done:  # the client went away: roll the turn back
                self._stepper.close()
        finally:  # an ephemeral session goes even if the rollback failed
            self.turn.close()


def open_stream(k: Kernel, c: Caller, body: w.ChatCompletionRequest) -> ChatStream:
    """Open the turn and sample its first token; on any failure the turn is closed here."""
    turn = open_chat(k, c, body)
    stepper: Stepper | None = None
    try:
        stepper = turn.generate()
        first = stepper.step()
    except BaseException:
        try:
            if stepper is not None and not stepper.done:
                stepper.close()
        finally:
            turn.close()
        raise
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return ChatStream(turn, stepper, first, include_usage=include_usage)
