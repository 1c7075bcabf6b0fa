"""Detectors: each reads a prepared ``Scan`` and returns findings with byte spans
in the original input, a family and a score in [0, 1]. They never raise on any
input and do bounded work (anchored regexes, capped decoding, a capped sample
for compression)."""

from __future__ import annotations

import math
import re
import zlib
from collections import Counter
from dataclasses import dataclass

from ahocorasick_rs import AhoCorasick

from fak.policy.normalize import View
from fak.policy.patterns import DISCUSSION, GAP, INJECTION, INJECTION_BACK, LINE_START, SECRETS, SECRETS_BACK
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
    return [(n, f, w, re.compile(rx.replace("~", GAP), flags), anchors) for n, f, w, rx, anchors in entries]


_INJECTION = _compile(INJECTION)
_SECRETS = [(n, f, w, re.compile(rx), anchors) for n, f, w, rx, anchors in SECRETS]
QUOTE_LOOKBACK = 4096  # how far back a code fence or <code> is looked for
DISCOUNT = 0.4  # a quoted phrase in a text that discusses attacks counts for less


def _quoted(text: str, start: int) -> bool:
    before = text[max(0, start - 4) : start]
    if any(q in before for q in "\"'`"):
        return True
    lo = max(0, start - QUOTE_LOOKBACK)
    if text.count("```", lo, start) % 2 == 1:
        return True
    return text.rfind("<code", lo, start) > text.rfind("</code", lo, start)


def _discussed(text: str, start: int, end: int) -> bool:
    return DISCUSSION.search(text, max(0, start - 300), min(len(text), end + 300)) is not None


class _Anchored:
    """Regexes that each contain one of their anchor literals. One Aho-Corasick pass
    finds the anchors; a regex is then tried only near each anchor: a match must start
    at most ``back`` characters before it and be at most ``span`` characters long."""

    def __init__(self, entries: list, back: dict[str, int], span: dict[str, int], default_span: int) -> None:
        self.entries = entries
        anchors = sorted({a for e in entries for a in e[4]})
        index = {a: i for i, a in enumerate(anchors)}
        self.by_anchor: list[list[int]] = [[] for _ in anchors]
        for n, e in enumerate(entries):
            for a in e[4]:
                self.by_anchor[index[a]].append(n)
        self.ac = AhoCorasick(anchors)
        self.back = [back.get(e[0], MAX_BACK) for e in entries]
        self.span = [span.get(e[0], default_span) for e in entries]

    def candidates(self, low: str) -> dict[int, list[int]]:
        """Entry index → sorted start positions of its anchors in ``low``."""
        try:
            hits = self.ac.find_matches_as_indexes(low, overlapping=True)
        except UnicodeEncodeError:  # lone surrogates from invalid UTF-8: same length, no anchors
            hits = self.ac.find_matches_as_indexes(_SURROGATES.sub(lambda m: "\ufffd" * len(m.group()), low),
                                                   overlapping=True)
        out: dict[int, list[int]] = {}
        by_anchor = self.by_anchor
        for a, start, _ in hits:
            for n in by_anchor[a]:
                out.setdefault(n, []).append(start)
        return out

    def matches(self, n: int, rx: re.Pattern[str], text: str, positions: list[int]):
        """Every match of entry ``n`` that contains one of ``positions``, leftmost first, once."""
        back, span, length = self.back[n], self.span[n], len(text)
        last_end = -1
        for p in sorted(set(positions)):
            if p < last_end:
                continue
            hi = min(length, p + span)
            if back <= SHORT_BACK:  # a few anchored attempts beat a search over the window
                for start in range(max(0, p - back, last_end), p + 1):
                    m = rx.match(text, start, hi)
                    if m is not None and m.end() > m.start():
                        yield m
                        last_end = m.end()
                        break
                continue
            m = rx.search(text, max(0, p - back, last_end), hi)
            while m is not None and m.start() <= p:
                yield m
                last_end = m.end()
                if last_end > p:
                    break
                m = rx.search(text, max(last_end, m.start() + 1), hi)


SHORT_BACK = 24
MAX_BACK = 320
_SURROGATES = re.compile("[\udc80-\udcff]+")
_INJ = _Anchored(_INJECTION, INJECTION_BACK, {}, 480)
_SEC = _Anchored(_SECRETS, SECRETS_BACK, {"secret.private_key": 17000}, 600)


def _at_line_start(text: str, pos: int) -> bool:
    return text[text.rfind("\n", 0, pos) + 1 : pos].strip(" \t>#*_-") == ""


def injection(scan: Scan) -> list[Finding]:
    out: list[Finding] = []
    seen: set[tuple[str, int, int]] = set()
    for view in scan.folded_views:
        text = view.text
        for n, positions in _INJ.candidates(text).items():
            name, family, weight, rx, _ = _INJECTION[n]
            for m in _INJ.matches(n, rx, text, positions):
                if name in LINE_START and not _at_line_start(text, m.start()):
                    continue
                score = weight
                if _quoted(text, m.start()) and _discussed(text, m.start(), m.end()):
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


def secrets(scan: Scan) -> list[Finding]:
    out: list[Finding] = []
    seen: set[tuple[int, int]] = set()
    for view in scan.raw_views:
        text = view.text
        # Anchor positions are only trusted when lower-casing keeps the length (ASCII).
        ascii_text = text.isascii()
        for n, positions in _SEC.candidates(text.lower()).items():
            name, family, weight, rx, _ = _SECRETS[n]
            for m in _SEC.matches(n, rx, text, positions) if ascii_text else rx.finditer(text):
                group = "v" if "v" in rx.groupindex and m.group("v") is not None else 0
                if group == "v" and not _plausible_secret(m.group("v"), text, m.start()):
                    continue
                start, end, exact = scan.to_bytes(view, m.start(group), m.end(group))
                if (start, end) not in seen:
                    seen.add((start, end))
                    out.append(Finding("secrets", family, name, weight, start, end, exact, view.layer))
    return out


_INVISIBLE_IN_WORD = re.compile(r"(?<=[^\W\d_])[\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e\u034f]+(?=[^\W\d_])")
_BIDI_OVERRIDE = re.compile(r"[\u202a-\u202e\u2066-\u2069]")
_TAGS = re.compile(r"[\U000e0000-\U000e007f]+")


def obfuscation(scan: Scan) -> list[Finding]:
    text = scan.root.text
    if text.isascii():
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


REPETITION_SAMPLE = 65536


def repetition_score(data: bytes) -> float:
    """0 for ordinary text, 1 for heavy repetition: from the compression ratio of a
    bounded sample (ordinary prose and JSON compress 2-6x at level 1)."""
    sample = data[:REPETITION_SAMPLE]
    if not sample:
        return 0.0
    ratio = len(sample) / len(zlib.compress(sample, 1))
    return max(0.0, min(1.0, (ratio - 6.0) / 12.0))


def repetition(scan: Scan, min_bytes: int) -> list[Finding]:
    if len(scan.data) < min_bytes:
        return []
    score = repetition_score(scan.data)
    if score <= 0:
        return []
    return [Finding("repetition", "repetition", "repetition.compression", score, 0, len(scan.data), False, "text")]


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
