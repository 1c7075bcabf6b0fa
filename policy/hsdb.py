"""Hyperscan databases for the gate's native passes.

Python regexes are translated into *supersets* that Hyperscan compiles without
prefilter mode (fast to build): look-arounds are dropped, long bounded repeats
become unbounded, and ``\\w``/``\\s``/``\\d`` also accept any non-ASCII byte, so
wherever the Python regex matches (on the UTF-8 bytes of a text) the translation
matches too, ending at the same offset. Hyperscan reports match *ends* only; the
exact Python regex is then tried just before each reported end.

Each thread gets its own scratch space, so scans are safe from many threads.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence

import hyperscan

_LOOKAROUND = re.compile(r"\(\?<?[!=](?:\\.|\[(?:\\.|[^\]])*\]|[^()\\])*\)")
_NAMED = re.compile(r"\(\?P<\w+>")
_LONG_REPEAT = re.compile(r"\{(\d+),(\d+)\}")
_ESCAPE_WIDE = {"w": r"\w\x80-\xff", "s": r"\s\x1c-\x1f\x80-\xff", "d": r"\d\x80-\xff"}
REPEAT_CAP = 24  # repeats bounded above this become unbounded (much cheaper to compile)


def _widen(rx: str) -> str:
    """Make \\w, \\s, \\d match any non-ASCII byte too (Python's are Unicode-aware)."""
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(rx):
        c = rx[i]
        if c == "\\" and i + 1 < len(rx):
            nxt = rx[i + 1]
            if nxt in _ESCAPE_WIDE:
                wide = _ESCAPE_WIDE[nxt]
                out.append(wide if in_class else f"[{wide}]")
            else:
                out.append(rx[i : i + 2])
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
            out.append(c)
            if rx[i + 1 : i + 2] == "^":
                out.append("^")
                i += 1
            if rx[i + 1 : i + 2] == "]":  # a literal ] first in a class
                out.append("\\]")
                i += 1
        elif c == "]" and in_class:
            in_class = False
            out.append(c)
        else:
            out.append(c)
        i += 1
    return "".join(out)


def superset(rx: str) -> bytes:
    """A Hyperscan pattern that matches wherever ``rx`` does (see module doc)."""
    text = _NAMED.sub("(?:", rx)
    while True:
        stripped = _LOOKAROUND.sub("", text)
        if stripped == text:
            break
        text = stripped
    text = _LONG_REPEAT.sub(lambda m: m.group() if int(m.group(2)) <= REPEAT_CAP else m.group(1).join(("{", ",}")), text)
    text = text.replace(r"\Z", r"\z")
    return _widen(text).encode()


class Multi:
    """A compiled set of patterns; ``ends`` reports every (pattern index, end offset)."""

    def __init__(self, patterns: Sequence[bytes], caseless: Sequence[int] | None = None) -> None:
        self.db = hyperscan.Database()
        self.size = len(patterns)
        base = hyperscan.HS_FLAG_ALLOWEMPTY
        flags = [base | (hyperscan.HS_FLAG_CASELESS if c else 0) for c in (caseless or [0] * len(patterns))]
        self.db.compile(expressions=list(patterns), ids=list(range(len(patterns))), elements=len(patterns),
                        flags=flags)
        self._local = threading.local()

    def _scratch(self) -> hyperscan.Scratch:
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = hyperscan.Scratch(self.db)
        return scratch

    def ends(self, data: bytes) -> dict[int, list[int]]:
        """Pattern index → end offsets (bytes) of its matches, in scan order."""
        out: dict[int, list[int]] = {}

        def on_match(pid: int, _from: int, to: int, _flags: int, _ctx: object) -> None:
            hits = out.get(pid)
            if hits is None:
                out[pid] = [to]
            else:
                hits.append(to)

        self.db.scan(data, match_event_handler=on_match, scratch=self._scratch())
        return out

    def any(self, data: bytes) -> bool:
        """True when any pattern matches anywhere (stops at the first match)."""
        try:
            self.db.scan(data, match_event_handler=_stop, scratch=self._scratch())
        except hyperscan.ScanTerminated:
            return True
        return False


def _stop(*_args: object) -> bool:
    return True
