"""Sessions of two tenants over one prefix cache: an eviction (forget) in one
tenant's session drops that tenant's cached KV only, and one tenant's inserts
never evict the other's (tiny model)."""

from __future__ import annotations

import torch
from support.kernel_helpers import tiny_model

from fak.kernel.kv.prefix_cache import PrefixCache, namespace
from fak.kernel.kv.session import EvictMode, PrefixBinding, Session
from fak.keys import tenant_salt

MASTER = bytes(range(32))


def ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 257, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def binding(cache: PrefixCache, model, tenant: str) -> PrefixBinding:  # noqa: ANN001
    return PrefixBinding(cache, namespace(tenant_salt(MASTER, tenant), model.model_id))


SYS, TOOL, Q = ids(40, 11), ids(30, 12), ids(8, 13)
REF = "blake3:" + "5c" * 32  # a public document both tenants fetched: the same ref string in both trees


def session(pc: PrefixCache, model, tenant: str, *parts) -> Session:  # noqa: ANN001
    s = Session(model, prefix=binding(pc, model, tenant), chunk_size=16)
    for kind, toks, ref in parts:
        s.append(kind, tokens=toks, ref=ref)
    return s


def test_eviction_in_one_tenant_keeps_the_other_tenants_cache() -> None:
    model = tiny_model()
    pc = PrefixCache()
    parts = (("system", SYS, None), ("tool", TOOL, REF), ("user", Q, None))
    acme = session(pc, model, "acme", *parts)
    session(pc, model, "globex", *parts)
    globex_ns = binding(pc, model, "globex").namespace
    globex_before = {n.id for n in pc.nodes(globex_ns)}

    acme.evict([next(s for s in acme.ledger.live() if s.ref == REF).id], EvictMode.RECOMPUTE)
    assert {n.id for n in pc.nodes(globex_ns)} == globex_before
    later_acme = session(pc, model, "acme", ("system", SYS, None), ("tool", TOOL, REF))
    later_globex = session(pc, model, "globex", ("system", SYS, None), ("tool", TOOL, REF))
    assert later_acme.prefix_hit_tokens == len(SYS)  # acme's forgotten tool result is prefilled again
    assert later_globex.prefix_hit_tokens == len(SYS) + len(TOOL)  # globex's copy is still served
    assert later_globex.fingerprint() == later_acme.fingerprint()


def test_one_tenants_sessions_never_evict_the_others() -> None:
    model = tiny_model()
    row = model.new_cache(1).bytes_per_token
    pc = PrefixCache(namespace_budget_bytes=64 * row)
    session(pc, model, "globex", ("system", SYS, None))
    globex_ns = binding(pc, model, "globex").namespace
    globex_before = {n.id for n in pc.nodes(globex_ns)}
    acme_ns = binding(pc, model, "acme").namespace
    for seed in range(6):  # far more than acme's budget
        session(pc, model, "acme", ("system", ids(40, 100 + seed), None))
        assert pc.stats_for(acme_ns).bytes <= 64 * row
    assert {n.id for n in pc.nodes(globex_ns)} == globex_before
    assert session(pc, model, "globex", ("system", SYS, None)).prefix_hit_tokens == len(SYS)
    assert pc.stats_for(globex_ns).evictions == 0 and pc.stats_for(acme_ns).evictions > 0
