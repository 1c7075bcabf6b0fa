"""Normalisation before detection: turn evasive text into the plain form the
detectors look for, while remembering where each piece came from so a match
can be mapped back to the original bytes.

Steps (each bounded, none can raise on any input):
* bytes → text with ``surrogateescape``: invalid UTF-8 becomes one lone
  surrogate per bad byte (counted, and itself a signal), never an exception;
* per code point: NFKD compatibility mapping (full-width, math letters,
  ligatures), combining marks stripped, zero-width / bidi / variation-selector
  / tag characters removed (tag characters spell ASCII, so they are decoded),
  homoglyphs folded to Latin, lower case; iterated to a fixed point so
  ``fold(fold(x)) == fold(x)``;
* de-spaced letter runs (``i g n o r e``) collapsed;
* percent and HTML escapes decoded in place; base64 and hex runs decoded into
  their own views, recursively up to a depth and byte budget.
"""

from __future__ import annotations

import binascii
import html
import re
import unicodedata
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from urllib.parse import unquote

import numpy as np

from fak.policy.matcher import Matcher, char_offsets, encode
from fak.policy.patterns import TRIGGER_BASE64, TRIGGER_HEX

ZERO_WIDTH = "\u200b\u200c\u200d\u2060\u2061\u2062\u2063\u2064\ufeff\u180e\u00ad\u034f\u115f\u1160\u3164\uffa0\u17b4\u17b5"
BIDI = "\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u061c"
_REMOVE = set(ZERO_WIDTH + BIDI)

# Latin look-alikes that compatibility decomposition leaves alone (Cyrillic, Greek,
# Armenian, Cherokee, IPA and a few symbols), plus typographic quotes and dashes.
_CONFUSABLE_SRC = {
    "a": "аɑαａ⍺", "b": "Ьвƅβ", "c": "сϲⅽ", "d": "ԁⅾ", "e": "еєҽεϵ℮", "f": "ϝ", "g": "ɡց", "h": "һհ",
    "i": "іӏιɩ", "j": "јϳ", "k": "κк", "l": "ⅼǀ", "m": "ⅿм", "n": "ոп", "o": "оοσօ০", "p": "рρ",
    "q": "ԛ", "r": "гᴦ", "s": "ѕꜱ", "t": "τт", "u": "υսʋ", "v": "νѵ", "w": "ѡԝ", "x": "хχ",
    "y": "уγү", "z": "ᴢ", "'": "‘’‚‛′`´", '"': "“”„‟″«»", "-": "‐‑‒–—―−", " ": "\u00a0\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000",
    "A": "АΑ", "B": "ВΒ", "C": "СϹ", "E": "ЕΕ", "H": "НΗ", "I": "ІΙ", "J": "Ј", "K": "КΚ", "M": "МΜ",
    "N": "Ν", "O": "ОΟ", "P": "РΡ", "S": "Ѕ", "T": "ТΤ", "X": "ХΧ", "Y": "ΥҮ", "Z": "Ζ",
}
# ASCII is never folded to other ASCII (a backtick stays a backtick, so code fences are
# seen the same way in ASCII and non-ASCII text; the ASCII fast path of ``fold`` relies on it).
CONFUSABLES = {src: dst for dst, srcs in _CONFUSABLE_SRC.items() for src in srcs if not src.isascii()}


def _fold_once(char: str) -> str:
    code = ord(char)
    if char in _REMOVE or 0xFE00 <= code <= 0xFE0F or 0xE0100 <= code <= 0xE01EF:
        return ""
    if 0xE0000 <= code <= 0xE007F:  # tag characters spell hidden ASCII
        return chr(code - 0xE0000).lower() if 0x20 <= code - 0xE0000 <= 0x7E else ""
    if 0xDC80 <= code <= 0xDCFF:  # an invalid byte kept by surrogateescape
        return "\ufffd"
    out = []
    for piece in unicodedata.normalize("NFKD", char):
        if unicodedata.combining(piece):
            continue
        out.append(CONFUSABLES.get(piece, piece))
    text = "".join(out).lower()
    return "".join(p for p in unicodedata.normalize("NFKD", text) if not unicodedata.combining(p))


