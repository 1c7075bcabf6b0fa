"""Tool-call authorization from the attention provenance and the arguments' provenance
(docs/policy.md, "Tool-call authorization").

Guardrails judge text; the kernel knows which refs every live token attended to and which
text of the context each argument's value came from. A policy's ``tool_calls`` rules say,
per callable tool, what may be in attention when the agent calls it (``when_in_attention``:
e.g. CONFIRM ``send_email`` while an ``untrusted`` ref is in attention) and where its
arguments may come from (``when_args_from``: e.g. CONFIRM when the recipient or the IBAN
was found only in untrusted content). The decision names the offending refs and the
arguments that made a rule fire; the remedy is exact: evict the refs (RECOMPUTE), drop the
turns generated while they were in attention, and ask the model again.

The decision is a pure function of (policy, tool, arguments, the context in attention: each
segment's producer at admission and text), plus, for a call fak generated, the evidence
of the model's attention and an exact counterfactual when a rule asks for them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any, Literal, Protocol

import blake3
import rfc8785

from fak.errors import InvalidInput
from fak.kernel.calls.provenance import (
    ArgumentTrace,
    ContextIndex,
    ContextText,
    Shape,
    ValueSource,
    field_matches,
    leaves,
    shape_of_media,
    trace_arguments,
)
from fak.kernel.calls.tool_classes import ToolClass, classify, inferred_rules, number_paths
from fak.kernel.calls.tool_text import ToolSpec
from fak.kernel.calls.value_forms import ENTITY_KINDS, canonical_tokens, needle_of
from fak.kernel.kv.ledger import SegmentKind
from fak.policy import tool_settings

if TYPE_CHECKING:
    from fak.kernel.kv.session import Session
    from fak.policy import Policy
    from fak.policy.schema import ArgsMatch, Endorsement, ToolCallRule
    from fak.state.store import StateStore

CallVerdict = Literal["ALLOW", "CONFIRM", "DENY"]
Producer = tuple[str, "str | None"]  # (tool name, source URL) of an admitted ref
_SEVERITY = {"ALLOW": 0, "CONFIRM": 1, "DENY": 2}
_TRUST_RANK = {"untrusted": 0, "internal": 1, "trusted": 2}
MAX_ARGS_BYTES = 1 << 20
UNKNOWN_TOOL = "?"  # the producing tool of a ref the kernel has no record of: judged untrusted


@dataclass(frozen=True)
class Counterfactual:
    """The exact counterfactual of a call (``counterfactual: true``): each argument's
    log-probability with the offending refs in context and with them evicted (RECOMPUTE,
    bit-exact to a session that never saw them); ``acquitted`` when no argument was more
    than the rule's margin less likely without them."""

    refs: tuple[str, ...]
    logprob_with: dict[str, float]
    logprob_without: dict[str, float]
    acquitted: bool
    seconds: float


@dataclass(frozen=True)
class ToolCallDecision:
    """``verdict`` for calling ``tool`` now: the rule that decided (``unlisted`` when no rule
    fired and ``unlisted`` is not ALLOW; None when nothing fired and the call is allowed),
    the offending refs (matched by a firing rule), the arguments that made a rule fire
    (``triggers``: value, origin and sources, for the person asked to confirm), every
    argument's provenance (``arguments``), the model's attention evidence per argument and
    the counterfactual when they were computed, and the audit index of the decision."""

    tool: str
    verdict: CallVerdict
    rule_id: str | None
    offending: tuple[str, ...]
    attention_refs: int
    policy_digest: str
    enforced: bool = True
    would_be: CallVerdict | None = None
    audited: tuple[str, ...] = ()
    audit_index: int | None = None
    arguments: tuple[ArgumentTrace, ...] = ()
    triggers: tuple[ArgumentTrace, ...] = ()
    attention: Mapping[str, Mapping[str, RefMass]] = field(default_factory=dict)
    counterfactual: Counterfactual | None = None
    approved_by: int | None = None  # the audit index of a remembered approval that allowed it
    tool_class: ToolClass | None = None  # the schema-inferred class, when inferred rules decided

    @property
    def allowed(self) -> bool:
        return self.verdict == "ALLOW"


