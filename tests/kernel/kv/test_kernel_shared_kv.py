"""The shared-KV interface (``fak.kernel.kv.shared``): the prefix cache and the PIC registry
behind one ``drop_ref`` / ``drop_namespace`` / ``holds_ref``, on real stores filled by a
session over a tiny random model."""

from __future__ import annotations

import torch
from support.kernel_helpers import tiny_model

from fak.kernel.kv.chunking import ChunkParams
from fak.kernel.kv.pic import PicRegistry
from fak.kernel.kv.pic_serve import PicBinding
from fak.kernel.kv.prefix_cache import PrefixBinding, PrefixCache, namespace
from fak.kernel.kv.session import Session
from fak.kernel.kv.shared import Dropped, SharedKV, drop_bound
from fak.kernel.model.llama import Llama
from fak.keys import tenant_salt

MASTER = bytes(range(32))
SMALL = ChunkParams(bits=3, min_size=8, max_size=32)


def ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 257, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


SYS, DOC, Q = ids(40, 11), ids(150, 12), ids(12, 13)


def ns(tenant: str) -> bytes:
    return namespace(tenant_salt(MASTER, tenant), "tiny-0")


def filled(model: Llama, shared: SharedKV, tenant: str) -> Session:
    """A session of ``tenant`` that put the ref ``doc`` into both stores."""
    assert shared.prefix is not None and shared.pic is not None
    s = Session(model, prefix=PrefixBinding(shared.prefix, ns(tenant)),
                pic=PicBinding(shared.pic, ns(tenant), chunking=SMALL))
    s.append("system", tokens=SYS)
    s.append("tool", tokens=DOC, ref="doc")
    s.append("user", tokens=Q)
    return s


def stores() -> tuple[Llama, SharedKV]:
    model = tiny_model()
    return model, SharedKV(PrefixCache(), PicRegistry(model.model_id, "tok"))


def test_drop_ref_removes_the_ref_from_the_prefix_cache_and_the_pic_registry() -> None:
    model, shared = stores()
    assert shared.prefix is not None and shared.pic is not None
    filled(model, shared, "acme")
    filled(model, shared, "globex")
    acme = ns("acme")
    assert shared.prefix.holds_ref(acme, "doc") and shared.pic.holds_ref(acme, "doc")
    assert shared.holds_ref(acme, "doc")
    prefix_nodes = {n.id for n in shared.prefix.nodes(acme) if "doc" in n.prov}
    pic_chunks = {e.id for e in shared.pic.entries(acme) if "doc" in e.provenance}
    globex_nodes = sorted(n.id for n in shared.prefix.nodes(ns("globex")))
    globex_chunks = sorted(e.id for e in shared.pic.entries(ns("globex")))
    system_rows = [n.id for n in shared.prefix.nodes(acme) if "doc" not in n.prov]

    dropped = shared.drop_ref(acme, "doc")

    assert set(dropped.prefix_nodes) == prefix_nodes and set(dropped.pic_chunks) == pic_chunks
    assert dropped.prefix_nodes and dropped.pic_chunks
    assert not shared.prefix.holds_ref(acme, "doc") and not shared.pic.holds_ref(acme, "doc")
    assert not shared.holds_ref(acme, "doc")
    # the prefix before the ref stays; another tenant's copy of the same ref is its own to forget
    assert [n.id for n in shared.prefix.nodes(acme)] == system_rows
    assert sorted(n.id for n in shared.prefix.nodes(ns("globex"))) == globex_nodes
    assert sorted(e.id for e in shared.pic.entries(ns("globex"))) == globex_chunks
    assert shared.holds_ref(ns("globex"), "doc")
    assert shared.drop_ref(acme, "doc") == Dropped()  # idempotent


def test_drop_ref_without_the_prefix_cache_drops_pic_chunks_only() -> None:
    model, shared = stores()
    assert shared.prefix is not None and shared.pic is not None
    filled(model, shared, "acme")
    dropped = shared.drop_ref(ns("acme"), "doc", prefix=False)
    assert dropped.pic_chunks and dropped.prefix_nodes == ()
    assert not shared.pic.holds_ref(ns("acme"), "doc") and shared.prefix.holds_ref(ns("acme"), "doc")
    assert shared.drop_refs(ns("acme"), ["doc"]).prefix_nodes  # the rest goes with the full drop


def test_drop_namespace_empties_both_stores_for_that_tenant_only() -> None:
    model, shared = stores()
    assert shared.prefix is not None and shared.pic is not None
    filled(model, shared, "acme")
    filled(model, shared, "globex")
    dropped = shared.drop_namespace(ns("acme"))
    assert dropped.prefix_nodes and dropped.pic_chunks
    assert shared.prefix.nodes(ns("acme")) == [] and shared.pic.entries(ns("acme")) == []
    assert shared.prefix.nodes(ns("globex")) and shared.pic.entries(ns("globex"))


def test_a_store_that_is_off_drops_nothing() -> None:
    model = tiny_model()
    pic_only = SharedKV(pic=PicRegistry(model.model_id, "tok"))
    assert pic_only.pic is not None
    s = Session(model, pic=PicBinding(pic_only.pic, ns("acme"), chunking=SMALL))
    s.append("system", tokens=SYS)
    s.append("tool", tokens=DOC, ref="doc")
    assert pic_only.holds_ref(ns("acme"), "doc")
    dropped = pic_only.drop_ref(ns("acme"), "doc")
    assert dropped.prefix_nodes == () and dropped.pic_chunks and not pic_only.holds_ref(ns("acme"), "doc")
    assert drop_bound(None, None, ["doc"]) == Dropped()


def test_a_session_eviction_drops_through_its_bindings() -> None:
    model, shared = stores()
    s = filled(model, shared, "acme")
    doc = next(x for x in s.ledger.live() if x.ref == "doc")
    report = s.evict([doc.id])
    assert report.prefix_nodes_dropped and report.pic_chunks_dropped
    assert not shared.holds_ref(ns("acme"), "doc")
    assert report.exactness == "bit-exact" and s.fingerprint() == s.replay_fingerprint()
