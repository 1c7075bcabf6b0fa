"""Triage: one native pass over the whole input that proves most of it clean.

The raw bytes are scanned once (Hyperscan) for every injection pattern (which
ignore ASCII case, so no lower-casing is needed), every secret format, and the
triggers of the derived views: base64/hex runs, percent escapes, numeric HTML
references, de-spaced letters, invisible/bidi/tag characters. Where folding
changes non-ASCII text (homoglyphs, full-width, zero-width, tag characters),
the folded bytes around it are scanned again. A base64/hex run is decoded on
the spot and its text triaged the same way (all runs in one native pass): a
run that decodes to nothing printable, or to clean text, needs no region.

Every other hit marks a region around it: room for the longest match of its
pattern plus the context the detectors read (``LEFT``/``RIGHT``/``CONTEXT``).
Regions are merged, put on UTF-8 character boundaries, and carry the derived
views their triggers call for; only they get the full treatment
(``scan.prepare`` and the detectors). An input with no hit has no region and
is admitted without any Python-level scanning. All of it is linear in the input.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from fak.policy import detectors
from fak.policy.hsdb import Multi, superset
from fak.policy.matcher import encode, max_width
from fak.policy.normalize import View, decoded_payloads, fold
from fak.policy.patterns import FOLDED_TRIGGERS, RUN_TRIGGERS, TRIGGER_BASE64, TRIGGER_DESPACE
from fak.policy.scan import ALL_VIEWS, DESPACE, MARKDOWN, PAYLOAD, ROOT, UNESCAPE

LEFT = 800  # bytes kept before a hit: longest match looked for (480) plus discussion context (300)
RIGHT = 400  # bytes kept after a hit: discussion context (300) and look-aheads
CONTEXT = 320  # bytes kept before the longest match of a pattern: discussion context, secret key names
RUN_MARGIN = 16  # bytes kept around a base64 or hex run (its decoded text is scanned on its own)
CUSTOM_CAP = 4096  # widest custom-regex match the regions are sized for
TRIAL_DECODE_BYTES = 1 << 22  # decoded bytes triage may look at per input before it stops proving runs clean

_RUN_END = {trigger: re.compile(rx) for trigger, rx in zip(
    RUN_TRIGGERS, (rb"[A-Za-z0-9+/_-]*={0,2}", rb"(?:[0-9a-fA-F]{2}[ :]?)*"), strict=True)}


NONE: frozenset[str] = frozenset({ROOT})  # a hit in the text itself: scan the text, derive nothing
_TRIGGER_VIEWS = dict(zip(FOLDED_TRIGGERS, (frozenset({ROOT, DESPACE}), frozenset({PAYLOAD}), frozenset({PAYLOAD}),
                                           frozenset({ROOT, UNESCAPE}), frozenset({ROOT, UNESCAPE}),
                                           frozenset({ROOT, MARKDOWN})), strict=True))
Span = tuple[int, int, frozenset[str]]
_FOLDED_ONLY = {TRIGGER_DESPACE}  # the one derived view built from folded text


class Region(NamedTuple):
    """A byte range that needs the full scan and the derived views its triggers call for."""

    start: int
    end: int
    views: frozenset[str]


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


_NON_ASCII = re.compile(rb"[\x80-\xff]+")
_FOLD_MEMO: dict[bytes, bytes] = {}  # memo of a pure function: folded form of a non-ASCII run
_FOLD_MEMO_MAX = 4096
_MAX_RUN_MEMO = 64


def _fold_run(run: bytes) -> bytes:
    found = _FOLD_MEMO.get(run)
    if found is None:
        found = fold(run.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogatepass")
        if len(run) <= _MAX_RUN_MEMO:
            if len(_FOLD_MEMO) >= _FOLD_MEMO_MAX:
                _FOLD_MEMO.clear()
            _FOLD_MEMO[run] = found
    return found


def _non_ascii_runs(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each maximal run of bytes >= 0x80 (whole UTF-8 characters), vectorised
    for large inputs."""
    if len(data) < 8192:
        return [m.span() for m in _NON_ASCII.finditer(data)]
    idx = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) >= 0x80)
    if not len(idx):
        return []
    cuts = np.flatnonzero(np.diff(idx) > 1)
    starts = np.concatenate(([idx[0]], idx[cuts + 1]))
    ends = np.concatenate((idx[cuts], [idx[-1]])) + 1
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def fold_bytes(data: bytes) -> Folded:
    """The input with every non-ASCII run replaced by its folded form (ASCII is left as is:
    the native patterns ignore ASCII case)."""
    if data.isascii():
        return Folded(data, [], [], [], [], [])
    try:
        data.decode("utf-8")
        valid = True
    except UnicodeDecodeError:
        valid = False
    parts: list[bytes] = []
    fs, fe, rs, re_, invalid = [], [], [], [], []
    pos = fpos = 0
    for start, end in _non_ascii_runs(data):
        run = data[start:end]
        if not valid:
            try:
                run.decode("utf-8")
            except UnicodeDecodeError:
                invalid.append(start)
        folded = _fold_run(run)
        if folded == run:  # e.g. CJK, emoji, symbols: folding leaves them as they are
            continue
        if start > pos:
            parts.append(data[pos:start])
            fpos += start - pos
        fs.append(fpos)
        rs.append(start)
        parts.append(folded)
        fpos += len(folded)
        fe.append(fpos)
        re_.append(end)
        pos = end
    if not parts:  # nothing changed: the folded input is the input (one native scan serves both)
        return Folded(data, [], [], [], [], invalid)
    parts.append(data[pos:])
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


