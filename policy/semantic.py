"""The semantic injection detector (opt-in: a policy enables it with ``detector: semantic``).

Phrase lists catch every obfuscation of a phrase they know and none of a paraphrase.
This detector reads the whole normalised input instead: every view the gate builds
(folded text, de-spaced runs, unescaped and decoded payloads) is cut into windows at
line and sentence ends, each window is embedded by all-MiniLM-L6-v2 (``minilm.py``)
and a logistic-regression head (``data/semantic_head.npz``, trained on the corpus's
spent splits and real documentation by ``bench/train_semantic.py``) gives the probability that the window is
an instruction aimed at the model. A window at or above the rule's threshold becomes a
finding whose span is that window's bytes in the original input and whose score is the
probability.

Cost: tens of milliseconds per KiB on a CPU, so it is for policies that can afford it
(``examples/policies/strict.yaml``). Per input at most ``MAX_BYTES`` of window text is
embedded; past that the windows are sampled evenly over the input (in view order), so a
long input is only partly covered: an instruction in a window left out is not seen by
this detector (the phrase detectors still read everything).

Thread safety: the model and head are loaded once, behind a lock; inference runs under
``torch.inference_mode()`` and keeps no state between calls but a small memo of the last
inputs' window probabilities (a pure function of the bytes).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from blake3 import blake3

from fak.policy.detectors import Finding
from fak.policy.normalize import View
from fak.policy.scan import Scan, prepare

HEAD_PATH = Path(__file__).with_name("data") / "semantic_head.npz"
MAX_BYTES = 16384  # characters of window text embedded per input; past it windows are sampled
SEG_CHARS = 400  # a longer segment is cut into pieces of this size, overlapping by half
MIN_LETTERS = 8  # a segment with fewer letters (a brace, a number, a rule line) is not embedded
FAMILY = "semantic"

# Where a window ends: a line (also a JSON-escaped one), a sentence, a closing block tag.
_BREAK = re.compile(r"\n|\\[nr]|(?<=[.!?])[\"')\]]*\s+|<br\s*/?>|</(?:p|li|div|td|h[1-6])>", re.I)
_ESCAPES = re.compile(r"\\[nrt]")
_SPACE = re.compile(r"\s+")
_LETTER = re.compile(r"[^\W\d_]")
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Window:
    view: View
    start: int
    end: int
    text: str  # what is embedded: the window's text with JSON escapes and runs of space flattened


def _clean(text: str) -> str:
    text = _ESCAPES.sub(" ", text).replace('\\"', '"')
    return _SURROGATE.sub("\ufffd", _SPACE.sub(" ", text)).strip()


def _segments(text: str) -> list[tuple[int, int]]:
    """(start, end) of each line/sentence of ``text``, stripped, long ones cut in pieces."""
    out: list[tuple[int, int]] = []
    pos = 0
    for m in [*_BREAK.finditer(text), None]:
        end = m.start() if m is not None else len(text)
        a, b = pos, end
        while a < b and text[a].isspace():
            a += 1
        while b > a and text[b - 1].isspace():
            b -= 1
        if b - a <= SEG_CHARS:
            if b > a:
                out.append((a, b))
        else:
            step = SEG_CHARS // 2
            out.extend((s, min(s + SEG_CHARS, b)) for s in range(a, b - step, step))
        if m is not None:
            pos = m.end()
    return out


def _letters(text: str, a: int, b: int) -> int:
    return len(_LETTER.findall(text, a, b))


def windows(scan: Scan, min_letters: int = MIN_LETTERS) -> list[Window]:
    """The windows of every folded view of ``scan``, from its lines and sentences: one with
    ``min_letters`` letters or more is a window alone; shorter ones (a heading, a bare
    ``System: ok``, which say little alone) are joined with the short ones after them until
    they have that many letters, and with the next long one (which also stands alone, so a
    short heading does not dilute it); short ones left at the end join the last long one.
    A window with fewer than ``MIN_LETTERS`` letters is dropped."""
    out: list[Window] = []
    for view in scan.folded_views:
        text = view.text
        spans: list[tuple[int, int]] = []
        pending, count, last_long, prev_end = None, 0, None, 0
        for a, b in _segments(text):
            n = _letters(text, a, b)
            if n >= min_letters:
                spans.append((a, b))
                if pending is not None and b - pending <= SEG_CHARS:
                    spans.append((pending, b))
                elif pending is not None and count >= MIN_LETTERS:
                    spans.append((pending, prev_end))
                pending, count, last_long = None, 0, a
            else:
                if pending is not None and b - pending > SEG_CHARS:  # cannot grow further
                    if count >= MIN_LETTERS:
                        spans.append((pending, prev_end))
                    pending, count = None, 0
                if pending is None:
                    pending = a
                count += n
                if count >= min_letters:
                    spans.append((pending, b))
                    pending, count = None, 0
            prev_end = b
        if pending is not None:
            if last_long is not None and prev_end - last_long <= SEG_CHARS:
                spans.append((last_long, prev_end))
            elif count >= MIN_LETTERS:
                spans.append((pending, prev_end))
        for a, b in spans:
            if _letters(text, a, b) >= MIN_LETTERS:
                out.append(Window(view, a, b, _clean(text[a:b])))
    return [w for w in out if w.text]


def _sample(texts: list[str], budget: int) -> list[str]:
    """At most ``budget`` characters of ``texts``, spread evenly over the list."""
    total = sum(len(t) for t in texts)
    if total <= budget:
        return texts
    keep = max(1, int(len(texts) * budget / total))
    picks = sorted({round(i * (len(texts) - 1) / max(1, keep - 1)) for i in range(keep)})
    out, used = [], 0
    for i in picks:
        if used + len(texts[i]) > budget and out:
            break
        out.append(texts[i])
        used += len(texts[i])
    return out


class Head:
    """Logistic regression over the sentence embedding, and the windowing it was trained with."""

    def __init__(self, path: Path = HEAD_PATH):
        with np.load(path, allow_pickle=False) as z:
            self.coef = z["coef"].astype(np.float64)
            self.intercept = float(z["intercept"])
            self.min_letters = int(z["min_letters"])
            self.threshold = float(z["threshold"])

    def proba(self, emb: np.ndarray) -> np.ndarray:
        z = emb.astype(np.float64) @ self.coef + self.intercept
        return 1.0 / (1.0 + np.exp(-z))


_LOCK = threading.Lock()
_ENCODER = None
_HEAD: Head | None = None


def encoder():
    """The MiniLM encoder, loaded once per process from the installed wheel (nothing is fetched)."""
    global _ENCODER
    if _ENCODER is None:
        with _LOCK:
            if _ENCODER is None:
                from fak.policy.minilm import MiniLM  # torch is imported only by policies that use this

                _ENCODER = MiniLM.load()
    return _ENCODER


def head() -> Head:
    """The head shipped in the package data, loaded once per process."""
    global _HEAD
    if _HEAD is None:
        with _LOCK:
            if _HEAD is None:
                _HEAD = Head()
    return _HEAD


def model():
    """(encoder, head)."""
    return encoder(), head()


def probabilities(texts: list[str]) -> np.ndarray:
    """The head's probability for each text (in order)."""
    enc, head = model()
    return head.proba(enc.embed(texts)) if texts else np.zeros(0)


