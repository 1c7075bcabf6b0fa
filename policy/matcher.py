"""Many regexes over one text: a native pass finds where any of them may end,
then each Python regex is tried only just before those ends.

The Hyperscan pass runs over the UTF-8 bytes of the text with superset
translations of the regexes (``hsdb.superset``), so every real match ends at a
reported offset; the exact Python regex then confirms it in a window that
reaches back its maximum width. On ordinary text almost nothing is reported,
so the Python work is a few calls per input instead of one per common word.
"""

from __future__ import annotations

import re
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from fak.policy.hsdb import Multi, superset

try:  # the regex parser moved in Python 3.11
    from re import _parser as _sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    import sre_parse as _sre_parse  # type: ignore[no-redef]

LOOKAHEAD_SLACK = 64  # characters after a reported end kept visible to look-aheads


def max_width(pattern: str, cap: int) -> int:
    """The longest match ``pattern`` can have, at most ``cap`` (unbounded repeats hit the cap)."""
    return min(cap, _sre_parse.parse(pattern).getwidth()[1])


def encode_with(text: str) -> tuple[bytes, str]:
    """UTF-8 bytes of ``text`` (lone surrogates from invalid input kept as their byte, other
    lone surrogates as three bytes) and the error handler that decodes them back."""
    if text.isascii():
        return text.encode("ascii"), "strict"
    try:
        return text.encode("utf-8", "surrogateescape"), "surrogateescape"
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass"), "surrogatepass"


def encode(text: str) -> bytes:
    """``encode_with`` without the handler."""
    return encode_with(text)[0]


def char_offsets(text: str, data: bytes) -> np.ndarray:
    """Byte offset in ``data`` (``encode(text)``) where each character of ``text`` starts, plus the end."""
    cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    lens = np.where(cps < 0x80, 1, np.where(cps < 0x800, 2, np.where(cps < 0x10000, 3, 4)))
    surrogate = (cps >= 0xD800) & (cps <= 0xDFFF)
    if surrogate.any():
        lens[surrogate] = (len(data) - int(lens[~surrogate].sum())) // int(surrogate.sum())
    return np.concatenate(([0], np.cumsum(lens)))


class _CharIndex:
    """Byte offsets of UTF-8 ``data`` → character offsets, by decoding only the stretches
    between the offsets asked for (cheap when hits are few, whatever the input size)."""

    def __init__(self, data: bytes, errors: str) -> None:
        self.data, self.errors = data, errors
        self.memo: dict[int, int] = {0: 0}

    def __call__(self, offsets: list[int]) -> list[int]:
        memo, data = self.memo, self.data
        known = sorted(memo)
        prev = 0
        for off in sorted(set(offsets) - memo.keys()):  # ascending: each decodes from the nearest known offset
            base = max(known[bisect_right(known, off) - 1], prev)
            memo[off] = memo[base] + len(data[base:off].decode("utf-8", self.errors))
            prev = off
        return [memo[o] for o in offsets]


