"""The signatures of ``signatures.yaml``, loaded and compiled once.

A signature is data: id, detector, family, weight, the view it reads (``folded``,
``raw`` or ``root``, see the YAML file's header), a regex and its examples. Two checks
for secrets are code, named by the data: ``plausible`` (the value group ``v`` looks
random: several character classes, a digit, entropy; not a placeholder) and
``not_placeholder`` (a documented token shape with a word where the random part goes,
``xoxb-your-bot-token``, is not a secret). They judge the secret itself, never the
words an author put around it.

Typo tolerance is generated, not listed: ``{~ignore|disregard}`` in a pattern is those words
and every one-edit form of each word of five letters or more, one typo a match (``one_typo``);
the native database gets a short superset of each (``widened``, ``Signature.loose``).
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

import yaml

from fak.policy.schema import DETECTOR_FAMILIES

PATH = Path(__file__).with_name("signatures.yaml")
ViewKind = Literal["folded", "raw", "root"]


@dataclass(frozen=True)
class Signature:
    id: str
    detector: str
    family: str
    weight: float
    on: ViewKind
    regex: re.Pattern[str]
    # for the native database: patterns that together match at least what ``regex`` does
    # (one per typo-tolerant group, that group widened; see ``variants``)
    loose: tuple[re.Pattern[str], ...]
    check: str | None
    match: tuple[str | bytes, ...]
    no_match: tuple[str | bytes, ...]
    # the phrases whose key words ``{~...}`` makes typo-tolerant, written correctly
    # (tests/policy/test_tripwire_typos.py edits them), and those key words
    canonical: tuple[str, ...] = ()
    keywords: frozenset[str] = frozenset()


def _expand(pattern: str, fragments: dict[str, str]) -> str:
    for name, value in fragments.items():
        pattern = pattern.replace("{" + name + "}", value)
    return pattern


# ---------------------------------------------------------------- typo tolerance

# ``{~ignore|disregard}`` in a pattern: each word, and each word of at least TYPO_MIN letters
# with any one edit (a character inserted, deleted, replaced, or two neighbours swapped),
# the new character being any printable ASCII one but a blank (patterns read the folded,
# lower-case text). Shorter words are spelled exactly: one edit of a four-letter word is too
# often another word ("skip" → "ship", "rule" → "role").
TOLERANT = re.compile(r"\{~([a-z]+(?:\|[a-z]+)*)\}")
TYPO_MIN = 5
EDIT_CHAR = "[!-~]"
PIECES = 5
_Trie = dict[str | None, "_Trie"]  # a character, or None for EDIT_CHAR; "" ends a word


def one_typo(pattern: str) -> str:
    """``pattern`` with a typo in one of its tolerant groups at most: the ``variants`` as one
    regex, a leading word start and tolerant group factored out (Python's engine then tests
    them once at each position, not once a variant: several times faster)."""
    head = "{B}" if pattern.startswith("{B}") else ""
    body = pattern[len(head) :]
    first = TOLERANT.match(body)
    if first is not None and max(map(len, first.group(1).split("|"))) >= TYPO_MIN:
        words, rest = first.group(1).split("|"), body[first.end() :]
        return (f"{head}(?:{tolerant(words)}{TOLERANT.sub(lambda m: _exact(m.group(1).split('|')), rest)}"
                f"|{_exact(words)}{one_typo(rest)})")
    found = variants(body, tolerant)
    return head + (found[0] if len(found) == 1 else "(?:" + "|".join(found) + ")")


def _exact(words: list[str]) -> str:
    return "(?:" + "|".join(sorted(words, key=len, reverse=True)) + ")"  # the longest first: "instructions", not "instruction"


def variants(pattern: str, form: Callable[[list[str]], str]) -> list[str]:
    """``pattern`` once per typo-tolerant group ``{~...}`` (one with a word of at least
    ``TYPO_MIN`` letters), that group written by ``form``, every other spelled exactly: a
    match holds one typo at most. (Each word tolerant at once would leave no long literal in
    the native patterns, which then scan at half the speed.)"""
    parts = TOLERANT.split(pattern)  # text, words, text, words, ..., text
    groups = [words.split("|") for words in parts[1::2]]
    chosen = [i for i, words in enumerate(groups) if max(map(len, words)) >= TYPO_MIN]
    out = []
    for pick in chosen or [-1]:
        written = [form(words) if i == pick else _exact(words) for i, words in enumerate(groups)]
        out.append("".join(part for pair in itertools.zip_longest(parts[::2], written, fillvalue="") for part in pair))
    return out




def edits(word: str) -> set[tuple[str | None, ...]]:
    """``word`` and its one-edit forms, None standing for any ``EDIT_CHAR`` character."""
    w: tuple[str | None, ...] = tuple(word)
    out = {w}
    for i in range(len(w) + 1):
        out.add(w[:i] + (None,) + w[i:])  # insertion
        if i < len(w):
            out.add(w[:i] + w[i + 1 :])  # deletion
            out.add(w[:i] + (None,) + w[i + 1 :])  # substitution
        if i + 1 < len(w):
            out.add(w[:i] + (w[i + 1], w[i]) + w[i + 2 :])  # transposition
    return out


def tolerant(words: list[str]) -> str:
    """A regex (one group, no captures) matching each of ``words`` and, for those of at
    least ``TYPO_MIN`` letters, every one-edit form: a trie of the forms, so that the
    regex engine tries each shared prefix once."""
    trie: _Trie = {}
    for word in words:
        for form in edits(word) if len(word) >= TYPO_MIN else {tuple(word)}:
            node = trie
            for c in form:
                node = node.setdefault(c, {})
            node[""] = {}
    return "(?:" + _emit_trie(trie) + ")"


def widened(words: list[str]) -> str:
    """A short regex matching at least what ``tolerant(words)`` matches (the native
    database's form: the exact one is too large for Hyperscan). A word of at least
    ``TYPO_MIN`` letters is cut in ``PIECES`` pieces; an edit inside one piece leaves the
    others whole and changes that piece's length by one at most (any character of a form
    is printable ASCII); a swap across a cut is spelled out. Five pieces: of the counts
    tried (3 to 6), the one Hyperscan scans fastest (1.5 to 2 times the time of exact words)."""
    alts = []
    for w in words:
        if len(w) < TYPO_MIN:
            alts.append(re.escape(w))
            continue
        cuts = [round(k * len(w) / PIECES) for k in range(PIECES + 1)]
        pieces = [w[a:b] for a, b in itertools.pairwise(cuts)]
        for k, piece in enumerate(pieces):
            gap = f"{EDIT_CHAR}{{{max(0, len(piece) - 1)},{len(piece) + 1}}}"
            alts.append("".join(re.escape(p) if j != k else gap for j, p in enumerate(pieces)))
        alts.extend(re.escape(w[: c - 1] + w[c] + w[c - 1] + w[c + 1 :]) for c in cuts[1:-1])
    return "(?:" + "|".join(alts) + ")"


def _emit_trie(node: _Trie) -> str:
    # letters first, then the word's end, then a typo: the longest word, no punctuation after it
    alts = [re.escape(c) + _emit_trie(child) for c, child in sorted(node.items(), key=lambda kv: str(kv[0]))
            if c]
    if "" in node:
        alts.append("")
    if None in node:
        alts.append(EDIT_CHAR + _emit_trie(node[None]))
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def keywords(pattern: str) -> frozenset[str]:
    """The typo-tolerant words of a pattern (before expansion)."""
    return frozenset(w for m in TOLERANT.finditer(pattern) for w in m.group(1).split("|") if len(w) >= TYPO_MIN)


def parse(text: str) -> list[Signature]:
    """Signatures from YAML text; raises ValueError naming the signature at fault."""
    doc = yaml.safe_load(text)
    fragments = doc.get("fragments", {})
    out: list[Signature] = []
    seen: set[str] = set()
    for entry in doc["signatures"]:
        sid = entry.get("id", "?")
        try:
            if sid in seen:
                raise ValueError("duplicate id")
            seen.add(sid)
            detector, family = entry["detector"], entry["family"]
            if detector not in DETECTOR_FAMILIES or detector in ("regex", "oversize", "repetition"):
                raise ValueError(f"unknown detector {detector!r}")
            if family not in DETECTOR_FAMILIES[detector]:
                raise ValueError(f"family {family!r} is not one of {detector!r}'s")
            weight = float(entry["weight"])
            if not 0.0 < weight <= 1.0:
                raise ValueError("weight must be in (0, 1]")
            on = entry.get("view", "folded")
            if on not in ("folded", "raw", "root"):
                raise ValueError(f"'view' must be folded, raw or root, not {on!r}")
            check = entry.get("check")
            if check not in (None, *CHECKS):
                raise ValueError(f"unknown check {check!r}")
            regex = re.compile(_expand(one_typo(entry["pattern"]), fragments))
            loose = tuple(re.compile(_expand(v, fragments)) for v in variants(entry["pattern"], widened))
            examples = entry.get("examples") or {}
            canonical = tuple(entry.get("canonical") or ())
            out.append(Signature(sid, detector, family, weight, on, regex, loose, check,
                                 tuple(examples.get("match") or ()), tuple(examples.get("no_match") or ()),
                                 canonical, keywords(entry["pattern"])))
        except (KeyError, TypeError, re.error, ValueError) as exc:
            raise ValueError(f"signature {sid}: {exc}") from None
    return out


@cache
def load() -> tuple[Signature, ...]:
    """The shipped signatures (parsed once per process)."""
    return tuple(parse(PATH.read_text(encoding="utf-8")))


# ---------------------------------------------------------------- checks on secrets

_PLACEHOLDER = re.compile(r"x{4,}|\*{4,}|your|example|changeme|redacted|dummy|placeholder|sample|test|<|\.\.\.|0{8,}", re.I)
_NON_SECRET_KEY = re.compile(r"(?:page|next|prev|continuation|cursor|sync|csrf_?|max_?|num_?|total_?)[_-]?$", re.I)
_TOKEN_PLACEHOLDER = re.compile(
    r"(?:^|[-_.])(?:your|my|example|placeholder|redacted|dummy|fake|changeme|token|secret|here)(?=[-_.]|$)|x{8,}", re.I)


def _entropy(value: str) -> float:
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in Counter(value).values())


def _plausible(m: re.Match[str], text: str) -> bool:
    value = m.group("v")
    line = text.rfind("\n", 0, m.start()) + 1  # the key's own line only (accel.py hands over whole lines)
    if _PLACEHOLDER.search(value) or _NON_SECRET_KEY.search(text[max(line, m.start() - 16) : m.start()]):
        return False
    classes = sum(bool(re.search(p, value)) for p in (r"[a-z]", r"[A-Z]", r"[0-9]", r"[^A-Za-z0-9]"))
    return classes >= 2 and any(c.isdigit() for c in value) and _entropy(value) >= 3.0


def _not_placeholder(m: re.Match[str], text: str) -> bool:
    return _TOKEN_PLACEHOLDER.search(m.group()) is None


CHECKS = {"plausible": _plausible, "not_placeholder": _not_placeholder}


def span(sig: Signature, m: re.Match[str], text: str) -> tuple[int, int] | None:
    """The span a match reports (its ``v`` group when it has one), or None when the
    signature's check rejects it."""
    if sig.check is not None and not CHECKS[sig.check](m, text):
        return None
    if "v" in sig.regex.groupindex and m.group("v") is not None:
        return m.span("v")
    return m.span()