def fold_char(char: str) -> str:
    """Fold one code point to its plain form, iterated until stable."""
    out = _fold_once(char)
    for _ in range(4):
        nxt = "".join(_fold_once(c) for c in out)
        if nxt == out:
            break
        out = nxt
    return out


class _FoldTable(dict):
    """``str.translate`` table that folds each code point on first sight (a memo of a pure function)."""

    def __missing__(self, code: int) -> str:
        value = fold_char(chr(code))
        self[code] = value
        return value


_TABLE = _FoldTable()


_NON_ASCII_TEXT = re.compile("[^\x00-\x7f]+")


def fold(text: str) -> str:
    """Per-code-point folding (see module doc). ASCII folds to its lower case, so only the
    non-ASCII runs go through the (slower) per-code-point table."""
    if text.isascii():
        return text.lower()
    out: list[str] = []
    pos = 0
    for start, end in _non_ascii_runs(text):
        out.append(text[pos:start].lower())
        out.append(text[start:end].translate(_TABLE))
        pos = end
    out.append(text[pos:].lower())
    return "".join(out)


def _non_ascii_runs(text: str) -> list[tuple[int, int]]:
    """(start, end) of each run of non-ASCII characters; vectorised for long text (a regex
    walks a non-ASCII string slowly)."""
    if len(text) < 2048:
        return [m.span() for m in _NON_ASCII_TEXT.finditer(text)]
    where = np.flatnonzero(_code_points(text) >= 0x80)
    cuts = np.flatnonzero(np.diff(where) > 1)
    starts = np.concatenate((where[:1], where[cuts + 1]))
    ends = np.concatenate((where[cuts], where[-1:])) + 1
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


# A run of single characters split by spaces. It may touch markup or punctuation
# (``<p>i g n o r e …</p>``, ``"s e n d …"``) but not a word: ``a b c`` inside ``xa b c`` is not one.
# Gaps up to six: letters may be spread wider than by one space, words wider still.
# In a JSON string a de-spaced text keeps its escapes (``t a k e s . \\n \\n a s k``,
# ``{ \\" a m o u n t \\" :``): an escape (``\\n``, ``\\"``, …) is one character of the run,
# and a run may start right after one (``\\ni g n o r e``: the ``n`` is not a word).
_ESC = r"\\[nrt\"/]"
_RUN = re.compile(rf"(?:(?<!\w)|(?<=\\[nrt]))(?:(?:{_ESC}|\S)[ \t]{{1,6}}){{3,}}(?:{_ESC}|\S)(?!\w)")
_GAP = re.compile(r"[ \t]+")


def _collapse(run: str) -> str:
    """A run with its letters joined: a gap wider than the run's narrowest separates words
    (``i g n o r e  a l l`` and ``i  g  n  o  r  e     a  l  l`` are both ``ignore all``)."""
    narrow = min(len(gap) for gap in _GAP.findall(run))
    words = re.split(rf"[ \t]{{{narrow + 1},}}", run)
    return " ".join(word.replace(" ", "").replace("\t", "") for word in words)


def despace(text: str) -> str:
    """Collapse runs of single characters split by spaces: ``i g n o r e  a l l`` → ``ignore all``."""
    while True:
        out = _RUN.sub(lambda m: _collapse(m.group()), text)
        if out == text:
            return out
        text = out


def normalize(text: str) -> str:
    """The full normal form of a text (fold, then de-space); idempotent."""
    out = despace(fold(text))
    while True:
        again = despace(fold(out))
        if again == out:
            return out
        out = again


# ---------------------------------------------------------------- views with position maps