class Matcher:
    """Regexes (compiled Python patterns with a width cap each) searched together."""

    def __init__(self, regexes: Sequence[re.Pattern[str]], caps: Sequence[int], extra: Sequence[bytes] = (),
                 prefixes: dict[int, bytes] | None = None, caseless: bool = False,
                 heads: dict[int, Sequence[tuple[bytes, int]]] | None = None,
                 suffixes: dict[int, str] | None = None) -> None:
        """``extra``: more native patterns scanned in the same pass (ids after the regexes');
        ``prefixes``: native context required before regex ``n`` (checked again in Python);
        ``caseless``: the native pass ignores ASCII case (for regexes written for lower-case
        text, so raw ASCII can be scanned without lower-casing it first);
        ``heads``: for regex ``n``, native patterns (ASCII case ignored) each ending a given
        number of bytes after a place where ``n`` may begin a match, such that every match
        of ``n`` begins at one of them: ``n`` is then tried only there, not searched for
        across the window its native end calls for (a search is slow for a regex that
        begins with a long alternation);
        ``suffixes``: for regex ``n``, a regex every match of ``n`` ends with (ending at the
        same place), scanned for natively instead of ``n`` itself when that is cheaper."""
        self.regexes = list(regexes)
        self.caseless = caseless
        self._prefixes = prefixes or {}
        self.widths = [max_width(rx.pattern, cap) for rx, cap in zip(regexes, caps, strict=True)]
        self._extra = list(extra)
        self._db: Multi | None = None
        self._offset = 0
        self.provider: Callable[[], object] | None = None  # wires a shared database in (see ``share``)
        self._lock = threading.Lock()
        self._heads = dict(heads or {})
        self._quick = {n: re.compile(_LEADING_LOOKBEHIND.sub("", rx.pattern), rx.flags)
                       for n, rx in enumerate(self.regexes) if _LEADING_LOOKBEHIND.match(rx.pattern)}
        self._suffixes = dict(suffixes or {})
        self._head_dbs: dict[int, Multi] = {}

    def native(self) -> tuple[list[bytes], list[bool]]:
        """The native patterns (regexes then extras) and whether each ignores ASCII case."""
        flags = [self.caseless or bool(rx.flags & re.IGNORECASE) for rx in self.regexes]
        pats = [self._prefixes.get(n, b"") + superset(self._suffixes.get(n, rx.pattern)) for n, rx in enumerate(self.regexes)]
        return pats + self._extra, flags + [self.caseless] * len(self._extra)

    def share(self, db: Multi, offset: int) -> None:
        """Use ``db``, a database holding this matcher's ``native()`` patterns from id
        ``offset`` on (several matchers can share one compile and one scan)."""
        self._db, self._offset = db, offset

    @property
    def db(self) -> Multi:
        """Built on first use (compiling takes a fraction of a second), then shared."""
        if self._db is None and self.provider is not None:
            self.provider()
        if self._db is None:
            with self._lock:
                if self._db is None:
                    self._db, self._offset = Multi(*self.native()), 0
        return self._db

    @property
    def count(self) -> int:
        return len(self.regexes)

    def ends(self, data: bytes) -> dict[int, list[int]]:
        """Native match ends of this matcher's patterns (ids relative to it: regexes, then extras)."""
        db = self.db
        offset = self._offset
        if offset == 0 and self._size == self._total(db):
            return db.ends(data)
        top = offset + self._size
        return {pid - offset: e for pid, e in db.ends(data).items() if offset <= pid < top}

    @property
    def _size(self) -> int:
        return len(self.regexes) + len(self._extra)

    @staticmethod
    def _total(db: Multi) -> int:
        return db.size

    def finditer(self, text: str, ends: dict[int, list[int]] | None = None) -> Iterator[tuple[int, re.Match[str]]]:
        """(regex index, match) for the matches of every regex, leftmost first per regex.
        ``ends``: this matcher's native ends on ``encode(text)`` when already known."""
        data, errors = encode_with(text)
        if ends is None:
            ends = self.ends(data)
        if not ends:
            return
        length = len(text)
        to_chars = None if len(data) == length else _CharIndex(data, errors)
        for n in sorted(ends):
            if n >= len(self.regexes):
                continue
            points = ends[n] if to_chars is None else to_chars(ends[n])
            yield from ((n, m) for m in self._confirm(n, sorted(set(points)), text, length))

    def _head_db(self, n: int) -> Multi | None:
        """The native database of regex ``n``'s heads, compiled on first use (None: it has none)."""
        if n not in self._heads:
            return None
        db = self._head_dbs.get(n)
        if db is None:
            with self._lock:
                db = self._head_dbs.get(n)
                if db is None:
                    db = self._head_dbs[n] = Multi([p for p, _ in self._heads[n]], caseless=[True] * len(self._heads[n]))
        return db

    def _starts(self, n: int, text: str, lo: int, endpos: int) -> list[int] | None:
        """Where regex ``n`` may begin a match in ``text[lo:endpos]`` (sorted), from one native
        scan of that window for its heads; None when it has no heads or the window is not ASCII."""
        db = self._head_db(n)
        window = text[lo:endpos]
        if db is None or not window.isascii():
            return None
        heads = self._heads[n]
        out: list[int] = []
        for pid, ends in db.ends(window.encode("ascii")).items():
            back = heads[pid][1] - lo
            out.extend(e - back for e in ends)
        out.sort()
        return out

    def _confirm(self, n: int, points: list[int], text: str, length: int) -> Iterator[re.Match[str]]:
        rx, width = self.regexes[n], self.widths[n]
        last_end = 0
        i = 0
        while i < len(points):
            lo = max(last_end, points[i] - width)
            hi = points[i]
            while i + 1 < len(points) and points[i + 1] - width <= hi:
                i += 1
                hi = points[i]
            i += 1
            endpos = min(length, hi + LOOKAHEAD_SLACK)
            starts = self._starts(n, text, lo, endpos) if n in self._heads else None
            if starts is not None:
                found = _at_starts(rx, text, lo, endpos, starts)
            elif n in self._quick:
                found = _via_quick(rx, self._quick[n], text, lo, endpos)
            else:
                found = rx.finditer(text, lo, endpos)
            for m in found:
                if m.end() > hi:
                    break
                if m.end() > m.start():
                    last_end = m.end()
                    yield m


# Look-behinds that begin a regex: a search for such a regex tries every place in turn (no
# literal to skip ahead by); without them it skips ahead, and the full regex confirms.
# One look-around may nest in another (``(?<!(?<!\\)[a-z])``, patterns.WORD_START).
_ATOM = r"\\.|\[(?:\\.|[^\]])*\]|[^()\\]"
_LEADING_LOOKBEHIND = re.compile(rf"^(?:\(\?<[!=](?:{_ATOM}|\(\?<?[!=](?:{_ATOM})*\))*\))+")


def _via_quick(rx: re.Pattern[str], quick: re.Pattern[str], text: str, lo: int, endpos: int) -> Iterator[re.Match[str]]:
    """What ``rx.finditer(text, lo, endpos)`` yields, where ``quick`` is ``rx`` without its
    leading look-behinds (it matches wherever ``rx`` does): ``quick`` finds each candidate
    place, ``rx`` is tried there."""
    pos = lo
    while pos <= endpos:
        q = quick.search(text, pos, endpos)
        if q is None:
            return
        m = rx.match(text, q.start(), endpos)
        if m is None:
            pos = q.start() + 1
            continue
        if m.end() == m.start():
            yield from rx.finditer(text, m.start(), endpos)
            return
        yield m
        pos = m.end()


def _at_starts(rx: re.Pattern[str], text: str, lo: int, endpos: int, starts: list[int]) -> Iterator[re.Match[str]]:
    """What ``rx.finditer(text, lo, endpos)`` yields, trying ``rx`` only at ``starts`` (sorted,
    every place where it can begin a match among them): a search tries each place in turn
    and fails at the others. An empty match would make finditer step by one: then the
    rest is left to finditer itself."""
    i = bisect_left(starts, lo)
    while i < len(starts) and starts[i] < endpos:
        m = rx.match(text, starts[i], endpos)
        if m is None:
            i += 1
            continue
        if m.end() == m.start():
            yield from rx.finditer(text, m.start(), endpos)
            return
        yield m
        i = bisect_left(starts, m.end(), i + 1)
