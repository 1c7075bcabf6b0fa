"""Optional acceleration: one Hyperscan pass over the raw bytes proves most of an input
clean, and only the lines around what it finds go to the reference path.

Contract (tests/policy/test_policy_triage.py): ``findings`` here equals
``reference.findings`` on every input. How it holds:

* every signature and every trigger of a derived view (de-spacing, escapes, base64
  and hex runs) is compiled as a *superset* (``superset``): look-arounds and anchors
  dropped, long repeats unbounded, any class that can match a non-ASCII character also
  matching its UTF-8 bytes, case ignored. So wherever the Python regex matches, the
  native pattern reports a match ending at the same byte.
* folding changes only non-ASCII characters; every non-ASCII run whose folded form
  differs is a trigger too.
* around each hit a region reaches back the longest match its pattern can have (for a
  trigger: as many lines either way as a folded match can span, ``_Native.margin``);
  regions are merged and widened to whole lines. Every view transform is line-local and
  lookarounds look at most two characters past a match, so the reference path run on a
  region's bytes sees what it sees there in the whole input.
* a signature hit alone needs only that signature on its region's text (no other view
  differs from the folded text there), searched from its longest match before each hit
  to just past it; decoded runs are scanned with every signature.
* a decoded text with no hit at all holds no finding and no run: it is not scanned.
* the decoding budget is spent in input order in both paths: every base64/hex run
  triggers, so every run lies in a region, and regions are scanned in order.

Without Hyperscan (no wheels off x86-64, or ``FAK_NO_HYPERSCAN=1``) ``findings`` is the
reference path.
"""

from __future__ import annotations

import os
import re
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Set
from dataclasses import dataclass
from re import _constants as C  # type: ignore[attr-defined]  # typeshed has no stubs for re's private modules
from re import _parser as sre_parse  # type: ignore[attr-defined]  # (the same)
from typing import Any, NamedTuple

from fak.policy import normalize, reference, signatures
from fak.policy.detectors import Finding
from fak.policy.normalize import fold

try:
    # read at import, before any Settings exists: it picks the matcher for the whole process (the
    # reference path's tests run it in a child); an allowed exception to "only fak.settings reads the environment" (tests/repo/test_settings_only_env_reader.py)
    if os.environ.get("FAK_NO_HYPERSCAN") == "1":
        raise ImportError("disabled by FAK_NO_HYPERSCAN=1")
    import hyperscan
except ImportError:  # pragma: no cover - depends on the platform
    # the optional module is None where it is missing (or switched off): available() says which
    hyperscan = None  # type: ignore[assignment]

# Repeats bounded above this become unbounded (still a superset). Below 15 on purpose: the
# Hyperscan of python-hyperscan 0.9.1 misses ``a[x ]{0,15}e?bcd`` in ``qqqqqqqqqqqqqqqqaebcd``
# (a bounded repeat of 15 or more, then an optional atom, after 15 or more bytes); unbounded
# repeats do not (tests/policy/test_policy_triage.py keeps the case).
REPEAT_CAP = 12
WIDTH_CAP = 1 << 15  # widest match a region is sized for
MERGE_GAP = 2048  # regions closer than this are scanned as one (fewer, larger scans cost less)
MAX_HITS = 20000  # native hits after which a region map costs more than scanning everything


def available() -> bool:
    return hyperscan is not None


# ---------------------------------------------------------------- regex → native superset

_CATEGORY = {C.CATEGORY_DIGIT: r"\d", C.CATEGORY_NOT_DIGIT: r"\D", C.CATEGORY_SPACE: r"\s",
             C.CATEGORY_NOT_SPACE: r"\S", C.CATEGORY_WORD: r"\w", C.CATEGORY_NOT_WORD: r"\W"}


def _byte(c: int) -> bytes:
    return b"\\x%02x" % c

# a parsed regex (``re._parser``'s SubPattern, or a class's items): (opcode, argument) pairs,
# each argument's type fixed by its opcode (an int, a list of pairs, a nested SubPattern, ...)
Parsed = Iterable[tuple[int, Any]]


