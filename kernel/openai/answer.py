"""One choice of an OpenAI-compatible answer: sample it, read the tool calls it writes, and
give each call fak's verdict before anything leaves the server (docs/openai.md).

``run_answer`` is a generator the chat door drives one model step at a time (``None`` for a
step that shows nothing yet, ``str`` for content a stream may send, an ``Answer`` last), so
the streamed and the non-streamed answers are the same computation. For every call the
model wrote, the decision is ``KernelSession.authorize_tool_call``'s (the same decision and
audit event as the SDK's): ``ALLOW`` calls are returned; ``CONFIRM`` calls are held for a
person (``fak.kernel.calls.held``) and returned only, marked held, to clients that asked
for them (``fak_held_calls: return``); a ``DENY`` never reaches the client: under the
policy's ``tool_calls.on_deny: evict_and_retry`` (the default) the offending refs and the
turns they caused are evicted exactly and the model asked again (at most
``tool_calls.max_retries`` times), else the answer is a refusal.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

from fak import wire as w
from fak.errors import InvalidInput
from fak.kernel.calls.formats import HERMES_SYNTAX, CallSyntax, ToolFormat, format_for
from fak.kernel.calls.generated import GeneratedCall, generated_calls
from fak.kernel.calls.held import HeldCall
from fak.kernel.calls.records import findings_out
from fak.kernel.calls.tool_text import OPEN, ParsedCall
from fak.kernel.kv.ledger import SegmentKind, SegmentState
from fak.kernel.model.generate import TokenHook
from fak.kernel.openai.constrain import (
    CompiledGrammar,
    Constrainer,
    Grammar,
    GrammarHook,
    auto_grammar,
    json_grammar,
    json_or_calls_grammar,
    tool_calls_grammar,
)
from fak.kernel.openai.params import ChatParameters
from fak.kernel.openai.sampling import LogitBias, LogprobRecorder, Penalties, StopStrings, token_bytes
from fak.kernel.session.kernel_session import TurnReceipt
from fak.kernel.session.tokens import TextDecoder, timed_tokens

if TYPE_CHECKING:
    from fak.kernel.calls.authorize import ToolCallDecision
    from fak.kernel.model.tokenizer import ChatTokenizer
    from fak.kernel.services import Services
    from fak.kernel.session.kernel_session import KernelSession

Finish = Literal["stop", "length", "tool_calls"]


@dataclass(frozen=True)
class AnswerPlan:
    """What every choice of a request is decoded and decided under, built once (``plan_answer``)
    before the request changes anything: a schema the grammar engine refuses, or a token id
    outside the vocabulary, is a 400 with nothing appended to the session."""

    parameters: ChatParameters
    principal: str  # as the tool-call decisions record it
    names: frozenset[str]  # the tools whose calls are read back and decided (empty: calls off)
    grammar: CompiledGrammar | None  # compiled when planned: what llguidance refuses is the 400
    logit_bias: LogitBias | None
    hooks: tuple[TokenHook, ...] = ()  # an in-process caller's own sampling hooks, applied first


def plan_answer(tokenizer: ChatTokenizer, parameters: ChatParameters, principal: str, *, calls: bool) -> AnswerPlan:
    """The plan of a request's answers; ``calls``: the tools are in attention and tool_choice is not none."""
    bias = LogitBias.from_openai(parameters.logit_bias, tokenizer.vocab_size) if parameters.logit_bias else None
    fmt = format_for(tokenizer)
    g = grammar(parameters, calls=calls, syntax=fmt.call_syntax(tokenizer))
    compiled = Constrainer.for_tokenizer(tokenizer).compile(g) if g is not None else None
    if compiled is not None and calls and parameters.choice.mode in ("required", "function"):
        least = Constrainer.for_tokenizer(tokenizer).shortest_call(compiled)
        if least is not None and parameters.max_tokens < least:
            raise InvalidInput(f"max_tokens: {parameters.max_tokens} tokens cannot hold the tool call tool_choice "
                               f"asks for: the shortest such call takes {least} tokens with this model's tokenizer "
                               "(its markup and the end of the turn included); raise max_tokens (or "
                               "max_completion_tokens) to at least that", param="max_tokens")
    return AnswerPlan(parameters=parameters, principal=principal,
                      names=frozenset(t.name for t in parameters.tools) if calls else frozenset(),
                      grammar=compiled, logit_bias=bias)


