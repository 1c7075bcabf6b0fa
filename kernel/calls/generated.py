"""Where the arguments of a call fak generated lie among the turn's tokens.

The model's attention evidence and the counterfactual (``kernel/kv/call_evidence.py``) are
about the tokens that wrote each argument's value. A call is one JSON object in the model
family's syntax (``fak.kernel.calls.formats``: a ``<tool_call>`` block's ``{"name": ...,
"arguments": {...}}``, Llama 3's bare ``{"name": ..., "parameters": {...}}``, an item of
Mistral's ``[TOOL_CALLS]`` array), found by the format's ``call_blocks``; its text is the
concatenation of the turn's token bytes (special tokens as their text), so each top-level
argument's value is a byte span, and the span a range of token indexes. Read only when a
firing rule asks for evidence.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from fak.kernel.calls.formats import HermesFormat, ToolFormat
from fak.kernel.calls.tool_text import CallBlock
from fak.kernel.kv.call_evidence import CallEvidence, RefAttention, call_evidence, token_ranges
from fak.kernel.kv.ledger import SegmentKind
from fak.kernel.kv.session import Session

_DECODER = json.JSONDecoder()
_WS = " \t\n\r"


@dataclass(frozen=True)
class GeneratedCall:
    """One call in a generated turn: the turn's tokens up to the end of the call, and each
    top-level argument's value as a token index range ``[i, j)`` of them."""

    name: str
    arguments: dict[str, object]
    tokens: tuple[int, ...]
    args: dict[str, tuple[int, int]]


def _members(text: str, at: int) -> list[tuple[str, object, int, int]]:
    """(key, value, start, end) of each member of the JSON object at ``at``."""
    out: list[tuple[str, object, int, int]] = []
    if not text.startswith("{", at):
        raise ValueError("not an object")
    i = at + 1
    while True:
        while text[i] in _WS:
            i += 1
        if text[i] == "}":
            return out
        if text[i] == ",":
            i += 1
            continue
        if text[i] != '"':
            raise ValueError("a key must be a string")
        key, i = json.decoder.scanstring(text, i + 1)  # type: ignore[attr-defined]  # a stable C helper
        while text[i] in _WS:
            i += 1
        if text[i] != ":":
            raise ValueError("a key needs a value")
        i += 1
        while text[i] in _WS:
            i += 1
        value, end = _DECODER.raw_decode(text, i)
        out.append((key, value, i, end))
        i = end


def _argument_spans(text: str, block: CallBlock) -> dict[str, tuple[int, int]]:
    """Each top-level argument's value as characters of ``text`` (none when the arguments are
    a JSON string, as some models write them: their values have no place of their own)."""
    members = {k: (v, a) for k, v, a, _ in _members(text, block.body)}
    args = members.get("arguments") or members.get("parameters")
    if args is None or not isinstance(args[0], dict):
        return {}
    return {k: (a, b) for k, _, a, b in _members(text, args[1])}


def generated_calls(tokens: Sequence[int], piece: Callable[[int], bytes],
                    fmt: ToolFormat | None = None) -> list[GeneratedCall]:
    """The calls of a generated turn (its tokens without the stop token) with their arguments'
    token ranges (``piece``: a token's own bytes, ``sampling_hooks.token_bytes``; ``fmt``: the
    model's call syntax, Hermes when None)."""
    pieces = [piece(int(t)) for t in tokens]
    raw = b"".join(pieces)
    text = raw.decode("utf-8", "surrogateescape")  # re-encodes to the same bytes: offsets stay exact

    def at(char: int) -> int:
        return len(text[:char].encode("utf-8", "surrogateescape"))

    out: list[GeneratedCall] = []
    for block in (fmt or HermesFormat()).call_blocks(text, None):
        try:
            spans = _argument_spans(text, block)
        except (ValueError, IndexError, RecursionError):
            continue
        ranges = token_ranges(pieces, {k: (at(a), at(b)) for k, (a, b) in spans.items()}
                              | {"\x00end": (0, at(block.body_end))})
        last = ranges.pop("\x00end")[1]
        out.append(GeneratedCall(block.call.name, block.call.arguments, tuple(tokens[:last]), ranges))
    return out


class TurnEvidence:
    """The model's evidence about one call fak is generating in a session (``EvidenceSource``
    for the authorizer), computed on forks of the session while the turn holds its lock; the
    call's tokens are located only when a firing rule asks."""

    def __init__(self, s: Session, base: int, call: Callable[[], GeneratedCall | None]) -> None:
        self._s, self._base, self._locate = s, base, call
        self._call: GeneratedCall | None = None
        self._located = False
        self._found: dict[frozenset[str], CallEvidence] = {}

    def _generated(self) -> GeneratedCall | None:
        if not self._located:
            self._call, self._located = self._locate(), True
        return self._call

    def _ref_rows(self) -> dict[str, list[tuple[int, int]]]:
        rows: dict[str, list[tuple[int, int]]] = {}
        for seg in self._s.ledger.live():
            if seg.kind is SegmentKind.TOOL and seg.ref and seg.start + seg.length <= self._base:
                rows.setdefault(seg.ref, []).append((seg.start, seg.start + seg.length))
        return rows

    def _evidence(self, refs: frozenset[str]) -> CallEvidence | None:
        call = self._generated()
        if call is None or not call.args:
            return None
        found = self._found.get(refs)
        if found is None:
            found = self._found[refs] = call_evidence(self._s, self._base, call.tokens, call.args,
                                                      self._ref_rows(), counterfactual_refs=refs)
        return found

    def attention(self) -> Mapping[str, Mapping[str, RefAttention]] | None:
        # any evidence already computed holds the same attention (its pass with the refs)
        found = next(iter(self._found.values()), None) or self._evidence(frozenset())
        return found.attention if found is not None else None

    def counterfactual(self, refs: Sequence[str]) -> tuple[dict[str, float], dict[str, float], float] | None:
        live = frozenset(refs) & frozenset(self._ref_rows())
        if not live:
            return None  # nothing in this context to evict: no counterfactual to run
        found = self._evidence(live)
        if found is None or found.logprob_without is None:
            return None
        return found.logprob_with, found.logprob_without, found.seconds_attention + found.seconds_counterfactual
