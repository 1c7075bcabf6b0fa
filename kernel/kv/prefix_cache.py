"""Prefix cache policy: namespaces, locks, retention, byte budgets, provenance, stats.

The mechanism is ``prefix_tree.RadixTree`` (one per namespace). This module
decides who may see which tree and what stays in it:

* **Namespaces.** A root key is ``namespace(tenant_salt, model_id)``; the salt
  is derived server-side from the authenticated tenant (``fak.keys.tenant_salt``)
  and never taken from a request, so byte-identical prompts of two tenants land
  in two trees and a hit cannot leak across them (a hit is a timing side
  channel). ``shared_namespace(model_id)`` is a separate, explicit root for
  content a policy marks public; inserting there requires ``public=True``.
* **Retention.** LRU over unlocked leaves, lowest priority (0–100, default 35)
  first, then least recently used; optional TTL per insertion.
  A node covered by several insertions keeps the highest priority and the
  latest expiry among them (an expired node still pinned by a lock is revived
  by a new insert of the same tokens rather than duplicated), so priorities and expiries never increase going
  down a path and removing an expired node with its subtree removes only
  expired nodes.
* **Budgets.** ``namespace_budget_bytes`` caps every namespace (an operator may
  override it per namespace with ``set_namespace_budget``); ``budget_bytes``
  caps the whole cache. Whatever happens in namespace X (an insert, a lock
  released) evicts only X's unlocked leaves, in the retention order above:
  first down to X's own cap, then as far as needed to bring the total under the
  global cap. What that cannot make room for is not kept: the new nodes of the
  insert are removed too (they compete in the same order, so a low-priority
  insert may be the first to go) and counted as ``rejected_bytes`` /
  ``rejected_inserts``, never as another tenant's eviction. So one tenant's
  inserts never flush another's entries (a noisy neighbour, and a timing side
  channel). With only a global cap, a full cache still tells a tenant that its
  inserts are rejected (a volume signal); namespace budgets that sum to at most
  the global cap close that too. ``evict(nbytes)`` is the operator's explicit,
  global call. ``stats_for(ns)`` reports one namespace only.
* **Provenance.** ``insert(..., provenance=[(start, end, ref), ...])``: a node
  records every ref whose span starts before the node's end (causal attention:
  everything earlier on its path influenced it). Inserts cut node boundaries
  at span starts, so ``drop_ref(ns, ref)`` removes exactly the nodes of that
  namespace that attended to a ref and keeps the prefix before it. It never
  looks at another namespace: a ref string (a public ``blake3:`` digest, say)
  may occur in several tenants' trees, and one tenant's forget is not another's.
* **In flight.** ``flights`` (``prefix_flight.Flights``) names the calls a session of a
  namespace is computing now; a session of the same namespace that needs the same calls waits
  for them and is served (``kernel/kv/prefill.py``), so a burst of agents computes their common
  prefix once. ``served_tokens`` / ``computed_tokens`` count the rows sessions were served
  and prefilled themselves; ``hit_tokens`` / ``miss_tokens`` count what lookups matched.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from fak.errors import FakError
from fak.kernel.kv.prefix_flight import Flights
from fak.kernel.kv.prefix_tree import Node, RadixTree, concat_rows, same_layout, token_of
from fak.kernel.model.kv_cache import KVBlock, KVCache

DEFAULT_PRIORITY = 35
_TENANT, _SHARED = b"t", b"s"
MIN_SALT_BYTES = 16


class PrefixError(FakError):
    """Bad input to the prefix cache (wrong namespace, rows that do not match the tokens, ...)."""


def _ns(kind: bytes, salt: bytes, model_id: str) -> bytes:
    h = hashlib.sha256(b"fak/kernel/prefix-namespace\x00" + kind)
    for part in (salt, model_id.encode()):
        h.update(len(part).to_bytes(8, "big") + part)
    return kind + h.digest()


def namespace(tenant_salt: bytes, model_id: str) -> bytes:
    """The root key of one tenant for one model (different models never share)."""
    if not isinstance(tenant_salt, bytes | bytearray) or len(tenant_salt) < MIN_SALT_BYTES:
        raise PrefixError(
            f"tenant salt must be at least {MIN_SALT_BYTES} server-derived bytes (fak.keys.tenant_salt)"
        )
    if not model_id:
        raise PrefixError("model id must not be empty")
    return _ns(_TENANT, bytes(tenant_salt), model_id)


def shared_namespace(model_id: str) -> bytes:
    """The explicit shared root for one model: only for content a policy marks public."""
    if not model_id:
        raise PrefixError("model id must not be empty")
    return _ns(_SHARED, b"", model_id)


def is_shared(ns: bytes) -> bool:
    return ns[:1] == _SHARED


@dataclass
class PrefixStats:
    """Counters for the metrics endpoint (a snapshot; read ``PrefixCache.stats``
    for the whole cache, ``PrefixCache.stats_for(ns)`` for one namespace)."""

    queries: int = 0
    hit_tokens: int = 0  # matched by lookups (a lookup matches the session's own rows too)
    miss_tokens: int = 0  # looked up and not matched
    served_tokens: int = 0  # rows copied into sessions from the cache (whole calls; their own rows not counted)
    computed_tokens: int = 0  # rows sessions bound to the cache prefilled themselves (the cache did not hold them)
    waits: int = 0  # lookups that waited for another session of the namespace computing the same calls
    inserted_tokens: int = 0
    evictions: int = 0  # nodes removed by a byte budget or evict() (cached before the insert that pushed them out)
    evicted_bytes: int = 0
    rejected_inserts: int = 0  # inserts that could not keep all their new tokens (a budget had no room)
    rejected_bytes: int = 0  # bytes of new nodes removed by the budget of the insert that created them
    expired: int = 0  # nodes removed because their TTL ran out
    dropped: int = 0  # nodes removed by drop_ref / drop_namespace
    bytes: int = 0
    nodes: int = 0
    namespaces: int = 0  # in stats_for(ns): 1 if ns holds a tree, else 0

    @property
    def hit_rate(self) -> float:
        total = self.hit_tokens + self.miss_tokens
        return self.hit_tokens / total if total else 0.0

    @property
    def served_rate(self) -> float:
        """Of the rows prefilled by sessions bound to the cache, the share copied from it."""
        total = self.served_tokens + self.computed_tokens
        return self.served_tokens / total if total else 0.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self) | {"hit_rate": self.hit_rate, "served_rate": self.served_rate}


class PrefixMatch:
    """The longest cached prefix of a query, locked until ``release()``.

    ``blocks()`` are the rows as they were at match time (splits made later by
    other inserts do not change them). If a ``drop_ref``/``drop_namespace``
    removed any matched node before the rows were copied, ``blocks()`` refuses:
    a forgotten prefix is never served."""

    def __init__(self, cache: PrefixCache, ns: bytes, length: int, nodes: list[Node]) -> None:
        self._cache = cache
        self.ns = ns
        self.length = length
        self.nodes = nodes
        self._blocks = [n.block for n in nodes]
        self.refs: frozenset[str] = frozenset(nodes[-1].prov) if nodes else frozenset()
        self._released = not nodes

    @property
    def node_ids(self) -> list[str]:
        return [n.id for n in self.nodes]

    def blocks(self) -> list[KVBlock]:
        """KV blocks in order (rows 0..length-1), to pass to ``KVCache.extend``."""
        if any(n.removed for n in self.nodes):
            raise PrefixError("a matched prefix node was dropped before its rows were copied")
        return [b for b in self._blocks if b is not None]

    def copy_into(self, cache: KVCache) -> int:
        """Append the matched rows to an empty cache of the same dtype; return the row count."""
        if cache.length != 0:
            raise PrefixError(f"a prefix must be copied into an empty cache (it holds {cache.length} rows)")
        cache.reserve(self.length)
        for b in self.blocks():
            if b.k.dtype != cache.dtype or b.k.shape[2:] != cache.k.shape[2:] or b.k.shape[0] != cache.k.shape[0]:
                raise PrefixError("cached prefix rows do not fit this cache (model geometry or dtype differs)")
            cache.extend(b)
        return self.length

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._cache.unpin(self.ns, self.nodes[-1])

    def __del__(self) -> None:  # safety net: a forgotten match must not pin its path forever
        with contextlib.suppress(Exception):  # e.g. at interpreter shutdown
            self.release()

    def __enter__(self) -> PrefixMatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class PrefixCache:
    """Radix-tree prefix cache shared by every session of a kernel (thread-safe).

    ``budget_bytes`` caps the whole cache, ``namespace_budget_bytes`` each
    namespace (``None``: no cap); enforcing either on an operation in one
    namespace evicts only that namespace's entries (see the module docstring)."""

    def __init__(
        self,
        budget_bytes: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        namespace_budget_bytes: int | None = None,
    ) -> None:
        self.budget_bytes = _check_budget(budget_bytes, "budget_bytes")
        self.namespace_budget_bytes = _check_budget(namespace_budget_bytes, "namespace_budget_bytes")
        self.clock = clock
        self._trees: dict[bytes, RadixTree] = {}
        self._ns_budgets: dict[bytes, int] = {}  # per-namespace overrides of namespace_budget_bytes
        self._lock = threading.RLock()
        self._counters = PrefixStats()
        self._ns_counters: dict[bytes, PrefixStats] = {}
        self._next_expiry: float | None = None
        self._seq = itertools.count()
        self.flights = Flights()  # calls sessions are computing now (``prefix_flight``)

    # --- lookup -------------------------------------------------------------
    def match(self, ns: bytes, tokens: Sequence[int] | torch.Tensor, *, count: bool = True) -> PrefixMatch:
        """Longest cached prefix of ``tokens`` in ``ns``, its path locked until released.
        ``count=False``: a second look at the same query (not counted as a lookup)."""
        ids = _token_list(tokens)
        with self._lock:
            now = self.clock()
            self._purge_expired(now)
            tree = self._trees.get(_check_ns(ns))
            length, nodes = tree.match(ids, self._stale(now)) if tree is not None else (0, [])
            for n in nodes:
                n.last_access = now
            if nodes and tree is not None:  # nodes come from a tree
                tree.lock(nodes[-1])
            for c in self._both(ns) if count else ():
                c.queries += 1
                c.hit_tokens += length
                c.miss_tokens += len(ids) - length
            return PrefixMatch(self, ns, length, nodes)

    def peek(self, ns: bytes, tokens: Sequence[int] | torch.Tensor) -> int:
        """Length of the longest cached prefix of ``tokens`` in ``ns``, read only: no
        statistics, no recency, nothing pinned (a router scoring where to place a session)."""
        ids = _token_list(tokens)
        with self._lock:
            now = self.clock()
            tree = self._trees.get(_check_ns(ns))
            return tree.match(ids, self._stale(now))[0] if tree is not None else 0

    def account(self, ns: bytes, *, served: int = 0, computed: int = 0, waits: int = 0) -> None:
        """Count rows a session was served from the cache, rows it computed while bound to it,
        and waits for another session's computation (``kernel/kv/prefill.py`` calls it)."""
        with self._lock:
            for c in self._both(_check_ns(ns)):
                c.served_tokens += served
                c.computed_tokens += computed
                c.waits += waits

    def unpin(self, ns: bytes, node: Node) -> None:
        """Unlock a matched path (``PrefixMatch.release`` calls it) so the budget may evict it again."""
        with self._lock:
            RadixTree.unlock(node)
            self._enforce_budget(ns)  # what the lock kept may go now, but only this namespace's

    # --- insertion ----------------------------------------------------------
    def insert(
        self,
        ns: bytes,
        tokens: Sequence[int] | torch.Tensor,
        cache_or_blocks: KVCache | KVBlock | Sequence[KVBlock],
        *,
        provenance: Sequence[tuple[int, int, str]] = (),
        priority: int = DEFAULT_PRIORITY,
        ttl: float | None = None,
        public: bool = False,
    ) -> int:
        """Store the KV of ``tokens`` (rows 0..n-1 of the source, positions
        0..n-1); only tokens not cached yet are copied. Returns how many of
        those the cache kept: fewer (down to 0) when the namespace's budget or
        the global one had no room for them even after evicting this
        namespace's own unlocked leaves (counted in ``rejected_*``)."""
        ids = _token_list(tokens)
        _check_ns(ns)
        if is_shared(ns) and not public:
            raise PrefixError("the shared namespace only takes content a policy marks public (public=True)")
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 100:
            raise PrefixError(f"priority must be an integer 0-100, not {priority!r}")
        if ttl is not None and not ttl > 0:
            raise PrefixError(f"ttl must be a positive number of seconds, not {ttl!r}")
        spans = _check_spans(provenance, len(ids))
        if not ids:
            return 0
        rows = _row_source(cache_or_blocks, ids)
        with self._lock:
            now = self.clock()
            self._purge_expired(now)
            tree = self._trees.get(ns)
            if tree is None:
                tree = self._trees[ns] = RadixTree(ns)
            self._check_layout(tree, rows(0, 1))
            cuts = sorted({s for s, _, _ in spans if 0 < s < len(ids)} | {len(ids)})
            created: list[Node] = []
            for cut in cuts:  # node boundaries at span starts: forget keeps the prefix before a ref
                path, new = tree.insert(ids[:cut], rows)
                created += new
            expires = now + ttl if ttl is not None else None
            for n in path:
                n.last_access = now
                n.priority = max(n.priority, priority) if n not in created else priority
                if n in created:
                    n.expires_at = expires
                elif n.expires_at is not None:
                    n.expires_at = None if expires is None else max(n.expires_at, expires)
                for s, _e, ref in spans:
                    if s < n.end and n.prov.get(ref, s + 1) > s:
                        n.prov[ref] = s
            if expires is not None and (self._next_expiry is None or expires < self._next_expiry):
                self._next_expiry = expires
            self._enforce_budget(ns, created)
            lost = [n for n in created if n.removed]
            kept = sum(len(n.tokens) for n in created if not n.removed)
            for c in self._both(ns):
                c.inserted_tokens += kept
                if lost:
                    c.rejected_inserts += 1
                    c.rejected_bytes += sum(n.nbytes for n in lost)
            return kept

    @staticmethod
    def _check_layout(tree: RadixTree, probe: KVBlock) -> None:
        for first in tree.root.children.values():
            if first.block is not None and not same_layout(first.block, probe):
                raise PrefixError("rows do not match this namespace's model geometry, dtype or device")
            return

    # --- removal ------------------------------------------------------------
    def drop_ref(self, ns: bytes, ref: str) -> list[str]:
        """Remove every node of namespace ``ns`` whose provenance holds ``ref``
        (with its subtree), locked or not; return the removed node ids (for the
        forget receipt). Other namespaces are not searched: the same ref in
        another tenant's tree is that tenant's to forget."""
        with self._lock:
            tree = self._trees.get(_check_ns(ns))
            gone: list[str] = []
            if tree is not None:
                for n in [n for n in tree.walk() if ref in n.prov]:
                    gone += [m.id for m in tree.remove(n)]  # [] if already gone with an ancestor
            for c in self._both(ns):
                c.dropped += len(gone)
            return gone

    def drop_namespace(self, ns: bytes) -> list[str]:
        """Remove a whole namespace (tenant deleted, model unloaded); return the node ids."""
        with self._lock:
            tree = self._trees.pop(_check_ns(ns), None)
            if tree is None:
                return []
            gone = [n.id for top in list(tree.root.children.values()) for n in tree.remove(top)]
            self._counters.dropped += len(gone)
            self._ns_counters.pop(ns, None)  # the namespace is gone, and its usage figures with it
            return gone

    def evict(self, nbytes: int) -> int:
        """Free at least ``nbytes`` if unlocked leaves allow; return the bytes freed.
        The operator's call: it takes from every namespace, in retention order."""
        with self._lock:
            before = self._bytes()
            self._evict_to(list(self._trees.values()), max(before - nbytes, 0))
            return before - self._bytes()

    def set_namespace_budget(self, ns: bytes, nbytes: int | None) -> None:
        """Cap namespace ``ns`` at ``nbytes`` instead of ``namespace_budget_bytes``
        (``None`` removes the override). Takes effect at once: the namespace's
        own unlocked leaves are evicted down to the new cap."""
        nbytes = _check_budget(nbytes, "a namespace budget")
        with self._lock:
            if nbytes is None:
                self._ns_budgets.pop(_check_ns(ns), None)
            else:
                self._ns_budgets[_check_ns(ns)] = nbytes
            self._enforce_budget(ns)

    def namespace_budget(self, ns: bytes) -> int | None:
        """The cap in force for ``ns`` (its override, else ``namespace_budget_bytes``)."""
        with self._lock:
            return self._ns_budgets.get(_check_ns(ns), self.namespace_budget_bytes)

    def _enforce_budget(self, ns: bytes, fresh: Sequence[Node] = ()) -> None:
        """Bring namespace ``ns`` under its own cap and the total under the
        global cap, evicting only ``ns``'s unlocked leaves. ``fresh`` are the
        nodes the current insert created: removed like the others if the
        budgets leave no room, but counted as rejected (by the caller), not evicted."""
        tree = self._trees.get(ns)
        if tree is None:
            return
        goal = self._ns_budgets.get(ns, self.namespace_budget_bytes)
        if self.budget_bytes is not None:
            room = max(self.budget_bytes - (self._bytes() - tree.nbytes), 0)
            goal = room if goal is None else min(goal, room)
        if goal is not None and tree.nbytes > goal:
            self._evict_to([tree], goal, fresh)

    def _evict_to(self, trees: list[RadixTree], goal: int, fresh: Sequence[Node] = ()) -> None:
        """Remove unlocked leaves of ``trees``, lowest priority then least
        recently used first, until those trees hold at most ``goal`` bytes (or
        nothing of theirs is evictable)."""
        heap: list[tuple[int, float, int, Node, RadixTree]] = []
        new = set(fresh)  # Node compares by identity

        def push(n: Node, tree: RadixTree) -> None:
            if n.parent is not None and n.is_leaf and not n.locks and not n.removed:
                heapq.heappush(heap, (n.priority, n.last_access, next(self._seq), n, tree))

        for tree in trees:
            for n in tree.walk():
                push(n, tree)
        total = sum(t.nbytes for t in trees)
        while total > goal and heap:
            *_, n, tree = heapq.heappop(heap)
            if n.removed or not n.is_leaf or n.locks:
                continue
            parent = n.parent
            total -= n.nbytes
            removed = len(tree.remove(n))
            if n not in new:
                for c in self._both(tree.ns):
                    c.evicted_bytes += n.nbytes
                    c.evictions += removed
            if parent is not None and parent is not tree.root:
                push(parent, tree)

    def _stale(self, now: float) -> Callable[[Node], bool]:
        return lambda n: n.expires_at is not None and now >= n.expires_at

    def _purge_expired(self, now: float) -> None:
        """Remove expired unlocked subtrees (checked only once the earliest expiry passed)."""
        if self._next_expiry is None or now < self._next_expiry:
            return
        nxt: float | None = None
        for tree in self._trees.values():
            for n in list(tree.walk()):
                if n.removed or n.expires_at is None:
                    continue
                if now >= n.expires_at and not n.locks:
                    gone = len(tree.remove(n))
                    for c in self._both(tree.ns):
                        c.expired += gone
                elif nxt is None or n.expires_at < nxt:
                    nxt = n.expires_at
        self._next_expiry = nxt

    # --- introspection ------------------------------------------------------
    def _bytes(self) -> int:
        return sum(t.nbytes for t in self._trees.values())

    def _both(self, ns: bytes) -> tuple[PrefixStats, PrefixStats]:
        """The global counters and those of ``ns`` (created on first use)."""
        c = self._ns_counters.get(ns)
        if c is None:
            c = self._ns_counters[ns] = PrefixStats()
        return self._counters, c

    @property
    def stats(self) -> PrefixStats:
        with self._lock:
            snap = PrefixStats(**asdict(self._counters))
            snap.bytes = self._bytes()
            snap.nodes = sum(t.num_nodes for t in self._trees.values())
            snap.namespaces = len(self._trees)
            return snap

    def stats_for(self, ns: bytes) -> PrefixStats:
        """The counters, bytes and nodes of one namespace only (what a metrics
        endpoint may show that namespace's tenant: nothing of the others)."""
        with self._lock:
            c = self._ns_counters.get(_check_ns(ns))
            snap = PrefixStats(**asdict(c)) if c is not None else PrefixStats()
            tree = self._trees.get(ns)
            if tree is not None:
                snap.bytes, snap.nodes, snap.namespaces = tree.nbytes, tree.num_nodes, 1
            return snap

    def full_copy_bytes(self) -> int:
        """Bytes the simple full-prefix-copy-per-node design would hold for the same nodes."""
        with self._lock:
            return sum(t.full_copy_bytes() for t in self._trees.values())

    def nodes(self, ns: bytes) -> list[Node]:
        """The nodes of one namespace (for tests and receipts; do not mutate)."""
        with self._lock:
            tree = self._trees.get(_check_ns(ns))
            return list(tree.walk()) if tree is not None else []

    def holds_ref(self, ns: bytes, ref: str) -> bool:
        """Whether a node of ``ns`` attended to ``ref`` (what ``drop_ref`` would remove)."""
        return any(ref in n.prov for n in self.nodes(ns))


