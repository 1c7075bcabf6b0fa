"""Triage: one native pass over the whole input that proves most of it clean.

The input is folded (ASCII lower-cased in C; only non-ASCII runs go through the
per-code-point fold) and scanned once for every injection pattern plus the
triggers of the derived views (base64/hex runs, percent escapes, numeric HTML
references, de-spaced letters); the raw bytes are scanned once for every secret
format and for invisible, bidi and tag characters. Each hit marks a bounded
region around it; only those regions get the full treatment (``scan.prepare``
and the detectors). An input with no hit has no region and is admitted without
any Python-level scanning.

Regions are byte ranges on UTF-8 character boundaries, wide enough to hold the
longest pattern and the context the detectors read (``LEFT``/``RIGHT``); a
base64 or hex run is kept whole so it can be decoded.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass

from fak.policy import detectors
from fak.policy.hsdb import Multi, superset
from fak.policy.matcher import max_width
from fak.policy.normalize import fold
from fak.policy.patterns import FOLDED_TRIGGERS, RUN_TRIGGERS

LEFT = 1024  # bytes kept before a hit: longest pattern (~500) plus discussion context (300)
RIGHT = 512  # bytes kept after a hit: look-aheads and discussion context
CUSTOM_CAP = 4096  # widest custom-regex match the regions are sized for

_NON_ASCII = re.compile(rb"[\x80-\xff]+")
_RUN_END = {TRIGGER: re.compile(rx) for TRIGGER, rx in zip(
    RUN_TRIGGERS, (rb"[A-Za-z0-9+/_-]*={0,2}", rb"(?:[0-9a-fA-F]{2}[ :]?)*"), strict=True)}


@dataclass(frozen=True)
class Folded:
    """The folded input as bytes, with the non-ASCII runs that changed length."""

    data: bytes
    f_starts: list[int]  # folded start of each non-ASCII run
    f_ends: list[int]
    r_starts: list[int]  # raw start of each run
    r_ends: list[int]
    invalid: list[int]  # raw offsets of runs holding invalid UTF-8

    def to_raw(self, pos: int) -> int:
        i = bisect_right(self.f_starts, pos) - 1
        if i < 0:
            return pos
        if pos <= self.f_ends[i]:
            return self.r_ends[i]
        return self.r_ends[i] + (pos - self.f_ends[i])


def fold_bytes(data: bytes) -> Folded:
    """``fold`` of the whole input, paying the per-code-point fold only on non-ASCII runs."""
    if data.isascii():
        return Folded(data.lower(), [], [], [], [], [])
    parts: list[bytes] = []
    fs, fe, rs, re_, invalid = [], [], [], [], []
    pos = fpos = 0
    for m in _NON_ASCII.finditer(data):
        if m.start() > pos:
            parts.append(data[pos : m.start()].lower())
            fpos += m.start() - pos
        text = m.group().decode("utf-8", "surrogateescape")
        if any("\udc80" <= c <= "\udcff" for c in text):
            invalid.append(m.start())
        folded = fold(text).encode("utf-8", "surrogatepass")
        fs.append(fpos)
        rs.append(m.start())
        parts.append(folded)
        fpos += len(folded)
        fe.append(fpos)
        re_.append(m.end())
        pos = m.end()
    parts.append(data[pos:].lower())
    return Folded(b"".join(parts), fs, fe, rs, re_, invalid)


class CustomTriage:
    """The policy's own regex rules as native patterns (None: they cannot be compiled, scan all)."""

    def __init__(self, folded: list[re.Pattern[str]], raw: list[re.Pattern[str]]) -> None:
        self.width = max((max_width(rx.pattern, CUSTOM_CAP) for rx in folded + raw), default=0)
        self.folded = self._build(folded)
        self.raw = self._build(raw)
        self.ok = (self.folded is not False) and (self.raw is not False)

    @staticmethod
    def _build(regexes: list[re.Pattern[str]]) -> Multi | None | bool:
        if not regexes:
            return None
        try:
            return Multi([superset(rx.pattern) for rx in regexes],
                         caseless=[rx.flags & re.IGNORECASE for rx in regexes])
        except Exception:  # noqa: BLE001 - any construct Hyperscan refuses: fall back to a full scan
            return False


_CUSTOM: dict[tuple[str, tuple[str, ...]], CustomTriage] = {}


def custom_triage(key: str, folded: list[re.Pattern[str]], raw: list[re.Pattern[str]]) -> CustomTriage:
    """Memo of ``CustomTriage`` per policy digest and rule set (a pure function of them)."""
    k = (key, tuple(rx.pattern for rx in folded + raw))
    found = _CUSTOM.get(k)
    if found is None:
        found = _CUSTOM[k] = CustomTriage(folded, raw)
    return found


def _boundary(data: bytes, pos: int) -> int:
    """Move ``pos`` back to the start of a UTF-8 character."""
    while 0 < pos < len(data) and 0x80 <= data[pos] < 0xC0:
        pos -= 1
    return pos


def hot_regions(data: bytes, custom: CustomTriage | None = None, left: int = LEFT) -> list[tuple[int, int]]:
    """Byte ranges of ``data`` that need the full scan, merged and sorted; [] when clean."""
    size = len(data)
    if custom is not None and not custom.ok:
        return [(0, size)] if size else []
    if custom is not None:
        left = max(left, custom.width + RIGHT)
    folded = fold_bytes(data)
    spans: list[tuple[int, int]] = [(p, p) for p in folded.invalid]
    n_inj = detectors.INJ.count
    for pid, ends in detectors.INJ.db.ends(folded.data).items():
        trigger = FOLDED_TRIGGERS[pid - n_inj] if pid >= n_inj else None
        run = _RUN_END.get(trigger) if trigger is not None else None
        for end in ends:
            raw = folded.to_raw(end)
            stop = run.match(data, raw).end() if run is not None else raw
            spans.append((raw, stop))
    for ends in detectors.SEC.db.ends(data).values():
        spans.extend((e, e) for e in ends)
    if custom is not None:
        if custom.folded is not None:
            for ends in custom.folded.ends(folded.data).values():
                spans.extend((folded.to_raw(e), folded.to_raw(e)) for e in ends)
        if custom.raw is not None:
            for ends in custom.raw.ends(data).values():
                spans.extend((e, e) for e in ends)
    return _merge(data, spans, left)


def _merge(data: bytes, spans: list[tuple[int, int]], left: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    size = len(data)
    for a, b in sorted(spans):
        lo, hi = max(0, a - left), min(size, b + RIGHT)
        if out and lo <= out[-1][1]:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return [(_boundary(data, lo), _boundary(data, hi)) for lo, hi in out]
