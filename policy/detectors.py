"""Detectors: each reads a prepared ``Scan`` and returns findings with byte spans
in the original input, a family and a score in [0, 1]. They never raise on any
input and do bounded work (anchored regexes, capped decoding, a capped sample
for compression)."""

from __future__ import annotations

import math
import re
import threading
import zlib
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from fak.policy.hsdb import Multi, superset
from fak.policy.matcher import Matcher, char_offsets, encode, max_width
from fak.policy.normalize import FoldView, View, utf8_shifts
from fak.policy.patterns import (
    DISCUSSION,
    DISCUSSION_PARTS,
    FOLDED_TRIGGERS,
    GAP,
    HEADS,
    INJECTION,
    LINE_START,
    NATIVE_SUFFIX,
    NOT_AFTER_LETTER,
    RAW_TRIGGERS,
    SECRETS,
    VOID_AFTER,
    VOID_START,
    WORD_START,
)
from fak.policy.scan import Scan


@dataclass(frozen=True)
class Finding:
    detector: str
    family: str
    name: str
    score: float
    start: int
    end: int
    exact: bool
    layer: str


def _compile(entries, flags=0):
    return [(n, f, w, re.compile(rx.replace("~", GAP).replace(NOT_AFTER_LETTER, WORD_START), flags), anchors)
            for n, f, w, rx, anchors in entries]


_INJECTION = _compile(INJECTION)
_SECRETS = [(n, f, w, re.compile(rx), anchors) for n, f, w, rx, anchors in SECRETS]
QUOTE_LOOKBACK = 4096  # how far back a code fence or <code> is looked for
DISCOUNT = 0.25  # a quoted phrase in a text that discusses attacks counts for less
INJECTION_SPAN = 480  # longest injection match looked for (characters)
SECRET_SPAN = {"secret.private_key": 17000}
SECRET_DEFAULT_SPAN = 600

# One native database per vocabulary; the triage pass reuses them with its extra
# trigger patterns (ids after the vocabulary's own).
_LINE_START_NATIVE = rb"(?:^|\n)[ \t>#*_-]*"  # what _at_line_start accepts before a match
_NOT_AFTER_LETTER = rb"(?:^|[^a-z]|\\[nrt])"  # native form of WORD_START


def _heads(literals: tuple[str, ...], bounded: bool) -> list[tuple[bytes, int]]:
    return [((_NOT_AFTER_LETTER if bounded else b"") + re.escape(lit).encode(), len(lit)) for lit in literals]


_VOID_AFTER = {name: re.compile(rx.replace("~", GAP)) for name, rx in VOID_AFTER.items()}
_VOID_START = {name: re.compile(rx.replace("~", GAP)) for name, rx in VOID_START.items()}
INJ = Matcher([e[3] for e in _INJECTION], [INJECTION_SPAN] * len(_INJECTION), FOLDED_TRIGGERS,
              {n: _LINE_START_NATIVE for n, e in enumerate(_INJECTION) if e[0] in LINE_START}, caseless=True,
              heads={n: _heads(*HEADS[e[0]]) for n, e in enumerate(_INJECTION) if e[0] in HEADS},
              suffixes={n: NATIVE_SUFFIX[e[0]].replace("~", GAP) for n, e in enumerate(_INJECTION) if e[0] in NATIVE_SUFFIX})
SEC = Matcher([e[3] for e in _SECRETS], [SECRET_SPAN.get(e[0], SECRET_DEFAULT_SPAN) for e in _SECRETS], RAW_TRIGGERS)
_NATIVE: list[tuple[Multi, int]] = []
_NATIVE_LOCK = threading.Lock()


def native() -> tuple[Multi, int]:
    """Both vocabularies in one native database, compiled once per process: (database, id of
    the first secret pattern). INJ and SEC scan it, each keeping its own ids; an ASCII text
    (where folded and raw bytes agree) needs a single scan for both."""
    if not _NATIVE:
        with _NATIVE_LOCK:
            if not _NATIVE:
                inj, inj_flags = INJ.native()
                sec, sec_flags = SEC.native()
                db = Multi(inj + sec, caseless=inj_flags + sec_flags)
                INJ.share(db, 0)
                SEC.share(db, len(inj))
                _NATIVE.append((db, len(inj)))
    return _NATIVE[0]



INJ.provider = SEC.provider = native