_MEMO: OrderedDict[tuple[bytes, int], dict[str, float]] = OrderedDict()
_MEMO_MAX = 8
_MEMO_LOCK = threading.Lock()


def detect(scan: Scan, floor: float, budget: int = MAX_BYTES) -> list[Finding]:
    """Findings for every window whose probability is at least ``floor`` (spans in bytes of
    ``scan.data``). The gate calls it on a scan of the whole input."""
    _, head = model()
    wins = windows(scan, head.min_letters)
    unique = list(dict.fromkeys(w.text for w in wins))
    key = (blake3("\0".join(unique).encode("utf-8", "replace")).digest(), budget)
    with _MEMO_LOCK:
        probs = _MEMO.get(key)
    if probs is None:
        chosen = _sample(unique, budget)
        probs = dict(zip(chosen, probabilities(chosen).tolist(), strict=True))
        with _MEMO_LOCK:
            _MEMO[key] = probs
            while len(_MEMO) > _MEMO_MAX:
                _MEMO.popitem(last=False)
    out: list[Finding] = []
    seen: set[tuple[int, int]] = set()
    for w in wins:
        p = probs.get(w.text)
        if p is None or p < floor:
            continue
        start, end, exact = scan.to_bytes(w.view, w.start, w.end)
        if (start, end) not in seen:
            seen.add((start, end))
            out.append(Finding("semantic", FAMILY, "semantic.instruction", p, start, end, exact, w.view.layer))
    return out


def whole_scan(data: bytes, max_depth: int, max_decoded: int) -> Scan:
    """Every view of the whole input (the gate's triage prepares only its hot regions, and a
    paraphrase has no trigger); built only for policies with a semantic rule."""
    return prepare(data, max_depth, max_decoded)