@dataclass(frozen=True)
class PrefixBinding:
    """Where a session looks up and inserts shared KV: a prefix cache and the
    namespace derived server-side from the authenticated tenant and model."""

    cache: PrefixCache
    namespace: bytes
    priority: int = 35
    ttl: float | None = None
    insert: bool = True  # False: look up only (a benchmark comparing settings on one state)


# --- input checks -------------------------------------------------------------
def _check_budget(nbytes: int | None, what: str) -> int | None:
    if nbytes is not None and (isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0):
        raise PrefixError(f"{what} must be a non-negative number of bytes or None, not {nbytes!r}")
    return nbytes


def _check_ns(ns: bytes) -> bytes:
    if not isinstance(ns, bytes) or len(ns) != 33 or ns[:1] not in (_TENANT, _SHARED):
        raise PrefixError("not a prefix-cache namespace (use namespace() or shared_namespace())")
    return ns


def _token_list(tokens: Sequence[int] | torch.Tensor) -> list[int]:
    if isinstance(tokens, torch.Tensor):
        return [int(t) for t in tokens.reshape(-1).tolist()]
    try:
        return [int(t) for t in tokens]
    except (TypeError, ValueError) as exc:
        raise PrefixError(f"tokens must be a sequence of integer ids: {exc}") from exc