WEIGHTS = [(e[1], e[2]) for e in _INJECTION]  # (family, weight) per injection pattern
_ANCHOR_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\[zZAbB]")


def _anchored(pattern: bytes) -> bool:
    """Whether a native pattern can depend on where the scanned text starts or ends."""
    if _ANCHOR_ESCAPE.search(pattern):
        return True
    bare = re.sub(rb"\[[^\]]*\]", b"", re.sub(rb"\\.", b"", pattern))  # escapes, then classes, taken out
    return b"^" in bare or b"$" in bare


# Per family, the strongest injection pattern whose native form is anchored (see ``gate._quiet``).
EDGE_WEIGHTS: dict[str, float] = {}
for _n, _pat in enumerate(INJ.native()[0][: INJ.count]):
    if _anchored(_pat):
        _family, _weight = WEIGHTS[_n]
        EDGE_WEIGHTS[_family] = max(EDGE_WEIGHTS.get(_family, 0.0), _weight)


class _Marks:
    """Positions of code fences and <code>/</code> tags in one text, found once, so the
    quoting test per finding is a few bisections instead of scans of 4 KiB."""

    def __init__(self, text: str) -> None:
        self.fences = [m.start() for m in _FENCE.finditer(text)]
        self.opens = [m.start() for m in _CODE_OPEN.finditer(text)]
        self.closes = [m.start() for m in _CODE_CLOSE.finditer(text)]
        self.pre_opens = [m.start() for m in _PRE_OPEN.finditer(text)]
        self.pre_closes = [m.start() for m in _PRE_CLOSE.finditer(text)]

    def quoted(self, lo: int, start: int) -> bool:
        fences = bisect_right(self.fences, start - 3) - bisect_left(self.fences, lo)
        if fences % 2 == 1:
            return True
        opened = max(self._last(self.opens, lo, start - 5), self._last(self.pre_opens, lo, start - 4))
        return opened > max(self._last(self.closes, lo, start - 6), self._last(self.pre_closes, lo, start - 5))

    @staticmethod
    def _last(positions: list[int], lo: int, hi: int) -> int:
        i = bisect_right(positions, hi) - 1
        return positions[i] if i >= 0 and positions[i] >= lo else -1


_FENCE = re.compile("```")
_CODE_OPEN = re.compile("<code")
_CODE_CLOSE = re.compile("</code")
_PRE_OPEN = re.compile("<pre")
_PRE_CLOSE = re.compile("</pre")
QUOTE_SPAN = 400  # how far back an open quotation is looked for (within the paragraph)


def _json_string_start(text: str, at: int) -> int:
    """Where the content of the JSON string holding ``at`` begins (just after its opening
    quote), or -1. A JSON string holds no raw line break and every quote mark inside it is
    escaped, so its opening quote is the nearest unescaped one before ``at`` on the same
    line (looked for at most ``QUOTE_LOOKBACK`` characters back); it opens a string when a
    key and a colon, an opening bracket, or a value and a comma come right before it
    (white space and line breaks between them aside)."""
    lo = max(0, at - QUOTE_LOOKBACK)
    lo = text.rfind("\n", lo, at) + 1 or lo
    q = at
    while True:
        q = text.rfind("\"", lo, q)
        if q < 0:
            return -1
        if _backslashes_before(text, q, lo) % 2 == 0:  # not escaped
            break
    head = text[max(0, q - 64) : q].rstrip(" \t\r\n")  # across a line break: pretty-printed arrays
    if head.endswith("["):
        return q + 1
    value = head[:-1].rstrip(" \t\r\n")
    if (head.endswith(":") and value.endswith("\"")) or (head.endswith(",") and value.endswith(_JSON_VALUE_ENDS)):
        return q + 1
    return -1


def _backslashes_before(text: str, pos: int, lo: int = 0) -> int:
    """How many backslashes come right before ``pos`` (not looking before ``lo``)."""
    if pos <= lo or text[pos - 1] != "\\":
        return 0
    run = text[lo:pos]
    return len(run) - len(run.rstrip("\\"))


_JSON_VALUE_ENDS = ("\"", "]", "}", "null", "true", "false", *"0123456789")  # how a value before a comma ends


