"""The chat door for a model fak forwards instead of running (docs/gateway.md): a request
naming one of the deployment's upstreams becomes a gateway session (``fak.kernel.gateway``)
whose history is forwarded to the upstream, and whose answer is governed as fak's own.

What is the same as for fak's model (``fak.kernel.openai.chat``): the messages are validated
(``plan_messages``), each tool message is admitted through the gate under the tool of the call
it answers (a held call's result refused, a rejected one's replaced by a notice), the tools
block is admitted as content of its own, every call in the answer is decided with argument
provenance against the conversation and logged before it acts, ALLOW is returned, CONFIRM held
for a person, DENY never reaches the client (``evict_and_retry``: the offending results and the
assistant turns that read them leave the forwarded history and the upstream is asked again;
``refuse``), and the answer's ``fak`` field reports it all.

What differs: there is no KV, so no attention evidence and no counterfactual (a rule that asks
for them fires, and each verdict names the upstream); the upstream's own parameters are
forwarded as the client sent them (fak's extensions and ``store``/``metadata`` are not);
``n`` is 1; the session lasts the request (``fak_session`` is refused: the client's history is
the conversation's state). A stream sends the upstream's content as it arrives; its tool calls
follow once decided, one delta each.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from fak import wire as w
from fak.kernel.calls.authorize import parsed_args
from fak.kernel.calls.tool_text import ParsedCall, ToolSpec, render_call, tool_choice, tool_specs
from fak.kernel.gateway.session import GatewaySession
from fak.kernel.gateway.upstream import Upstream, UpstreamError
from fak.kernel.kv.ledger import SegmentKind
from fak.kernel.openai.answer import Answer, Finish, issue_calls, refusal_remedy
from fak.kernel.openai.history import HistoryItem, new_suffix
from fak.kernel.openai.params import UnsupportedParameter
from fak.kernel.session.caller import Caller, Right
from fak.types import TOOL_DEFINITIONS

if TYPE_CHECKING:
    from fak.kernel.calls.authorize import ToolCallDecision
    from fak.kernel.facade import Kernel

__all__ = ["ForwardPlan", "ForwardTurn", "open_forward"]

# fields of a request that are fak's, never the upstream's: the extensions, and what would make the
# upstream keep the conversation outside fak's reach (``store``) or carry fak's metadata
NOT_FORWARDED = frozenset({"model", "messages", "stream", "stream_options", "n", "fak_session", "fak_held_calls",
                           "store", "metadata"})
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call")
FINISHES: dict[str, Finish] = {"stop": "stop", "length": "length", "tool_calls": "tool_calls",
                               "function_call": "tool_calls"}


class MessageOp(Protocol):
    """A request message as the chat door planned it (``fak.kernel.openai.chat.ChatOp``)."""

    @property
    def index(self) -> int: ...

    @property
    def kind(self) -> Literal["system", "user", "assistant", "tool"]: ...

    @property
    def text(self) -> str: ...

    @property
    def tool(self) -> str: ...

    @property
    def call_id(self) -> str | None: ...


@dataclass(frozen=True)
class ForwardPlan:
    """What a forwarded request is answered under: the decisions' principal, whether calls are
    read, how held calls are given, and the upstream's own parameters as the client sent them."""

    principal: str
    calls: bool
    held_calls: str
    fields: dict[str, Any]
    metadata: dict[str, str] | None
    ignored: tuple[str, ...] = ()
    include_usage: bool = False  # a stream's usage chunk, asked by the client (and then of the upstream)
    tools: dict[str, ToolSpec] = field(default_factory=dict)  # the request's tools: their schemas classify them


def forward_plan(body: w.ChatCompletionRequest, principal: str) -> ForwardPlan:
    if body.n not in (None, 1):
        raise UnsupportedParameter("n: a forwarded model answers one choice per request (n = 1)", param="n")
    specs = tool_specs(body.tools if body.tools is not None else
                       [{"type": "function", "function": f} for f in body.functions or []])
    choice = tool_choice(body.tool_choice if body.tool_choice is not None else body.function_call, specs)
    fields = {k: v for k, v in body.model_dump(exclude_unset=True).items()
              if k not in NOT_FORWARDED and not k.startswith("fak_")}
    ignored = tuple(k for k in ("store", "metadata") if k in body.model_fields_set)
    return ForwardPlan(principal=principal, calls=bool(specs) and choice.mode != "none",
                       held_calls=body.fak_held_calls or "withhold", fields=fields, metadata=body.metadata,
                       ignored=ignored, include_usage=bool(body.stream_options and body.stream_options.include_usage),
                       tools={t.name: t for t in specs})