def _char_class(items: Parsed, folded: bool = False) -> tuple[bytes, bool]:
    """A class as a byte class: the ASCII bytes it matches, and every byte of a non-ASCII
    character (``\\x80-\\xff``) when it may match one (then True: one character may be up
    to four such bytes). ``folded``: the class reads the folded text, where an ASCII byte
    stands for its lower case (folding changes no other ASCII character), so a byte is in
    when its lower case is: ``[^a-z]`` keeps no letter once compiled caseless."""
    ascii_set, wide = _ascii_set(items)
    if folded:
        ascii_set = {c for c in range(128) if ord(chr(c).lower()) in ascii_set}
    if not ascii_set and not wide:
        raise ValueError("empty class")
    return b"[" + b"".join(_ranges(sorted(ascii_set))) + (b"\\x80-\\xff" if wide else b"") + b"]", wide


def _ascii_set(items: Parsed) -> tuple[set[int], bool]:
    """The ASCII characters a class matches, and whether it may match a non-ASCII one."""
    ascii_set: set[int] = set()
    wide = negate = False
    for op, av in items:
        if op is C.NEGATE:
            negate = True
        elif op is C.LITERAL:
            if av < 128:
                ascii_set.add(av)
            else:
                wide = True
        elif op is C.RANGE:
            ascii_set.update(range(av[0], min(av[1], 127) + 1))
            wide |= av[1] >= 128
        elif op is C.CATEGORY:
            rx = re.compile(_CATEGORY[av])
            ascii_set.update(c for c in range(128) if rx.match(chr(c)))
            wide = True  # Unicode digits, spaces and letters (and their complements) include non-ASCII ones
        else:
            raise ValueError(f"class item {op} not supported")
    if negate:
        ascii_set = set(range(128)) - ascii_set
        wide = True
    return ascii_set, wide


def _ranges(codes: list[int]) -> list[bytes]:
    """Sorted byte values as class items, each run of three or more as a range (a class of
    all printable characters is 9 bytes of pattern, not 376: Hyperscan bounds a pattern's length)."""
    out: list[bytes] = []
    i = 0
    while i < len(codes):
        j = i
        while j + 1 < len(codes) and codes[j + 1] == codes[j] + 1:
            j += 1
        if j - i >= 2:
            out.append(_byte(codes[i]) + b"-" + _byte(codes[j]))
        else:
            out.extend(_byte(c) for c in codes[i : j + 1])
        i = j + 1
    return out


_SINGLE = (C.NOT_LITERAL, C.ANY, C.IN)


def _single(op: int, av: Any, dotall: bool, folded: bool) -> tuple[bytes, bool]:
    """One character of class kind as (byte class, may be non-ASCII)."""
    if op is C.NOT_LITERAL:
        return _char_class([(C.NEGATE, None), (C.LITERAL, av)], folded)
    if op is C.ANY:
        return _char_class([(C.NEGATE, None)] + ([] if dotall else [(C.LITERAL, 10)]), folded)
    return _char_class(av, folded)


def _bound(lo: int, hi: int) -> bytes:
    lo = min(lo, REPEAT_CAP)
    return b"{%d,}" % lo if hi is C.MAXREPEAT or hi > REPEAT_CAP else b"{%d,%d}" % (lo, hi)


def _emit(tree: Parsed, dotall: bool, folded: bool) -> bytes:
    out: list[bytes] = []
    for op, av in tree:
        if op is C.LITERAL:
            out.append(b"".join(_byte(b) for b in chr(av).encode("utf-8", "surrogateescape")) if av >= 128
                       else bytes([av]) if chr(av).isalnum() else _byte(av))  # letters and digits as themselves: shorter
        elif op in _SINGLE:
            cls, wide = _single(op, av, dotall, folded)
            out.append(cls + (b"{1,4}" if wide else b""))
        elif op is C.BRANCH:
            out.append(b"(?:" + b"|".join(_emit(alt, dotall, folded) for alt in av[1]) + b")")
        elif op is C.SUBPATTERN:
            out.append(b"(?:" + _emit(av[3], dotall or bool(av[1] & C.SRE_FLAG_DOTALL), folded) + b")")
        elif op is C.ATOMIC_GROUP:
            out.append(b"(?:" + _emit(av, dotall, folded) + b")")
        elif op in (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT):
            lo, hi, sub = av
            if len(sub) == 1 and sub[0][0] in _SINGLE:  # a run of one class: bytes, four per character at most
                cls, wide = _single(sub[0][0], sub[0][1], dotall, folded)
                out.append(cls + (_bound(lo, hi if hi is C.MAXREPEAT else 4 * hi) if wide else _bound(lo, hi)))
            else:
                out.append(b"(?:" + _emit(sub, dotall, folded) + b")" + _bound(lo, hi))
        elif op is C.AT and av is C.AT_BEGINNING_LINE:
            out.append(b"^")  # compiled with HS_FLAG_MULTILINE: after a line break or at the start
        elif op in (C.AT, C.ASSERT, C.ASSERT_NOT):
            continue  # dropping an assertion only widens the match set
        else:
            raise ValueError(f"regex construct {op} not supported by the native superset")
    return b"".join(out)


