"""Prefix cache policy: exact reuse through splits, tenant isolation, retention,
budget, locks, provenance-driven drops, stats and bad input."""

from __future__ import annotations

import random
import threading

import pytest
import torch
from support.kernel_helpers import tiny_model

from fak.errors import FakError
from fak.kernel.kv.prefix_cache import PrefixCache, PrefixError, PrefixStats, namespace, shared_namespace
from fak.kernel.model.kv_cache import KVBlock
from fak.keys import load_master_secret, tenant_salt
from fak.settings import StorageSettings

MODEL_ID = "tiny-0"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ns_for(tenant: str, model_id: str = MODEL_ID) -> bytes:
    return namespace(tenant_salt(load_master_secret(StorageSettings().data_dir), tenant), model_id)


def toks(seed: int, n: int, first: int | None = None) -> list[int]:
    rng = random.Random(seed)
    out = [rng.randrange(1, 257) for _ in range(n)]
    if first is not None:
        out[0] = first
    return out


def prefill(model, *chunks: list[int]):
    """A session that prefills each chunk with its own forward call; returns (cache, logits of the last)."""
    cache = model.new_cache(64)
    logits = None
    for c in chunks:
        logits = model.forward(c, cache, all_logits=True)
    return cache, logits


def block(seq: list[int], value: float = 1.0) -> KVBlock:
    """Synthetic rows for the pure-policy tests (byte size is what matters there)."""
    n = len(seq)
    t = torch.full((2, n, 1, 8), value)
    return KVBlock(t.clone(), t.clone(), t.clone(), torch.tensor(seq), torch.arange(n))


ROW = block([1]).nbytes


def hit(pc: PrefixCache, ns: bytes, seq: list[int]) -> int:
    """Matched length of a lookup that releases its lock at once."""
    with pc.match(ns, seq) as m:
        return m.length


# --- exactness ---------------------------------------------------------------
def test_reuse_through_split_matches_recompute():
    model = tiny_model()
    a, b = toks(1, 21), toks(2, 13, first=7)
    c = toks(3, 9, first=8)
    pc, ns = PrefixCache(), ns_for("alice")
    s1, _ = prefill(model, a, b)
    assert pc.insert(ns, a + b, s1) == len(a + b)

    with pc.match(ns, a + c) as m:  # forces the split at the end of A
        assert m.length == len(a)
        assert [n.end for n in m.nodes] == [len(a)]
        s2 = model.new_cache(8)
        m.copy_into(s2)
    assert sorted(n.end for n in pc.nodes(ns)) == [len(a), len(a + b)]
    got = model.forward(c, s2, all_logits=True)

    ref, want = prefill(model, a, c)
    assert torch.equal(got, want)
    assert s2.fingerprint() == ref.fingerprint()
    # only C is new when the second session inserts
    assert pc.insert(ns, a + c, s2) == len(c)
    assert pc.stats.bytes == len(a + b + c) * s2.bytes_per_token


def test_split_inside_an_edge_serves_the_rows_of_the_original_call():
    model = tiny_model()
    x, b = toks(4, 30), toks(5, 6)
    k = 17
    c = toks(6, 8, first=(x[k] % 200) + 3)
    pc, ns = PrefixCache(), ns_for("alice")
    s1, _ = prefill(model, x, b)
    pc.insert(ns, x + b, s1)

    with pc.match(ns, x[:k] + c) as m:
        assert m.length == k
        s2 = model.new_cache(8)
        m.copy_into(s2)
    served = s2.export(0, k)
    orig = s1.export(0, k)
    for f in ("k", "kraw", "v", "tokens", "positions"):
        assert torch.equal(getattr(served, f), getattr(orig, f))
    got = model.forward(c, s2, all_logits=True)
    # reference: the same calls — prefill X, cut back to k rows, prefill C
    ref, _ = prefill(model, x)
    ref.truncate(k)
    want = model.forward(c, ref, all_logits=True)
    assert torch.equal(got, want)
    assert s2.fingerprint() == ref.fingerprint()