@dataclass
class Answer:
    """A finished choice: what the message says, the calls returned, every verdict, the
    remedies applied, and the tokens it cost."""

    index: int
    content: str | None
    refusal: str | None
    tool_calls: list[w.ToolCallOut]
    verdicts: list[w.CallVerdictInfo]
    remedies: list[w.RemedyInfo]
    finish: Finish
    produced: list[int]  # the tokens of the answer's last attempt
    sampled: int  # tokens sampled over every attempt (completion_tokens)
    logprobs: w.ChoiceLogprobs | None
    context: int  # tokens in the session before the answer's last attempt
    streamed: str = ""  # content already sent by a stream
    decide_s: float = 0.0  # reading the calls and deciding them: what the verdicts add to the turn
    fingerprint: str | None = None  # the session's KV fingerprint as the kept turn was committed (None: not kept)
    # refs whose bytes the answer's content and calls may carry: its last attempt's content provenance
    provenance: frozenset[str] = frozenset()
    # and those of the retried attempts whose text a stream was already given (it stays sent):
    # what holds the streamed text (a stored streamed response) is sealed under both
    sent_provenance: frozenset[str] = frozenset()


@dataclass
class _Attempt:
    hooks: list[TokenHook] = field(default_factory=list)
    stops: StopStrings | None = None
    recorder: LogprobRecorder | None = None


def _hooks(plan: AnswerPlan, tok: ChatTokenizer, grammar: TokenHook | None) -> _Attempt:
    """This attempt's sampling hooks, in order: the caller's, biases and penalties, the
    grammar, stop strings, and the log-probability recorder last (it reports what was drawn
    from). Stateful ones are the attempt's own."""
    p, a = plan.parameters, _Attempt(hooks=list(plan.hooks))
    if plan.logit_bias is not None:
        a.hooks.append(plan.logit_bias)
    if p.presence_penalty or p.frequency_penalty:
        a.hooks.append(Penalties(p.presence_penalty, p.frequency_penalty))
    if grammar is not None:
        a.hooks.append(grammar)
    if p.stop:
        a.stops = StopStrings(p.stop, lambda ids: tok.decode(ids, skip_special=True), tok.stop_token_ids)
        a.hooks.append(a.stops)
    if p.logprobs:
        a.recorder = LogprobRecorder(p.top_logprobs)
        a.hooks.append(a.recorder)
    return a


def grammar(p: ChatParameters, *, calls: bool, syntax: CallSyntax = HERMES_SYNTAX) -> Grammar | None:
    """The grammar the answers are decoded under, if any: ``required`` or a named function make
    every answer calls of those tools; ``auto`` with a strict tool makes a started call follow
    its schema; ``response_format`` json makes a text answer JSON (of its schema).
    The calls are written in the model family's ``syntax`` (``ToolFormat.call_syntax``;
    docs/openai.md, "The tool format")."""
    mode = p.choice.mode if calls else "none"
    # each schema named as the request holds it, in errors (error.param)
    specs = [replace(t, where=f"tools[{i}].function.parameters") for i, t in enumerate(p.tools)]
    rf = p.response_format
    answer = "response_format.json_schema.schema" if rf is not None and rf.kind == "json_schema" else "response_format"
    if mode in ("required", "function"):
        tools = [t for t in specs if mode == "required" or t.name == p.choice.function]
        return tool_calls_grammar(tools, parallel=p.parallel, syntax=syntax)
    if mode == "auto" and rf is not None:
        return json_or_calls_grammar(rf.schema, specs, parallel=p.parallel, syntax=syntax, what=answer)
    if mode == "auto" and any(t.strict for t in specs):
        return auto_grammar(specs, parallel=p.parallel, syntax=syntax)
    if rf is not None:
        return json_grammar(rf.schema, what=answer)
    return None