@dataclass
class ForwardTurn:
    """One forwarded request: its gateway session (known to withdrawals until ``close``), the
    upstream, and what the answer reports."""

    kernel: Kernel
    session: GatewaySession
    upstream: Upstream
    plan: ForwardPlan
    streaming: bool
    completion_id: str = field(default_factory=lambda: "chatcmpl-" + uuid.uuid4().hex[:24])
    admissions: list[w.AdmissionInfo] = field(default_factory=list)
    tools_ref: str | None = None
    tools_admitted: bool = True
    usage_in: list[dict[str, Any]] = field(default_factory=list)  # each upstream call's usage
    _scope: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    @property
    def ephemeral(self) -> bool:
        return not self.session.persistent

    @property
    def model(self) -> str:
        return self.upstream.name

    def fingerprint(self) -> str:
        return self.session.fingerprint()

    def close(self) -> None:
        self._scope.close()

    def answers(self) -> Iterator[tuple[int, Generator[None | str | Answer, None, None]]]:
        yield 0, forward_answer(self)

    def request(self) -> dict[str, Any]:
        """The body the upstream receives now: the client's parameters, the live history."""
        body = dict(self.plan.fields)
        if not self.tools_admitted:
            for name in TOOL_FIELDS:
                body.pop(name, None)
        body |= {"model": self.upstream.model, "messages": self.session.forwarded(), "stream": self.streaming}
        if self.streaming and self.plan.include_usage:  # as the client asked: not every upstream takes it
            body["stream_options"] = {"include_usage": True}
        salt = self.upstream.salt(self.kernel.services.keys.derive(f"fak/gateway/cache-salt:{self.session.tenant}"))
        if salt is not None:
            body["cache_salt"] = salt
        return body

    def usage(self, answers: list[Answer]) -> w.Usage:
        """The upstream's usage: the last attempt's prompt, every attempt's completion tokens."""
        last = self.usage_in[-1] if self.usage_in else {}
        prompt = _count(last.get("prompt_tokens"))
        completion = sum(_count(u.get("completion_tokens")) for u in self.usage_in)
        details = last.get("prompt_tokens_details")
        cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else 0
        return w.Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                       prompt_tokens_details=w.PromptTokensDetails(cached_tokens=min(cached, prompt)))

    def info(self, fingerprint: str | None, answers: list[Answer]) -> w.FakInfo:
        return w.FakInfo(session_id=self.session.id, ephemeral=self.ephemeral, fingerprint=fingerprint,
                         admissions=self.admissions, ignored=list(self.plan.ignored),
                         tool_calls=[v for a in answers for v in a.verdicts],
                         remedies=[r for a in answers for r in a.remedies], tools_ref=self.tools_ref,
                         metadata=self.plan.metadata, upstream=self.upstream.name)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def open_forward(k: Kernel, c: Caller, body: w.ChatCompletionRequest, up: Upstream, ops: Sequence[MessageOp],
                 principal: str) -> ForwardTurn:
    """The request's gateway session, its messages appended and its tool results admitted (the
    ops are the chat door's, validated and with held calls' results settled). Closed here on
    any failure."""
    c.require(Right.AGENT)
    plan = forward_plan(body, principal)
    turn: ForwardTurn | None = None
    scope = contextlib.ExitStack()
    try:
        gs = scope.enter_context(k.gateway_sessions.open(c.tenant, up.name, body.fak_session))
        turn = ForwardTurn(k, gs, up, plan, bool(body.stream), _scope=scope)
        if gs.segments:  # a persistent session: a resent history appends only its new suffix
            ops = ops[new_suffix(gs, [HistoryItem(op.kind, op.text, op.tool) for op in ops]):]
        tools = body.tools if body.tools is not None else body.functions
        lead = next((i for i, op in enumerate(ops) if op.kind != "system"), len(ops))
        for i, op in enumerate(ops):
            if i == lead and tools:
                _add_tools(turn, tools)
            msg = body.messages[op.index]
            if op.kind == "tool":
                a = gs.admit(op.tool, op.text.encode("utf-8", "surrogatepass"), call_id=op.call_id, name=msg.name)
                turn.admissions.append(w.AdmissionInfo(
                    message_index=op.index, tool=op.tool, tool_call_id=op.call_id, verdict=a.verdict.kind.value,
                    rule_id=a.verdict.rule_id, ref=a.ref, admitted_ref=a.admitted_ref, admitted=a.admitted,
                    segment_id=a.segment.id, audit_index=a.audit_index))
            else:
                gs.append(SegmentKind(op.kind), msg.model_dump(exclude_none=True), text=op.text)
        if lead == len(ops) and tools:
            _add_tools(turn, tools)
    except BaseException:
        scope.close()
        raise
    return turn


