"""Fold and views: the text forms the signatures are matched on, each able to map a
match back to the bytes of the input it came from.

* ``fold``: per code point, NFKC-like compatibility mapping (full-width, ligatures,
  math letters), combining marks dropped, invisible, bidi, variation-selector
  characters removed, tag characters (U+E0000..) turned into the ASCII they spell,
  Latin look-alikes (Cyrillic, Greek, …) folded to Latin, lower case.
* views of a text: the folded text; a de-spaced view (``i g n o r e`` → ``ignore``);
  an unescaped view (percent and HTML escapes decoded); and base64/hex runs decoded
  into child texts of their own, within a depth and a byte budget.

Every transform here is local to a line (no view joins text across a line break), so
the accelerated path may hand whole lines to the reference path and get the same
views (``accel.py`` relies on it).
"""

from __future__ import annotations

import binascii
import html
import re
import unicodedata
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import unquote

ZERO_WIDTH = "\u200b\u200c\u200d\u2060\u2061\u2062\u2063\u2064\ufeff\u180e\u00ad\u034f\u115f\u1160\u3164\uffa0\u17b4\u17b5"
BIDI = "\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u061c"
_REMOVE = frozenset(ZERO_WIDTH + BIDI)

# Latin look-alikes that compatibility decomposition leaves alone, and typographic punctuation.
_CONFUSABLE_SRC = {
    "a": "аɑαａ⍺", "b": "Ьвƅβ", "c": "сϲⅽ", "d": "ԁⅾ", "e": "еєҽεϵ℮", "f": "ϝ", "g": "ɡց", "h": "һհ",
    "i": "іӏιɩ", "j": "јϳ", "k": "κк", "l": "ⅼǀ", "m": "ⅿм", "n": "ոп", "o": "оοσօ০", "p": "рρ",
    "q": "ԛ", "r": "гᴦ", "s": "ѕꜱ", "t": "τт", "u": "υսʋ", "v": "νѵ", "w": "ѡԝ", "x": "хχ",
    "y": "уγү", "z": "ᴢ", "'": "‘’‚‛′´", '"': "“”„‟″«»", "-": "‐‑‒–—―−",
    " ": "\u00a0\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000",
    "A": "АΑ", "B": "ВΒ", "C": "СϹ", "E": "ЕΕ", "H": "НΗ", "I": "ІΙ", "J": "Ј", "K": "КΚ", "M": "МΜ",
    "N": "Ν", "O": "ОΟ", "P": "РΡ", "S": "Ѕ", "T": "ТΤ", "X": "ХΧ", "Y": "ΥҮ", "Z": "Ζ",
}
CONFUSABLES = {src: dst for dst, srcs in _CONFUSABLE_SRC.items() for src in srcs}


def _fold_once(char: str) -> str:
    code = ord(char)
    if char in _REMOVE or 0xFE00 <= code <= 0xFE0F or 0xE0100 <= code <= 0xE01EF:
        return ""
    if 0xE0000 <= code <= 0xE007F:  # tag characters spell hidden ASCII
        return chr(code - 0xE0000).lower() if 0x20 <= code - 0xE0000 <= 0x7E else ""
    if 0xDC80 <= code <= 0xDCFF:  # an invalid byte kept by surrogateescape
        return "\ufffd"
    pieces = (CONFUSABLES.get(p, p) for p in unicodedata.normalize("NFKD", char) if not unicodedata.combining(p))
    text = "".join(pieces).lower()
    return "".join(p for p in unicodedata.normalize("NFKD", text) if not unicodedata.combining(p))


def fold_char(char: str) -> str:
    """One code point folded, iterated to a fixed point (so ``fold(fold(x)) == fold(x)``)."""
    out = _fold_once(char)
    for _ in range(4):
        nxt = "".join(_fold_once(c) for c in out)
        if nxt == out:
            break
        out = nxt
    return out


class _Table(dict[int, str]):
    """Memo of ``fold_char`` keyed by code point (a pure function)."""

    def __missing__(self, code: int) -> str:
        value = self[code] = fold_char(chr(code))
        return value


_TABLE = _Table()
_NON_ASCII = re.compile("[^\x00-\x7f]+")


# ---------------------------------------------------------------- views