_B64_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-")
_HEX_BYTES = frozenset(b"0123456789abcdefABCDEF")
_HEX_RUN_CHARS = b"0123456789abcdefABCDEF :"


def _run_start(data: bytes, end: int, trigger: bytes) -> int:
    """Where the base64/hex run whose trigger ended at ``end`` begins (a trigger found in
    folded bytes maps back only approximately, so look around)."""
    if trigger is TRIGGER_BASE64:
        pos = max(0, end - 24)
        while pos < end and data[pos] not in _B64_BYTES:
            pos += 1
        floor = max(0, pos - 64)
        while pos > floor and data[pos - 1] in _B64_BYTES:
            pos -= 1
        return pos
    pos = max(0, end - 37)
    while pos < end and data[pos] not in _HEX_BYTES:
        pos += 1
    return pos


def _hot_runs(data: bytes, runs: list[tuple[list[int], int]], budget: list[int],
              triage_decoded: bool = True) -> list[tuple[int, int]]:
    """The base64 or hex runs that may hide something. Each run's decoded text is triaged
    like an input of its own (all of them in one native pass); a run that decodes to
    nothing printable, or only to clean text, needs no region. Past the trial budget
    every run is taken as hot; without ``triage_decoded`` (a policy with its own regexes,
    which this triage does not know) every run that decodes is."""
    hot: list[tuple[int, int]] = []
    texts: list[str] = []
    owners: list[int] = []
    for n, (starts, stop) in enumerate(runs):
        if budget[0] <= 0:
            hot.append((starts[0], stop))
            continue
        lo = max(0, starts[0] - 1)
        text = data[lo : stop + 1].decode("ascii", "replace")
        at = [s - lo for s in starts]
        hexish = not data[starts[0] : stop].translate(None, _HEX_RUN_CHARS)  # only hex digits and separators
        for _, _, _, decoded in decoded_payloads(View(text, "text"), budget[0], (at, at if hexish else [])):
            budget[0] -= len(decoded)
            texts.append(decoded)
            owners.append(n)
    if triage_decoded:
        flagged = {owners[i] for i, views in enumerate(texts_views(texts)) if views is not None}
    else:
        flagged = set(owners)
    hot.extend((runs[n][0][0], runs[n][1]) for n in sorted(flagged))
    return hot


def _boundary(data: bytes, pos: int) -> int:
    """Move ``pos`` back to the start of a UTF-8 character."""
    while 0 < pos < len(data) and 0x80 <= data[pos] < 0xC0:
        pos -= 1
    return pos


def hot_regions(data: bytes, custom: CustomTriage | None = None, left: int = LEFT) -> list[Region]:
    """Byte ranges of ``data`` that need the full scan, merged and sorted, each with the
    derived views its triggers call for; [] when the input is clean."""
    return triage(data, custom, left).regions


class Triage(NamedTuple):
    """What ``triage`` found: the hot regions; the native scan of the raw bytes, (injection,
    secret) ends per pattern, so that an ASCII region need not be scanned again; and the
    injection patterns' ends in the folded input (raw offsets; the raw scan's where the
    input is ASCII). Both None when the input was not scanned."""

    regions: list[Region]
    raw: tuple[dict[int, list[int]], dict[int, list[int]]] | None
    injection: dict[int, list[int]] | None