@dataclass
class View:
    """A text derived from its parent, with a map from its positions to the parent's.

    ``pieces`` are (start in this view, parent start, parent end, exact): an exact piece
    maps position by position; an inexact one maps as a whole to its parent span.
    ``pieces is None`` means identity. The root view (parent None) is the decoded input,
    whose positions map to byte offsets.
    """

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
        a = self._locate(start, True)
        b = self._locate(max(end - 1, start), False)
        return a[0], b[1], a[2] and b[2]

    def _locate(self, pos: int, left: bool) -> tuple[int, int, bool]:
        i = max(bisect_right(self._starts, pos) - 1, 0)
        vstart, pstart, pend, exact = self.pieces[i]
        if exact:
            p = min(pstart + (pos - vstart), pend)
            return p, p + 1, True
        return pstart, pend, False


class Shifts:
    """The map between a text and a form of it in which the characters at ``idx`` (sorted)
    became ``lens[k]`` characters (or bytes) long and every other one stayed one long; a
    few bisections per query, built from the changed characters only (for text that is
    mostly ASCII, much cheaper than a cumulative array over every character)."""

    def __init__(self, idx: list[int], lens: list[int], n: int) -> None:
        self.idx = idx
        self.shift = [0]  # segment j: characters after idx[j-1] up to idx[j] are shifted by shift[j]
        self.seg_start = [0]  # where segment j starts in the form
        for k, (i, length) in enumerate(zip(idx, lens, strict=True)):
            self.shift.append(self.shift[k] + length - 1)
            self.seg_start.append(i + 1 + self.shift[k + 1])
        self.last = idx + [n]  # last character of each segment

    def forward(self, i: int) -> int:
        """Where character ``i`` begins in the form (``i == n``: the form's length)."""
        return i + self.shift[bisect_left(self.idx, i)]

    def back(self, pos: int) -> int:
        """The last character that begins at or before ``pos`` in the form."""
        j = bisect_right(self.seg_start, pos) - 1
        return min(pos - self.shift[j], self.last[j])


SPARSE_MAX = 4096  # changed characters up to which a ``Shifts`` map is used (else a cumulative array)


def fold_shifts(text: str) -> Shifts | None:
    """``Shifts`` from ``text`` to ``fold(text)`` (None: too many changed characters)."""
    wide = _non_ascii(text)
    if wide is None:
        return None
    idx: list[int] = []
    lens: list[int] = []
    for k, code in wide:
        length = len(_TABLE[code])
        if length != 1:
            idx.append(k)
            lens.append(length)
    return Shifts(idx, lens, len(text))


def utf8_shifts(text: str) -> Shifts | None:
    """``Shifts`` from a surrogateescape-decoded text to its bytes (None: too many non-ASCII characters)."""
    wide = _non_ascii(text)
    if wide is None:
        return None
    lens = [1 if 0xDC80 <= code <= 0xDCFF else 2 if code < 0x800 else 3 if code < 0x10000 else 4 for _, code in wide]
    return Shifts([k for k, _ in wide], lens, len(text))


def _non_ascii(text: str) -> list[tuple[int, int]] | None:
    """(index, code point) of each non-ASCII character, or None when there are more than ``SPARSE_MAX``."""
    cps = _code_points(text)
    where = np.flatnonzero(cps >= 0x80)
    if len(where) > SPARSE_MAX:
        return None
    return list(zip(where.tolist(), cps[where].tolist(), strict=True))


class FoldView(View):
    """Folded text of its parent; the per-character map is built only when a match needs it."""

    _cum: np.ndarray | Shifts | None = None

    def to_parent(self, start: int, end: int) -> tuple[int, int, bool]:
        parent = self.parent
        if parent is not None and len(self.text) == len(parent.text) and parent.text.isascii():
            return start, end, True
        if self._cum is None:
            self._cum = fold_shifts(parent.text) or fold_offsets(parent.text)
        cum = self._cum
        last = max(end - 1, start)
        if isinstance(cum, Shifts):
            a, b = cum.back(start), cum.back(last)
        else:
            a = int(cum.searchsorted(start, side="right")) - 1
            b = int(cum.searchsorted(last, side="right")) - 1
        return a, min(b + 1, len(parent.text)), True


def _code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