@dataclass(frozen=True)
class ContextEntry:
    """One segment of the context a call is made in: its text and, for a tool segment, its
    ref (the ref's producers are the context's), the producer and the media type it was admitted
    with (which declare its structure); a system or user turn has none."""

    segment: str
    ref: str | None
    text: str
    producer: Producer | None = None
    media_type: str | None = None


@dataclass(frozen=True)
class CallContext:
    """What a decision reads of a session: every ref in attention with the producers of the
    segments that carry it (a ref admitted twice has both), and the texts of the context."""

    producers: Mapping[str, tuple[Producer, ...]]
    entries: tuple[ContextEntry, ...] = ()
    tenant: str = ""

    @classmethod
    def of_refs(cls, attention: Mapping[str, Producer]) -> CallContext:
        """A context known only by its refs and their producers (no texts: every argument
        then traces to nothing, ``generated``)."""
        return cls({ref: (p,) for ref, p in attention.items()})

    @classmethod
    def of_entries(cls, entries: Sequence[ContextEntry], tenant: str = "") -> CallContext:
        """A context from its segments alone, as ``AttentionView`` reads a session's: every ref a
        tool segment carries is in attention, with the producers of the segments that carry it
        (a ref admitted twice, by two tools or from two sources, has both); system and user
        turns are texts with no ref. For a context built outside a session (``fak policy
        authorize``: a transcript judged offline), where no segment's provenance says more."""
        producers: dict[str, list[Producer]] = {}
        for e in entries:
            if e.ref is not None:
                found = producers.setdefault(e.ref, [])
                if e.producer is not None and e.producer not in found:
                    found.append(e.producer)
        return cls({ref: tuple(found) if found else ((UNKNOWN_TOOL, None),) for ref, found in producers.items()},
                   tuple(entries), tenant)


class RefMass(Protocol):
    """The attention mass an argument's tokens put on one ref's rows."""

    @property
    def per_layer(self) -> tuple[float, ...]: ...

    @property
    def mean(self) -> float: ...


class EvidenceSource(Protocol):
    """The model's side of a call fak generated: what its argument tokens attended to, and
    how likely it wrote them without some refs. Computed only when a firing rule asks; None
    when it cannot be had (the call's tokens could not be located): the rule then fires."""

    def attention(self) -> Mapping[str, Mapping[str, RefMass]] | None:
        """Argument name → ref → the attention mass its tokens put on the ref's rows."""
        ...

    def counterfactual(self, refs: Sequence[str]) -> tuple[dict[str, float], dict[str, float], float] | None:
        """Each argument's log-probability with and without ``refs`` (evicted exactly), and
        the seconds it took."""
        ...


def parsed_args(args: Any) -> Any:
    """The call's arguments as JSON values (OpenAI sends them as a JSON string; one that is not
    JSON is kept as ``{"_raw": text}``)."""
    if isinstance(args, str | bytes):
        try:
            return json.loads(args) if args else {}
        except ValueError:
            return {"_raw": args if isinstance(args, str) else args.decode("utf-8", "replace")}
    return args if args is not None else {}


def args_bytes(args: Any) -> bytes:
    """Canonical JSON of the call's arguments (``parsed_args`` first)."""
    try:
        raw = rfc8785.dumps(parsed_args(args))
    except Exception as exc:  # noqa: BLE001 - rfc8785 raises several types for non-JSON values
        raise InvalidInput(f"tool-call arguments are not JSON: {exc}") from None
    if len(raw) > MAX_ARGS_BYTES:
        raise InvalidInput(f"tool-call arguments are larger than {MAX_ARGS_BYTES} bytes")
    return raw


def args_digest(key: bytes, args: Any) -> str:
    """A keyed digest of the arguments: the log can show two calls had the same arguments
    without letting anyone confirm a guess of what they were."""
    return "blake3k:" + blake3.blake3(args_bytes(args), key=key).hexdigest()


@dataclass
class _Firing:
    rule: ToolCallRule
    offending: list[str]
    triggers: list[ArgumentTrace]


