"""The admission gate: ``gate(policy, tool, data, context) -> Verdict``.

A pure function of (policy, input): it reads nothing global but memo tables of
pure functions, so it is safe to call from many threads. Order of work, cheapest
first: tool rule (a DENY tool is refused unread), media type, size (oversized
input gets a verdict without a scan), then one preparation of the text shared by
every detector rule that applies to this tool and trust level. The most
restrictive verdict wins; in audit mode the gate admits and says what it would
have done.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections import deque
from dataclasses import dataclass
from fnmatch import fnmatchcase

from fak.policy import detectors, triage
from fak.policy.detectors import Finding
from fak.policy.policy import Policy
from fak.policy.scan import ALL_VIEWS, Scan, prepare
from fak.policy.schema import DetectorRule, VerdictKind
from fak.policy.verdict import GateContext, Match, Verdict

REDACTION = b"[REDACTED:%s]"


@dataclass(frozen=True)
class ToolSettings:
    rule_id: str
    trust: str
    max_bytes: int
    media_types: tuple[str, ...]
    verdict: VerdictKind


def tool_settings(policy: Policy, tool: str) -> ToolSettings:
    """Exact name first, then the first glob that matches, else the defaults."""
    spec = policy.spec
    chosen = next((t for t in spec.tools if t.name == tool), None)
    if chosen is None:
        chosen = next((t for t in spec.tools if fnmatchcase(tool, t.name)), None)
    d = spec.defaults
    if chosen is None:
        return ToolSettings("default", d.trust, d.max_bytes, tuple(d.media_types), d.verdict)
    return ToolSettings(
        f"tool:{chosen.name}",
        chosen.trust or d.trust,
        chosen.max_bytes or d.max_bytes,
        tuple(chosen.media_types if chosen.media_types is not None else d.media_types),
        chosen.verdict or d.verdict,
    )


def _applies(rule: DetectorRule, tool: str, trust: str) -> bool:
    return trust in rule.trust and any(fnmatchcase(tool, pattern) for pattern in rule.tools)


def _sniff(data: bytes) -> str:
    return "application/octet-stream" if b"\x00" in data[:4096] else "text/plain"


def _media_ok(media: str, allowed: tuple[str, ...]) -> bool:
    base = media.split(";", 1)[0].strip().lower()
    return any(fnmatchcase(base, pattern) for pattern in allowed)


def _findings(scan: Scan, rule: DetectorRule, policy: Policy, cache: dict[str, list[Finding]]) -> list[Finding]:
    kind = rule.detector
    if kind == "regex":
        return detectors.custom(scan, rule.id, policy.custom[rule.id], rule.ignore_case)
    if kind == "semantic":  # ``scan`` is of the whole input (see ``_scan``); imported only when a policy uses it
        from fak.policy import semantic

        return semantic.detect(scan, rule.threshold)
    if kind not in cache:
        cache[kind] = getattr(detectors, kind)(scan)
    return cache[kind]


SCORE_WINDOW = 1024  # bytes: findings further apart than this are not added up


def _score(found: list[Finding]) -> float:
    """The score of the most suspicious stretch of ``SCORE_WINDOW`` bytes: within it, the
    strongest finding per family, families combined as independent evidence. A long
    document that mentions several families far apart does not add them up.

    Linear in the number of findings: the window's left edge steps through the findings
    in order while, per family, a queue of decreasing scores keeps the window's maximum."""
    if len(found) == 1:
        return found[0].score
    items = sorted(found, key=lambda f: f.start)
    queues: dict[str, deque[tuple[int, float]]] = {}
    top = 0.0
    j = 0
    for first in items:
        limit = first.start + SCORE_WINDOW
        while j < len(items) and items[j].start < limit:
            f = items[j]
            q = queues.setdefault(f.family, deque())
            while q and q[-1][1] <= f.score:
                q.pop()
            q.append((f.start, f.score))
            j += 1
        miss = 1.0
        for q in queues.values():
            while q and q[0][0] < first.start:
                q.popleft()
            if q:
                miss *= 1.0 - q[0][1]
        top = max(top, 1.0 - miss)
        if top >= 1.0 or j == len(items):
            break
    return top


def _redact(data: bytes, spans: list[tuple[int, int, str]]) -> bytes:
    out = bytearray()
    pos = 0
    for start, end, family in sorted(spans):
        if end <= pos:
            continue
        start = max(start, pos)
        out += data[pos:start] + REDACTION % family.encode()
        pos = end
    out += data[pos:]
    return bytes(out)


def _finish(policy: Policy, tool: str, kind: VerdictKind, rule_id: str, matches: list[Match],
            redacted: bytes | None, score: float, size: int) -> Verdict:
    # Plain (validating) construction: pydantic-core validates these few fields faster
    # than ``model_construct`` skips validation in Python (measured: 2.7 µs against 5.5 µs).
    if policy.enforcing or kind is VerdictKind.ALLOW:
        return Verdict(kind=kind, rule_id=rule_id, policy_digest=policy.digest, tool=tool, matches=matches,
                       redacted_bytes=redacted if kind is VerdictKind.REDACT else None, score=score, input_bytes=size)
    return Verdict(kind=VerdictKind.ALLOW, rule_id=rule_id, policy_digest=policy.digest, tool=tool, matches=matches,
                   enforced=False, would_be=kind, score=score, input_bytes=size)