def _add_tools(turn: ForwardTurn, tools: list[dict[str, Any]]) -> None:
    """The tools the upstream is sent, through the gate as content of their own (a poisoned
    description is a tool result like any other); kept out, no tools are forwarded."""
    data = json.dumps(tools, ensure_ascii=False, sort_keys=True).encode("utf-8")
    ref = turn.kernel.store.digest_of(data, turn.session.tenant)
    if turn.session.holds_live(ref):  # a persistent session has them from an earlier request
        turn.tools_ref, turn.tools_admitted = ref, True
        return
    a = turn.session.admit(TOOL_DEFINITIONS, data, call_id=None, in_history=False)
    turn.admissions.append(w.AdmissionInfo(message_index=-1, tool=TOOL_DEFINITIONS, tool_call_id=None,
                                           verdict=a.verdict.kind.value, rule_id=a.verdict.rule_id, ref=a.ref,
                                           admitted_ref=a.admitted_ref, admitted=a.admitted,
                                           segment_id=a.segment.id, audit_index=a.audit_index))
    turn.tools_ref = a.admitted_ref if a.admitted else None
    turn.tools_admitted = a.admitted


@dataclass
class _Reply:
    """One upstream answer, read whole or assembled from its stream."""

    content: str = ""
    refusal: str | None = None
    calls: dict[int, dict[str, str]] = field(default_factory=dict)  # index -> {id, name, arguments}
    finish: str | None = None
    logprobs: Any = None

    def call(self, index: int) -> dict[str, str]:
        return self.calls.setdefault(index, {"id": "", "name": "", "arguments": ""})

    def parsed(self) -> list[ParsedCall]:
        out = []
        for _, c in sorted(self.calls.items()):
            if not c["name"]:
                raise UpstreamError("the upstream wrote a tool call without a name")
            args = parsed_args(c["arguments"])
            out.append(ParsedCall(c["name"], args if isinstance(args, dict) else {"_raw": c["arguments"]}))
        return out


def _whole(turn: ForwardTurn, body: dict[str, Any]) -> _Reply:
    out = turn.kernel.services.upstreams.complete(turn.upstream, body)
    if isinstance(out.get("usage"), dict):
        turn.usage_in.append(out["usage"])
    choice = out["choices"][0]
    msg = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(msg, dict):
        raise UpstreamError(f"upstream {turn.upstream.name}: a choice without a message")
    reply = _Reply(content=msg.get("content") or "", refusal=msg.get("refusal"), finish=choice.get("finish_reason"),
                   logprobs=choice.get("logprobs"))
    for i, tc in enumerate(msg.get("tool_calls") or []):
        fn = tc.get("function") if isinstance(tc, dict) else None
        if isinstance(fn, dict):
            reply.calls[i] = {"id": str(tc.get("id") or ""), "name": str(fn.get("name") or ""),
                              "arguments": _args_text(fn.get("arguments"))}
    fc = msg.get("function_call")
    if isinstance(fc, dict):
        reply.calls[len(reply.calls)] = {"id": "", "name": str(fc.get("name") or ""),
                                         "arguments": _args_text(fc.get("arguments"))}
    return reply


def _args_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value if value is not None else {})


def _streamed(turn: ForwardTurn, body: dict[str, Any], reply: _Reply) -> Iterator[str]:
    """The upstream's stream: content pieces yielded as they come, the calls assembled into
    ``reply`` (held back until decided)."""
    for chunk in turn.kernel.services.upstreams.stream(turn.upstream, body):
        if isinstance(chunk.get("usage"), dict):
            turn.usage_in.append(chunk["usage"])
        for ch in chunk.get("choices") or []:
            if not isinstance(ch, dict) or ch.get("index", 0) != 0:
                continue
            delta = ch.get("delta") or {}
            piece = delta.get("content")
            if isinstance(piece, str) and piece:
                reply.content += piece
                yield piece
            if isinstance(delta.get("refusal"), str):
                reply.refusal = (reply.refusal or "") + delta["refusal"]
            for tc in delta.get("tool_calls") or []:
                if not isinstance(tc, dict):
                    continue
                c = reply.call(tc.get("index", 0) if isinstance(tc.get("index"), int) else 0)
                c["id"] = c["id"] or str(tc.get("id") or "")
                raw = tc.get("function")
                fn: dict[str, Any] = raw if isinstance(raw, dict) else {}
                if isinstance(fn.get("name"), str):
                    c["name"] += fn["name"]
                if isinstance(fn.get("arguments"), str):
                    c["arguments"] += fn["arguments"]
            fc = delta.get("function_call")
            if isinstance(fc, dict):
                c = reply.call(10_000)  # the legacy single call, after any tool call
                if isinstance(fc.get("name"), str):
                    c["name"] += fc["name"]
                if isinstance(fc.get("arguments"), str):
                    c["arguments"] += fc["arguments"]
            if ch.get("finish_reason"):
                reply.finish = ch["finish_reason"]