def _in_quotation(text: str, start: int, json_start: int = -1) -> bool:
    """Quoted without a quote mark right before: inside a double-quoted passage opened
    earlier in its paragraph (an odd number of unescaped quote marks since the paragraph
    began), after an opening curly quote not yet closed, or on a line of an indented code
    block (each looked for at most ``QUOTE_SPAN`` characters back).

    Inside a JSON string (``json_start``, see ``_json_string_start``) the string's own quote
    marks and the indentation of its line are JSON's, not a quotation: there a passage is
    quoted by escaped quote marks (an odd number since the string or its last ``\\n\\n``
    began) or curly quotes, as a payload in prose is quoted by plain ones."""
    lo = max(0, start - QUOTE_SPAN)
    if json_start >= 0:
        lo = max(lo, json_start)
        para = text.rfind("\\n\\n", lo, start)
        seg = text[para + 4 if para >= 0 else lo : start]
        if seg.count("\\\"") % 2 == 1:
            return True
        return seg.rfind("\u201c") > seg.rfind("\u201d")
    line = text.rfind("\n", lo, start)
    if (line >= 0 or lo == 0) and text.startswith(("    ", "\t"), line + 1):
        return True
    para = text.rfind("\n\n", lo, start)
    if para >= 0:
        lo = para + 2
    seg = text[lo:start]
    if (seg.count("\"") - seg.count("\\\"")) % 2 == 1:
        return True
    return seg.rfind("\u201c") > seg.rfind("\u201d")


def _quoted(text: str, start: int, before: str = "", marks: _Marks | None = None) -> bool:
    """Inside quotes, a code fence or <code>: ``before`` is the folded text preceding
    this window of the input, so a fence opened before the window still counts."""
    if text[start : start + 1] in ("\"", "'", "`"):  # the match begins with a quote mark (a JSON key or string)
        return True
    if start < QUOTE_LOOKBACK and before:
        text = before[-(QUOTE_LOOKBACK - start) :] + text[:start]
        start = len(text)
        marks = None
    json_start = _json_string_start(text, start)
    before_q = text[max(0, start - 4, json_start) : start]
    if any(q in before_q for q in "\"'`"):
        return True
    if _in_quotation(text, start, json_start):
        return True
    lo = max(0, start - QUOTE_LOOKBACK, json_start)
    if marks is not None:
        return marks.quoted(lo, start)
    if text.count("```", lo, start) % 2 == 1:
        return True
    return max(text.rfind("<code", lo, start), text.rfind("<pre", lo, start)) > max(
        text.rfind("</code", lo, start), text.rfind("</pre", lo, start))


# A phrase after "can", "could", "may", "might" or "would" is described, not ordered
# ("a model can leak the conversation to https://…" in a write-up).
_HEDGE = re.compile((WORD_START + r"(?:can|could|may|might|would)(?:~not)?~$").replace("~", GAP))


def _hedged(text: str, start: int) -> bool:
    return _HEDGE.search(text, max(0, start - 14), start) is not None


def _talk_outside_strings(joined: str, off: int, text: str, start: int, end: int,
                          in_value: Callable[[int], bool] | None = None) -> bool:
    """A discussion match within reach of ``text[start:end]`` that lies in no JSON string
    value (``joined`` is ``text`` preceded by ``off`` characters of the input before it): a
    record's keys (``"grader":``, ``"chat_template":``) or words of the code or prose around
    the strings. Whoever wrote a string value controls the words inside it, not those."""
    lo, hi = max(0, start - 300), min(len(text), end + 300)
    for part in DISCUSSION_PARTS:
        for m in part.finditer(text, lo, hi):
            at = off + m.start()
            if not (in_value(at) if in_value is not None else _in_json_value(joined, at)):
                return True
    return False


def _in_json_value(text: str, at: int) -> bool:
    """Whether ``at`` lies in a JSON string that is not a key (a key's closing quote is
    followed by a colon): keys are structure, like the brackets around them. A string whose
    end is not in reach on its line counts as a value."""
    if _json_string_start(text, at) < 0:
        return False
    line_end = text.find("\n", at)
    stop = min(len(text) if line_end < 0 else line_end, at + QUOTE_LOOKBACK)
    close = at
    while True:
        close = text.find("\"", close, stop)
        if close < 0:
            return True
        if _backslashes_before(text, close, at) % 2 == 0:  # the string's closing quote
            return not text[close + 1 : close + 40].lstrip(" \t").startswith(":")
        close += 1