def triage(data: bytes, custom: CustomTriage | None = None, left: int = LEFT) -> Triage:
    """``hot_regions`` and the native scans it made (see ``Triage``)."""
    size = len(data)
    if custom is not None and not custom.ok:
        return Triage([Region(0, size, ALL_VIEWS)] if size else [], None, None)
    if custom is not None:
        left = max(left, custom.width + RIGHT)
    folded = fold_bytes(data)
    spans: list[Span] = [(max(0, p - left), p + RIGHT, NONE) for p in folded.invalid]
    trial = [TRIAL_DECODE_BYTES]
    n_inj = detectors.INJ.count
    inj_widths, sec_widths = detectors.INJ.widths, detectors.SEC.widths
    raw_scan = _scan_raw(data)
    inj_ends, sec_ends = _scan_both(data, folded, raw_scan)
    candidates: dict[int, set[int]] = {}  # run end -> possible run starts, for base64/hex runs
    # a hit in a folded non-ASCII run maps to the run's raw end; the match may begin anywhere
    # in the run (a long full-width passage is one run), so its span reaches back from the run's start
    run_starts = dict(zip(folded.r_ends, folded.r_starts, strict=True))
    for pid, ends in inj_ends.items():
        trigger = FOLDED_TRIGGERS[pid - n_inj] if pid >= n_inj else None
        run = _RUN_END.get(trigger) if trigger is not None else None
        views = _TRIGGER_VIEWS[trigger] if trigger is not None else NONE
        back = max(left, inj_widths[pid] + CONTEXT) if pid < n_inj else left
        if run is None:
            spans.extend(_collapse(ends, back, views))
            if run_starts:
                spans.extend((max(0, run_starts[e] - back), e + RIGHT, views) for e in ends
                             if e in run_starts)
            continue
        stop = -1  # a trigger inside a run already measured only adds a start (re-measuring would be quadratic)
        for raw in sorted(ends):
            if raw >= stop:
                stop = run.match(data, raw).end()
            candidates.setdefault(stop, set()).add(_run_start(data, raw, trigger))
    runs_found = [(sorted(a), b) for b, a in sorted(candidates.items())]
    for start, stop in _hot_runs(data, runs_found, trial, custom is None):
        spans.append((max(0, start - RUN_MARGIN), stop + RUN_MARGIN, frozenset({PAYLOAD})))
    for pid, ends in sec_ends.items():
        back = max(left, sec_widths[pid] + CONTEXT) if pid < len(sec_widths) else left
        spans.extend(_collapse(ends, back, NONE))
    if custom is not None:
        if custom.folded is not None:
            for ends in custom.folded.ends(folded.data).values():
                spans.extend((max(0, folded.to_raw(e) - left), folded.to_raw(e) + RIGHT, NONE) for e in ends)
        if custom.raw is not None:
            for ends in custom.raw.ends(data).values():
                spans.extend((max(0, e - left), e + RIGHT, NONE) for e in ends)
    return Triage(_merge(data, spans), raw_scan, inj_ends)


def region_ends(raw: tuple[dict[int, list[int]], dict[int, list[int]]], start: int,
                end: int) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """The raw scan's ends that fall in ``(start, end]``, relative to ``start``: what a native
    scan of ``data[start:end]`` alone reports, but for matches that need the bytes around
    the window (a line start, a word boundary at its edge), which the window alone would
    see wrongly. They serve the window's raw text (the secrets detector) and, when the
    window is ASCII, its folded text too (injection patterns ignore ASCII case)."""
    out: tuple[dict[int, list[int]], dict[int, list[int]]] = ({}, {})
    for src, dst in zip(raw, out, strict=True):
        for pid, ends in src.items():
            inside = ends[bisect_right(ends, start) : bisect_right(ends, end)]
            if inside:
                dst[pid] = [e - start for e in inside]
    return out


def _collapse(ends: list[int], back: int, views: frozenset[str]) -> list[Span]:
    """Spans around the hits of one pattern, neighbours already joined (dense hits make
    one span, not one each)."""
    out: list[Span] = []
    lo = hi = -(1 << 62)
    for end in sorted(ends):
        if end - back <= hi:
            hi = end + RIGHT
            continue
        if hi >= 0:
            out.append((max(0, lo), hi, views))
        lo, hi = end - back, end + RIGHT
    if hi >= 0:
        out.append((max(0, lo), hi, views))
    return out


