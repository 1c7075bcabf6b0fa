"""OpenAI-compatible chat: ``POST /v1/chat/completions`` (JSON, or server-sent events with
``stream: true``) and ``GET /v1/models``, so agent frameworks that speak the OpenAI chat
API run unchanged against fak (``openai.OpenAI(base_url=URL + "/v1", api_key=FAK_KEY)``).
Authentication is the same as everywhere: the Bearer API key names the tenant; chat
needs the ``agent`` (or ``admin``) role, the model list any role.

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
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from fak.api.deps import AGENT, READER, kernel
from fak.api.keys import Principal
from fak.errors import Conflict, InvalidInput, NotFound
from fak.kernel.agent_session import MAX_TEXT_BYTES, KernelSession
from fak.kernel.facade import Kernel
from fak.kernel.operations import Stepper, TextDecoder, check_context

router = APIRouter(prefix="/v1", tags=["openai"])

DEFAULT_MAX_TOKENS = 256
MAX_TOKENS = 4096
MAX_MESSAGES = 4096
SESSION_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_IMAGE_PARTS = {"image_url", "input_image", "image"}
_IGNORED = ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call", "user",
            "presence_penalty", "frequency_penalty", "logit_bias", "top_logprobs", "metadata", "store",
            "service_tier", "reasoning_effort", "prediction", "web_search_options")


class UnsupportedParameter(InvalidInput):
    """A chat-completions parameter fak does not implement (n > 1, stop, logprobs, ...)."""

    code = "unsupported_parameter"


class UnsupportedContent(InvalidInput):
    """A message part the text model cannot read (an image, audio, a file)."""

    code = "unsupported_content"


# --- request -------------------------------------------------------------------------
class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")  # clients send fields fak does not know


class FunctionCall(_Open):
    name: str = Field(max_length=256)
    arguments: str | dict[str, Any] = Field("", description="JSON text, as OpenAI sends it")


class ToolCall(_Open):
    id: str | None = Field(None, max_length=256)
    type: str = "function"
    function: FunctionCall | None = None
    custom: dict[str, Any] | None = None


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = Field(None, description="a string or a list of text parts")
    name: str | None = Field(None, max_length=256)
    tool_calls: list[ToolCall] | None = Field(None, max_length=256)
    tool_call_id: str | None = Field(None, max_length=256)
    function_call: FunctionCall | None = None


class StreamOptions(_Open):
    include_usage: bool | None = None


class ChatCompletionRequest(_Open):
    model: str = Field(max_length=256, description="any name; responses name the kernel's model")
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS, description="older name of max_completion_tokens")
    min_tokens: int | None = Field(None, ge=0, le=MAX_TOKENS, description="extension (as vLLM's)")
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)
    n: int | None = Field(None, description="must be 1")
    stop: str | list[str] | None = Field(None, description="not supported: accepted only when empty")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    logprobs: bool | None = Field(None, description="not supported: accepted only when false")
    response_format: dict[str, Any] | None = Field(None, description="only {'type': 'text'}")
    modalities: list[str] | None = Field(None, description="only ['text']")
    tools: list[dict[str, Any]] | None = Field(None, description="accepted, ignored (no function calling)")
    tool_choice: str | dict[str, Any] | None = Field(None, description="accepted, ignored")
    user: str | None = Field(None, description="accepted, ignored (does not pick a session)")
    fak_session: str | None = Field(None, pattern=SESSION_ID,
                                    description="extension: a persistent session holding the history")


# --- response ------------------------------------------------------------------------
class AdmissionInfo(BaseModel):
    message_index: int
    tool: str
    tool_call_id: str | None
    verdict: Literal["ALLOW", "QUARANTINE", "REDACT", "DENY"]
    rule_id: str
    ref: str
    admitted_ref: str | None
    admitted: bool
    segment_id: str | None
    audit_index: int | None


class FakInfo(BaseModel):
    session_id: str
    ephemeral: bool
    fingerprint: str | None
    admissions: list[AdmissionInfo]
    ignored: list[str]


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[Choice]
    usage: Usage
    fak: FakInfo


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "fak"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# --- models --------------------------------------------------------------------------
_STARTED = int(time.time())


@router.get("/models", response_model=ModelList)
def list_models(who: Principal = Depends(READER), k: Kernel = Depends(kernel)) -> ModelList:  # noqa: B008
    """The kernel's one model."""
    return ModelList(data=[ModelCard(id=k.model_id, created=_STARTED)])