def _recorded(text: str, start: int, end: int, before: str = "") -> bool:
    """Inside a JSON string (see ``_json_string_start``) with discussion outside every
    string value within reach: evaluation and API logs, tokenizer configurations, test code
    listing attack strings."""
    off = min(len(before), QUOTE_LOOKBACK)
    joined = before[len(before) - off :] + text if off else text
    if _json_string_start(joined, off + start) < 0:
        return False
    return _talk_outside_strings(joined, off, text, start, end)


def _discussed(text: str, start: int, end: int) -> bool:
    return DISCUSSION.search(text, max(0, start - 300), min(len(text), end + 300)) is not None


_TALK: list[Multi] = []
_TALK_WIDTH = max_width(DISCUSSION.pattern, 1 << 16)  # longest discussion match (characters)


def _talk_db() -> Multi:
    if not _TALK:
        with _NATIVE_LOCK:
            if not _TALK:
                _TALK.append(Multi([superset(DISCUSSION.pattern)]))
    return _TALK[0]


def _talk_ends(text: str) -> list[int]:
    """Character offsets where a discussion match may end (sorted; [] when there are none)."""
    data = encode(text)
    ends = sorted({e for found in _talk_db().ends(data).values() for e in found})
    if len(data) != len(text) and ends:
        shifts = utf8_shifts(text)
        ends = [shifts.back(e) for e in ends] if shifts is not None else char_offsets(text, data).searchsorted(ends).tolist()
    return ends


class _Checks:
    """The quoting and discussion checks of the matches in one view, with what they read
    found once per view: code fences and <code> tags over the text preceded by ``before``
    (the input before this window), and where a discussion word may end (one native scan),
    so each check is a few bisections and at most a short search.
    Same answers as ``_quoted(text, start, before)``, ``_discussed`` and ``_recorded``."""

    def __init__(self, text: str, before: str) -> None:
        self.text = text
        self.off = min(len(before), QUOTE_LOOKBACK)
        self.joined = before[len(before) - self.off :] + text if self.off else text
        self._marks: _Marks | None = None
        self._talk: list[int] | None = None  # where a discussion match may end
        # discussion matches found so far (sorted by start, with their ends), and ranges
        # searched in vain: nearby findings ask about overlapping ranges, and the vocabulary
        # has no look-arounds, so a match inside a range answers for it without a search
        self._said_at: list[int] = []
        self._said_end: list[int] = []
        self._silent: list[tuple[int, int]] = []
        self._json_at, self._json = -1, -1  # the last place asked about, and its JSON string start
        self._values: dict[int, bool] = {}  # place -> whether it lies in a JSON string value

    def quoted(self, start: int) -> bool:
        at = self.off + start
        if self.joined[at : at + 1] in ("\"", "'", "`"):
            return True
        json_start = self._json_start(at)
        near = self.joined[max(0, at - 4, json_start) : at]
        if "\"" in near or "'" in near or "`" in near:
            return True
        if _in_quotation(self.joined, at, json_start):
            return True
        if self._marks is None:
            self._marks = _Marks(self.joined)
        return self._marks.quoted(max(0, at - QUOTE_LOOKBACK, json_start), at)

    def _json_start(self, at: int) -> int:
        if at != self._json_at:
            self._json_at, self._json = at, _json_string_start(self.joined, at)
        return self._json

    def recorded(self, start: int, end: int) -> bool:
        if self._json_start(self.off + start) < 0:
            return False
        return _talk_outside_strings(self.joined, self.off, self.text, start, end, self._in_value)

    def _in_value(self, at: int) -> bool:
        """``_in_json_value`` of the joined text, remembered: nearby findings ask about the
        same discussion matches."""
        found = self._values.get(at)
        if found is None:
            found = self._values[at] = _in_json_value(self.joined, at)
        return found

    def discussed(self, start: int, end: int) -> bool:
        text = self.text
        lo, hi = max(0, start - 300), min(len(text), end + 300)
        if self._talk is None:
            self._talk = _talk_ends(text)
        # every discussion match ends where the native pass says one may: none in (lo, hi]
        # means none at all; one starting before the first such end minus the longest
        # match would end before it, so the search can begin there
        i = bisect_right(self._talk, lo)
        if i == len(self._talk) or self._talk[i] > hi:
            return False
        lo = max(lo, self._talk[i] - _TALK_WIDTH)
        k = bisect_left(self._said_at, lo)
        while k < len(self._said_at) and self._said_at[k] <= hi:
            if self._said_end[k] <= hi:
                return True
            k += 1
        if any(a <= lo and hi <= b for a, b in self._silent):
            return False
        for part in DISCUSSION_PARTS:
            m = part.search(text, lo, hi)
            if m is not None:
                k = bisect_left(self._said_at, m.start())
                self._said_at.insert(k, m.start())
                self._said_end.insert(k, m.end())
                return True
        self._silent.append((lo, hi))
        return False