class Authorizer:
    """Decides tool calls for one policy. Build one per policy digest (``for_policy``)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._rules: dict[str, list[ToolCallRule]] = {}
        self._trust: dict[Producer, str] = {}
        self._match: dict[tuple[str, Producer], bool] = {}
        self._indexes: dict[int, tuple[CallContext, ContextIndex]] = {}
        self._classes: dict[tuple[str, str, str], tuple[ToolClass, list[ToolCallRule]]] = {}
        self._lock = threading.Lock()

    def rules_for(self, tool: str) -> list[ToolCallRule]:
        found = self._rules.get(tool)
        if found is None:
            spec = self.policy.spec.tool_calls
            found = [r for r in spec.rules if any(fnmatchcase(tool, g) for g in r.tools)]
            if len(self._rules) < 4096:
                self._rules[tool] = found
        return found

    def trust_of(self, producer: Producer) -> str:
        """Trust of a ref's producer (tool, source URL) under this policy, as the gate judges it
        (a tool entry may give a trust level only to some source hosts); unknown: untrusted."""
        if producer[0] == UNKNOWN_TOOL:
            return "untrusted"
        trust = self._trust.get(producer)
        if trust is None:
            trust = tool_settings(self.policy, producer[0], producer[1]).trust
            if len(self._trust) < 4096:
                self._trust[producer] = trust
        return trust

    def least_trust(self, producers: Sequence[Producer]) -> str:
        """The trust of content several producers delivered: the least trusted one's."""
        return min((self.trust_of(p) for p in producers), key=lambda t: _TRUST_RANK.get(t, 0), default="untrusted")

    def _matches(self, rule: ToolCallRule, producer: Producer) -> bool:
        key = (rule.id, producer)
        hit = self._match.get(key)
        if hit is None:
            cond = rule.when_in_attention
            assert cond is not None
            hit = self.trust_of(producer) in cond.trust and any(fnmatchcase(producer[0], g) for g in cond.tools)
            if len(self._match) < 65536:
                self._match[key] = hit
        return hit

    def shape_of(self, entry: ContextEntry) -> Shape:
        """The structure a tool segment's result declares: its media type at admission (JSON,
        YAML, ``message/rfc822``), else its tool's ``output`` in this policy; else text (no
        field paths, whatever the text looks like: its author does not choose them)."""
        shape = shape_of_media(entry.media_type)
        if shape == "text" and entry.producer is not None and entry.producer[0] != UNKNOWN_TOOL:
            shape = tool_settings(self.policy, entry.producer[0], entry.producer[1]).output or "text"
        return shape

    def texts(self, context: CallContext) -> list[ContextText]:
        """The context's texts with the trust this policy gives each (turns: trusted) and its
        fields (the least trusted producer's tool entry: ``fields``, ``free_text``), the
        structure each declares and the tools that produced it."""
        out = []
        for e in context.entries:
            if e.ref is None:
                out.append(ContextText(e.segment, None, "trusted", e.text))
                continue
            producers = context.producers.get(e.ref, ())
            trust = self.least_trust(producers)
            weakest = next((p for p in producers if self.trust_of(p) == trust), None)
            settings = tool_settings(self.policy, weakest[0], weakest[1]) \
                if weakest is not None and weakest[0] != UNKNOWN_TOOL else None
            out.append(ContextText(e.segment, e.ref, trust, e.text, self.shape_of(e),
                                   tuple(dict.fromkeys(p[0] for p in producers)),
                                   settings.fields if settings else (), settings.free_text if settings else None))
        return out

    def tool_class(self, tool: str, spec: ToolSpec | None, args: Any, tenant: str = ""
                   ) -> tuple[ToolClass, list[ToolCallRule]]:
        """The class of ``tool`` read from its declared schema and the call's argument names (or,
        without a schema, from those names and the tool's name), with the policy's ``classes`` applied, and
        the rules inferred for it; cached per tenant, tool and schema (how fast a decision is
        tells no tenant which schemas another declared)."""
        names = ",".join(sorted(map(str, args))) if isinstance(args, dict) else ""
        shape = (spec.line() if spec is not None else "") + "|" + names  # names beyond a schema count too
        key = (tenant, tool, shape)
        with self._lock:
            found = self._classes.get(key)
        if found is None:
            cls = classify(tool, spec, args, self.policy.spec.tool_calls.classes)
            found = (cls, inferred_rules(cls))
            with self._lock:
                if len(self._classes) >= 4096:
                    self._classes.clear()
                self._classes[key] = found
        return found

    def index(self, context: CallContext) -> ContextIndex:
        """The context's texts with this policy's trust, indexed once per context (a session's
        context object lives until its ledger changes)."""
        with self._lock:
            found = self._indexes.get(id(context))
            if found is not None and found[0] is context:
                return found[1]
        index = ContextIndex(self.texts(context), context.tenant)
        with self._lock:
            if len(self._indexes) >= 64:
                self._indexes.pop(next(iter(self._indexes)))
            self._indexes[id(context)] = (context, index)
        return index

    def decide(self, tool: str, context: CallContext | Mapping[str, Producer], args: Any = None,
               evidence: EvidenceSource | None = None, spec: ToolSpec | None = None) -> ToolCallDecision:
        """The decision on calling ``tool`` with ``args`` in ``context`` (a ``CallContext``, or
        a plain ref → producer map). ``evidence``: the model's, for a call fak generated.
        ``spec``: the tool as the agent declared it (description, JSON schema of its arguments);
        with the policy's ``from_schemas``, a tool no rule names is classified from it (or from
        the call's argument names) and decided by the rules inferred for it."""
        if not isinstance(context, CallContext):
            context = CallContext.of_refs(context)
        calls = self.policy.spec.tool_calls
        rules = self.rules_for(tool)
        parsed = parsed_args(args)
        inferred: ToolClass | None = None
        if not rules and calls.from_schemas:
            inferred, rules = self.tool_class(tool, spec, parsed, context.tenant)
        routed: tuple[str, ...] | None = None

        def counts_number(path: str) -> bool:  # an amount or a routing argument: traced however few its digits
            nonlocal routed
            if routed is None:
                routed = number_paths(inferred or self.tool_class(tool, spec, parsed, context.tenant)[0])
            return _path_matches(path, routed)

        traces: list[ArgumentTrace] | None = None
        if parsed and (context.entries or any(r.when_args_from for r in rules)):  # recorded for every call
            traces = trace_arguments(parsed, self.index(context), min_number_digits=calls.min_number_digits,
                                     counts_number=counts_number)
        firing: list[_Firing] = []
        audited: list[str] = []
        for rule in rules:
            fired = self._fires(rule, context, traces or [], parsed)
            if fired is None:
                continue
            if rule.action == "audit":
                audited.append(rule.id)
                continue
            firing.append(fired)
        attention: Mapping[str, Mapping[str, RefMass]] = {}
        counterfactual: Counterfactual | None = None
        if evidence is not None and any(f.rule.when_attention or f.rule.counterfactual for f in firing):
            firing, attention, counterfactual = self._weigh(firing, context, evidence)
        best: CallVerdict = "ALLOW"
        best_rule: str | None = None
        offending: dict[str, None] = {}
        triggers: dict[tuple[str, str | None], ArgumentTrace] = {}
        for f in firing:
            if best_rule is None or _SEVERITY[f.rule.verdict] > _SEVERITY[best]:
                best, best_rule = f.rule.verdict, f.rule.id
            if f.rule.verdict != "ALLOW":
                offending.update(dict.fromkeys(f.offending))
                triggers.update({(t.path, t.entity): t for t in f.triggers})
        if not firing:
            best = self.policy.spec.tool_calls.unlisted
            best_rule = "unlisted" if best != "ALLOW" else None
        return self._finish(ToolCallDecision(
            tool, best, best_rule, tuple(offending), len(context.producers), self.policy.digest,
            audited=tuple(audited), arguments=tuple(traces or ()), triggers=tuple(triggers.values()),
            attention=attention, counterfactual=counterfactual, tool_class=inferred))

    def _fires(self, rule: ToolCallRule, context: CallContext, traces: list[ArgumentTrace],
               args: Any) -> _Firing | None:
        """The rule's offending refs and triggering arguments if all its conditions hold."""
        offending: list[str] = []
        triggers: list[ArgumentTrace] = []
        if rule.when_args_absent is not None and any(
                _path_matches(path, rule.when_args_absent) for path, value in leaves(args) if _present(value)):
            return None
        if rule.when_in_attention is not None:
            seen = rule.when_in_attention
            fields = self.index(context).field_trusts() if context.entries else {}
            hits = [ref for ref, producers in context.producers.items()
                    if any(self._matches(rule, p) for p in producers)
                    or (not fields.get(ref, frozenset()).isdisjoint(seen.trust)
                        and any(fnmatchcase(p[0], g) for p in producers for g in seen.tools))]
            if not hits:
                return None
            offending += hits
        for cond in rule.when_args_from or ():
            found = [t for t in traces if _about(cond, t)]
            if not found:
                return None
            triggers += found
            offending += [src.ref for t in found for src in t.sources if src.ref and src.trust == t.origin]
        if rule.when_endorsed is not None:
            endorsed = self._endorsed(rule.when_endorsed, context, traces, args)
            if not endorsed:
                return None
            for trace, naming in endorsed:
                triggers.append(replace(trace, sources=naming))
                offending += [src.ref for src in naming if src.ref]
        return _Firing(rule, list(dict.fromkeys(offending)), triggers)

    def _endorsed(self, cond: Endorsement, context: CallContext, traces: list[ArgumentTrace], args: Any
                  ) -> list[tuple[ArgumentTrace, tuple[ValueSource, ...]]]:
        """The arguments at ``cond.args`` that text of ``cond.by`` names in an instruction, with
        the places that name them."""
        out: list[tuple[ArgumentTrace, tuple[ValueSource, ...]]] = []
        index = self.index(context)
        values = dict(leaves(args))
        for t in traces:
            if t.entity is not None or t.origin == "generated" or not _path_matches(t.path, cond.args):
                continue
            tokens = canonical_tokens(str(values.get(t.path, "")))
            if not tokens:
                continue
            naming = index.endorsers(needle_of(tokens), cond.by)
            if naming:
                out.append((t, tuple(naming)))
        return out

    def _weigh(self, firing: list[_Firing], context: CallContext, evidence: EvidenceSource
               ) -> tuple[list[_Firing], Mapping[str, Mapping[str, RefMass]], Counterfactual | None]:
        """Acquit firing rules the model's evidence clears: attention below the rule's
        threshold, or a counterfactual in which the call is as likely without the refs."""
        attention: Mapping[str, Mapping[str, RefMass]] | None = None
        if any(f.rule.when_attention for f in firing):
            attention = evidence.attention()
        counterfactual: Counterfactual | None = None
        kept: list[_Firing] = []
        for f in firing:
            rule = f.rule
            if rule.when_attention is not None and attention is not None:
                trusts = set(rule.when_attention.trust)
                refs = {ref for ref, ps in context.producers.items() if self.least_trust(ps) in trusts}
                share = max((sum(m.mean for ref, m in per.items() if ref in refs) for per in attention.values()),
                            default=0.0)
                if share <= rule.when_attention.above:
                    continue
            if rule.counterfactual and f.offending:
                if counterfactual is None or set(counterfactual.refs) != set(f.offending):
                    found = evidence.counterfactual(f.offending)
                    if found is not None:
                        with_, without, seconds = found
                        acquitted = bool(with_) and all(
                            without.get(a, float("-inf")) >= lp - rule.counterfactual_margin for a, lp in with_.items())
                        counterfactual = Counterfactual(tuple(f.offending), with_, without, acquitted, seconds)
                if counterfactual is not None and set(counterfactual.refs) == set(f.offending) \
                        and counterfactual.acquitted:
                    continue
            kept.append(f)
        return kept, attention or {}, counterfactual

    def _finish(self, d: ToolCallDecision) -> ToolCallDecision:
        if self.policy.enforcing or d.verdict == "ALLOW":
            return d
        return replace(d, verdict="ALLOW", enforced=False, would_be=d.verdict)


