"""Sessions on top of the prefix cache: exact reuse across sessions, tenant
isolation, and no poisoned KV served after an eviction (tiny model)."""

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


SYS, USER, TOOL, TOOL2, Q = ids(40, 1), ids(12, 2), ids(30, 3), ids(25, 4), ids(8, 5)


def test_second_session_reuses_prefix_bit_exact() -> None:
    model = tiny_model()
    pc = PrefixCache()
    first = Session(model, prefix=binding(pc, model, "acme"), chunk_size=16)
    for kind, t in (("system", SYS), ("user", USER), ("tool", TOOL)):
        first.append(kind, tokens=t)
    second = Session(model, prefix=binding(pc, model, "acme"), chunk_size=16)
    plain = Session(model, chunk_size=16)
    for s in (second, plain):
        s.append("system", tokens=SYS)
        s.append("user", tokens=USER)
        s.append("tool", tokens=TOOL2)
        s.append("user", tokens=Q)
    assert second.prefix_hit_tokens == len(SYS) + len(USER)
    assert second.fingerprint() == plain.fingerprint()
    assert torch.equal(second.last_logits, plain.last_logits)


def test_other_tenant_gets_no_hits() -> None:
    model = tiny_model()
    pc = PrefixCache()
    a = Session(model, prefix=binding(pc, model, "acme"))
    a.append("system", tokens=SYS)
    a.append("user", tokens=USER)
    b = Session(model, prefix=binding(pc, model, "globex"))
    b.append("system", tokens=SYS)
    b.append("user", tokens=USER)
    assert b.prefix_hit_tokens == 0
    c = Session(model, prefix=binding(pc, model, "acme"))
    c.append("system", tokens=SYS)
    assert c.prefix_hit_tokens == len(SYS)
    assert b.fingerprint() == a.fingerprint()


def test_evicted_tool_result_not_served_to_later_sessions() -> None:
    model = tiny_model()
    pc = PrefixCache()
    ref = "blake3k:" + "9a" * 32
    first = Session(model, prefix=binding(pc, model, "acme"))
    first.append("system", tokens=SYS)
    poison = first.append("tool", tokens=TOOL, ref=ref)
    first.append("user", tokens=Q)
    first.evict([poison.id], EvictMode.RECOMPUTE)
    later = Session(model, prefix=binding(pc, model, "acme"))
    later.append("system", tokens=SYS)
    later.append("tool", tokens=TOOL, ref=ref)  # it sends the tokens itself: prefilled, not served
    assert later.prefix_hit_tokens == len(SYS)
    # what the first session kept (SYS then Q, replayed) is served exactly
    again = Session(model, prefix=binding(pc, model, "acme"))
    again.append("system", tokens=SYS)
    again.append("user", tokens=Q)
    assert again.prefix_hit_tokens == len(SYS) + len(Q)
    assert again.fingerprint() == first.fingerprint()


def test_rerope_session_never_feeds_the_cache() -> None:
    model = tiny_model()
    pc = PrefixCache()
    s = Session(model, prefix=binding(pc, model, "acme"))
    s.append("system", tokens=SYS)
    t = s.append("tool", tokens=TOOL, ref="blake3k:" + "7b" * 32)
    s.append("user", tokens=Q)
    s.evict([t.id], EvictMode.REROPE)
    s.append("user", tokens=USER)
    later = Session(model, prefix=binding(pc, model, "acme"))
    later.append("system", tokens=SYS)
    later.append("user", tokens=Q)
    assert later.prefix_hit_tokens == len(SYS)  # the approximate (re-roped) rows are never shared


def test_prefix_served_only_to_the_same_calls() -> None:
    """A row's bytes depend on the forward calls that computed it (and the rows before):
    rows another session computed in a longer call are not served, rows computed by the
    same calls are, and either way the session equals a fresh replay (found by schemathesis:
    a 13-token segment served from a 20-token call did not rebuild to its fingerprint)."""
    model = tiny_model()
    pc = PrefixCache()
    tokens = ids(20, 7)
    longer = Session(model, prefix=binding(pc, model, "acme"))
    longer.append("user", tokens=tokens, chunks=[20])
    shorter = Session(model, prefix=binding(pc, model, "acme"))
    shorter.append("user", tokens=tokens[:13], chunks=[13])
    assert shorter.prefix_hit_tokens == 0  # the producer's call went on past row 13
    assert shorter.fingerprint() == shorter.replay_fingerprint()
    same_calls = Session(model, prefix=binding(pc, model, "acme"))
    same_calls.append("user", tokens=tokens[:13], chunks=[13])
    assert same_calls.prefix_hit_tokens == 13  # `shorter` inserted rows computed by a 13-token call
    assert same_calls.fingerprint() == shorter.fingerprint() == same_calls.replay_fingerprint()
    split = Session(model, prefix=binding(pc, model, "acme"))
    split.append("user", tokens=tokens, chunks=[13, 7])
    assert split.prefix_hit_tokens == 13  # its first call is the cached one; the second is its own
    assert split.fingerprint() == split.replay_fingerprint()