def _at_line_start(text: str, pos: int) -> bool:
    return text[text.rfind("\n", 0, pos) + 1 : pos].strip(" \t>#*_-") == ""


def _native_ends(scan: Scan, text: str) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """(injection ends, secret ends) of one native scan of ``text``, memoised per scan so
    the injection and secrets detectors share it."""
    found = scan.native.get(text)
    if found is None:
        db, split = native()
        inj: dict[int, list[int]] = {}
        sec: dict[int, list[int]] = {}
        for pid, ends in db.ends(encode(text)).items():
            if pid < split:
                inj[pid] = ends
            else:
                sec[pid - split] = ends
        found = scan.native[text] = (inj, sec)
    return found


def _scanned_text(scan: Scan, view: View) -> str:
    """The text whose native scan serves ``view``: the folded root view is the root text
    lower-cased (always so for ASCII; for other text when folding changed nothing else),
    and the injection patterns ignore ASCII case, so the root's scan (shared with the
    secrets detector, and in a window of a larger input taken from the triage) gives the
    same ends."""
    parent = view.parent
    same = isinstance(view, FoldView) and parent is not None and len(parent.text) == len(view.text)
    if same and (parent.text.isascii() or (parent is scan.root and encode(view.text) == scan.data.lower())):
        return parent.text
    return view.text


def injection(scan: Scan) -> list[Finding]:
    out: list[Finding] = []
    seen: set[tuple[str, int, int]] = set()
    for view in scan.folded_views:
        text = view.text
        checks: _Checks | None = None
        for n, m in INJ.finditer(text, _native_ends(scan, _scanned_text(scan, view))[0]):
            name, family, weight, _, _ = _INJECTION[n]
            if name in LINE_START and not _at_line_start(text, m.start()):
                continue
            if (name in _VOID_AFTER and _VOID_AFTER[name].match(text, m.end())) or (
                    name in _VOID_START and _VOID_START[name].match(text, m.start())):
                continue
            score = weight
            if checks is None:
                checks = _Checks(text, scan.before_folded if view.depth == 0 else "")
            # quoted (or hedged) near discussion words, or a JSON string near discussion words
            # outside every string (so the discussion check goes first: it is the cheaper)
            if checks.discussed(m.start(), m.end()) and (
                    checks.quoted(m.start()) or _hedged(text, m.start()) or checks.recorded(m.start(), m.end())):
                score *= DISCOUNT
            start, end, exact = scan.to_bytes(view, m.start(), m.end())
            if (name, start, end) not in seen:
                seen.add((name, start, end))
                out.append(Finding("injection", family, name, score, start, end, exact, view.layer))
    return out


_PLACEHOLDER = re.compile(r"x{4,}|\*{4,}|your|example|changeme|redacted|dummy|placeholder|sample|test|<|\.\.\.|0{8,}", re.I)
_NON_SECRET_KEY = re.compile(r"(?:page|next|prev|continuation|cursor|sync|csrf_?|max_?|num_?|total_?)[_-]?$", re.I)


def _entropy(value: str) -> float:
    counts = Counter(value)
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def _plausible_secret(value: str, text: str, key_start: int) -> bool:
    if _PLACEHOLDER.search(value) or _NON_SECRET_KEY.search(text[max(0, key_start - 16) : key_start]):
        return False
    classes = sum(bool(re.search(p, value)) for p in (r"[a-z]", r"[A-Z]", r"[0-9]", r"[^A-Za-z0-9]"))
    return classes >= 2 and any(c.isdigit() for c in value) and _entropy(value) >= 3.0