def _path_matches(path: str, globs: Sequence[str]) -> bool:
    """``path`` (``recipients.0``) or one of its prefixes (``recipients``) matches a glob."""
    parts = path.split(".")
    prefixes = [".".join(parts[: i + 1]) for i in range(len(parts))]
    return any(fnmatchcase(p, g) for g in globs for p in prefixes)


def _present(value: Any) -> bool:
    """A leaf that gives an argument a value (not null, not an empty string)."""
    return value is not None and value != ""


def _about(cond: ArgsMatch, trace: ArgumentTrace) -> bool:
    """Does an argument's trace satisfy an ``ArgsMatch``?"""
    if trace.entity is not None and not cond.entities:
        return False
    if cond.entities_only and trace.entity is None and trace.kind not in ENTITY_KINDS:
        return False
    if trace.origin not in cond.trust or not _path_matches(trace.path, cond.args):
        return False
    if cond.except_fields:
        weak = [s for s in trace.sources if s.trust == trace.origin]
        if weak and all(_excused(s, cond) for s in weak):
            return False
    return True


def _excused(source: ValueSource, cond: ArgsMatch) -> bool:
    """A value that is a field ``except_fields`` names (or, with ``except_inside_fields``, lies
    inside one), of a result of declared structure that only tools ``except_tools`` names
    produced."""
    return (source.field is not None and (not source.inside or cond.except_inside_fields)
            and any(field_matches(source.field, g) for g in cond.except_fields)
            and bool(source.tools) and all(any(fnmatchcase(t, g) for g in cond.except_tools) for t in source.tools))