def fold_offsets(text: str) -> np.ndarray:
    """Start of each character's folded form in ``fold(text)`` (plus the total), vectorised."""
    cps = _code_points(text)
    lens = np.ones(len(cps), dtype=np.int64)
    wide = cps >= 0x80
    if wide.any():
        uniq, inverse = np.unique(cps[wide], return_inverse=True)
        lens[wide] = np.array([len(_TABLE[int(u)]) for u in uniq], dtype=np.int64)[inverse]
    return np.concatenate(([0], np.cumsum(lens)))


def piecewise(parent: View, pattern: re.Pattern[str], repl, layer: str) -> View | None:
    """A view with every match of ``pattern`` replaced by ``repl(match)`` (None keeps it)."""
    pieces: list[tuple[int, int, int, bool]] = []
    out: list[str] = []
    pos = 0
    vpos = 0
    changed = False
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
        changed = True
    if not changed:
        return None
    if pos < len(text):
        pieces.append((vpos, pos, len(text), True))
        out.append(text[pos:])
    return View("".join(out), layer, parent, pieces, parent.depth)


def byte_span(view: View, start: int, end: int, root_bytes_len: int,
              cum: np.ndarray | Shifts | None) -> tuple[int, int, bool]:
    """Map a span in ``view`` back to byte offsets of the original input (``cum``: the root
    text's characters to bytes, ``char_byte_offsets`` or ``utf8_shifts``; None for ASCII)."""
    exact = True
    while view.parent is not None:
        start, end, ok = view.to_parent(start, end)
        exact = exact and ok
        view = view.parent
    if cum is None:  # the root text is ASCII (one byte per character)
        return start, end, exact
    if isinstance(cum, Shifts):
        return cum.forward(start), cum.forward(min(end, cum.last[-1])), exact
    return int(cum[start]), int(cum[min(end, len(cum) - 1)]), exact


def char_byte_offsets(text: str) -> np.ndarray:
    """Cumulative UTF-8 byte offsets of each character of a surrogateescape-decoded text."""
    cps = _code_points(text)
    lens = np.where(cps < 0x80, 1, np.where(cps < 0x800, 2, np.where(cps < 0x10000, 3, 4)))
    lens[(cps >= 0xDC80) & (cps <= 0xDCFF)] = 1  # one invalid byte kept by surrogateescape
    return np.concatenate(([0], np.cumsum(lens)))


# ---------------------------------------------------------------- decoders

_PCT = re.compile(r"(?:%[0-9a-fA-F]{2})+")
_ENT = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[a-zA-Z][a-zA-Z0-9]{1,31});")
_B64 = re.compile(r"(?<![A-Za-z0-9+/_-])[A-Za-z0-9+/_-]{24,}={0,2}(?![A-Za-z0-9+/=_-])")
_HEX = re.compile(r"(?<![0-9a-fA-F])(?:[0-9a-fA-F]{2}[ :]?){12,}(?![0-9a-fA-F])")


def _pct(m: re.Match[str]) -> str | None:
    return unquote(m.group(), errors="replace")


def _ent(m: re.Match[str]) -> str | None:
    out = html.unescape(m.group())
    return None if out == m.group() else out


def unescape_view(parent: View) -> View | None:
    """Percent-escapes and numeric HTML character references decoded in place, when
    there are enough to hide words (a lone ``&amp;`` or ``50%`` is left alone)."""
    text = parent.text
    view = parent
    if text.count("%") >= 3:
        view = piecewise(view, _PCT, _pct, "percent") or view
    if "&#" in view.text:
        view = piecewise(view, _ENT, _ent, "html") or view
    return None if view is parent else view


# Markdown that is not rendered: a comment ``[//]: # (…)`` and a link title ``[…](url "…")``.
# Either holds one line, so text hidden there has its line breaks flattened to spaces, and
# a forged exchange (``User: … Assistant: …``) or a ReAct block loses the line structure
# its patterns look for. The view puts a line break back before each capitalised ``Word:``
# label and at the start of the hidden text. Bounded so that the whole of it lies in a triage region.
_MD_HIDDEN = re.compile(r"(\[//\]:[ \t]*#[ \t]*\()([^()\n]{1,300})(\))"
                        r"|(\]\([^()\s]{1,300}[ \t]+\\?\")([^\"\n]{1,300}?)(\\?\"\))")