def _check_spans(provenance: Sequence[tuple[int, int, str]], n: int) -> list[tuple[int, int, str]]:
    spans = []
    for item in provenance:
        try:
            start, end, ref = item
        except (TypeError, ValueError) as exc:
            raise PrefixError(f"provenance entries are (start, end, ref), not {item!r}") from exc
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= n):
            raise PrefixError(f"provenance span [{start}, {end}) is outside the {n} inserted tokens")
        if not isinstance(ref, str) or not ref:
            raise PrefixError(f"provenance ref must be a non-empty string, not {ref!r}")
        spans.append((start, end, ref))
    return spans


def _row_source(src: KVCache | KVBlock | Sequence[KVBlock], ids: list[int]) -> Callable[[int, int], KVBlock]:
    """Check that the rows really are the KV of ``ids`` at positions 0..n-1 (a
    mismatch would serve one prompt's KV under another prompt's tokens)."""
    n = len(ids)
    if isinstance(src, KVCache):
        if src.length < n:
            raise PrefixError(f"the cache holds {src.length} rows, fewer than the {n} tokens to insert")
        toks, pos = src.tokens[:n], src.positions[:n]

        def rows(start: int, end: int) -> KVBlock:
            return src.export(start, end)
    else:
        try:
            blocks = [src] if isinstance(src, KVBlock) else list(src)
        except TypeError:
            blocks = []
        if not blocks or not all(isinstance(b, KVBlock) for b in blocks):
            raise PrefixError("insert takes a KVCache, a KVBlock or a sequence of KVBlocks")
        if any(not same_layout(blocks[0], b) for b in blocks):
            raise PrefixError("the blocks differ in model geometry, dtype or device")
        total = sum(len(b) for b in blocks)
        if total < n:
            raise PrefixError(f"the blocks hold {total} rows, fewer than the {n} tokens to insert")
        toks = torch.cat([b.tokens for b in blocks])[:n]
        pos = torch.cat([b.positions for b in blocks])[:n]

        def rows(start: int, end: int) -> KVBlock:
            return concat_rows(blocks, start, end)

    if toks.tolist() != [token_of(k) for k in ids]:
        raise PrefixError("the KV rows were computed for different tokens than the ones being inserted")
    if not torch.equal(pos.cpu(), torch.arange(n, dtype=pos.dtype)):
        raise PrefixError("prefix rows must sit at positions 0..n-1")
    return rows
