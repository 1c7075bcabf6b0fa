"""Detection for the gate: the findings of a policy's detector rules over one input,
and how findings combine into a score. ``gate.py`` decides from them.

``findings`` takes the accelerated path (``accel.py``) when Hyperscan is there and
the reference path (``reference.py``) otherwise, or when asked; both give the same
findings (the equivalence tests in tests/policy/test_policy_triage.py).
"""

from __future__ import annotations

from collections import deque

from fak.policy import accel, reference
from fak.policy.detectors import Finding
from fak.policy.policy import Policy
from fak.policy.schema import DetectorRule

SIGNATURE_DETECTORS = frozenset({"injection", "secrets", "obfuscation", "encoding"})
SCORE_WINDOW = 1024  # bytes: findings further apart than this are not added up


def findings(policy: Policy, data: bytes, rules: list[DetectorRule], accelerated: bool = True
             ) -> dict[str, list[Finding]]:
    """Findings per detector (per ``regex:<rule id>`` for regex rules) of ``rules`` over
    ``data``. Repetition and size are the gate's (whole-input properties)."""
    norm = policy.spec.normalization
    wanted = {r.detector for r in rules} & SIGNATURE_DETECTORS
    regex_rules = [r for r in rules if r.detector == "regex"]
    if regex_rules:  # an operator's regex is not in the native database: the reference path, once
        scan = reference.Scan(data, norm.max_decode_depth, [norm.max_decoded_bytes])
        out = reference.run(scan, wanted)
        for rule in regex_rules:
            found = reference.custom(scan, rule.id, policy.custom[rule.id], rule.ignore_case)
            if found:
                out[f"regex:{rule.id}"] = found
        return out
    if not wanted:
        return {}
    if accelerated:
        return accel.findings(data, wanted, norm.max_decode_depth, norm.max_decoded_bytes)
    return reference.findings(data, wanted, norm.max_decode_depth, norm.max_decoded_bytes)


def score(found: list[Finding]) -> float:
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