_LABEL_GAP = re.compile(r"[ \t]+(?=[A-Z][\w-]{0,24}[ \t]?:(?:[ \t]|$))")  # a capitalised label: "… Assistant: …"


def _md_lines(m: re.Match[str]) -> str:
    head, body, tail = (m.group(1, 2, 3) if m.group(1) is not None else m.group(4, 5, 6))
    return head + "\n" + _LABEL_GAP.sub("\n", body.strip()) + "\n" + tail


def markdown_view(parent: View) -> View | None:
    """Text hidden in markdown comments and link titles with its flattened line breaks put back."""
    if "[//]" not in parent.text and '"' not in parent.text:
        return None
    return piecewise(parent, _MD_HIDDEN, _md_lines, "markdown")


def _mostly_printable(text: str, share: float = 0.9) -> bool:
    """Whether at least ``share`` of ``text`` is printable (line breaks and tabs count; U+FFFD,
    which marks bytes that were not UTF-8, does not: a binary blob is not text, whatever
    ``isprintable`` says)."""
    if not text:
        return False
    bad = text.count("\ufffd")
    if len(text) - bad < share * len(text):
        return False
    if not bad and (text.isprintable() or text.replace("\n", "").replace("\r", "").replace("\t", "").isprintable()):
        return True
    good = sum(map(str.isprintable, text)) + text.count("\n") + text.count("\r") + text.count("\t") - bad
    return good >= share * len(text)


def _table(pick) -> bytes:
    return bytes(pick(chr(b)) for b in range(256))


_B64_CLASS = _table(lambda c: ord("a") if c.isascii() and (c.isalnum() or c in "+/_-") else ord("s"))
_HEX_CLASS = _table(lambda c: ord("h") if c in "0123456789abcdefABCDEF" else ord("s") if c in " :" else ord("x"))
_RUN_CLASS = _table(lambda c: ord("s") if c in " \t" else ord("n") if c.isspace() else ord("a"))


def _classes(text: str, table: bytes) -> bytes:
    return text.encode("utf-8", "surrogatepass").translate(table)


def may_have_letter_run(text: str) -> bool:
    """Cheap pre-check for ``despace`` (true wherever ``_RUN`` matches): four single characters
    separated by spaces, once runs of up to eight spaces are taken as one."""
    # a backslash is dropped: an escape (``\\n``) counts as one character, as in ``_RUN``
    t = text.encode("utf-8", "surrogatepass").translate(_RUN_CLASS, b"\\")
    t = t.replace(b"ss", b"s").replace(b"ss", b"s").replace(b"ss", b"s")
    return b"asasasa" in t


def may_have_payload(text: str) -> bool:
    """Cheap pre-check for ``decoded_payloads``: a 24-character base64 run or 12 spaced hex pairs."""
    return b"a" * 24 in _classes(text, _B64_CLASS) or b"hhshhshhshhshhshh" in _classes(text, _HEX_CLASS)


_RUN_LOCATOR: list[Matcher] = []


def _run_starts(text: str) -> tuple[list[int], list[int]]:
    """Where base64-looking and hex-looking runs may start (character offsets), found
    natively; each is confirmed by ``_B64``/``_HEX`` at that place."""
    if not _RUN_LOCATOR:
        _RUN_LOCATOR.append(Matcher([], [], (TRIGGER_BASE64, TRIGGER_HEX), caseless=True))
    data = encode(text)
    ends = _RUN_LOCATOR[0].db.ends(data)
    if not ends:
        return [], []
    cum = None if len(data) == len(text) else char_offsets(text, data)

    def chars(points: list[int]) -> list[int]:
        return points if cum is None else np.searchsorted(cum, points).tolist()

    b64 = [max(0, p - 24) for p in chars(ends.get(0, []))]
    hexes = [max(0, p - 37) for p in chars(ends.get(1, []))]
    return b64, hexes


