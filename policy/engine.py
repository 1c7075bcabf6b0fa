"""Detection: the findings of a policy's detector rules over one input.

The gate (``gate.py``) decides from these findings; this module only finds them.
``findings`` is the one entry point: it scans the hot regions the triage picks,
leaves out injection findings that cannot reach any injection threshold, and scans
again in full when the pruned findings could fire an injection rule, so its result
decides exactly as a full scan would.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections import deque

from fak.policy import detectors, triage
from fak.policy.detectors import Finding
from fak.policy.policy import Policy
from fak.policy.scan import ALL_VIEWS, Scan, prepare
from fak.policy.schema import DetectorRule


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


def findings(policy: Policy, data: bytes, rules: list[DetectorRule]) -> dict[str, list[Finding]]:
    """Findings per detector (per ``regex:<rule id>`` for regex rules) of ``rules`` over
    ``data``: complete wherever an injection rule could fire."""
    floor = _injection_floor(rules) if len(data) >= PRUNE_MIN else None
    found, partial, tri = _scan(policy, data, rules, floor=floor)
    if partial and floor is not None and _score(found.get("injection", [])) >= floor:
        found = _scan(policy, data, rules, tri=tri)[0]
    return found