def superset(rx: re.Pattern[str], folded: bool = False) -> bytes:
    """A Hyperscan pattern (to be compiled caseless) matching, on the UTF-8 bytes of any
    text, wherever ``rx`` matches on that text, with the same end (``folded``: wherever
    ``rx`` matches on the text's folded form)."""
    return _emit(sre_parse.parse(rx.pattern, rx.flags), bool(rx.flags & re.DOTALL), folded)


def _lines(tree: Parsed) -> int:
    """How many line breaks a match of ``tree`` can hold (``WIDTH_CAP`` for unbounded)."""
    total = 0
    for op, av in tree:
        if op is C.LITERAL:
            n = int(av == 10)
        elif op in (C.NOT_LITERAL, C.ANY):
            n = int(av != 10) if op is C.NOT_LITERAL else 0
        elif op is C.IN:
            n = int(10 in _ascii_set(av)[0])
        elif op is C.BRANCH:
            n = max(_lines(alt) for alt in av[1])
        elif op is C.SUBPATTERN:
            n = _lines(av[3])
        elif op is C.ATOMIC_GROUP:
            n = _lines(av)
        elif op in (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT):
            inner = _lines(av[2])
            n = 0 if not inner else WIDTH_CAP if av[1] is C.MAXREPEAT else inner * av[1]
        else:
            n = 0
        total += n
    return min(total, WIDTH_CAP)


def lines(rx: re.Pattern[str]) -> int:
    """How many line breaks a match of ``rx`` can span."""
    return _lines(sre_parse.parse(rx.pattern, rx.flags))


def width(rx: re.Pattern[str]) -> int:
    """The longest match of ``rx`` in characters (at most ``WIDTH_CAP``)."""
    longest: int = sre_parse.parse(rx.pattern, rx.flags).getwidth()[1]
    return min(WIDTH_CAP, longest)


# ---------------------------------------------------------------- the native database

# Where a derived view may differ from the text: a de-spaced run, escapes, and the start
# of a base64 or hex run (once per run: the region, whole lines, holds the rest of it).
_PAYLOAD_TRIGGERS = {3, 4}  # indexes in _TRIGGERS of the base64 and hex runs
_CHAR = rb"(?:[\x00-\x08\x0e-\x1b\x21-\x7f]|[\x80-\xff]{1,4})"  # one character that is not white space (\S)
_TRIGGERS = [rb"(?:^|[^A-Za-z0-9_]|\\[nrt])(?:" + _CHAR + rb"[ \t]{1,6}){3}" + _CHAR + rb"(?:[^A-Za-z0-9_]|$)",
             superset(normalize.PERCENT_RUN), superset(normalize.HTML_ENTITY),
             rb"(?:^|[^A-Za-z0-9+/_-])[A-Za-z0-9+/_-]{24}", rb"(?:^|[^0-9a-fA-F])(?:[0-9a-fA-F]{2}[ :]?){12}",
             rb"(?:^|[\x00-\x7f])[\x80-\xff]"]  # the first byte of a non-ASCII run
_NON_ASCII_TRIGGER = 5


