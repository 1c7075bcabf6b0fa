"""OpenAI's sampling parameters as ``TokenHook``s (``fak.kernel.model.generate``): ``logit_bias``,
``presence_penalty``/``frequency_penalty``, ``logprobs``/``top_logprobs`` and ``stop`` strings.

Each hook is one turn's own (it holds the turn's state) and changes only which token is
drawn, never the forward. Order matters: biases and penalties first, then whatever masks
(a grammar, ``StopStrings``), and ``LogprobRecorder`` last so that it reports the
distribution the token was actually drawn from. Everything here runs on the host in numpy."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TypedDict

import numpy as np
from tokenizers import Tokenizer

from fak.errors import InvalidInput, shown
from fak.kernel.model.generate import only

MAX_BIAS = 100.0  # OpenAI: each logit_bias value is in [-100, 100]
MAX_PENALTY = 2.0  # OpenAI: presence_penalty and frequency_penalty are in [-2, 2]
MAX_TOP_LOGPROBS = 20  # OpenAI: top_logprobs is in [0, 20]
MAX_STOPS = 4  # OpenAI: up to 4 stop sequences
MAX_STOP_CHARS = 256  # fak's own bound (OpenAI documents none): keeps each step's search small
_HELD, _HELD_AFTER = 8, 4  # tokens of an unfinished character waited for: a UTF-8 character has ≤ 4 bytes
UNLIKELY = -9999.0  # what OpenAI reports for a token of (about) zero probability


class LogitBias:
    """OpenAI ``logit_bias``: a value in [-100, 100] added to a token's logit before
    sampling (-100 all but bans it, +100 all but forces it). A token already masked
    (-inf, e.g. by a grammar) stays masked."""

    def __init__(self, bias: Mapping[int, float], vocab_size: int) -> None:
        ids, values = [], []
        for token, value in bias.items():
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
                raise InvalidInput(f"logit_bias: token {shown(token)} is not in the model's vocabulary "
                                   f"(ids 0..{vocab_size - 1})", param="logit_bias")
            if isinstance(value, bool) or not isinstance(value, int | float) or not -MAX_BIAS <= value <= MAX_BIAS:
                raise InvalidInput(f"logit_bias: the bias of token {token} must be a number in "
                                   f"[-100, 100], got {shown(value)}", param="logit_bias")
            ids.append(token)
            values.append(float(value))
        self.ids = np.array(ids, dtype=np.int64)
        self.values = np.array(values, dtype=np.float32)

    @classmethod
    def from_openai(cls, bias: Mapping[str, float], vocab_size: int) -> LogitBias:
        """From the request's JSON map, whose keys are token ids written as strings."""
        parsed: dict[int, float] = {}
        for key, value in bias.items():
            if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 12):
                raise InvalidInput(f"logit_bias: key {shown(key)} is not a token id", param="logit_bias")
            parsed[int(key)] = value
        return cls(parsed, vocab_size)

    def adjust(self, step: int, row: np.ndarray) -> np.ndarray:
        if len(self.ids):
            row[self.ids] += self.values
        return row

    def chosen(self, step: int, token: int) -> None:
        pass


