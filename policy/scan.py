"""One input, prepared once for every detector: the decoded root text, its
folded form and the derived views (de-spaced, unescaped, decoded payloads),
with the lazily built maps that take a span back to original bytes."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fak.policy.normalize import (
    _RUN,
    FoldView,
    Shifts,
    View,
    _collapse,
    byte_span,
    char_byte_offsets,
    decoded_payloads,
    fold,
    markdown_view,
    may_have_letter_run,
    piecewise,
    unescape_view,
    utf8_shifts,
)

_SURROGATE = re.compile("[\udc80-\udcff]+")


def _despace_view(parent: View) -> View | None:
    if not may_have_letter_run(parent.text) or not _RUN.search(parent.text):
        return None
    return piecewise(parent, _RUN, lambda m: _collapse(m.group()), "despaced")


@dataclass
class Scan:
    """Views of one input. ``raw_views`` keep case (for secrets); ``folded_views`` are
    lower-case normal forms (for injection phrases), built on first use (a window whose
    injection findings cannot change the verdict is never folded)."""

    data: bytes
    root: View
    raw_views: list[View] = field(default_factory=list)
    invalid_utf8: int = 0
    before: bytes = b""  # the input bytes just before this window (context for quoting)
    _cum: np.ndarray | Shifts | None = None
    _cum_ready: bool = False
    _before_folded: str | None = None
    native: dict[str, tuple[dict[int, list[int]], dict[int, list[int]]]] = field(default_factory=dict, repr=False)
    _to_fold: list[tuple[View, bool]] = field(default_factory=list, repr=False)  # (view, de-space it too), in order
    _folded_views: list[View] | None = field(default=None, repr=False)

    @property
    def folded_views(self) -> list[View]:
        if self._folded_views is None:
            out: list[View] = []
            for view, despace in self._to_fold:
                _add_folded(out, view, despace)
            self._folded_views = out
        return self._folded_views

    @property
    def before_folded(self) -> str:
        """Folded text of ``before``, built on first use (only a quoted-looking hit needs it)."""
        if self._before_folded is None:
            self._before_folded = fold(self.before.decode("utf-8", "replace")) if self.before else ""
        return self._before_folded

    def to_bytes(self, view: View, start: int, end: int) -> tuple[int, int, bool]:
        if not self._cum_ready:
            text = self.root.text
            self._cum = None if self.data.isascii() else (utf8_shifts(text) or char_byte_offsets(text))
            self._cum_ready = True
        return byte_span(view, start, end, len(self.data), self._cum)


# Which views of a text to build: ROOT (the text itself, raw and folded), de-spaced,
# unescaped, decoded payloads, markdown comments and titles with their line breaks back.
# A text that triage found clean but for an encoded run needs only its decoded payloads.
ROOT, DESPACE, UNESCAPE, PAYLOAD, MARKDOWN = "root", "despace", "unescape", "payload", "markdown"
ALL_VIEWS = frozenset({ROOT, DESPACE, UNESCAPE, PAYLOAD, MARKDOWN})


def _add_folded(out: list[View], view: View, despace: bool = True) -> None:
    fv = FoldView(fold(view.text), "folded" if view.parent is None else view.layer, view, None, view.depth)
    out.append(fv)
    dv = _despace_view(fv) if despace else None
    if dv is not None:
        out.append(dv)


ChildTriage = Callable[[str], "frozenset[str] | None"]


def _expand(scan: Scan, view: View, max_depth: int, budget: list[int], derive: frozenset[str] = ALL_VIEWS,
            child_triage: ChildTriage | None = None) -> None:
    """Add ``view`` and what derives from it. ``derive`` names the derived views worth
    building for this view (the triage pass knows where their triggers are). Decoded
    text is new to triage: ``child_triage`` says which views it needs, or None when it
    is clean (then it is not scanned at all); without it every view is built."""
    if ROOT in derive:
        scan.raw_views.append(view)
        scan._to_fold.append((view, DESPACE in derive))
    md = markdown_view(view) if MARKDOWN in derive else None
    if md is not None:
        scan.raw_views.append(md)
        scan._to_fold.append((md, True))
    un = unescape_view(view) if UNESCAPE in derive else None
    if un is not None:
        scan.raw_views.append(un)
        scan._to_fold.append((un, True))
    if view.depth >= max_depth or budget[0] <= 0:
        return
    sources = ([view] if PAYLOAD in derive else []) + ([un] if un is not None else [])
    for source in sources:
        for start, end, layer, text in decoded_payloads(source, budget[0]):
            budget[0] -= len(text)
            child_views = child_triage(text) if child_triage is not None else ALL_VIEWS
            if child_views is None:
                continue
            child = View(text, layer, source, [(0, start, end, False)], view.depth + 1)
            _expand(scan, child, max_depth, budget, child_views, child_triage)


def prepare(data: bytes, max_depth: int = 2, max_decoded: int = 65536, before: bytes = b"",
            budget: list[int] | None = None, derive: frozenset[str] = ALL_VIEWS,
            child_triage: ChildTriage | None = None) -> Scan:
    """Build every view of ``data`` the detectors need, within the given bounds.
    ``before`` is the input preceding ``data`` when ``data`` is a window of a larger
    input; ``budget`` (a one-element list) is the decoding budget shared by windows;
    ``derive`` limits the derived views of the root, ``child_triage`` those of decoded
    text (see ``_expand``)."""
    if data.isascii():
        text = data.decode("ascii")
        invalid = 0
    else:
        text = data.decode("utf-8", "surrogateescape")
        invalid = sum(len(m.group()) for m in _SURROGATE.finditer(text)) if not _valid_utf8(data) else 0
    root = View(text, "text")
    scan = Scan(data, root, invalid_utf8=invalid, before=before)
    _expand(scan, root, max_depth, budget if budget is not None else [max_decoded], derive, child_triage)
    return scan


def _valid_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