class _Native:
    """Every signature but those on the root view (they match only characters that
    folding changes, which are triggers of their own), then every view trigger."""

    def __init__(self) -> None:
        sigs = [s for s in signatures.load() if s.on != "root"]
        # a signature may have several native patterns (``Signature.loose``): pattern id -> signature
        self.ids = [s.id for s in sigs for _ in s.loose]
        self.count = len(self.ids)
        self.widths = [width(s.regex) for s in sigs for _ in s.loose]
        # pattern id -> the first pattern id of its signature (its patterns' hits are counted once)
        self.first = [self.ids.index(sid) for sid in self.ids]
        # a trigger's region: its line and as many lines either side as a folded match can span
        self.margin = max(lines(s.regex) for s in sigs if s.on == "folded")
        patterns = [superset(rx, s.on == "folded") for s in sigs for rx in s.loose] + _TRIGGERS
        # the encoded-run triggers report where they begin (``Region.starts``)
        flags = [hyperscan.HS_FLAG_CASELESS | (hyperscan.HS_FLAG_MULTILINE if b"^" in p else 0)
                 | (hyperscan.HS_FLAG_SOM_LEFTMOST if i - self.count in _PAYLOAD_TRIGGERS else 0)
                 for i, p in enumerate(patterns)]
        self.db = hyperscan.Database()
        self.db.compile(expressions=patterns, ids=list(range(len(patterns))), elements=len(patterns), flags=flags)
        self._local = threading.local()

    def hits(self, data: bytes) -> dict[int, list[tuple[int, int]]] | None:
        """Pattern id → (start, end) of its matches, in scan order (the start is reported for
        the encoded-run triggers only, 0 for the others); None after ``MAX_HITS`` hits (scan
        everything instead)."""
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = hyperscan.Scratch(self.db)
        out: dict[int, list[tuple[int, int]]] = {}
        total = [0]
        som = {self.count + i for i in _PAYLOAD_TRIGGERS}

        def on_match(pid: int, start: int, to: int, _flags: int, _ctx: object) -> bool:
            out.setdefault(pid, []).append((start if pid in som else 0, to))
            total[0] += 1
            return total[0] >= MAX_HITS

        try:
            self.db.scan(data, match_event_handler=on_match, scratch=scratch)
        except hyperscan.ScanTerminated:
            return None
        return out

    def clean(self, data: bytes) -> bool:
        """Whether no pattern matches ``data``: ``hits(data) == {}``, the scan stopped at
        the first match (decoded payloads are scanned one by one: this is most of their cost)."""
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = hyperscan.Scratch(self.db)
        try:
            self.db.scan(data, match_event_handler=_stop, scratch=scratch)
        except hyperscan.ScanTerminated:
            return False
        return True


def _stop(_pid: int, _start: int, _to: int, _flags: int, _ctx: object) -> bool:
    return True  # a match: stop the scan


_DB: list[_Native] = []
_LOCK = threading.Lock()


def native() -> _Native:
    if not _DB:
        with _LOCK:
            if not _DB:
                _DB.append(_Native())
    return _DB[0]


# ---------------------------------------------------------------- regions

_NON_ASCII = re.compile(rb"[\x80-\xff]+")
_FOLDS: dict[bytes, bool] = {}  # memo of a pure function: whether folding changes a non-ASCII run


def _changes(run: bytes) -> bool:
    found = _FOLDS.get(run)
    if found is None:
        text = run.decode("utf-8", "surrogateescape")
        found = fold(text) != text
        if len(_FOLDS) > 65536:
            _FOLDS.clear()
        _FOLDS[run] = found
    return found


class _NonAscii:
    """The non-ASCII runs of an input (from the native trigger on their first bytes), to
    size a signature's look-back in bytes: ``chars`` characters before a hit span
    ``chars`` bytes plus at most the non-ASCII bytes among the ``4 * chars`` bytes before
    it. Counting them, not taking four bytes a character wherever the input has one
    non-ASCII byte, keeps the lines searched around a hit in mostly-ASCII text short."""

    def __init__(self, data: bytes, spans: list[tuple[int, int]]) -> None:
        self.runs: list[tuple[int, int]] = []  # (first byte, end) of each run, in order
        for e in sorted({e for _, e in spans}):
            m = _NON_ASCII.match(data, e - 1)
            assert m is not None  # the trigger matched the non-ASCII byte at e - 1
            self.runs.append(m.span())
        self.starts = [a for a, _ in self.runs]
        self.ends = [b for _, b in self.runs]
        self.before = [0]  # non-ASCII bytes in the runs before each one
        for a, b in self.runs:
            self.before.append(self.before[-1] + b - a)

    def back(self, end: int, chars: int) -> int:
        """Bytes that hold at least the ``chars`` characters before byte ``end``
        (at most ``4 * chars - 6``, the bound before this count: ``4 * width + 2``)."""
        lo = end - 4 * chars
        i, j = bisect_right(self.ends, lo), bisect_left(self.starts, end)
        if i >= j:  # no non-ASCII byte in data[lo:end]
            return chars
        inside = self.before[j] - self.before[i] - max(0, lo - self.starts[i]) - max(0, self.ends[j - 1] - end)
        return min(4 * chars - 6, chars + inside)