def forward_answer(turn: ForwardTurn) -> Generator[None | str | Answer, None, None]:
    """The one choice of a forwarded request: ask the upstream, decide every call it wrote, and
    apply the DENY remedy (at most ``tool_calls.max_retries`` times) before anything is answered."""
    services, gs, plan = turn.kernel.services, turn.session, turn.plan
    remedies: list[w.RemedyInfo] = []
    shown_refs: set[str] = set()
    attempt = 0
    while True:
        body = turn.request()
        refs = gs.provenance()
        reply = _Reply()
        sent: list[str] = []
        if turn.streaming:
            for piece in _streamed(turn, body, reply):
                sent.append(piece)
                yield piece
        else:
            reply = _whole(turn, body)
            yield None
        t0 = time.perf_counter()
        calls = reply.parsed()
        judged: list[tuple[ParsedCall, ToolCallDecision]] = [(c, gs.decide(c.name, c.arguments, plan.principal,
                                                                                plan.tools.get(c.name)))
                                                             for c in calls]
        denied = [d for _, d in judged if d.verdict == "DENY"]
        policy = services.policy.spec.tool_calls
        offending = sorted({r for d in denied for r in d.offending})
        if denied and policy.on_deny == "evict_and_retry" and offending and attempt < policy.max_retries:
            evicted = gs.evict_refs(offending)
            remedies.append(w.RemedyInfo(action="evict_and_retry", tool=denied[0].tool, rule_id=denied[0].rule_id,
                                         evicted_refs=offending, evicted_segments=evicted.segment_ids,
                                         exactness=None, fingerprint=evicted.fingerprint, choice=0))
            if sent:
                shown_refs |= refs
            attempt += 1
            continue
        issued = issue_calls(services, gs, plan.principal, plan.held_calls, 0, judged, tuple(sorted(refs)),
                             upstream=turn.upstream.name)
        if issued.refusal is not None:
            remedies.append(refusal_remedy(issued, 0))
        text = "\n".join([t for t in (reply.content, *issued.notes, issued.refusal or "") if t])
        finish: Finish = "tool_calls" if issued.returned else FINISHES.get(reply.finish or "stop", "stop")
        if finish == "tool_calls" and not issued.returned:
            finish = "stop"
        answer = Answer(index=0, content=text if (text or not issued.returned) else None,
                        refusal=issued.refusal or reply.refusal, tool_calls=issued.returned, verdicts=issued.verdicts,
                        remedies=remedies, finish=finish, produced=[],
                        sampled=sum(_count(u.get("completion_tokens")) for u in turn.usage_in),
                        logprobs=_logprobs(reply.logprobs), context=0, streamed="".join(sent))
        answer.decide_s = time.perf_counter() - t0
        answer.provenance, answer.sent_provenance = frozenset(refs), frozenset(shown_refs)
        _keep(gs, answer)
        yield answer
        return


def _keep(gs: GatewaySession, answer: Answer) -> None:
    """The answer as the session's next assistant message (the client resends it as it got it:
    its content and fak's calls, matched as the chat door renders them)."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.content}
    if answer.tool_calls:
        message["tool_calls"] = [c.model_dump() for c in answer.tool_calls]
    lines = [answer.content] if answer.content else []
    lines += [render_call(c.function.name, c.function.arguments) for c in answer.tool_calls]
    gs.append(SegmentKind.ASSISTANT, message, text="\n".join(lines))


def _logprobs(value: Any) -> w.ChoiceLogprobs | None:
    if not isinstance(value, dict):
        return None
    try:
        return w.ChoiceLogprobs.model_validate(value)
    except ValueError:
        return None