def decoded_payloads(root: View, budget: int,
                     starts: tuple[list[int], list[int]] | None = None) -> list[tuple[int, int, str, str]]:
    """Base64 and hex runs of ``root`` that decode to mostly printable text:
    (start, end, layer, decoded text), within a byte budget. ``starts`` (base64, hex
    candidate starts) skips locating the runs when the caller knows them."""
    out: list[tuple[int, int, str, str]] = []
    text = root.text
    b64_starts, hex_starts = starts if starts is not None else _run_starts(text)
    if not b64_starts and not hex_starts:
        return out
    for m in _confirmed(_B64, text, b64_starts):
        if budget <= 0:
            break
        run = m.group()
        if run.isalpha() and (run.islower() or run.isupper()):  # a long word, not base64
            continue
        if not run.lstrip(_HEX_DIGITS):  # a hash or hex dump: decoded as hex below (see ``_HEX_DIGITS``)
            continue
        for shift in range(4):  # a run glued to a preceding letter (JSON "\\n") is misaligned
            raw = _b64(run[shift:] if shift else run)
            decoded = None if raw is None else raw.decode("utf-8", "replace")
            if decoded is not None and _mostly_printable(decoded):
                out.append((m.start() + shift, m.end(), "base64", decoded))
                budget -= len(raw)
                break
    hex_starts = sorted(set(hex_starts + b64_starts))
    if hex_starts and b"h" * 24 not in _classes(text, _HEX_CLASS).replace(b"s", b""):
        hex_starts = []  # not twelve hex pairs anywhere, even with the separators taken out
    for m in _confirmed(_HEX, text, hex_starts, 13):
        if budget <= 0:
            break
        digits = m.group().replace(" ", "").replace(":", "")
        if len(digits) % 2:
            digits = digits[:-1]
        try:
            raw = binascii.unhexlify(digits)
        except (binascii.Error, ValueError):
            continue
        decoded = raw.decode("utf-8", "replace")
        if _mostly_printable(decoded):
            out.append((m.start(), m.end(), "hex", decoded))
            budget -= len(raw)
    return out


# Base64 made only of hex digits cannot spell an instruction: the letters b, c, d, e, j, r and
# H-L, R-U, X, Y decode from it at no position (tested exhaustively), so such a run (a digest,
# a key id, a UUID without dashes) is decoded as hex only, not tried as base64 at four shifts.
_HEX_DIGITS = "0123456789abcdefABCDEF"


def _confirmed(rx: re.Pattern[str], text: str, starts: list[int], slack: int = 0):
    """Matches of ``rx`` beginning at a candidate start (or up to ``slack`` after it), once each.
    With a slack, one search finds the leftmost match from a place (what a match tried at
    each place in turn would find), and serves the later candidates until they pass it."""
    last = -1
    ahead: re.Match[str] | None = None  # leftmost match beginning at or after ``searched``
    searched = -1
    for start in starts:
        lo, hi = max(start, last), start + slack
        if lo > hi:
            continue
        if not slack:
            m = rx.match(text, lo)
        else:
            if searched < 0 or lo < searched or (ahead is not None and ahead.start() < lo):
                ahead, searched = rx.search(text, lo), lo
            m = ahead if ahead is not None and ahead.start() <= hi else None
        if m is not None:
            last = m.end()
            yield m


_URLSAFE = str.maketrans("-_", "+/")


def _b64(run: str) -> bytes | None:
    """``base64.b64decode(validate=True)``, or ``urlsafe_b64decode`` for the URL-safe
    alphabet, of ``run`` padded; None when it does not decode (binascii directly: the
    wrappers cost more than the decoding of a short run)."""
    body = run.rstrip("=")
    pad = "=" * (-len(body) % 4)
    try:
        if "-" in body or "_" in body:
            return binascii.a2b_base64((body + pad).translate(_URLSAFE))
        return binascii.a2b_base64(body + pad, strict_mode=True)
    except (binascii.Error, ValueError):
        return None