class Authorizers:
    """The authorizer of the active policy, rebuilt when the policy's digest changes."""

    def __init__(self) -> None:
        self._found: Authorizer | None = None

    def current(self, policy: Policy) -> Authorizer:
        found = self._found
        if found is None or found.policy.digest != policy.digest:
            found = self._found = Authorizer(policy)
        return found


class Producers:
    """Which tool (and URL) produced each admitted ref: authorization asks per call, so the
    answer is cached in memory over the state database's record."""

    MAX = 65536

    def __init__(self, state: StateStore) -> None:
        self._state = state
        self._lock = threading.Lock()
        self._known: dict[tuple[str, str], Producer] = {}

    def of(self, tenant: str, ref: str) -> Producer:
        """The producer of ``ref`` (``?``, None if the kernel has no record: judged untrusted)."""
        found = self._known.get((tenant, ref))
        if found is None:
            meta = self._state.ref(tenant, ref)
            found = (meta.tool, meta.source) if meta is not None else (UNKNOWN_TOOL, None)
            self.note(tenant, ref, found)
        return found

    def note(self, tenant: str, ref: str, producer: Producer) -> None:
        """Remember which tool (and URL) produced ``ref``."""
        with self._lock:
            if len(self._known) >= self.MAX:
                self._known.clear()
            self._known[(tenant, ref)] = producer

    def forget_tenant(self, tenant: str) -> None:
        """Drop every record of ``tenant`` (its erasure)."""
        with self._lock:
            self._known = {key: v for key, v in self._known.items() if key[0] != tenant}

    def clear(self) -> None:
        """Drop the cache: the next question reads the state database (as after a restart)."""
        with self._lock:
            self._known.clear()