def _line_start(data: bytes, pos: int, before: int = 0) -> int:
    """Start of the line holding ``pos``, ``before`` lines further back."""
    pos = data.rfind(b"\n", 0, max(0, pos))
    for _ in range(before):
        if pos < 0:
            break
        pos = data.rfind(b"\n", 0, pos)
    return pos + 1


def _line_end(data: bytes, pos: int, after: int = 0) -> int:
    """End (past its line break) of the line holding ``pos``, ``after`` lines further on."""
    pos = data.find(b"\n", min(len(data), max(0, pos)))
    for _ in range(after):
        if pos < 0:
            break
        pos = data.find(b"\n", pos + 1)
    return len(data) if pos < 0 else pos + 1


class Region(NamedTuple):
    """Whole lines of the input, and the signatures to run on its text (None: all, because a
    view other than the folded text, or folding itself, changes something there). Text
    decoded from a base64 or hex run is new: every signature runs on it; ``runs``: whether
    the region holds such a run. A named signature need only be searched for in the lines
    from its longest match before each of its hits to the hit."""

    start: int
    end: int
    only: dict[str, list[tuple[int, int]]] | None  # signature id -> byte ranges around its hits
    runs: bool = True
    starts: tuple[list[int], list[int]] = ([], [])  # where base64 / hex runs may begin (relative)


def regions(data: bytes) -> list[Region] | None:
    """Regions (merged, in order) that hold every finding of ``data``; [] when it is clean,
    None when scanning it whole is cheaper. A signature's hit needs the lines from its
    longest match back to its end; a trigger (a view's or a folded character's) needs its
    line and ``margin`` lines either side, and every signature."""
    db = native()
    hits = db.hits(data)
    if hits is None:
        return None
    points: list[tuple[int, int, str | None]] = []  # (first byte, last byte, signature id or None for a trigger)
    run_starts: tuple[list[int], list[int]] = ([], [])  # where base64 and hex runs may begin
    non_ascii = _NonAscii(data, hits.get(db.count + _NON_ASCII_TRIGGER, []))
    ends: dict[int, set[int]] = {}  # a signature's first pattern id -> where any of its patterns hit (once each)
    for pid, spans in hits.items():
        if pid < db.count:
            ends.setdefault(db.first[pid], set()).update(e for _, e in spans)
        elif pid - db.count == _NON_ASCII_TRIGGER:  # folding changes only non-ASCII runs: those it changes
            points.extend((a, b - 1, None) for a, b in non_ascii.runs if _changes(data[a:b]))
        elif pid - db.count in _PAYLOAD_TRIGGERS:  # a run decoded into a text of its own: its line is enough
            kind = pid - db.count - min(_PAYLOAD_TRIGGERS)
            for s, e in spans:
                points.append((e - 1, e - 1, ""))
                run_starts[kind].extend((s, s + 1))  # the match may begin with the byte before the run
        else:
            points.extend((e - 1, e - 1, None) for _, e in spans)
    for pid, found in ends.items():
        name, chars = db.ids[pid], db.widths[pid] + 2
        if non_ascii.runs:
            points.extend((max(0, e - non_ascii.back(e, chars)), e, name) for e in found)
        else:
            points.extend((max(0, e - chars), e, name) for e in found)
    if not points:
        return []
    points.sort(key=lambda p: p[0])
    k = db.margin
    out: list[_Open] = []
    line_done = -1  # end of the last line a trigger's margin was taken from
    for lo, hi, sid in points:
        if sid is None:
            if lo < line_done:
                if out[-1].only is not None:
                    out[-1].only = None
                continue
            start, end = _line_start(data, lo, k), _line_end(data, hi, k)
            line_done = _line_end(data, hi)
        else:
            if out and hi < out[-1].end and (inside := out[-1].only) is not None:  # inside the last region already
                if sid:
                    inside.setdefault(sid, []).append((lo, hi + 2))
                out[-1].runs |= not sid
                continue
            start, end = _line_start(data, lo), _line_end(data, hi)
        # overlapping regions merge; near ones too when neither needs every signature
        if out and (start < out[-1].end or (start < out[-1].end + MERGE_GAP and sid is not None and out[-1].only is not None)):
            last = out[-1]
            last.end = max(last.end, end)
            last.runs |= not sid
            if sid is None:
                last.only = None
            elif sid and last.only is not None:
                last.only.setdefault(sid, []).append((lo, hi + 2))
        else:
            out.append(_Open(start, end, None if sid is None else {sid: [(lo, hi + 2)]} if sid else {}, not sid))
    regions = [Region(o.start, o.end, None if o.only is None else {sid: _merged(r) for sid, r in o.only.items()}, o.runs)
               for o in out]
    return _with_starts(regions, run_starts)


