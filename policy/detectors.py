"""What a detection is (``Finding``), and the detector that is code, not signatures:
repetition, a property of the whole input (``repetition_findings``). The signature
detectors (injection, secrets, obfuscation, encoding) are data: ``signatures.yaml``, run
by ``reference.py``, which also runs an operator's own regex rules (``reference.custom``)
over the same views.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass


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