def run_answer(services: Services, ks: KernelSession, plan: AnswerPlan, index: int,
               *, keep: bool) -> Generator[None | str | Answer, None, None]:
    """Drive one choice in ``ks`` (see the module notes); ``keep=False`` undoes the turn at its
    end (a sibling of the kept choice). Closing the generator early rolls the running turn back."""
    tok, p, names, g = services.tokenizer, plan.parameters, plan.names, plan.grammar
    remedies: list[w.RemedyInfo] = []
    shown_refs: set[str] = set()  # content provenance of the retried attempts a stream sent text of
    sampled, attempt = 0, 0
    while True:
        gh: GrammarHook | None = Constrainer.for_tokenizer(tok).hook(g) if g is not None else None
        a = _hooks(plan, tok, gh)
        seed = None if p.seed is None else (p.seed + 7919 * index + 104729 * attempt) % 2**64
        context = ks.tokens
        known = {v.id for v in ks.segments()}  # the turn's segment is the one added after these
        decoder = TextDecoder(tok)
        shown = Shown(a.stops.stops if a.stops is not None else [], calls=bool(names),
                      opens=format_for(tok).opens)
        produced: list[int] = []
        sent: list[str] = []  # this attempt's content a stream was given (a retried attempt's stays sent)
        sampling = p.sampling() | {"seed": seed} | ({"min_tokens": 0} if g is not None else {})  # a grammar ends turns
        decider = ks.call_decider(plan.principal, plan.parameters.tools) if names else None  # bound to the turn's attention by generate
        read: tuple[str, list[ParsedCall]] | None = None
        spent = 0.0  # deciding, while the turn is still open
        receipt = TurnReceipt()
        tokens = timed_tokens(ks.generate(keep=keep, decider=decider, receipt=receipt, hooks=tuple(a.hooks),
                                          **sampling), services.events, ks.tenant)
        try:
            for token in tokens:
                produced.append(token)
                if decider is not None and read is None and token in tok.stop_token_ids:
                    # the calls are all written: decide them now, so the log commits the decisions
                    # while the turn closes (its closing forward and ledger write come next)
                    t0 = time.perf_counter()
                    read = _read(tok, produced, a.stops, names)
                    for i, call in enumerate(read[1]):  # the turn is open: its evidence can be computed
                        decider.decide(call.name, call.arguments,
                                       turn=_locator(tok, list(produced), i, call, format_for(tok)))
                    spent += time.perf_counter() - t0
                piece = shown.feed(decoder.push(token))
                if piece:
                    sent.append(piece)
                    yield piece
                else:
                    yield None
        finally:
            tokens.close()  # closing early rolls the turn back
        turn_refs = _turn_provenance(ks, known)
        sampled += len(produced)
        t0 = time.perf_counter()
        if read is None:  # ended by max_tokens, or no tools: read (and decide) now
            read = _read(tok, produced, a.stops, names)
            if decider is not None:
                for call in read[1]:
                    decider.decide(call.name, call.arguments)
        content, calls = read  # calls only where tools are enabled, hence a decider
        judged = list(zip(calls, decider.settle() if decider is not None else [], strict=True))
        denied = [d for _, d in judged if d.verdict == "DENY"]
        policy = services.policy.spec.tool_calls
        offending = sorted({r for d in denied for r in d.offending})
        if denied and policy.on_deny == "evict_and_retry" and offending and attempt < policy.max_retries:
            evicted = ks.evict_refs(offending, drop_generated=True, reason="tool_call_denied")
            remedies.append(w.RemedyInfo(action="evict_and_retry", tool=denied[0].tool, rule_id=denied[0].rule_id,
                                         evicted_refs=offending, evicted_segments=evicted.segment_ids,
                                         exactness=evicted.exactness, fingerprint=evicted.fingerprint,
                                         choice=index))
            if sent:  # the client holds this attempt's text: what keeps the stream keeps its refs
                shown_refs |= turn_refs
            attempt += 1
            continue
        answer = _finish(services, ks, plan, index, content, judged, remedies, produced, sampled, a.recorder, "".join(sent),
                         context, stopped=a.stops is not None and a.stops.matched, refs=decider.refs if decider else (),
                         closed=gh is not None and gh.closed_to_fit and (gh.accepting or gh.finished))
        answer.decide_s = spent + time.perf_counter() - t0
        answer.provenance, answer.sent_provenance = turn_refs, frozenset(shown_refs)
        answer.fingerprint = receipt.fingerprint
        yield answer
        return


def _turn_provenance(ks: KernelSession, known: set[str]) -> frozenset[str]:
    """The content provenance of the turn just generated: its assistant segment's (every ref
    live while it was produced, kept in the ledger through any later eviction); for a turn not
    kept (a sibling, an empty turn) what that segment would have had, the live segments'
    refs. A segment a concurrent request added meanwhile only widens it."""
    views = ks.segments()
    turns = [v for v in views if v.id not in known and v.kind is SegmentKind.ASSISTANT]
    if turns:
        return frozenset(r for v in turns for r in v.content_provenance)
    return frozenset(r for v in views if v.state is SegmentState.LIVE for r in (*v.provenance, *v.content_provenance))