@dataclass
class _Open:
    """A region being built: bytes ``start``-``end`` of the input, the byte ranges of the
    signatures to run there (None: all), whether it holds an encoded run."""

    start: int
    end: int
    only: dict[str, list[tuple[int, int]]] | None
    runs: bool


def _with_starts(regions: list[Region], run_starts: tuple[list[int], list[int]]) -> list[Region]:
    """Each region with the run starts inside it, relative to its start."""
    b64, hexes = sorted(run_starts[0]), sorted(run_starts[1])

    def inside(found: list[int], r: Region) -> list[int]:
        return [p - r.start for p in found[bisect_left(found, r.start) : bisect_left(found, r.end)]]

    return [r._replace(starts=(inside(b64, r), inside(hexes, r))) for r in regions]


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _char_ranges(text: bytes, ranges: list[tuple[int, int]], base: int) -> list[tuple[int, int]]:
    """Byte ranges of ``text`` (offset by ``base``) as character ranges, each widened to whole
    characters (an only-region folds character for character, so these are positions of
    its folded text too)."""
    wide: list[tuple[int, int]] = []
    for lo, hi in ranges:
        lo, hi = max(0, lo - base), min(len(text), hi - base)
        while 0 < lo < len(text) and 0x80 <= text[lo] < 0xC0:
            lo -= 1
        while 0 < hi < len(text) and 0x80 <= text[hi] < 0xC0:
            hi += 1
        wide.append((lo, hi))
    out: list[tuple[int, int]] = []
    byte = char = 0
    for lo, hi in _merged(wide):
        char += len(text[byte:lo].decode("utf-8", "surrogateescape"))
        start = char
        char += len(text[lo:hi].decode("utf-8", "surrogateescape"))
        byte = hi
        out.append((start, char))
    return out


def _char_offsets(text: bytes, positions: list[int]) -> list[int]:
    """Byte offsets (sorted) of ``text`` as character offsets, each moved back to the
    character it falls in."""
    out: list[int] = []
    byte = char = 0
    for pos in positions:
        while 0 < pos < len(text) and 0x80 <= text[pos] < 0xC0:
            pos -= 1
        if pos < byte:
            out.append(char)
            continue
        char += len(text[byte:pos].decode("utf-8", "surrogateescape"))
        byte = pos
        out.append(char)
    return out


def _clean(data: bytes) -> bool:
    """Whether no signature and no trigger matches anywhere in ``data`` (a decoded text:
    then it holds no finding and nothing more to decode)."""
    return native().clean(data)


def findings(data: bytes, detectors: Set[str], max_depth: int = 2, max_decoded: int = 65536
             ) -> dict[str, list[Finding]]:
    """``reference.findings`` of ``data``, computed on the regions only."""
    if not available():
        return reference.findings(data, detectors, max_depth, max_decoded)
    found = regions(data)
    if found is None:
        return reference.findings(data, detectors, max_depth, max_decoded)
    out: dict[str, list[Finding]] = {}
    budget = [max_decoded]
    for lo, hi, only, runs, starts in found:
        if only == {} and budget[0] <= 0:  # only encoded runs, and nothing left to decode them with
            continue
        text = data[lo:hi]
        ascii_text = text.isascii()  # byte offsets are character offsets
        if not ascii_text:
            starts = (_char_offsets(text, starts[0]), _char_offsets(text, starts[1]))
        scan = reference.Scan(text, max_depth, budget, derived=only is None, decode=only is None or runs,
                              clean=_clean, starts=starts)
        if only is not None:
            only = {sid: [(a - lo, b - lo) for a, b in r] if ascii_text else _char_ranges(text, r, lo)
                    for sid, r in only.items()}
        for name, items in reference.run(scan, detectors, only).items():
            out.setdefault(name, []).extend(
                Finding(f.detector, f.family, f.name, f.score, f.start + lo, f.end + lo, f.exact, f.layer)
                for f in items)
    return out