# --- namespaces ----------------------------------------------------------------
def test_tenant_isolation_no_cross_hits():
    model = tiny_model()
    prompt = toks(7, 40)
    cache, _ = prefill(model, prompt)
    pc = PrefixCache()
    alice, bob = ns_for("alice"), ns_for("bob")
    assert alice != bob
    pc.insert(alice, prompt, cache)

    with pc.match(bob, prompt) as m:
        assert m.length == 0 and m.blocks() == []
    assert pc.stats.hit_tokens == 0 and pc.stats.miss_tokens == len(prompt)
    with pc.match(alice, prompt) as m:
        assert m.length == len(prompt)
    assert pc.stats.hit_tokens == len(prompt)

    # bob pays for his own copy; dropping alice's namespace leaves bob's intact
    assert pc.insert(bob, prompt, cache) == len(prompt)
    assert pc.drop_namespace(alice)
    with pc.match(alice, prompt) as m:
        assert m.length == 0
    with pc.match(bob, prompt) as m:
        assert m.length == len(prompt)
    # the same tenant on another model, and the shared root, are other trees too
    with pc.match(ns_for("bob", "tiny-1"), prompt) as m:
        assert m.length == 0
    with pc.match(shared_namespace(MODEL_ID), prompt) as m:
        assert m.length == 0


def test_shared_namespace_only_for_public_content():
    pc, shared = PrefixCache(), shared_namespace(MODEL_ID)
    seq = [1, 2, 3]
    with pytest.raises(PrefixError, match="public"):
        pc.insert(shared, seq, block(seq))
    assert pc.insert(shared, seq, block(seq), public=True) == 3
    assert shared not in (ns_for("alice"), shared_namespace("tiny-1"))
    with pytest.raises(PrefixError, match="salt"):
        namespace(b"", MODEL_ID)  # a client cannot pick an empty salt to reach shared content
    with pytest.raises(PrefixError, match="namespace"):
        pc.match(b"alice", seq)


# --- retention -------------------------------------------------------------------
def test_retention_priority_and_ttl():
    clock = Clock()
    pc, ns = PrefixCache(budget_bytes=12 * ROW, clock=clock), ns_for("alice")
    low, high, mid = [1] * 4, [2] * 4, [3] * 4
    pc.insert(ns, low, block(low), priority=10)
    pc.insert(ns, high, block(high), priority=90)
    pc.insert(ns, mid, block(mid))  # default 35
    clock.now += 1
    pc.match(ns, low).release()  # most recently used, but the lowest priority
    new = [4] * 4
    clock.now += 1
    pc.insert(ns, new, block(new))
    assert pc.stats.evictions == 1
    assert hit(pc, ns, low) == 0
    for s in (high, mid, new):  # touched in this order: mid is now older than new
        clock.now += 1
        assert hit(pc, ns, s) == 4

    # TTL: gone once it runs out (never served, then purged)
    t = [5] * 2
    clock.now += 1
    pc.insert(ns, t, block(t), priority=100, ttl=5.0)
    # room is made at priority 35: the older of the two default-priority nodes goes
    assert (hit(pc, ns, mid), hit(pc, ns, new), hit(pc, ns, high)) == (0, 4, 4)
    assert hit(pc, ns, t) == 2
    clock.now += 5.0
    assert hit(pc, ns, t) == 0
    assert pc.stats.expired == 1 and pc.stats.bytes == 8 * ROW

    # a later insert without TTL keeps a node alive past the first insert's TTL
    u = [6] * 2
    pc.insert(ns, u, block(u), ttl=1.0)
    pc.insert(ns, u + [7], block(u + [7]))
    clock.now += 10
    assert hit(pc, ns, u + [7]) == 3

    # an expired node still locked by a reader is not served, not purged, and a
    # new insert of the same tokens revives it instead of storing them twice
    w = [8] * 3
    pc.insert(ns, w, block(w), ttl=1.0)
    reader = pc.match(ns, w)
    clock.now += 2
    assert hit(pc, ns, w) == 0 and reader.blocks()
    assert pc.insert(ns, w, block(w), ttl=1.0) == 0
    assert hit(pc, ns, w) == 3
    reader.release()

    for bad in (-1, 101, 3.5, True):
        with pytest.raises(PrefixError, match="priority"):
            pc.insert(ns, [8], block([8]), priority=bad)
    with pytest.raises(PrefixError, match="ttl"):
        pc.insert(ns, [8], block([8]), ttl=0)