@router.get("/models/{model_id:path}", response_model=ModelCard)
def get_model(model_id: str, who: Principal = Depends(READER), k: Kernel = Depends(kernel)) -> ModelCard:  # noqa: B008
    if model_id != k.model_id:
        raise NotFound(f"no model {model_id[:80]!r}")
    return ModelCard(id=k.model_id, created=_STARTED)


# --- mapping messages onto session operations -----------------------------------------
@dataclass
class _Op:
    index: int
    kind: str  # system | user | assistant | tool
    text: str = ""
    tool: str = ""
    call_id: str | None = None


def _text(msg: ChatMessage, where: str, *, required: bool) -> str:
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
            elif kind in _IMAGE_PARTS:
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


def _render_call(call: ToolCall | FunctionCall, where: str) -> tuple[str, str]:
    """(name, rendered line) of one of the assistant's own calls."""
    if isinstance(call, FunctionCall):
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


def _plan(messages: list[ChatMessage]) -> list[_Op]:
    """Validate every message and turn it into one session operation (nothing runs yet)."""
    ops: list[_Op] = []
    names: dict[str, str] = {}  # tool_call_id -> tool name, from earlier assistant messages
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if msg.role in ("system", "developer", "user"):
            ops.append(_Op(i, "user" if msg.role == "user" else "system", _text(msg, where, required=True)))
        elif msg.role == "assistant":
            lines = [t] if (t := _text(msg, where, required=False)) else []
            calls: list[ToolCall | FunctionCall] = list(msg.tool_calls or [])
            if msg.function_call is not None:
                calls.append(msg.function_call)
            for j, call in enumerate(calls):
                name, line = _render_call(call, f"{where}.tool_calls[{j}]")
                lines.append(line)
                if isinstance(call, ToolCall) and call.id:
                    names[call.id] = name
            ops.append(_Op(i, "assistant", _bounded("\n".join(lines), where)))
        else:  # tool, function: through the gate
            text = _text(msg, where, required=False)
            if msg.role == "tool" and not msg.tool_call_id:
                raise InvalidInput(f"{where}.tool_call_id: a tool message names the call it answers")
            tool = _unicode((names.get(msg.tool_call_id or "") or msg.name or "tool")[:128], f"{where}.name")
            _unicode(msg.tool_call_id or "", f"{where}.tool_call_id")
            ops.append(_Op(i, "tool", text, tool=tool, call_id=msg.tool_call_id))
    return ops


# --- parameters ----------------------------------------------------------------------
def _check(body: ChatCompletionRequest) -> tuple[dict[str, Any], list[str]]:
    """Sampling parameters for the kernel, and the names of the parameters ignored."""
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
    if (body.model_extra or {}).get("audio") is not None:
        raise UnsupportedParameter("audio: the model writes text only")
    max_tokens = body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS
    temperature = 1.0 if body.temperature is None else body.temperature
    top_p = 1.0 if body.top_p is None else body.top_p
    if top_p == 0:  # the nucleus shrinks to the most probable token
        temperature, top_p = 0.0, 1.0
    params = {"max_tokens": max_tokens, "min_tokens": min(body.min_tokens or 0, max_tokens),
              "temperature": temperature, "top_p": top_p,
              "seed": None if body.seed is None else body.seed % 2**64}
    extra = body.model_extra or {}
    ignored = sorted({name for name in body.model_fields_set if name in _IGNORED and getattr(body, name) is not None}
                     | {name[:64] for name, value in extra.items() if value is not None})
    return params, ignored