class Penalties:
    """OpenAI ``presence_penalty`` and ``frequency_penalty``: each token's logit loses
    ``presence`` once it was generated in this turn and ``frequency`` per time it was
    (the prompt does not count). Negative values encourage repetition."""

    def __init__(self, presence: float = 0.0, frequency: float = 0.0) -> None:
        for name, value in (("presence_penalty", presence), ("frequency_penalty", frequency)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise InvalidInput(f"{name} must be a number in [-2, 2], got {shown(value)}", param=name)
        self.presence = float(presence)
        self.frequency = float(frequency)
        self.counts: dict[int, int] = {}

    def adjust(self, step: int, row: np.ndarray) -> np.ndarray:
        if self.counts and (self.presence or self.frequency):
            ids = np.fromiter(self.counts, dtype=np.int64, count=len(self.counts))
            counts = np.fromiter(self.counts.values(), dtype=np.float64, count=len(self.counts))
            row[ids] -= (self.presence + self.frequency * counts).astype(np.float32)
        return row

    def chosen(self, step: int, token: int) -> None:
        self.counts[token] = self.counts.get(token, 0) + 1


class TopLogprob(TypedDict):
    token: str
    logprob: float
    bytes: list[int]


class LogprobContent(TypedDict):
    """One entry of OpenAI's ``choices[].logprobs.content``."""

    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class LogprobRecorder:
    """OpenAI ``logprobs``/``top_logprobs``: for every step, the log probability (float64
    log-softmax of the row as it reaches this hook: put it last) of the token drawn and of
    the ``top`` most probable tokens (ties by id). Tokens masked out (-inf) are never among
    the top, so a step with fewer allowed tokens lists fewer."""

    def __init__(self, top: int = 0) -> None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise InvalidInput(f"top_logprobs must be an integer in [0, 20], got {shown(top)}", param="top_logprobs")
        self.top = top
        self.steps: list[tuple[int, float, list[tuple[int, float]]]] = []  # (token, logprob, top)
        self._pending: tuple[np.ndarray, list[tuple[int, float]]] | None = None

    def adjust(self, step: int, row: np.ndarray) -> np.ndarray:
        lp = row.astype(np.float64)
        finite = np.isfinite(lp)
        if finite.any():
            peak = lp[finite].max()
            lp = lp - (peak + math.log(np.exp(lp[finite] - peak).sum()))
        self._pending = (lp, _top(lp, self.top))
        return row

    def chosen(self, step: int, token: int) -> None:
        if self._pending is None:  # adjust was not called for this step (not a hook of it)
            return
        lp, top = self._pending
        self._pending = None
        self.steps.append((token, _finite(float(lp[token])), top))

    def content(self, token_bytes: Callable[[int], bytes], skip: Collection[int] = ()) -> list[LogprobContent]:
        """OpenAI's ``logprobs.content``: one entry per recorded token except those in
        ``skip`` (the stop tokens, which OpenAI does not list). ``token_bytes``: a token's
        own bytes (``token_bytes(tokenizer)``), so a token holding part of a UTF-8 character
        reports its bytes and shows as ``bytes:\\xNN...`` as OpenAI does."""
        def entry(token: int) -> tuple[str, list[int]]:
            raw = token_bytes(token)
            return _token_text(raw), list(raw)

        out: list[LogprobContent] = []
        for token, logprob, top in self.steps:
            if token in skip:
                continue
            text, raw = entry(token)
            tops: list[TopLogprob] = []
            for t, p in top:
                t_text, t_raw = entry(t)
                tops.append({"token": t_text, "logprob": p, "bytes": t_raw})
            out.append({"token": text, "logprob": logprob, "bytes": raw, "top_logprobs": tops})
        return out


def _top(lp: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The ``k`` finite entries of ``lp`` with the highest values, ties by id, without
    sorting the vocabulary."""
    if k == 0:
        return []
    cand = np.flatnonzero(np.isfinite(lp))
    if len(cand) > k:
        kth = lp[cand[np.argpartition(-lp[cand], k - 1)[k - 1]]]
        cand = cand[lp[cand] >= kth]  # every tie of the k-th value too
    cand = cand[np.lexsort((cand, -lp[cand]))][:k]
    return [(int(t), float(lp[t])) for t in cand]


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else UNLIKELY


def _token_text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def token_bytes(tk: Tokenizer) -> Callable[[int], bytes]:
    """A function giving a token's own bytes: through the byte-level alphabet for byte-level
    BPE (GPT-2, Llama 3, Qwen, SmolLM), ``<0xNN>`` byte-fallback tokens and ``▁`` spaces for
    SentencePiece-style vocabularies, else the token decoded alone, as UTF-8 (a token holding
    part of a character then shows as U+FFFD: its true bytes are not recoverable)."""
    config = json.loads(tk.decoder.__getstate__()) if tk.decoder is not None else {}  # not the whole vocabulary
    kinds = {d.get("type") for d in config.get("decoders", [])} | {config.get("type")}
    added = {t for t, a in tk.get_added_tokens_decoder().items() if a.special}
    cache: dict[int, bytes] = {}

    if "ByteLevel" in kinds:
        from tokenizers.pre_tokenizers import ByteLevel

        alphabet = _byte_alphabet(ByteLevel.alphabet())

        def piece(token: int) -> bytes:
            text = tk.id_to_token(token) or ""
            if token in added or not all(ch in alphabet for ch in text):
                return text.encode()
            return bytes(alphabet[ch] for ch in text)
    elif "ByteFallback" in kinds or "Metaspace" in kinds:
        def piece(token: int) -> bytes:
            text = tk.id_to_token(token) or ""
            if token not in added and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
                try:
                    return bytes([int(text[3:5], 16)])
                except ValueError:
                    pass
            return text.replace("\u2581", " ").encode() if token not in added else text.encode()
    else:
        def piece(token: int) -> bytes:
            return tk.decode([token], skip_special_tokens=False).encode()

    def lookup(token: int) -> bytes:
        raw = cache.get(token)
        if raw is None:
            raw = cache[token] = piece(token)
        return raw

    return lookup


def _byte_alphabet(chars: Iterable[str]) -> dict[str, int]:
    """GPT-2's byte ↔ printable-character map, character → byte (``ByteLevel.alphabet()``
    lists the characters; the map itself is the published construction)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    table = {chr(c): b for b, c in zip(printable, codes, strict=True)}
    missing = set(chars) - table.keys()
    if missing:  # pragma: no cover - a tokenizers release with another alphabet
        raise ValueError(f"unexpected byte-level alphabet: {sorted(missing)[:5]}")
    return table


class StopStrings:
    """OpenAI ``stop``: up to 4 strings; once one appears in the turn's text (anywhere, also
    across token boundaries), the next step may draw only a stop token, so the turn ends.
    The answer is the text before the first stop string (``cut``); a stream emits only what
    cannot turn out to be part of one (``safe_prefix_len``).

    The text is decoded incrementally (a few tokens each step): only the tokens since the
    last whole character are decoded again, after the previous piece as context. ``decode`` should
    leave special tokens out (``lambda ids: tokenizer.decode(ids, skip_special=True)``)."""

    def __init__(self, stops: str | Iterable[str], decode: Callable[[list[int]], str], stop_ids: Iterable[int]) -> None:
        stops = [stops] if isinstance(stops, str) else list(stops)
        if not 1 <= len(stops) <= MAX_STOPS:
            raise InvalidInput(f"stop takes 1 to {MAX_STOPS} strings, got {len(stops)}", param="stop")
        for s in stops:
            if not isinstance(s, str) or not s:
                raise InvalidInput(f"stop: each stop sequence must be a non-empty string, got {shown(s)}", param="stop")
            if len(s) > MAX_STOP_CHARS:
                raise InvalidInput(f"stop: a stop sequence is at most {MAX_STOP_CHARS} characters, got {len(s)}",
                                   param="stop")
        self.stops = list(dict.fromkeys(stops))
        self._longest = max(len(s) for s in self.stops)
        self._decode = decode
        self.stop_ids = np.array(sorted(set(stop_ids)), dtype=np.int64)
        if not len(self.stop_ids):
            raise ValueError("StopStrings needs the model's stop tokens to end the turn with")
        self._stop_set = set(self.stop_ids.tolist())
        self._ids: list[int] = []
        self._context = 0  # ids[context:settled] are decoded with the rest, as context only
        self._settled = 0  # the text of ids[:settled] is final: ``_done`` (joined only when asked)
        self._done: list[str] = []
        self._end = ""  # the last characters of the settled text, where a stop string may begin
        self._tail = ""  # the text of ids[settled:]
        self.matched = False

    @property
    def text(self) -> str:
        """The turn's text so far (the last character may be U+FFFD, incomplete)."""
        if len(self._done) > 1:
            self._done = ["".join(self._done)]
        return (self._done[0] if self._done else "") + self._tail

    def adjust(self, step: int, row: np.ndarray) -> np.ndarray:
        if not self.matched:
            return row
        forced = only(row, self.stop_ids)
        if not np.isfinite(forced).any():  # the stop tokens were masked (min_tokens, a grammar):
            forced[self.stop_ids] = 0.0  # the stop string ends the turn all the same
        return forced

    def chosen(self, step: int, token: int) -> None:
        if self.matched or token in self._stop_set:
            return
        self._ids.append(token)
        tail = self._tail = self._decoded(len(self._ids))
        window = self._end + tail  # a new match ends after the settled text: it begins in its end at the earliest
        self.matched = any(s in window for s in self.stops)
        if not tail.endswith("\ufffd"):
            self._settle(len(self._ids), tail)
        elif len(self._ids) - self._settled > _HELD:  # bytes that never become a character (a
            # model emitting invalid UTF-8): settle all but the last few, which may still begin one
            cut = len(self._ids) - _HELD_AFTER
            head = self._decoded(cut)
            if tail.startswith(head):
                self._settle(cut, head)

    def _decoded(self, end: int) -> str:
        """The text of ids[settled:end], decoded after its context (a SentencePiece decoder
        drops the leading space of a text's first token: with context it keeps it)."""
        context = self._decode(self._ids[self._context : self._settled])
        text = self._decode(self._ids[self._context : end])
        return text[len(context) :] if text.startswith(context) else self._decode(self._ids[self._settled : end])

    def _settle(self, end: int, text: str) -> None:
        self._done.append(text)
        end_text = self._end + text
        self._end = end_text[max(0, len(end_text) - self._longest + 1):] if self._longest > 1 else ""
        self._tail = self._tail[len(text):]
        self._context, self._settled = self._settled, end

    def _first(self, text: str) -> int:
        """Where the first stop string in ``text`` begins (``len(text)`` if none does)."""
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        return min(hits, default=len(text))

    def cut(self, text: str) -> str:
        """``text`` before the first stop string in it (all of it if none)."""
        return text[: self._first(text)]

    def safe_prefix_len(self, text: str) -> int:
        """How many characters of ``text`` (the turn so far) a stream may emit: those before
        the first stop string, or, with none yet, all but the longest end of ``text`` that
        begins a stop string."""
        first = self._first(text)
        if first < len(text):
            return first
        for k in range(min(len(text), self._longest - 1), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return len(text) - k
        return len(text)
