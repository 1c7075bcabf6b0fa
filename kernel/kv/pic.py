"""PIC registry: position-independent KV of content-defined chunks, per tenant namespace.

An entry is keyed by BLAKE3 over (model id, tokenizer id, namespace, the chunk's
token ids) and holds the chunk's pre-RoPE keys (``Kraw``) and values as one prefill
computed them, the position it was computed at, and its attention provenance (every
ref the rows attended to, its own included). A hit at another position re-rotates
the keys from ``Kraw`` there (``kernel/kv/pic_serve.py``); the rows still carry what
the chunk attended to where it was computed, so PIC is **approximate** (docs/design.md):
served only when the policy allows approximate reuse and counted apart from exact hits.

Namespaces are the prefix cache's (derived server-side from the tenant), and so are
the budget rules: an insert evicts only its own namespace's least recently used
entries, first down to the namespace cap, then as far as the global cap needs; what
still does not fit is rejected, never paid for by another tenant's entries.
``drop_ref`` removes exactly the entries of one namespace that attended to a ref.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import blake3
import torch

from fak.errors import FakError


class PicError(FakError):
    """Bad input to the PIC registry."""

    code = "pic_invalid"
    status = 400


@dataclass
class PicEntry:
    id: str  # "pic_" + 32 hex of the key: names the chunk in receipts and audit events
    tokens: tuple[int, ...]
    kraw: torch.Tensor  # (layers, n, kv_heads, head_dim), pre-RoPE
    v: torch.Tensor
    source_position: int  # absolute position of the first token where the rows were computed
    provenance: frozenset[str]

    @property
    def nbytes(self) -> int:
        return self.kraw.numel() * self.kraw.element_size() + self.v.numel() * self.v.element_size()

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class PicStats:
    lookups: int = 0
    hits: int = 0
    hit_tokens: int = 0
    inserts: int = 0
    evicted: int = 0
    dropped: int = 0
    rejected: int = 0
    entries: int = 0
    bytes: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class _Space:
    entries: OrderedDict[bytes, PicEntry] = field(default_factory=OrderedDict)  # LRU order, oldest first
    stats: PicStats = field(default_factory=PicStats)
    nbytes: int = 0


class PicRegistry:
    def __init__(
        self,
        model_id: str,
        tokenizer_id: str,
        *,
        budget_bytes: int = 512 << 20,
        namespace_budget_bytes: int | None = None,
    ) -> None:
        if budget_bytes < 0 or (namespace_budget_bytes is not None and namespace_budget_bytes < 0):
            raise PicError("PIC budgets must be ≥ 0 bytes")
        self.model_id = model_id
        self.tokenizer_id = tokenizer_id
        self.budget_bytes = budget_bytes
        self.namespace_budget_bytes = namespace_budget_bytes
        self._spaces: dict[bytes, _Space] = {}
        self._lock = threading.Lock()

    # --- keys -------------------------------------------------------------------
    def key(self, ns: bytes, tokens: Sequence[int]) -> bytes:
        h = blake3.blake3(b"fak pic chunk v1\x00")
        for part in (self.model_id.encode(), self.tokenizer_id.encode(), _check_ns(ns)):
            h.update(len(part).to_bytes(4, "big") + part)
        h.update(torch.as_tensor(list(tokens), dtype=torch.int64).numpy().astype("<i8").tobytes())
        return h.digest()

    # --- lookups and inserts -----------------------------------------------------
    def get(self, ns: bytes, tokens: Sequence[int]) -> PicEntry | None:
        """The entry for exactly these tokens in ``ns``, marked recently used; None on a miss."""
        key = self.key(ns, tokens)
        with self._lock:
            space = self._spaces.get(ns)
            entry = space.entries.get(key) if space else None
            stats = space.stats if space else None
            if stats is not None:
                stats.lookups += 1
            if entry is None:
                return None
            space.entries.move_to_end(key)  # type: ignore[union-attr]
            stats.hits += 1  # type: ignore[union-attr]
            stats.hit_tokens += len(entry)  # type: ignore[union-attr]
            return entry

    def put(
        self,
        ns: bytes,
        tokens: Sequence[int],
        kraw: torch.Tensor,
        v: torch.Tensor,
        source_position: int,
        provenance: frozenset[str] = frozenset(),
    ) -> PicEntry | None:
        """Store a chunk's rows (copied: never a view pinning a session's cache). Returns
        the entry, the one already there for the same tokens, or None when the namespace
        cannot make room for it."""
        n = len(tokens)
        if n == 0 or kraw.shape[1] != n or v.shape != kraw.shape:
            raise PicError(f"rows {tuple(kraw.shape)} / {tuple(v.shape)} do not match {n} tokens")
        key = self.key(ns, tokens)
        entry = PicEntry(
            id="pic_" + key.hex()[:32],
            tokens=tuple(int(t) for t in tokens),
            kraw=kraw.detach().clone(),
            v=v.detach().clone(),
            source_position=int(source_position),
            provenance=frozenset(provenance),
        )
        with self._lock:
            space = self._spaces.setdefault(ns, _Space())
            if key in space.entries:
                space.entries.move_to_end(key)
                return space.entries[key]
            if not self._make_room(ns, space, entry.nbytes):
                space.stats.rejected += 1
                return None
            space.entries[key] = entry
            space.nbytes += entry.nbytes
            space.stats.inserts += 1
            return entry

    def _make_room(self, ns: bytes, space: _Space, need: int) -> bool:
        """Evict ``ns``'s own LRU entries until ``need`` more bytes fit both caps."""
        cap = self.namespace_budget_bytes
        if need > self.budget_bytes or (cap is not None and need > cap):
            return False

        def over() -> bool:
            total = sum(s.nbytes for s in self._spaces.values())
            return (cap is not None and space.nbytes + need > cap) or total + need > self.budget_bytes

        while over() and space.entries:
            _, old = space.entries.popitem(last=False)
            space.nbytes -= old.nbytes
            space.stats.evicted += 1
        return not over()

    # --- removal -----------------------------------------------------------------
    def drop_ref(self, ns: bytes, ref: str) -> list[str]:
        """Remove every entry of ``ns`` whose rows attended to ``ref``; returns their ids."""
        with self._lock:
            space = self._spaces.get(_check_ns(ns))
            if space is None:
                return []
            gone = [k for k, e in space.entries.items() if ref in e.provenance]
            ids = []
            for k in gone:
                e = space.entries.pop(k)
                space.nbytes -= e.nbytes
                ids.append(e.id)
            space.stats.dropped += len(ids)
            return ids

    def drop_namespace(self, ns: bytes) -> list[str]:
        with self._lock:
            space = self._spaces.pop(_check_ns(ns), None)
            return [e.id for e in space.entries.values()] if space else []

    def clear(self) -> None:
        with self._lock:
            self._spaces.clear()

    # --- reading -----------------------------------------------------------------
    def entries(self, ns: bytes) -> list[PicEntry]:
        with self._lock:
            space = self._spaces.get(ns)
            return list(space.entries.values()) if space else []

    def holds_ref(self, ns: bytes, ref: str) -> bool:
        return any(ref in e.provenance for e in self.entries(ns))

    def stats_for(self, ns: bytes) -> PicStats:
        with self._lock:
            space = self._spaces.get(ns)
            if space is None:
                return PicStats()
            out = PicStats(**space.stats.as_dict())
            out.entries, out.bytes = len(space.entries), space.nbytes
            return out

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(s.nbytes for s in self._spaces.values())


def _check_ns(ns: bytes) -> bytes:
    if not isinstance(ns, bytes) or len(ns) < 16:
        raise PicError("a PIC namespace is the bytes the kernel derives for a tenant")
    return ns
