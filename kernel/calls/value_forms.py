"""Canonical forms of values, so an argument is recognised in a text whatever way either writes it.

A tool-call argument is traced to the texts in attention that contain it (argument
provenance, ``kernel/calls/provenance.py``). The model rarely copies bytes verbatim: it
changes case, spacing, the form of a number (``1,234.50`` → ``1234.5``), of a URL
(``https://www.Example.com/a/`` → ``example.com/a``), of an e-mail address or an IBAN
(``DE89 3704 0044 …`` → ``de893704…``). Both sides are therefore cut into canonical tokens:

- e-mail addresses, URLs (with or without a scheme), IBAN-like and phone-like tokens become
  one canonical token each (lower-case; no scheme, ``www.`` or trailing slash; no spaces);
- numbers, with or without a currency sign or code, thousands separators in either
  convention, trailing zeros, become their decimal value (``$1,234.50`` → ``1234.5``);
- every other run of letters and digits becomes one word, Unicode-folded (NFKC, case-fold);
- punctuation and whitespace separate tokens and are otherwise dropped.

A value is found in a text when its canonical tokens occur there contiguously. Each canonical
token keeps the character span it came from, so a finding names offsets in the original text.
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Literal

TokenKind = Literal["email", "url", "iban", "phone", "number", "word"]
# Kinds that route something somewhere (a recipient, an account, a link): traced even inside
# a longer string an argument carries, e.g. an IBAN in an e-mail body.
ENTITY_KINDS: frozenset[TokenKind] = frozenset({"email", "url", "iban", "phone"})

_CURRENCY_SIGNS = "$€£¥₹₩₽¢"
_CURRENCY_CODES = r"(?:usd|eur|gbp|chf|jpy|cny|inr|cad|aud|sek|nok|dkk|pln|czk|huf|brl|mxn|krw|rub|try|zar)"
# Every repetition is bounded: tool results are written by anyone, and an unbounded run
# (``a.a.a.a…`` with no ``@``) would make each start position scan to the end (quadratic).
_EMAIL = r"(?P<email>(?:mailto:)?[\w.+'-]{1,64}@[\w-]{1,63}(?:\.[\w-]{1,63}){1,8})"
_URL = (r"(?P<url>(?:[a-z][a-z0-9+.-]{0,15}://|www\.)[^\s<>\"'`)\]}]{1,2048}"
        r"|(?<![\w@.])[a-z0-9][\w-]{0,62}(?:\.[\w-]{1,63}){0,6}\.[a-z]{2,24}(?::\d{1,5})?"
        r"(?:/[^\s<>\"'`)\]}]{0,2048})?(?![\w@]))")
_IBAN = r"(?P<iban>(?<![\w])[a-z]{2}\d{2}(?:[ ]?[a-z0-9]{4}){2,7}(?:[ ]?[a-z0-9]{1,4})?(?![\w]))"
_PHONE = (r"(?P<phone>(?<![\w.,])(?:\+\d{1,3}[\s.-]?(?:\(\d{1,4}\)[\s.-]?)?\d{1,4}(?:[\s.-]?\d{2,5}){1,4}"
          r"|\(\d{2,4}\)[\s.-]?\d{3}[\s.-]?\d{3,4}|\d{3}[\s.-]\d{3}[\s.-]\d{4}|\d{2,4}(?:[ ]\d{2,4}){3,4})(?![\w]|[.,]\d))")
_NUMBER = (rf"(?P<number>(?:[{_CURRENCY_SIGNS}]\s?|{_CURRENCY_CODES}\s?)?(?:(?<![\w])-)?(?:\d{{1,3}}(?P<sep>[,.'\u00a0 ])\d{{3}}(?:(?P=sep)\d{{3}}){{0,12}}|\d{{1,64}})(?:[.,]\d{{1,32}})?"
           rf"(?:\s?(?:{_CURRENCY_CODES}|[{_CURRENCY_SIGNS}])(?![a-z]))?)")
_WORD = r"(?P<word>\w{1,256})"
_TOKEN = re.compile("|".join((_EMAIL, _URL, _IBAN, _PHONE, _NUMBER, _WORD)), re.IGNORECASE)
_NOT_PHONE = re.compile("|".join((_NUMBER, _WORD)), re.IGNORECASE)  # a phone-like run too short to dial
_PHONE_DIGITS = 7
_TRAILING = ".,;:!?"


@dataclass(frozen=True)
class Token:
    """One canonical token and the characters ``[start, end)`` of the text it came from."""

    kind: TokenKind
    form: str
    start: int
    end: int


def fold(text: str) -> str:
    """Unicode compatibility form, case-folded: full-width digits, ligatures, case."""
    return unicodedata.normalize("NFKC", text).casefold()


def _number(raw: str) -> str | None:
    """The decimal value of a number written with separators in either convention."""
    core = re.sub(rf"[{_CURRENCY_SIGNS}\s\u00a0']|{_CURRENCY_CODES}", "", raw, flags=re.IGNORECASE)
    if not core or not any(c.isdigit() for c in core):
        return None
    if "," in core and "." in core:  # the later one is the decimal separator
        decimal, group = (",", ".") if core.rfind(",") > core.rfind(".") else (".", ",")
        core = core.replace(group, "").replace(decimal, ".")
    elif "," in core:  # 1,234 (groups of three: thousands) or 12,5 (a decimal comma)
        parts = core.split(",")
        core = "".join(parts) if all(len(p) == 3 for p in parts[1:]) else core.replace(",", ".", 1).replace(",", "")
    elif core.count(".") > 1:  # 1.234.567: European thousands
        core = core.replace(".", "")
    try:
        value = Decimal(core)
    except InvalidOperation:
        return None
    text = format(value.normalize(), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _url(raw: str) -> str:
    form = re.sub(r"^[a-z][a-z0-9+.-]*://", "", raw.casefold())
    form = form.removeprefix("www.")
    return form.rstrip("/") or form


def canonical_tokens(text: str) -> list[Token]:
    """The canonical tokens of ``text``, in order, with their spans in ``text``."""
    folded = fold(text)
    same_length = len(folded) == len(text)  # spans index the original only when folding kept lengths
    return _tokens(folded if same_length else text, 0, same_length, _TOKEN)


def _tokens(source: str, offset: int, same_length: bool, pattern: re.Pattern[str]) -> list[Token]:
    out: list[Token] = []
    for m in pattern.finditer(source):
        kind = m.lastgroup
        start, end = m.start() + offset, m.end() + offset
        raw = m.group()
        if kind in ("email", "url"):
            while raw and raw[-1] in _TRAILING:  # a sentence's full stop is not part of the address
                raw, end = raw[:-1], end - 1
        piece = fold(raw) if not same_length else raw
        if kind == "email":
            out.append(Token("email", piece.removeprefix("mailto:"), start, end))
        elif kind == "url":
            out.append(Token("url", _url(piece), start, end))
        elif kind == "iban":
            out.append(Token("iban", re.sub(r"\s", "", piece), start, end))
        elif kind == "phone":
            digits = re.sub(r"\D", "", piece)
            if len(digits) >= _PHONE_DIGITS:
                out.append(Token("phone", digits, start, end))
            else:  # too short to be a number anyone dials: its parts are numbers
                out.extend(_tokens(raw, start, same_length, _NOT_PHONE))
        elif kind == "number":
            value = _number(piece)
            out.append(Token("number", value, start, end) if value is not None else Token("word", piece, start, end))
        else:
            out.append(Token("word", piece, start, end))
    return out


@dataclass(frozen=True)
class Match:
    """Where a value's tokens occur in an indexed text: characters ``[start, end)``, tokens
    ``[first, first + count)``."""

    start: int
    end: int
    first: int
    count: int


class IndexedText:
    """A text cut into canonical tokens once, searched for many values (``ContextIndex`` joins
    the ``joined`` forms of a context's texts and maps a hit back with ``match_at``)."""

    def __init__(self, text: str) -> None:
        self.tokens = canonical_tokens(text)
        self._starts = [t.start for t in self.tokens]
        self._ends = [t.end for t in self.tokens]  # tokens do not overlap: both lists ascend
        self._joined = " " + " ".join(t.form for t in self.tokens) + " "
        self._offsets: list[int] = []
        at = 1
        for t in self.tokens:
            self._offsets.append(at)
            at += len(t.form) + 1

    @property
    def joined(self) -> str:
        """The canonical forms, space-separated, with a space at each end."""
        return self._joined

    def match_at(self, at: int, count: int) -> Match:
        """The characters of the ``count`` tokens whose search string starts at ``at``
        (the space before the first one) of ``joined``."""
        first = bisect_right(self._offsets, at + 1) - 1
        return Match(self.tokens[first].start, self.tokens[first + count - 1].end, first, count)

    def tokens_within(self, start: int, end: int) -> tuple[int, int]:
        """The tokens lying in characters ``[start, end)``: ``[first, last)`` indexes."""
        first = bisect_left(self._starts, start)
        return first, max(first, bisect_right(self._ends, end))


def needle_of(tokens: list[Token]) -> str:
    """The search string of a value's canonical tokens."""
    return " ".join(t.form for t in tokens)
