"""Tool-call authorization from the attention provenance (docs/design.md, Policy and Verdicts).

Guardrails judge text; the kernel knows which refs every live token attended to. A
policy's ``tool_calls`` rules say, per callable tool, what may be in attention when the
agent calls it — e.g. ``send_email`` is DENYed (or needs a person to CONFIRM) while any
ref produced by an ``untrusted`` tool is in attention. The decision names the offending
refs; the remedy is exact: evict them (RECOMPUTE), drop the turns generated while they
were in attention, and ask the model again — the session is then bit-exact to one that
never saw them.

The decision is a pure function of (policy, tool name, the set of refs in attention, the
tool each ref came from), memoised per policy digest, so it costs microseconds.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any, Literal

import blake3
import rfc8785

from fak.errors import InvalidInput
from fak.policy import tool_settings

if TYPE_CHECKING:
    from fak.kernel.kv.session import Session
    from fak.policy import Policy
    from fak.policy.schema import ToolCallRule
    from fak.state.store import StateStore

CallVerdict = Literal["ALLOW", "CONFIRM", "DENY"]
Producer = tuple[str, "str | None"]  # (tool name, source URL) of an admitted ref
_SEVERITY = {"ALLOW": 0, "CONFIRM": 1, "DENY": 2}
MAX_ARGS_BYTES = 1 << 20
UNKNOWN_TOOL = "?"  # the producing tool of a ref the kernel has no record of: judged untrusted


@dataclass(frozen=True)
class ToolCallDecision:
    """``verdict`` for calling ``tool`` now: the rule that decided (``unlisted`` when no rule
    names the tool, None when rules name it and none fired), the offending refs (in attention
    and matched by a firing rule), and the audit index of the decision."""

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

    @property
    def allowed(self) -> bool:
        return self.verdict == "ALLOW"


def args_bytes(args: Any) -> bytes:
    """Canonical JSON of the call's arguments (a JSON string is parsed first, as OpenAI sends it)."""
    if isinstance(args, str | bytes):
        try:
            args = json.loads(args) if args else {}
        except ValueError:
            args = {"_raw": args if isinstance(args, str) else args.decode("utf-8", "replace")}
    try:
        raw = rfc8785.dumps(args if args is not None else {})
    except Exception as exc:  # noqa: BLE001 - rfc8785 raises several types for non-JSON values
        raise InvalidInput(f"tool-call arguments are not JSON: {exc}") from None
    if len(raw) > MAX_ARGS_BYTES:
        raise InvalidInput(f"tool-call arguments are larger than {MAX_ARGS_BYTES} bytes")
    return raw


def args_digest(key: bytes, args: Any) -> str:
    """A keyed digest of the arguments: the log can show two calls had the same arguments
    without letting anyone confirm a guess of what they were."""
    return "blake3k:" + blake3.blake3(args_bytes(args), key=key).hexdigest()


class Authorizer:
    """Decides tool calls for one policy. Build one per policy digest (``for_policy``)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._rules: dict[str, list[ToolCallRule]] = {}
        self._trust: dict[Producer, str] = {}
        self._match: dict[tuple[str, Producer], bool] = {}

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

    def decide(self, tool: str, attention: dict[str, Producer]) -> ToolCallDecision:
        """``attention``: ref → its producer (tool, source URL), for every ref in attention now."""
        rules = self.rules_for(tool)
        spec = self.policy.spec
        if not rules:
            verdict: CallVerdict = spec.tool_calls.unlisted
            return self._finish(tool, verdict, "unlisted" if verdict != "ALLOW" else None, (), len(attention), ())
        best: CallVerdict = "ALLOW"
        best_rule: str | None = None
        offending: dict[str, None] = {}
        audited: list[str] = []
        for rule in rules:
            if rule.when_in_attention is None:
                hits: list[str] = []
            else:
                hits = [ref for ref, producer in attention.items() if self._matches(rule, producer)]
                if not hits:
                    continue
            if rule.action == "audit":
                audited.append(rule.id)
                continue
            offending.update(dict.fromkeys(hits))
            if _SEVERITY[rule.verdict] > _SEVERITY[best]:
                best, best_rule = rule.verdict, rule.id
        return self._finish(tool, best, best_rule, tuple(offending), len(attention), tuple(audited))

    def _finish(self, tool: str, verdict: CallVerdict, rule_id: str | None, offending: tuple[str, ...],
                count: int, audited: tuple[str, ...]) -> ToolCallDecision:
        p = self.policy
        if p.enforcing or verdict == "ALLOW":
            return ToolCallDecision(tool, verdict, rule_id, offending, count, p.digest, audited=audited)
        return ToolCallDecision(tool, "ALLOW", rule_id, offending, count, p.digest, enforced=False,
                                would_be=verdict, audited=audited)


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
    """The refs in the attention provenance of one session's live KV, each with the tool (and
    URL) that produced it: what ``Authorizer.decide`` reads. Cached until the ledger changes:
    every change appends a segment (more segments) or evicts one (fewer rows), so (session
    object, segments, rows) names a state."""

    def __init__(self, producers: Producers, tenant: str) -> None:
        self._producers = producers
        self._tenant = tenant
        self._cached: tuple[tuple[int, int, int], dict[str, Producer]] | None = None

    def of(self, s: Session) -> dict[str, Producer]:
        """The refs in ``s``'s attention with their producers."""
        key = (id(s), len(s.ledger.segments), s.cache.length)
        cached = self._cached
        if cached is None or cached[0] != key:
            refs = sorted(frozenset[str]().union(*(x.provenance for x in s.ledger.live())))
            cached = self._cached = (key, {ref: self._producers.of(self._tenant, ref) for ref in refs})
        return cached[1]