# --- running a request ---------------------------------------------------------------
def _hits(ks: KernelSession) -> tuple[object, int]:
    mech = ks.live_session  # the kernel.session.Session; its prefix-cache counter is read only
    return mech, (mech.prefix_hit_tokens if mech is not None else 0)


@dataclass
class _Run:
    k: Kernel
    ks: KernelSession
    ephemeral: bool
    completion_id: str
    params: dict[str, Any]
    ignored: list[str]
    cached: int = 0
    context: int = 0  # tokens in the session before generation
    admissions: list[AdmissionInfo] = field(default_factory=list)
    deleted: bool = False

    def close(self) -> None:
        """Delete an ephemeral session (idempotent; the generation must be over)."""
        if self.ephemeral and not self.deleted:
            self.deleted = True
            with contextlib.suppress(NotFound):
                self.k.delete_session(self.ks.tenant, self.ks.id)

    def usage(self, produced: list[int]) -> Usage:
        prompt = self.context
        last = self.ks.ledger()[-1] if produced else None
        if last is not None and last["kind"] == "assistant":  # the turn's opener is prompt too
            closing = len(self.k.tokenizer.close_turn(produced[-1]))
            length = last["length"]
            assert isinstance(length, int)  # a ledger summary's length is its token count
            prompt += length - (len(produced) - 1) - closing
        return Usage(prompt_tokens=prompt, completion_tokens=len(produced), total_tokens=prompt + len(produced),
                     prompt_tokens_details=PromptTokensDetails(cached_tokens=min(self.cached, prompt)))

    def info(self, fingerprint: str | None) -> FakInfo:
        return FakInfo(session_id=self.ks.id, ephemeral=self.ephemeral, fingerprint=fingerprint,
                       admissions=self.admissions, ignored=self.ignored)

    def finish_reason(self, produced: list[int]) -> Literal["stop", "length"]:
        return "stop" if produced and produced[-1] in self.k.tokenizer.stop_token_ids else "length"


def _open(k: Kernel, who: Principal, body: ChatCompletionRequest) -> _Run:
    """Validate, get the session, replay the messages into it. Nothing is created when
    validation fails; an ephemeral session is deleted when a later step fails."""
    params, ignored = _check(body)
    ops = _plan(body.messages)
    completion_id = "chatcmpl-" + uuid.uuid4().hex[:24]
    if body.fak_session is None:
        ks, ephemeral = k.create_session(who.tenant, completion_id), True
    else:
        try:
            ks = k.session(who.tenant, body.fak_session)
        except NotFound:
            try:
                ks = k.create_session(who.tenant, body.fak_session)
            except Conflict:  # created meanwhile by a concurrent request
                ks = k.session(who.tenant, body.fak_session)
        ephemeral = False
    run = _Run(k, ks, ephemeral, completion_id, params, ignored)
    try:
        before = ks.tokens
        if before and ops[0].kind == "system":
            raise Conflict(f"session {ks.id} already holds a conversation: send only the new messages "
                           "(a system message first means a resent history)")
        check_context(k, [op.text for op in ops], "these messages")
        mech0, hits0 = _hits(ks)
        for op in ops:
            if op.kind != "tool":
                ks.append(op.kind, op.text)
                continue
            data = op.text.encode("utf-8", "surrogatepass")
            a = ks.admit(op.tool, data)
            run.admissions.append(AdmissionInfo(
                message_index=op.index, tool=op.tool, tool_call_id=op.call_id, verdict=a.verdict.kind.value,
                rule_id=a.verdict.rule_id, ref=a.ref, admitted_ref=a.admitted_ref, admitted=a.admitted,
                segment_id=a.segment.id, audit_index=a.audit_index))
        mech1, hits1 = _hits(ks)
        run.cached = before + (hits1 - hits0 if mech1 is mech0 else hits1)
        run.context = ks.tokens
    except BaseException:
        run.close()
        raise
    return run