def _locator(tok: ChatTokenizer, produced: list[int], i: int, call: ParsedCall, fmt: ToolFormat
             ) -> Callable[[], GeneratedCall | None]:
    """Finds the ``i``-th call of a turn among its tokens (in the family's syntax ``fmt``), when
    a rule asks for evidence; the turn's stop token is not part of its text."""

    def locate() -> GeneratedCall | None:
        text = [t for t in produced if t not in tok.stop_token_ids]
        found = generated_calls(text, token_bytes(tok.tk), fmt)
        same = [g for g in found if g.name == call.name and g.arguments == call.arguments]
        if i < len(found) and found[i] in same:
            return found[i]
        return same[0] if len(same) == 1 else None

    return locate


def _read(tok: ChatTokenizer, produced: list[int], stops: StopStrings | None,
          names: frozenset[str]) -> tuple[str, list[ParsedCall]]:
    """(content, calls) of the tokens of a turn: its text, cut at a stop string, calls read back.
    A turn the model did not end itself (``max_tokens``, the context, a stop string) may end
    inside a call it could not complete: the content ends where that call began (what a stream
    holds back: ``ToolFormat.safe_text_len``), so a call's markup never reaches the content."""
    text = tok.decode_turn(produced)
    cut = stops is not None and stops.matched
    if stops is not None:
        text = stops.cut(text)
    if not names:
        return text, []
    fmt = format_for(tok)
    content, calls = fmt.parse_calls(text, names)
    if cut or not (produced and produced[-1] in tok.stop_token_ids):
        content = without_unfinished_call(fmt, content)
    return content, calls


def without_unfinished_call(fmt: ToolFormat, content: str) -> str:
    """``content`` (what ``parse_calls`` left of a turn cut short) up to where a call it could
    not complete begins, in the family's syntax ``fmt``: what a stream would have sent of it."""
    return content[: fmt.safe_text_len(content)]


class Shown:
    """What a stream may send of a turn's text, fed piece by piece: nothing from the first
    stop string on, nor from a call's opening (``<tool_call>``) on, and not yet an end that
    may still become one (as ``StopStrings.safe_prefix_len`` and ``safe_text_len`` say of the
    whole text). Only the text not sent yet is looked at, and it stays short: an end held back
    is shorter than the longest stop string or opening, and once one is found only what can
    still matter before it is kept. So each piece costs the same however long the turn."""

    def __init__(self, stops: list[str], *, calls: bool, opens: tuple[str, ...] = (OPEN,)) -> None:
        self._groups = [g for g in (stops, list(opens) if calls else []) if g]
        self._reach = max((len(x) for g in self._groups for x in g), default=0)
        self.held = ""  # decoded, not sent

    def feed(self, piece: str) -> str:
        """The text that may be sent now, ``piece`` having been decoded."""
        if not self._groups:
            return piece
        held = self.held + piece
        limit, found = len(held), None
        for group in self._groups:
            hits = [i for i in (held.find(x) for x in group) if i >= 0]
            if hits:
                found = min(hits) if found is None else min(found, *hits)
                limit = min(limit, min(hits))
            else:
                limit = min(limit, len(held) - _begun(held, group))
        out, self.held = held[:limit], held[limit:]
        if found is not None:  # nothing from ``found`` on is ever sent: keep what may still begin before it
            self.held = self.held[: found - limit + self._reach]
        return out


def _begun(text: str, group: list[str]) -> int:
    """The length of the longest end of ``text`` (shorter than a string of ``group``) that begins one."""
    for k in range(min(len(text), max(len(x) for x in group) - 1), 0, -1):
        tail = text[-k:]
        if any(x.startswith(tail) for x in group):
            return k
    return 0


class CallSession(Protocol):
    """What issuing a turn's calls needs of its session: a kernel session, or a gateway session
    (``fak.kernel.gateway.session``)."""

    tenant: str
    id: str

    def approval_key(self, name: str, args: Any, decision: ToolCallDecision) -> str: ...


@dataclass
class Issued:
    """A turn's decided calls as the answer carries them: those returned, every verdict, the
    notes a message gets for held calls, and the refusal of a denied one."""

    returned: list[w.ToolCallOut]
    verdicts: list[w.CallVerdictInfo]
    notes: list[str]
    refusal: str | None