def test_budget_evicts_lru_leaves():
    clock = Clock()
    p = [9] * 6
    x1, x2, x3 = p + [1, 1], p + [2, 2], p + [3, 3]
    pc, ns = PrefixCache(budget_bytes=10 * ROW, clock=clock), ns_for("alice")
    for s in (x1, x2):
        clock.now += 1
        pc.insert(ns, s, block(s))
    assert pc.stats.bytes == 10 * ROW
    clock.now += 1
    pc.match(ns, x1).release()  # x2 is now the least recently used leaf
    clock.now += 1
    pc.insert(ns, x3, block(x3))
    st = pc.stats
    assert st.evictions == 1 and st.bytes == 10 * ROW <= pc.budget_bytes
    assert hit(pc, ns, x2) == len(p)  # only the leaf went, the shared parent stayed
    assert hit(pc, ns, x1) == len(x1) and hit(pc, ns, x3) == len(x3)
    # the parent becomes evictable only once its children are gone
    assert pc.evict(2 * ROW) == 2 * ROW
    assert hit(pc, ns, p) == len(p)
    assert pc.evict(10**9) == 8 * ROW
    assert pc.stats.bytes == 0 and pc.stats.nodes == 0


def test_locked_path_not_evicted():
    pc, ns = PrefixCache(budget_bytes=100 * ROW), ns_for("alice")
    p = [4] * 5
    a, b = p + [1] * 3, p + [2] * 3
    pc.insert(ns, a, block(a, 1.0))
    pc.insert(ns, b, block(b, 2.0))
    m = pc.match(ns, a)
    pc.insert(ns, p[:2] + [7], block(p[:2] + [7]))  # splits the locked path after the lock was taken
    pc.budget_bytes = 0
    pc.insert(ns, [8], block([8]))  # over budget: everything unlocked goes
    assert pc.stats.bytes == len(a) * ROW  # the locked path survived
    rows = torch.cat([blk.k for blk in m.blocks()], dim=1)
    assert torch.equal(rows, block(a, 1.0).k)
    assert hit(pc, ns, b) == len(p)
    m.release()
    m.release()  # idempotent
    assert pc.stats.bytes == 0 and all(n.locks == 0 for n in pc.nodes(ns))