def _scan_all(policy: Policy, data: bytes, rules: list[DetectorRule], triaged: bool = True) -> dict[str, list[Finding]]:
    """Findings per detector (per rule id for regex rules) over the hot regions only
    (``triaged=False``: over the whole input with every view, the reference the triage
    is tested against)."""
    return _scan(policy, data, rules, triaged)[0]


def _injection_floor(rules: list[DetectorRule]) -> float | None:
    """The lowest threshold of the injection rules (None: no such rule)."""
    return min((r.threshold for r in rules if r.detector == "injection"), default=None)


def _scan(policy: Policy, data: bytes, rules: list[DetectorRule], triaged: bool = True, floor: float | None = None,
          tri: triage.Triage | None = None) -> tuple[dict[str, list[Finding]], bool, triage.Triage | None]:
    """``_scan_all``, and with ``floor`` (the lowest injection threshold) it leaves out the
    injection findings of regions where they cannot reach it (``_quiet``): (findings,
    whether any region was left out, the triage made, which ``tri`` passes back in so a
    second scan does not repeat it)."""
    out: dict[str, list[Finding]] = {}
    norm = policy.spec.normalization
    meaning = [r for r in rules if r.detector == "semantic"]
    if meaning:  # a paraphrase has no trigger: the whole input, every view, not the triage's regions
        from fak.policy.semantic import whole_scan

        lowest = min(meaning, key=lambda r: r.threshold)
        found = _findings(whole_scan(data, norm.max_decode_depth, norm.max_decoded_bytes), lowest, policy, {})
        if found:
            out["semantic"] = found
    scanning = [r for r in rules if r.detector not in ("oversize", "repetition", "semantic")]
    if not scanning:
        return out, False, None
    custom = [policy.custom[r.id] for r in scanning if r.detector == "regex"]
    triage_custom = None
    if custom:
        triage_custom = triage.custom_triage(policy.digest, [rx for rx in custom if rx.flags & re.IGNORECASE],
                                             [rx for rx in custom if not rx.flags & re.IGNORECASE])
    budget = [norm.max_decoded_bytes]
    if triaged:
        tri = tri or triage.triage(data, triage_custom)
        regions, raw_ends, inj_ends = tri
    else:
        regions, raw_ends, inj_ends = [triage.Region(0, len(data), ALL_VIEWS)], None, None
    quiet = set() if floor is None or inj_ends is None else _quiet(data, regions, inj_ends, floor)
    for k, (lo, hi, views) in enumerate(regions):
        window = data[lo:hi]
        scan = prepare(window, norm.max_decode_depth, norm.max_decoded_bytes,
                       before=data[max(0, lo - detectors.QUOTE_LOOKBACK) : lo], budget=budget, derive=views,
                       child_triage=None if custom or not triaged else triage.text_views)
        if raw_ends is not None:  # the window's bytes were scanned already: no second scan
            scan.native[scan.root.text] = triage.region_ends(raw_ends, lo, hi)
        cache: dict[str, list[Finding]] = {"injection": []} if k in quiet else {}
        for rule in scanning:
            found = _findings(scan, rule, policy, cache)
            if not found:
                continue
            key = f"regex:{rule.id}" if rule.detector == "regex" else rule.detector
            if lo:
                found = [Finding(f.detector, f.family, f.name, f.score, f.start + lo, f.end + lo, f.exact, f.layer)
                         for f in found]
            out.setdefault(key, []).extend(found)
    return out, bool(quiet), tri


PRUNE_MIN = 8192  # bytes: below this, leaving regions out saves less than finding out which costs
REACH = SCORE_WINDOW + detectors.INJECTION_SPAN  # bytes around a region whose hits may share a window with its findings


def _quiet(data: bytes, regions: list[triage.Region], ends: dict[int, list[int]], floor: float) -> set[int]:
    """Regions whose injection findings cannot reach ``floor`` in any score window, so that
    leaving them out changes no verdict: every native hit of an injection pattern within
    ``REACH`` of the region (a finding's start lies within its pattern's longest match
    before the hit's end) is taken at its full weight, the strongest per family combined
    as ``_score`` does. Only regions scanned as plain text (no de-spaced, decoded or
    unescaped view, whose hits the native pass over the input does not see) qualify; a
    non-ASCII region is scanned folded on its own, where a pattern anchored at the start or
    end of text may also match at its edges, so those patterns count there as if they hit."""
    out: set[int] = set()
    plain = [k for k, region in enumerate(regions) if region.views == triage.NONE]
    if not plain:
        return out
    count = detectors.INJ.count
    hits = sorted((e, pid) for pid, found in ends.items() if pid < count for e in found)
    at = [e for e, _ in hits]
    ascii_input = data.isascii()
    for k in plain:
        lo, hi, _ = regions[k]
        best = {} if ascii_input or data[lo:hi].isascii() else dict(detectors.EDGE_WEIGHTS)
        for _, pid in hits[bisect_left(at, lo - REACH) : bisect_right(at, hi + REACH)]:
            family, weight = detectors.WEIGHTS[pid]
            if weight > best.get(family, 0.0):
                best[family] = weight
        miss = 1.0
        for weight in best.values():
            miss *= 1.0 - weight
        if 1.0 - miss < floor:
            out.add(k)
    return out


