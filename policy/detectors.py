"""What a detection is (``Finding``), and the two detectors that are code, not
signatures: an operator's own regex rules (``custom``) and repetition, a property of
the whole input (``repetition_findings``). The signature detectors (injection,
secrets, obfuscation, encoding) are data: ``signatures.yaml``, run by ``reference.py``.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fak.policy.reference import Scan


@dataclass(frozen=True)
class Finding:
    """One match: byte span in the input, score in [0, 1], the view (``layer``) it was
    found in; ``exact`` when the span maps position by position (not a whole decoded run)."""

    detector: str
    family: str
    name: str
    score: float
    start: int
    end: int
    exact: bool
    layer: str


def custom(scan: Scan, rule_id: str, rx: re.Pattern[str], folded: bool) -> list[Finding]:
    """An operator's regex rule over the folded views (``folded``) or the views as written."""
    out: list[Finding] = []
    seen: set[tuple[int, int]] = set()
    for view in scan.views("folded" if folded else "raw"):
        for m in rx.finditer(view.text):
            if m.end() == m.start():
                continue
            start, end, exact = scan.to_bytes(view, m.start(), m.end())
            if (start, end) not in seen:
                seen.add((start, end))
                out.append(Finding("regex", "custom", rule_id, 1.0, start, end, exact, view.layer))
    return out


REPETITION_SAMPLE = 65536


def repetition_score(data: bytes) -> float:
    """0 for ordinary text, 1 for heavy repetition: from the compression ratio of a
    bounded sample (ordinary prose and JSON compress 2-6x at level 1)."""
    sample = data[:REPETITION_SAMPLE]
    if not sample:
        return 0.0
    ratio = len(sample) / len(zlib.compress(sample, 1))
    return max(0.0, min(1.0, (ratio - 6.0) / 12.0))


def repetition_findings(data: bytes, min_bytes: int) -> list[Finding]:
    """Heavy repetition over the whole input (a property of the whole, not of a window)."""
    if len(data) < min_bytes:
        return []
    score = repetition_score(data)
    if score <= 0:
        return []
    return [Finding("repetition", "repetition", "repetition.compression", score, 0, len(data), False, "text")]