class AttentionView:
    """What a decision reads of one session's live KV (``CallContext``): the refs in the
    attention provenance, each with the producers of the segments that carry it (recorded at
    admission or placement: trust belongs to the segment, not to the bytes; only a segment
    appended without one falls back to the ref's record), and the texts of the live system,
    user and tool segments. Cached until the ledger changes: every change appends a segment
    (more segments) or evicts one (fewer rows), so (session object, segments, rows) names a state."""

    def __init__(self, producers: Producers, tenant: str) -> None:
        self._producers = producers
        self._tenant = tenant
        self._cached: tuple[tuple[int, int, int], CallContext] | None = None

    def of(self, s: Session) -> CallContext:
        """The context of ``s`` now."""
        key = (id(s), len(s.ledger.segments), s.cache.length)
        cached = self._cached
        if cached is None or cached[0] != key:
            cached = self._cached = (key, self._build(s))
        return cached[1]

    def _build(self, s: Session) -> CallContext:
        refs = sorted(frozenset[str]().union(*(x.provenance for x in s.ledger.live())))
        by_segment: dict[str, list[Producer]] = {}
        for seg in s.ledger.segments:
            if seg.kind is SegmentKind.TOOL and seg.ref and seg.tool:
                by_segment.setdefault(seg.ref, []).append((seg.tool, seg.source))
        producers: dict[str, tuple[Producer, ...]] = {}
        for ref in refs:
            found = by_segment.get(ref)
            producers[ref] = tuple(dict.fromkeys(found)) if found else (self._producers.of(self._tenant, ref),)
        entries: list[ContextEntry] = []
        for seg in s.ledger.live():
            message = s.message(seg.id)
            if message is None:
                continue
            if seg.kind in (SegmentKind.SYSTEM, SegmentKind.USER):
                entries.append(ContextEntry(seg.id, None, message["content"]))
            elif seg.kind is SegmentKind.TOOL and seg.ref:
                producer = (seg.tool, seg.source) if seg.tool else None
                entries.append(ContextEntry(seg.id, seg.ref, message["content"], producer, seg.media_type))
        return CallContext(producers, tuple(entries), self._tenant)