def _rule_findings(rule: DetectorRule, data: bytes, found: dict[str, list[Finding]]) -> list[Finding]:
    if rule.detector == "repetition":
        return detectors.repetition_findings(data, rule.min_bytes)
    return found.get(f"regex:{rule.id}" if rule.detector == "regex" else rule.detector, [])


_PLAN: dict[tuple[str, str], tuple[ToolSettings, list[DetectorRule]]] = {}
_PLAN_MAX = 4096


def _plan(policy: Policy, tool: str) -> tuple[ToolSettings, list[DetectorRule]]:
    """Tool settings and the detector rules that apply to ``tool``: a memo of a pure
    function of (policy digest, tool name), bounded in size."""
    key = (policy.digest, tool)
    found = _PLAN.get(key)
    if found is None:
        settings = tool_settings(policy, tool)
        found = (settings, [r for r in policy.spec.detectors if _applies(r, tool, settings.trust)])
        if len(_PLAN) >= _PLAN_MAX:
            _PLAN.clear()
        _PLAN[key] = found
    return found


def gate(policy: Policy, tool: str, data: bytes, context: GateContext | None = None) -> Verdict:
    """Decide whether ``data``, the result of ``tool``, may enter attention."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError("gate() takes the tool result as bytes")
    data = bytes(data)
    size = len(data)
    settings, rules = _plan(policy, tool)
    if settings.verdict is VerdictKind.DENY:
        return _finish(policy, tool, VerdictKind.DENY, settings.rule_id, [], None, 1.0, size)
    media = (context.media_type if context and context.media_type else None) or _sniff(data)
    if not _media_ok(media, settings.media_types):
        return _finish(policy, tool, VerdictKind.DENY, f"{settings.rule_id}:media_type", [], None, 1.0, size)
    limit = min(settings.max_bytes, policy.spec.normalization.max_scan_bytes)
    if size > limit:
        oversize = [r for r in rules if r.detector == "oversize"] or None
        worst = max(oversize, key=lambda r: r.verdict.severity) if oversize else None
        kind = worst.verdict if worst else VerdictKind.DENY
        rule_id = worst.id if worst else f"{settings.rule_id}:max_bytes"
        match = Match(rule_id=rule_id, detector="oversize", family="oversize", name="oversize.max_bytes",
                      start=limit, end=size, score=1.0, exact=True)
        return _finish(policy, tool, kind, rule_id, [match], None, 1.0, size)

    # Injection findings that cannot reach a threshold are left out at first; if an injection
    # rule fires all the same, every region is scanned again so that its matches are complete.
    floor = _injection_floor(rules) if size >= PRUNE_MIN else None
    found_all, partial, tri = _scan(policy, data, rules, floor=floor)
    decided = _decide(settings, rules, data, found_all)
    if partial and any(m.detector == "injection" for m in decided[3]):
        decided = _decide(settings, rules, data, _scan(policy, data, rules, tri=tri)[0])
    kind, rule_id, best_score, matches, redact_spans = decided
    redacted = _redact(data, redact_spans) if kind is VerdictKind.REDACT else None
    return _finish(policy, tool, kind, rule_id, matches, redacted, round(best_score, 4), size)


def _decide(settings: ToolSettings, rules: list[DetectorRule], data: bytes, found_all: dict[str, list[Finding]]
            ) -> tuple[VerdictKind, str, float, list[Match], list[tuple[int, int, str]]]:
    """The most restrictive rule that fires: (verdict, rule id, score, matches of every rule
    that fires, spans to redact)."""
    kind, rule_id, best_score = settings.verdict, settings.rule_id, 0.0
    matches: list[Match] = []
    redact_spans: list[tuple[int, int, str]] = []
    for rule in rules:
        if rule.detector == "oversize":
            continue
        found = _rule_findings(rule, data, found_all)
        if not found:
            continue
        if rule.families is not None:
            found = [f for f in found if f.family in rule.families]
        if not found:
            continue
        score = _score(found)
        if score < rule.threshold or score == 0.0:
            continue
        matches.extend(
            Match(rule_id=rule.id, detector=f.detector, family=f.family, name=f.name, start=f.start, end=f.end,
                  score=round(f.score, 4), exact=f.exact, layer=f.layer)
            for f in found
        )
        if rule.verdict is VerdictKind.REDACT:
            redact_spans.extend((f.start, f.end, f.family) for f in found)
        if (rule.verdict.severity, score) > (kind.severity, best_score):
            kind, rule_id, best_score = rule.verdict, rule.id, score
    return kind, rule_id, best_score, matches, redact_spans