# --- provenance ------------------------------------------------------------------
def test_evicted_segment_not_served_from_cache():
    model = tiny_model()
    p, x, q = toks(10, 16), toks(11, 10), toks(12, 8)
    y = toks(13, 6, first=(x[0] % 200) + 3)
    prov = [(0, 16, "blake3:system"), (16, 26, "blake3k:poison"), (26, 34, "blake3k:answer")]
    pc, ns = PrefixCache(), ns_for("alice")
    s1, _ = prefill(model, p, x, q)
    pc.insert(ns, p + x + q, s1, provenance=prov)
    s_clean, _ = prefill(model, p, y)
    pc.insert(ns, p + y, s_clean, provenance=[(0, 16, "blake3:system")])
    held = pc.match(ns, p + x)
    assert held.length == len(p + x) and held.refs == {"blake3:system", "blake3k:poison"}
    with pc.match(ns, p + x + q) as m:
        assert m.length == len(p + x + q)

    # the session evicts the poisoned segment: the kernel forgets it from the tree
    gone = pc.drop_ref(ns, "blake3k:poison")
    ids_after = {n.id for n in pc.nodes(ns)}
    assert len(gone) == 2 and not set(gone) & ids_after
    assert all("blake3k:poison" not in n.prov for n in pc.nodes(ns))
    with pytest.raises(PrefixError, match="dropped"):
        held.blocks()  # a match taken before the forget cannot serve it either
    held.release()
    with pc.match(ns, p + y) as m:
        assert m.length == len(p + y)  # the clean sibling and the prefix before the ref survive

    # a new session with the same prefix plus the poison gets only P from the tree ...
    with pc.match(ns, p + x + q) as m:
        assert m.length == len(p) and m.refs == {"blake3:system"}
        s2 = model.new_cache(8)
        m.copy_into(s2)
    # ... and has the poisoned KV only because it prefills those tokens itself
    model.forward(x, s2)
    model.forward(q, s2)
    assert s2.fingerprint() == s1.fingerprint()

    # the evicting session re-prefills the survivors (RECOMPUTE) and inserts them
    s1.truncate(len(p))
    model.forward(q, s1)
    pc.insert(ns, p + q, s1, provenance=[(0, 16, "blake3:system"), (16, 24, "blake3k:answer")])
    with pc.match(ns, p + q) as m:
        s3 = model.new_cache(8)
        m.copy_into(s3)
    ref, _ = prefill(model, p, q)
    assert s3.fingerprint() == ref.fingerprint()
    assert pc.stats.dropped == 2


def test_provenance_is_causal_and_forget_keeps_earlier_nodes():
    pc, ns = PrefixCache(), ns_for("alice")
    seq = list(range(1, 21))
    pc.insert(ns, seq, block(seq), provenance=[(5, 8, "r1"), (12, 20, "r2")])
    by_end = {n.end: set(n.prov) for n in pc.nodes(ns)}
    assert by_end == {5: set(), 12: {"r1"}, 20: {"r1", "r2"}}
    assert len(pc.drop_ref(ns, "r2")) == 1
    assert hit(pc, ns, seq) == 12
    assert pc.drop_ref(ns, "unknown") == []


# --- stats and bad input ------------------------------------------------------------
def test_stats_count_queries_hits_misses_and_bytes():
    pc, ns = PrefixCache(), ns_for("alice")
    seq = [3] * 10
    pc.insert(ns, seq, block(seq))
    pc.match(ns, seq[:4] + [1, 1]).release()
    pc.match(ns, [2, 2]).release()
    st = pc.stats.as_dict()
    assert st["queries"] == 2 and st["hit_tokens"] == 4 and st["miss_tokens"] == 4
    assert st["hit_rate"] == 0.5
    assert st["bytes"] == 10 * ROW and st["nodes"] == 2 and st["namespaces"] == 1
    assert st["inserted_tokens"] == 10


def test_bad_input_is_refused_and_loses_nothing():
    pc, ns = PrefixCache(), ns_for("alice")
    seq = [1, 2, 3, 4]
    pc.insert(ns, seq, block(seq))
    before = pc.stats
    bad = [
        ([1, 2, 9, 9], block(seq)),  # rows computed for other tokens
        ([5] * 6, block([5] * 4)),  # too few rows
        ([5, 5], KVBlock(*(torch.zeros(2, 2, 1, 8),) * 3, torch.tensor([5, 5]), torch.tensor([3, 4]))),
        (["x"], block(seq)),
        ([5, 5], "not rows"),
        ([5, 5], 5),
        ([5, 5], []),
    ]
    for tokens, rows in bad:
        with pytest.raises(PrefixError):
            pc.insert(ns, tokens, rows)
    with pytest.raises(PrefixError, match="geometry"):
        pc.insert(ns, [6], KVBlock(*(torch.zeros(3, 1, 1, 8),) * 3, torch.tensor([6]), torch.tensor([0])))
    for spans in ([(0, 9, "r")], [(2, 1, "r")], [(0, 1, "")], ["r"]):
        with pytest.raises(PrefixError, match="provenance"):
            pc.insert(ns, seq, block(seq), provenance=spans)
    assert issubclass(PrefixError, FakError)
    after = pc.stats
    assert (after.bytes, after.nodes, after.inserted_tokens) == (before.bytes, before.nodes, before.inserted_tokens)
    assert hit(pc, ns, seq) == 4