def issue_calls(services: Services, session: CallSession, principal: str, held_calls: str, index: int,
                judged: list[tuple[ParsedCall, ToolCallDecision]], refs: tuple[str, ...] = (),
                upstream: str | None = None) -> Issued:
    """Give each decided call its id and fate: ALLOW returned, CONFIRM held for a person (kept in
    the state database) and returned only to clients that asked (``held_calls == "return"``),
    DENY refused."""
    holds = services.holds
    out = Issued([], [], [], None)
    for call, d in judged:
        held = d.verdict == "CONFIRM"
        cid = holds.new_id(session.tenant, call.name, call.arguments, held=held)  # an allowed call's id names its form
        tool_call = w.ToolCallOut(id=cid, function=w.FunctionCallOut(name=call.name, arguments=call.arguments_json))
        holds.issue(session.tenant, cid, call.name)
        if held:  # kept in the state database: every replica, and a restart, refuse its result until approved
            holds.hold(HeldCall(tenant=session.tenant, session_id=session.id, call_id=cid, tool=call.name,
                                arguments=call.arguments, rule_id=d.rule_id, offending=d.offending,
                                decision_index=d.audit_index, created=time.time(),
                                approval_key=session.approval_key(call.name, call.arguments, d),
                                producer=principal, findings=tuple(findings_out(d)), refs=refs))
        give = d.verdict == "ALLOW" or (held and held_calls == "return")
        if give:
            out.returned.append(tool_call)
        elif held:
            out.notes.append(f"[fak] The call to {call.name} is held for approval ({cid}); a person approves it with "
                             f"POST /v1/tool-calls/{cid}/approve.")
        else:
            out.refusal = (f"fak refused the call to {call.name}: policy rule {d.rule_id or 'unlisted'} denies it"
                           + (f" ({len(d.offending)} ref(s) involved)." if d.offending else "."))
        out.verdicts.append(w.CallVerdictInfo(id=cid, name=call.name, verdict=d.verdict, rule_id=d.rule_id,
                                              offending=list(d.offending), enforced=d.enforced, returned=give,
                                              held=held, audit_index=d.audit_index, findings=findings_out(d),
                                              approved_by=d.approved_by, choice=index, upstream=upstream))
    return out


def refusal_remedy(issued: Issued, index: int) -> w.RemedyInfo:
    """The ``refuse`` remedy of an answer whose denied call was not retried."""
    denied = next(v for v in issued.verdicts if v.verdict == "DENY")
    return w.RemedyInfo(action="refuse", tool=denied.name, rule_id=denied.rule_id, evicted_refs=[],
                        evicted_segments=[], exactness=None, fingerprint=None, choice=index)


def _finish(services: Services, ks: KernelSession, plan: AnswerPlan, index: int, content: str,
            judged: list[tuple[ParsedCall, ToolCallDecision]], remedies: list[w.RemedyInfo], produced: list[int],
            sampled: int, recorder: LogprobRecorder | None, streamed: str, context: int, *, stopped: bool,
            refs: tuple[str, ...] = (), closed: bool = False) -> Answer:
    p, tok = plan.parameters, services.tokenizer
    issued = issue_calls(services, ks, plan.principal, p.held_calls, index, judged, refs)
    if closed and issued.verdicts:  # the grammar closed the turn's last call to fit its budget
        issued.verdicts[-1] = issued.verdicts[-1].model_copy(update={"closed_to_fit": True})
    returned, verdicts, notes, refusal = issued.returned, issued.verdicts, issued.notes, issued.refusal
    if refusal is not None:
        remedies.append(refusal_remedy(issued, index))
    text = "\n".join([t for t in (content, *notes, refusal or "") if t])
    finish: Finish
    if returned:
        finish = "tool_calls"
    elif stopped or (produced and produced[-1] in tok.stop_token_ids):
        finish = "stop"
    else:
        finish = "length"
    logprobs = None
    if recorder is not None:
        entries = recorder.content(token_bytes(tok.tk), skip=tok.stop_token_ids)
        logprobs = w.ChoiceLogprobs(content=[w.TokenLogprob.model_validate(e) for e in entries])
    return Answer(index=index, content=text if (text or not returned) else None, refusal=refusal,
                  tool_calls=returned, verdicts=verdicts, remedies=remedies, finish=finish, produced=produced,
                  sampled=sampled, logprobs=logprobs, context=context, streamed=streamed)