def _merge(data: bytes, spans: list[Span]) -> list[Region]:
    out: list[list] = []
    size = len(data)
    for lo, hi, views in sorted(spans, key=lambda s: s[0]):
        hi = min(size, hi)
        if out and lo <= out[-1][1]:
            last = out[-1]
            last[1] = max(last[1], hi)
            last[2] = last[2] | views
        else:
            out.append([lo, hi, views])
    return [Region(_boundary(data, lo), _boundary(data, hi), views) for lo, hi, views in out]


FOLD_WINDOW = 512  # folded bytes scanned on each side of a non-ASCII run (longest pattern looked for)


def _scan_raw(data: bytes) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """One native scan of the raw bytes for both vocabularies: (injection + trigger ends,
    secret ends), each list sorted."""
    both, split = detectors.native()
    inj: dict[int, list[int]] = {}
    sec: dict[int, list[int]] = {}
    for pid, ends in both.ends(data).items():
        if pid < split:
            inj[pid] = ends
        else:
            sec[pid - split] = ends
    return inj, sec


def _scan_both(data: bytes, folded: Folded,
               raw: tuple[dict[int, list[int]], dict[int, list[int]]] | None = None
               ) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """(injection + trigger ends, secret + raw-trigger ends), both as raw byte offsets.

    One native scan of the raw bytes (``raw``, when already made) serves both vocabularies
    (the injection patterns ignore ASCII case, so on ASCII stretches raw and folded bytes
    match alike); the folded bytes are scanned again only in windows around the non-ASCII
    runs, where folding changes them."""
    inj, sec = raw if raw is not None else _scan_raw(data)
    if folded.data is data:
        return inj, sec
    inj = {pid: list(ends) for pid, ends in inj.items()}  # the raw scan's lists stay as they are
    windows: list[list[int]] = []
    for fs, fe in zip(folded.f_starts, folded.f_ends, strict=True):
        lo, hi = max(0, fs - FOLD_WINDOW), fe + FOLD_WINDOW
        if windows and lo <= windows[-1][1]:
            windows[-1][1] = hi
        else:
            windows.append([lo, hi])
    n_inj = detectors.INJ.count
    for lo, hi in windows:
        for pid, ends in detectors.INJ.ends(folded.data[lo:hi]).items():
            if pid >= n_inj and FOLDED_TRIGGERS[pid - n_inj] not in _FOLDED_ONLY:
                continue  # escapes and encoded runs are decoded from the raw text only
            inj.setdefault(pid, []).extend(folded.to_raw(lo + e) for e in ends)
    return inj, sec


_SEPARATOR = b"\n" * 8  # between texts scanned together (a hit across it only costs a region)


def texts_views(texts: list[str]) -> list[frozenset[str] | None]:
    """Triage of decoded texts (each a small input of its own), all in one native pass:
    per text None when it is clean, else the derived views its triggers call for
    (possibly none but the text itself)."""
    if not texts:
        return []
    parts = [encode(t) for t in texts]
    data = _SEPARATOR.join(parts)
    starts: list[int] = []
    pos = 0
    for part in parts:
        starts.append(pos)
        pos += len(part) + len(_SEPARATOR)
    folded = fold_bytes(data)
    inj, sec = _scan_both(data, folded)
    out: list[frozenset[str] | None] = [None] * len(texts)

    def mark(end: int, views: frozenset[str]) -> None:
        if end >= len(data):  # a match running to the very end (\z) may belong to any text
            for i in range(len(out)):
                out[i] = (out[i] or frozenset()) | views
            return
        i = max(0, bisect_right(starts, end) - 1)
        out[i] = (out[i] or frozenset()) | views

    for ends in sec.values():
        for end in ends:
            mark(end, NONE)
    for raw in folded.invalid:
        mark(raw, NONE)
    n_inj = detectors.INJ.count
    for pid, ends in inj.items():
        views = _TRIGGER_VIEWS[FOLDED_TRIGGERS[pid - n_inj]] if pid >= n_inj else NONE
        for end in ends:
            mark(end, views)
    return out


def text_views(text: str) -> frozenset[str] | None:
    """``texts_views`` of one text."""
    return texts_views([text])[0]