def test_concurrent_sessions_keep_the_tree_consistent():
    pc, ns = PrefixCache(budget_bytes=60 * ROW), ns_for("alice")
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(150):
                seq = [rng.randrange(3) for _ in range(rng.randrange(1, 10))]
                op = rng.random()
                if op < 0.5:
                    pc.insert(ns, seq, block(seq), priority=rng.randrange(101),
                              provenance=[(0, len(seq), f"r{seq[0]}")])
                elif op < 0.95:
                    with pc.match(ns, seq) as m:
                        try:
                            rows = m.blocks()
                        except PrefixError:
                            if any(n.removed for n in m.nodes):
                                continue  # another thread's drop_ref forgot it after the match: refused
                            raise
                        got = torch.cat([b.tokens for b in rows]).tolist() if rows else []
                        assert got == seq[: m.length]
                        assert [int(p) for b in rows for p in b.positions] == list(range(m.length))
                else:
                    pc.drop_ref(ns, f"r{rng.randrange(3)}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    nodes = pc.nodes(ns)
    assert all(n.locks == 0 for n in nodes)
    assert pc.stats.bytes == sum(n.nbytes for n in nodes) <= pc.budget_bytes
    assert pc.stats.nodes == len(nodes)


# --- tenants: forget and budgets stay inside a namespace ------------------------------
def ids_of(pc: PrefixCache, ns: bytes) -> set[str]:
    return {n.id for n in pc.nodes(ns)}


def test_drop_ref_only_searches_its_own_namespace():
    pc = PrefixCache()
    alice, bob = ns_for("alice"), ns_for("bob")
    seq = list(range(1, 21))
    ref = "blake3:" + "ab" * 32  # a public digest: the same ref string in both tenants' trees
    branch = seq[:14] + [50, 51]
    for ns in (alice, bob):
        pc.insert(ns, seq, block(seq), provenance=[(8, 14, ref)])
        pc.insert(ns, branch, block(branch), provenance=[(8, 14, ref)])
    bob_before = ids_of(pc, bob)
    alice_with_ref = {n.id for n in pc.nodes(alice) if ref in n.prov}
    assert len(alice_with_ref) == 3 and not alice_with_ref & bob_before  # [8,14) and its two children

    gone = pc.drop_ref(alice, ref)
    assert set(gone) == alice_with_ref and len(gone) == 3
    assert ids_of(pc, bob) == bob_before
    assert hit(pc, bob, seq) == len(seq) and hit(pc, bob, branch) == len(branch)  # bob still hits in full
    assert hit(pc, alice, seq) == 8  # the prefix before the ref stays
    assert (pc.stats_for(alice).dropped, pc.stats_for(bob).dropped, pc.stats.dropped) == (3, 0, 3)
    assert pc.drop_ref(alice, ref) == []
    assert pc.drop_ref(ns_for("carol"), ref) == []  # a namespace without a tree
    with pytest.raises(PrefixError, match="namespace"):
        pc.drop_ref(b"alice", ref)
    with pytest.raises(TypeError):
        pc.drop_ref(ref)  # type: ignore[call-arg]  # the old, all-tenant form is gone


def test_namespace_budget_never_evicts_other_tenants():
    clock = Clock()
    pc = PrefixCache(namespace_budget_bytes=10 * ROW, clock=clock)
    alice, bob = ns_for("alice"), ns_for("bob")
    b1, b2 = [1] * 4 + [2] * 4, [1] * 4 + [3] * 2
    for s in (b1, b2):
        pc.insert(bob, s, block(s), priority=0)  # the cheapest entries in the cache
    bob_before = ids_of(pc, bob)
    clock.now += 1
    seqs = [[10 + i] * 4 for i in range(6)]
    for s in seqs:  # alice fills her budget, then keeps inserting
        clock.now += 1
        assert pc.insert(alice, s, block(s), priority=100) == 4
    assert ids_of(pc, bob) == bob_before
    assert hit(pc, bob, b1) == len(b1) and hit(pc, bob, b2) == len(b2)
    a, b = pc.stats_for(alice), pc.stats_for(bob)
    assert a.bytes == 8 * ROW <= 10 * ROW and a.evictions == 4 and a.evicted_bytes == 16 * ROW
    assert (b.bytes, b.evictions, b.rejected_inserts) == (10 * ROW, 0, 0)
    assert [hit(pc, alice, s) for s in seqs] == [0, 0, 0, 0, 4, 4]  # LRU inside alice's own tree
    # bob's own inserts beyond his budget evict his own lowest-priority leaves, never alice's
    alice_before = ids_of(pc, alice)
    clock.now += 1
    b3 = [4] * 3
    assert pc.insert(bob, b3, block(b3)) == 3
    assert ids_of(pc, alice) == alice_before and pc.stats_for(alice).evictions == 4
    b = pc.stats_for(bob)
    assert b.bytes <= 10 * ROW and b.evictions >= 1 and hit(pc, bob, b3) == 3


def test_global_cap_evicts_or_rejects_only_the_inserting_namespace():
    clock = Clock()
    pc = PrefixCache(budget_bytes=16 * ROW, clock=clock)
    alice, bob = ns_for("alice"), ns_for("bob")
    bs = [5] * 8
    pc.insert(bob, bs, block(bs), priority=0)  # oldest, lowest priority: the old code evicted it first
    bob_before = ids_of(pc, bob)
    a1, a2, a3 = [1] * 4, [2] * 4, [3] * 4
    for s in (a1, a2, a3):
        clock.now += 1
        assert pc.insert(alice, s, block(s)) == 4
    # room for alice is 16 - 8 (bob): her least recently used entry made way for a3
    assert hit(pc, alice, a1) == 0 and hit(pc, alice, a2) == 4 and hit(pc, alice, a3) == 4
    assert ids_of(pc, bob) == bob_before and hit(pc, bob, bs) == 8
    st = pc.stats
    assert st.bytes == 16 * ROW and st.evictions == 1 and st.rejected_inserts == 0

    # alice holds a3; a 6-row insert cannot fit next to it in her 8 rows of room:
    # her unlocked a2 goes first, then the new rows themselves (rejected, not kept)
    held = pc.match(alice, a3)
    clock.now += 1
    big = [6] * 6
    assert pc.insert(alice, big, block(big)) == 0
    assert ids_of(pc, bob) == bob_before and hit(pc, bob, bs) == 8
    assert hit(pc, alice, big) == 0 and hit(pc, alice, a2) == 0 and held.blocks()
    a = pc.stats_for(alice)
    assert (a.rejected_inserts, a.rejected_bytes, a.evictions, a.bytes) == (1, 6 * ROW, 2, 4 * ROW)
    assert a.inserted_tokens == 12  # what was kept: a1, a2, a3; not the rejected rows
    st = pc.stats
    assert (st.rejected_inserts, st.rejected_bytes) == (1, 6 * ROW) and st.bytes == 12 * ROW
    assert pc.stats_for(bob).rejected_inserts == 0 and pc.stats_for(bob).evictions == 0

    # a partial fit keeps the head of the insert (node boundaries at span starts):
    # 4 rows of room next to the held a3, so [0, 3) stays and [3, 7) is rejected
    seq = [7] * 7
    assert pc.insert(alice, seq, block(seq), provenance=[(3, 7, "r")]) == 3
    assert hit(pc, alice, seq) == 3 and ids_of(pc, bob) == bob_before
    a = pc.stats_for(alice)
    assert (a.rejected_inserts, a.rejected_bytes, a.bytes) == (2, 10 * ROW, 7 * ROW)
    held.release()

    # the operator's evict() stays global
    assert pc.evict(16 * ROW) == 15 * ROW
    assert pc.stats.bytes == 0 and hit(pc, bob, bs) == 0


def test_lock_release_evicts_only_its_own_namespace():
    pc = PrefixCache(budget_bytes=12 * ROW)
    alice, bob = ns_for("alice"), ns_for("bob")
    a, b = [1] * 4, [2] * 4
    pc.insert(alice, a, block(a), priority=100)
    held = pc.match(alice, a)
    pc.insert(bob, b, block(b), priority=0)
    pc.budget_bytes = 4 * ROW  # the operator lowers the cap while alice holds her path
    held.release()  # enforcement on alice's release: her rows make way, not bob's
    assert hit(pc, alice, a) == 0 and hit(pc, bob, b) == 4
    assert pc.stats_for(bob).evictions == 0 and pc.stats_for(alice).evictions == 1


def test_namespace_budget_override():
    pc = PrefixCache(namespace_budget_bytes=4 * ROW)
    alice, bob = ns_for("alice"), ns_for("bob")
    assert pc.namespace_budget(alice) == 4 * ROW
    pc.set_namespace_budget(alice, 12 * ROW)
    assert pc.namespace_budget(alice) == 12 * ROW and pc.namespace_budget(bob) == 4 * ROW
    seqs = [[i] * 4 for i in range(1, 4)]
    for s in seqs:
        pc.insert(alice, s, block(s))
        pc.insert(bob, s, block(s))
    assert pc.stats_for(alice).bytes == 12 * ROW and pc.stats_for(alice).evictions == 0
    assert pc.stats_for(bob).bytes == 4 * ROW and pc.stats_for(bob).evictions == 2
    bob_before = ids_of(pc, bob)
    # lowering an override takes effect at once, inside that namespace only
    pc.set_namespace_budget(alice, 8 * ROW)
    assert pc.stats_for(alice).bytes == 8 * ROW and ids_of(pc, bob) == bob_before
    pc.set_namespace_budget(alice, None)  # back to the default cap
    assert pc.namespace_budget(alice) == 4 * ROW and pc.stats_for(alice).bytes == 4 * ROW
    assert ids_of(pc, bob) == bob_before
    # an override larger than the global cap is still bounded by it
    pc2 = PrefixCache(budget_bytes=6 * ROW, namespace_budget_bytes=2 * ROW)
    pc2.set_namespace_budget(alice, 100 * ROW)
    s = [9] * 8
    assert pc2.insert(alice, s, block(s)) == 0 and pc2.stats_for(alice).rejected_bytes == 8 * ROW
    for bad in (-1, True, 1.5, "8"):
        with pytest.raises(PrefixError, match="budget"):
            pc.set_namespace_budget(alice, bad)  # type: ignore[arg-type]
        with pytest.raises(PrefixError, match="budget"):
            PrefixCache(namespace_budget_bytes=bad)  # type: ignore[arg-type]
        with pytest.raises(PrefixError, match="budget"):
            PrefixCache(budget_bytes=bad)  # type: ignore[arg-type]
    with pytest.raises(PrefixError, match="namespace"):
        pc.set_namespace_budget(b"alice", 1)


def test_stats_for_reports_one_namespace_only():
    pc = PrefixCache()
    alice, bob, carol = ns_for("alice"), ns_for("bob"), ns_for("carol")
    seq = [3] * 10
    pc.insert(alice, seq, block(seq))
    pc.insert(bob, seq[:4], block(seq[:4]))
    pc.match(alice, seq[:6] + [1, 1]).release()
    pc.match(bob, seq).release()
    a, b = pc.stats_for(alice), pc.stats_for(bob)
    assert (a.queries, a.hit_tokens, a.miss_tokens, a.inserted_tokens) == (1, 6, 2, 10)
    assert (a.bytes, a.nodes, a.namespaces) == (10 * ROW, 2, 1)
    assert (b.queries, b.hit_tokens, b.miss_tokens, b.inserted_tokens) == (1, 4, 6, 4)
    assert (b.bytes, b.nodes, b.namespaces) == (4 * ROW, 1, 1)
    assert pc.stats_for(carol).as_dict() == PrefixStats().as_dict()  # unknown: zeros
    st = pc.stats
    assert (st.queries, st.hit_tokens, st.bytes, st.namespaces) == (2, 10, 14 * ROW, 2)
    # a snapshot: mutating it changes nothing
    a.hit_tokens = 999
    assert pc.stats_for(alice).hit_tokens == 6
    pc.drop_namespace(alice)
    assert pc.stats_for(alice).as_dict() == PrefixStats().as_dict()
    assert pc.stats_for(bob).bytes == 4 * ROW
    with pytest.raises(PrefixError, match="namespace"):
        pc.stats_for(b"bob")


@pytest.mark.parametrize("seed", range(6))
def test_random_ops_never_touch_other_namespaces(seed: int):
    """Any insert, match or release in one namespace leaves every other
    namespace's node ids as they were; after an insert with no lock held in its
    namespace, that namespace fits its cap and the room the global cap leaves it;
    per-namespace counters add up to the global ones."""
    rng = random.Random(seed)
    nss = [ns_for(t) for t in ("alice", "bob", "carol")]
    pc = PrefixCache(budget_bytes=rng.choice([None, 30 * ROW, 60 * ROW]),
                     namespace_budget_bytes=rng.choice([None, 12 * ROW, 25 * ROW]))
    pc.set_namespace_budget(nss[0], rng.choice([None, 5 * ROW, 40 * ROW]))
    held: list = []
    for _ in range(300):
        ns = rng.choice(nss)
        others = {o: ids_of(pc, o) for o in nss if o != ns}
        op = rng.random()
        if op < 0.5:
            seq = [rng.randrange(3) for _ in range(rng.randrange(1, 12))]
            cut = rng.randrange(len(seq))
            prov = [(cut, len(seq), f"r{seq[cut]}")]
            pc.insert(ns, seq, block(seq), priority=rng.randrange(101), provenance=prov)
            if not any(m.ns == ns for m in held):
                tree_bytes = pc.stats_for(ns).bytes
                cap = pc.namespace_budget(ns)
                assert cap is None or tree_bytes <= cap
                if pc.budget_bytes is not None:
                    assert tree_bytes <= max(pc.budget_bytes - (pc.stats.bytes - tree_bytes), 0)
        elif op < 0.75:
            held.append(pc.match(ns, [rng.randrange(3) for _ in range(rng.randrange(1, 12))]))
        elif op < 0.95 and held:
            held.pop(rng.randrange(len(held))).release()
        else:
            pc.drop_ref(ns, f"r{rng.randrange(3)}")
        assert {o: ids_of(pc, o) for o in others} == others
    for m in held:
        m.release()
    total = pc.stats
    fields = ("queries", "hit_tokens", "miss_tokens", "inserted_tokens", "evictions", "evicted_bytes",
              "rejected_inserts", "rejected_bytes", "dropped", "bytes", "nodes", "namespaces")
    for f in fields:
        assert sum(getattr(pc.stats_for(ns), f) for ns in nss) == getattr(total, f), f
    assert all(n.locks == 0 for ns in nss for n in pc.nodes(ns))