@dataclass
class View:
    """A text and how its positions map to its parent's: ``pieces`` are (start here,
    parent start, parent end, exact); an exact piece maps position by position, an
    inexact one as a whole. ``pieces is None``: identity. The root (no parent) is the
    decoded input, whose character offsets ``Scan`` maps to bytes."""

    text: str
    layer: str
    parent: View | None = None
    pieces: list[tuple[int, int, int, bool]] | None = None
    depth: int = 0
    _starts: list[int] = field(default_factory=list, repr=False)

    def to_parent(self, start: int, end: int) -> tuple[int, int, bool]:
        if self.pieces is None:
            return start, end, True
        if not self._starts:
            self._starts = [p[0] for p in self.pieces]
        a0, a1, a_exact = self._locate(self.pieces, start)
        b0, b1, b_exact = self._locate(self.pieces, max(end - 1, start))
        return a0, b1, a_exact and b_exact

    def _locate(self, pieces: list[tuple[int, int, int, bool]], pos: int) -> tuple[int, int, bool]:
        i = max(bisect_right(self._starts, pos) - 1, 0)
        vstart, pstart, pend, exact = pieces[i]
        if exact:
            p = min(pstart + (pos - vstart), max(pend - 1, pstart))
            return p, p + 1, True
        return pstart, pend, False

    def to_root(self, start: int, end: int) -> tuple[int, int, bool]:
        view, exact = self, True
        while view.parent is not None:
            start, end, ok = view.to_parent(start, end)
            exact = exact and ok
            view = view.parent
        return start, end, exact


def fold(text: str) -> str:
    """The folded form of ``text`` (see module doc)."""
    return fold_view(View(text, "text")).text


def fold_view(parent: View) -> View:
    """``parent`` folded; ASCII only changes case, so only non-ASCII characters cost a lookup."""
    text = parent.text
    if text.isascii():
        return View(text.lower(), "folded" if parent.parent is None else parent.layer, parent, None, parent.depth)
    out: list[str] = []
    pieces: list[tuple[int, int, int, bool]] = []
    pos = vpos = 0  # parent position and view position of the current exact stretch
    run_start, run_vstart = 0, 0
    for m in _NON_ASCII.finditer(text):
        out.append(text[pos : m.start()].lower())
        vpos += m.start() - pos
        for i in range(m.start(), m.end()):
            folded = _TABLE[ord(text[i])]
            if len(folded) == 1:
                out.append(folded)
                vpos += 1
                continue
            if i > run_start:
                pieces.append((run_vstart, run_start, i, True))
            pieces.append((vpos, i, i + 1, False))
            out.append(folded)
            vpos += len(folded)
            run_start, run_vstart = i + 1, vpos
        pos = m.end()
    out.append(text[pos:].lower())
    if not pieces:
        return View("".join(out), "folded" if parent.parent is None else parent.layer, parent, None, parent.depth)
    if run_start < len(text):
        pieces.append((run_vstart, run_start, len(text), True))
    return View("".join(out), "folded" if parent.parent is None else parent.layer, parent, pieces, parent.depth)


def piecewise(
    parent: View, pattern: re.Pattern[str], repl: Callable[[re.Match[str]], str | None], layer: str
) -> View | None:
    """``parent`` with every match of ``pattern`` replaced by ``repl(match)``; None when nothing changed."""
    pieces: list[tuple[int, int, int, bool]] = []
    out: list[str] = []
    pos = vpos = 0
    text = parent.text
    for m in pattern.finditer(text):
        new = repl(m)
        if new is None or new == m.group():
            continue
        if m.start() > pos:
            pieces.append((vpos, pos, m.start(), True))
            out.append(text[pos : m.start()])
            vpos += m.start() - pos
        pieces.append((vpos, m.start(), m.end(), False))
        out.append(new)
        vpos += len(new)
        pos = m.end()
    if not pieces:
        return None
    if pos < len(text):
        pieces.append((vpos, pos, len(text), True))
        out.append(text[pos:])
    return View("".join(out), layer, parent, pieces, parent.depth)


# A run of four or more single characters split by one to six blanks, not inside a word
# (``i g n o r e``, also right after markup: ``<p>i g n …``); a gap wider than the run's
# narrowest separates words.
_RUN = re.compile(r"(?:(?<!\w)|(?<=\\[nrt]))(?:\S[ \t]{1,6}){3,}\S(?!\w)")
_GAP = re.compile(r"[ \t]+")


def _collapse(m: re.Match[str]) -> str:
    run = m.group()
    narrow = min(len(gap) for gap in _GAP.findall(run))
    return " ".join(w.replace(" ", "").replace("\t", "") for w in re.split(rf"[ \t]{{{narrow + 1},}}", run))


def despace_view(parent: View) -> View | None:
    return piecewise(parent, _RUN, _collapse, "despaced")


def despace(text: str) -> str:
    view = despace_view(View(text, "text"))
    return text if view is None else view.text


def normalize(text: str) -> str:
    """The normal form signatures see first: folded, then de-spaced (to a fixed point)."""
    out = text
    for _ in range(8):
        again = despace(fold(out))
        if again == out:
            break
        out = again
    return out


