"""The reference detection path: fold → views → signatures → findings.

Read this module first; everything else in detection is either data
(``signatures.yaml``) or speed (``accel.py``, which must find exactly what this
finds). For one input:

1. decode the bytes (invalid UTF-8 kept as one lone surrogate per byte);
2. build its views (``normalize.py``): the text as written (``raw``), its folded form,
   the folded form de-spaced and unescaped, and every base64/hex run that decodes to
   text, recursively as a text of its own, within the policy's depth and byte bounds;
3. run every signature of the wanted detectors over the views it reads;
4. map each match back to bytes of the input and report it as a ``Finding`` with the
   signature's weight as its score. Nothing else changes a score.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Set

import numpy as np

from fak.policy import signatures
from fak.policy.detectors import Finding
from fak.policy.normalize import View, despace_view, fold_view, payloads, unescape_view


class Scan:
    """The views of one input, and the map from their positions to input bytes."""

    def __init__(self, data: bytes, max_depth: int = 2, budget: list[int] | None = None,
                 derived: bool = True, decode: bool = True, clean: Callable[[bytes], bool] | None = None,
                 starts: tuple[list[int], list[int]] | None = None) -> None:
        self.data = data
        self.root = View(data.decode("utf-8", "surrogateescape"), "text")
        self.raw: list[View] = []  # case kept: the text, then decoded payloads
        self.folded: list[View] = []  # lower-case normal forms of each raw view, de-spaced, unescaped
        self._offsets: np.ndarray | None = None
        # ``derived``/``decode`` False skip the input's own de-spaced and unescaped views / its
        # encoded runs, and ``clean`` (decoded bytes -> no signature or view trigger can
        # match) skips decoded texts, ``starts`` says where the input's encoded runs may begin:
        # for the accelerated path, which knows
        self._clean = clean
        self._starts = starts
        self._expand(self.root, max_depth, budget if budget is not None else [65536], derived, decode)

    def _expand(self, view: View, max_depth: int, budget: list[int], derived: bool = True,
                decode: bool = True) -> None:
        self.raw.append(view)
        folded = fold_view(view)
        self.folded.append(folded)
        for other in (despace_view(folded), unescape_view(folded)) if derived else ():
            if other is not None:
                self.folded.append(other)
        if view.depth >= max_depth or not decode:
            return
        for start, end, layer, raw in payloads(view.text, budget, self._starts if view.depth == 0 else None):
            if self._clean is not None and self._clean(raw):
                continue
            child = View(raw.decode("utf-8", "replace"), layer, view, [(0, start, end, False)], view.depth + 1)
            self._expand(child, max_depth, budget)

    def views(self, on: str) -> list[View]:
        return self.folded if on == "folded" else self.raw if on == "raw" else [self.root]

    def to_bytes(self, view: View, start: int, end: int) -> tuple[int, int, bool]:
        """A span of ``view`` as a byte span of the input (``exact``: position by position)."""
        start, end, exact = view.to_root(start, end)
        if len(self.root.text) == len(self.data):  # ASCII, or invalid bytes only: one byte per character
            return start, end, exact
        if self._offsets is None:
            codes = np.frombuffer(self.root.text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
            sizes = np.where(codes < 0x80, 1, np.where(codes < 0x800, 2, np.where(codes < 0x10000, 3, 4)))
            sizes[(codes >= 0xDC80) & (codes <= 0xDCFF)] = 1  # one invalid byte kept by surrogateescape
            self._offsets = np.concatenate(([0], np.cumsum(sizes)))
        return int(self._offsets[start]), int(self._offsets[end]), exact


def run(scan: Scan, detectors: Set[str], only: Mapping[str, list[tuple[int, int]] | None] | None = None
        ) -> dict[str, list[Finding]]:
    """Findings per detector of every signature of ``detectors`` over ``scan``'s views,
    sorted by position; the same signature at the same bytes is reported once. ``only``
    (for the accelerated path) limits the signatures run on the input's own text, not on
    text decoded from it, to those it names, searched in the ranges it gives (None: all)."""
    out: dict[str, list[Finding]] = {}
    seen: set[tuple[str, int, int]] = set()
    sigs = signatures.load()
    if only is not None and len(scan.raw) == 1:  # nothing decoded: only the named ones run at all
        sigs = tuple(s for s in sigs if s.id in only)
    for sig in sigs:
        if sig.detector not in detectors:
            continue
        for view in scan.views(sig.on):
            if only is not None and view.depth == 0:
                if sig.id not in only:
                    continue
                matches = _within(sig.regex, view.text, only[sig.id])
            else:
                matches = sig.regex.finditer(view.text)
            for m in matches:
                span = signatures.span(sig, m, view.text)
                if span is None or span[0] == span[1]:
                    continue
                start, end, exact = scan.to_bytes(view, *span)
                if (sig.id, start, end) in seen:
                    continue
                seen.add((sig.id, start, end))
                out.setdefault(sig.detector, []).append(
                    Finding(sig.detector, sig.family, sig.id, sig.weight, start, end, exact, view.layer))
    for found in out.values():
        found.sort(key=lambda f: (f.start, f.end, f.name))
    return out


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


def _within(rx: re.Pattern[str], text: str, ranges: list[tuple[int, int]] | None) -> Iterator[re.Match[str]]:
    if ranges is None:
        yield from rx.finditer(text)
        return
    for lo, hi in ranges:
        yield from rx.finditer(text, lo, hi)


def findings(data: bytes, detectors: Set[str], max_depth: int = 2, max_decoded: int = 65536,
             budget: list[int] | None = None) -> dict[str, list[Finding]]:
    """The reference findings of ``detectors`` over ``data`` (``budget``: a decoding
    budget shared with other calls, as a one-element list)."""
    return run(Scan(data, max_depth, budget if budget is not None else [max_decoded]), detectors)
