"""The signatures of ``signatures.yaml``, loaded and compiled once.

A signature is data: id, detector, family, weight, the view it reads (``folded``,
``raw`` or ``root``, see the YAML file's header), a regex and its examples. Two checks
for secrets are code, named by the data: ``plausible`` (the value group ``v`` looks
random: several character classes, a digit, entropy; not a placeholder) and
``not_placeholder`` (a documented token shape with a word where the random part goes,
``xoxb-your-bot-token``, is not a secret). They judge the secret itself, never the
words an author put around it.
"""

from __future__ import annotations

import math
import re
from collections import Counter
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
    check: str | None
    match: tuple[str | bytes, ...]
    no_match: tuple[str | bytes, ...]


def _expand(pattern: str, fragments: dict[str, str]) -> str:
    for name, value in fragments.items():
        pattern = pattern.replace("{" + name + "}", value)
    return pattern


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
            regex = re.compile(_expand(entry["pattern"], fragments))
            examples = entry.get("examples") or {}
            out.append(Signature(sid, detector, family, weight, on, regex, check,
                                 tuple(examples.get("match") or ()), tuple(examples.get("no_match") or ())))
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