def _complete(k: Kernel, who: Principal, body: ChatCompletionRequest) -> ChatCompletion:
    run = _open(k, who, body)
    try:
        produced = list(run.ks.generate(**run.params))
        tok = k.tokenizer
        text = tok.decode_turn(produced)
        usage = run.usage(produced)
        fingerprint = run.ks.fingerprint()
    finally:
        run.close()
    return ChatCompletion(id=run.completion_id, created=int(time.time()), model=k.model_id,
                          choices=[Choice(message=AssistantMessage(content=text),
                                          finish_reason=run.finish_reason(produced))],
                          usage=usage, fak=run.info(fingerprint))


@router.post("/chat/completions", response_model=ChatCompletion,
             responses={200: {"content": {"text/event-stream": {}}}})
async def chat_completions(body: ChatCompletionRequest, who: Principal = Depends(AGENT),  # noqa: B008
                           k: Kernel = Depends(kernel)) -> ChatCompletion | StreamingResponse:  # noqa: B008
    """OpenAI chat completions over a session of the caller's tenant (see the module notes)."""
    if not body.stream:
        return await run_in_threadpool(_complete, k, who, body)
    held: dict[str, Any] = {}  # what to clean up if this handler is cancelled meanwhile

    def start() -> int | None:
        run = held["run"] = _open(k, who, body)
        stepper = held["stepper"] = Stepper(run.ks.generate(**run.params))
        return stepper.step()  # errors (busy, bad parameters) come before any 200

    try:
        first = await run_in_threadpool(start)
    except BaseException:
        if "run" in held:
            with anyio.CancelScope(shield=True):
                await run_in_threadpool(_shutdown, held["run"], held.get("stepper"))
        raise
    run, stepper = held["run"], held["stepper"]
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return _Stream(run, stepper, _chunks(run, stepper, first, include_usage))


def _shutdown(run: _Run, stepper: Stepper | None) -> None:
    if stepper is not None and not stepper.done:  # the client went away: roll the turn back
        stepper.close()
    run.close()


class _Stream(StreamingResponse):
    """SSE whose cleanup runs however the response ends, even if the body never started."""

    def __init__(self, run: _Run, stepper: Stepper, chunks: AsyncIterator[str]) -> None:
        super().__init__(chunks, media_type="text/event-stream",
                         headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
        self._run, self._stepper = run, stepper

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
                await run_in_threadpool(_shutdown, self._run, self._stepper)


def _event(run: _Run, choices: list[dict[str, Any]], **extra: Any) -> str:
    chunk = {"id": run.completion_id, "object": "chat.completion.chunk", "created": int(time.time()),
             "model": run.k.model_id, "system_fingerprint": None, "choices": choices} | extra
    return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"


def _delta(run: _Run, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
    return _event(run, [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], **extra)


async def _chunks(run: _Run, stepper: Stepper, first: int | None, include_usage: bool) -> AsyncIterator[str]:
    decoder = TextDecoder(run.k.tokenizer)
    produced: list[int] = []
    yield _delta(run, {"role": "assistant", "content": ""})
    token = first
    while token is not None:
        produced.append(token)
        piece = decoder.push(token)
        if piece:
            yield _delta(run, {"content": piece})
        token = await run_in_threadpool(stepper.step)
    tok = run.k.tokenizer
    full = tok.decode_turn(produced)
    if len(full) > len(decoder.emitted):  # a held-back tail (an incomplete character at the end)
        yield _delta(run, {"content": full[len(decoder.emitted):]})
    usage = await run_in_threadpool(run.usage, produced)
    fingerprint = await run_in_threadpool(run.ks.fingerprint)
    yield _delta(run, {}, run.finish_reason(produced), fak=run.info(fingerprint).model_dump())
    if include_usage:
        yield _event(run, [], usage=usage.model_dump())
    yield "data: [DONE]\n\n"