# A documented token shape with a word where the random part goes (xoxb-your-bot-token,
# ghp_XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX) is a placeholder: real token bodies are random
# characters, and the words stand between separators or are long runs of one letter.
_TOKEN_PLACEHOLDER = re.compile(
    r"(?:^|[-_.])(?:your|my|example|placeholder|redacted|dummy|fake|changeme|token|secret|here)(?=[-_.]|$)|x{8,}",
    re.I)


def secrets(scan: Scan) -> list[Finding]:
    out: list[Finding] = []
    seen: set[tuple[int, int]] = set()
    for view in scan.raw_views:
        text = view.text
        for n, m in SEC.finditer(text, _native_ends(scan, text)[1]):
            name, family, weight, rx, _ = _SECRETS[n]
            group = "v" if "v" in rx.groupindex and m.group("v") is not None else 0
            if group == "v" and not _plausible_secret(m.group("v"), text, m.start()):
                continue
            if group == 0 and _TOKEN_PLACEHOLDER.search(m.group()):
                continue
            start, end, exact = scan.to_bytes(view, m.start(group), m.end(group))
            if (start, end) not in seen:
                seen.add((start, end))
                out.append(Finding("secrets", family, name, weight, start, end, exact, view.layer))
    return out


_INVISIBLE_IN_WORD = re.compile(r"(?<=[^\W\d_])[\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e\u034f]+(?=[^\W\d_])")
_BIDI_OVERRIDE = re.compile(r"[\u202a-\u202e\u2066-\u2069]")
_TAGS = re.compile(r"[\U000e0000-\U000e007f]+")


_ANY_HIDDEN = re.compile(r"[\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e\u034f\u202a-\u202e\u2066-\u2069\U000e0000-\U000e007f]")


def obfuscation(scan: Scan) -> list[Finding]:
    text = scan.root.text
    if text.isascii():
        return []
    known = scan.native.get(text)  # the raw text's native ends, when scanned already
    if known is not None and SEC.count not in known[1]:
        return []  # the raw trigger (every character ``_ANY_HIDDEN`` looks for) never fired
    if _ANY_HIDDEN.search(text) is None:
        return []
    out: list[Finding] = []
    hidden = list(_INVISIBLE_IN_WORD.finditer(text))
    for m in hidden:
        start, end, exact = scan.to_bytes(scan.root, m.start(), m.end())
        out.append(Finding("obfuscation", "invisible", "obfuscation.zero_width", min(1.0, 0.25 * len(hidden)), start, end, exact, "text"))
    for m in _BIDI_OVERRIDE.finditer(text):
        start, end, exact = scan.to_bytes(scan.root, m.start(), m.end())
        out.append(Finding("obfuscation", "bidi", "obfuscation.bidi_override", 0.8, start, end, exact, "text"))
    for m in _TAGS.finditer(text):
        start, end, exact = scan.to_bytes(scan.root, m.start(), m.end())
        out.append(Finding("obfuscation", "invisible", "obfuscation.tag_chars", 1.0, start, end, exact, "text"))
    return out


def encoding(scan: Scan) -> list[Finding]:
    if not scan.invalid_utf8:
        return []
    out = []
    for m in _SURROGATES.finditer(scan.root.text):
        start, end, exact = scan.to_bytes(scan.root, m.start(), m.end())
        out.append(Finding("encoding", "invalid_utf8", "encoding.invalid_utf8", 1.0, start, end, exact, "text"))
    return out


_SURROGATES = re.compile("[\udc80-\udcff]+")
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
    """Heavy repetition over the whole input (not per window: it is a property of the whole)."""
    if len(data) < min_bytes:
        return []
    score = repetition_score(data)
    if score <= 0:
        return []
    return [Finding("repetition", "repetition", "repetition.compression", score, 0, len(data), False, "text")]


def repetition(scan: Scan, min_bytes: int) -> list[Finding]:
    return repetition_findings(scan.data, min_bytes)


def custom(scan: Scan, rule_id: str, rx: re.Pattern[str], folded: bool) -> list[Finding]:
    out: list[Finding] = []
    seen: set[tuple[int, int]] = set()
    views: list[View] = scan.folded_views if folded else scan.raw_views
    for view in views:
        for m in rx.finditer(view.text):
            if m.end() == m.start():
                continue
            start, end, exact = scan.to_bytes(view, m.start(), m.end())
            if (start, end) not in seen:
                seen.add((start, end))
                out.append(Finding("regex", "custom", rule_id, 1.0, start, end, exact, view.layer))
    return out