# a run of percent escapes; public because policy.accel builds its prefilter from it
PERCENT_RUN = re.compile(r"(?:%[0-9a-fA-F]{2})+")
# Numeric references, and the named ones of the punctuation markers are made of (``&lt;|im_start|&gt;``);
# ``&amp;``, ``&nbsp;`` and the like, everywhere in HTML, hide nothing a signature looks for.
HTML_ENTITY = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|(?i:lt|gt|quot|apos|vert|verbar|lsqb|rsqb|lbrack|rbrack"
                  r"|lcub|rcub|lbrace|rbrace|colon|sol|bsol|num|excl|lpar|rpar|lowbar|dollar|commat|equals|newline));")


def unescape_view(parent: View) -> View | None:
    """Percent escapes and HTML character references decoded in place, then folded again."""
    view = parent
    if "%" in view.text:
        view = piecewise(view, PERCENT_RUN, lambda m: unquote(m.group(), errors="replace"), "percent") or view
    if "&" in view.text:
        view = piecewise(view, HTML_ENTITY, lambda m: html.unescape(m.group()), "html") or view
    if view is parent:
        return None
    return fold_view(view)


# ---------------------------------------------------------------- encoded payloads

_B64 = re.compile(r"(?<![A-Za-z0-9+/_-])[A-Za-z0-9+/_-]{24,}={0,2}(?![A-Za-z0-9+/=_-])")
_HEX = re.compile(r"(?<![0-9a-fA-F])(?:[0-9a-fA-F]{2}[ :]?){12,}(?![0-9a-fA-F])")
_HEX_DIGITS = "0123456789abcdefABCDEF"
_URLSAFE = str.maketrans("-_", "+/")


def _b64(run: str) -> bytes | None:
    body = run.rstrip("=")
    body += "=" * (-len(body) % 4)
    try:
        if "-" in body or "_" in body:
            return binascii.a2b_base64(body.translate(_URLSAFE))
        return binascii.a2b_base64(body, strict_mode=True)
    except (binascii.Error, ValueError):
        return None


def _printable(text: str, share: float = 0.9) -> bool:
    """Mostly printable text (U+FFFD, a byte that was not UTF-8, does not count)."""
    if not text:
        return False
    if "\ufffd" not in text and text.replace("\n", "").replace("\r", "").replace("\t", "").isprintable():
        return True
    bad = text.count("\ufffd")
    if len(text) - bad < share * len(text):  # decoded binary, mostly U+FFFD: no count can reach the share
        return False
    # printable characters, and line breaks and tabs (not printable): counted in C, not a generator
    good = sum(map(str.isprintable, text)) + text.count("\n") + text.count("\r") + text.count("\t") - bad
    return good >= share * len(text)


def _runs(rx: re.Pattern[str], text: str, starts: list[int] | None) -> list[re.Match[str]]:
    """``rx.finditer(text)``, or its matches beginning at ``starts`` (a superset of where
    they begin, as the accelerated path knows): runs are maximal, so both agree."""
    if starts is None:
        return list(rx.finditer(text))
    out: list[re.Match[str]] = []
    for start in sorted(set(starts)):
        if out and start < out[-1].end():
            continue
        m = rx.match(text, start)
        if m is not None:
            out.append(m)
    return out


def payloads(text: str, budget: list[int], starts: tuple[list[int], list[int]] | None = None
             ) -> list[tuple[int, int, str, bytes]]:
    """Base64 and hex runs of ``text`` that decode to mostly printable text, in order of
    position: (start, end, layer, decoded bytes). ``budget`` (a one-element list) is the
    decoded bytes still allowed; every run that decodes spends it, printable or not. A
    base64 run glued to a letter before it (``\\naWdu…`` in JSON) is also tried one to
    three characters in. ``starts``: where base64 and hex runs may begin (see ``_runs``)."""
    if budget[0] <= 0:
        return []
    runs: list[tuple[int, int, str]] = []
    for m in _runs(_B64, text, None if starts is None else starts[0]):
        run = m.group()
        if (run.isalpha() and (run.islower() or run.isupper())) or not run.lstrip(_HEX_DIGITS):
            continue  # a long word, or hex digits only (decoded as hex below)
        runs.append((m.start(), m.end(), "base64"))
    runs.extend((m.start(), m.end(), "hex") for m in _runs(_HEX, text, None if starts is None else starts[1]))
    out: list[tuple[int, int, str, bytes]] = []
    for start, end, layer in sorted(runs):
        if budget[0] <= 0:
            break
        run = text[start:end]
        tries: Iterator[bytes | None]
        if layer == "hex":
            digits = run.replace(" ", "").replace(":", "")
            tries = iter([binascii.unhexlify(digits[: len(digits) // 2 * 2])])
        else:
            tries = (_b64(run[shift:]) for shift in range(4))
        spent = False
        for shift, raw in enumerate(tries):
            if raw is None:
                continue
            raw = raw[: budget[0]]
            if not spent:
                budget[0] -= len(raw)
                spent = True
            if _printable(raw.decode("utf-8", "replace")):
                out.append((start + shift, end, layer, raw))
                break
    return out
