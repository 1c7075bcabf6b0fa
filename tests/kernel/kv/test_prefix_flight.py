"""Prefix computations in flight (``fak.kernel.kv.prefix_flight``): a session that needs the
calls another session of its namespace is computing now waits for them and is served the
rows from the prefix cache (bit-exact), never for another namespace's; a claim ends however
its prefill ends; a waiter gives up after ``WAIT_S`` (tiny model)."""

from __future__ import annotations

import threading

import pytest
import torch
from support.kernel_helpers import tiny_model

from fak.kernel.kv import prefill
from fak.kernel.kv.prefix_cache import PrefixCache, namespace
from fak.kernel.kv.prefix_flight import Claim, Flight, Flights, flight_key
from fak.kernel.kv.prefix_tree import call_keys
from fak.kernel.kv.session import PrefixBinding, Session
from fak.keys import tenant_salt

MASTER = bytes(range(32))


def ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 257, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


SYS, USER = ids(40, 11), ids(12, 12)


def binding(cache: PrefixCache, model, tenant: str) -> PrefixBinding:  # noqa: ANN001
    return PrefixBinding(cache, namespace(tenant_salt(MASTER, tenant), model.model_id))


def names(tokens: list[int], chunk: int) -> list[bytes]:
    """The flight names of a first segment of ``tokens`` prefilled in ``chunk``-token calls."""
    starts = list(range(0, len(tokens), chunk))
    keys = call_keys(tokens, starts)
    return [flight_key(keys[: min(s + chunk, len(tokens))]) for s in starts]


def test_take_claims_what_no_one_computes_and_release_wakes_waiters() -> None:
    f = Flights()
    ns, other = b"t" + b"\x01" * 32, b"t" + b"\x02" * 32
    a, b, c = (flight_key([i]) for i in range(3))
    mine = f.take(ns, [a, b], claim=True)
    assert isinstance(mine, Claim) and mine.names == [a, b] and f.open_count(ns) == 2
    busy = f.take(ns, [a, c], claim=True)  # its first call is in flight: wait for it
    assert isinstance(busy, Flight) and busy is mine.flight and not busy.wait(0.01)
    assert f.take(ns, [b], claim=False) is busy
    assert f.take(ns, [c], claim=False) is None  # nothing to wait for, and no claim asked
    assert isinstance(f.take(other, [a], claim=True), Claim)  # another namespace never waits on this one
    mine.release()
    mine.release()  # idempotent
    assert busy.wait(0) and f.open_count(ns) == 0
    assert f.take(ns, [], claim=True) is None


def test_waiter_is_served_what_the_other_session_computed() -> None:
    """B appends the system prompt while another session of its tenant computes the same calls:
    B waits, then copies the rows (no forward call of its own) and they are the bytes B would
    compute alone."""
    model = tiny_model()
    pc = PrefixCache()
    bind = binding(pc, model, "acme")
    claim = pc.flights.take(bind.namespace, names(SYS, 16), claim=True)  # the computing session's claim
    assert isinstance(claim, Claim)
    b = Session(model, prefix=bind, chunk_size=16)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (b.append("system", tokens=SYS), done.set()))
    worker.start()
    assert not done.wait(0.5)  # waiting for the computation in flight
    a = Session(model, chunk_size=16)  # the computing session's rows, inserted as its prefill would
    a.append("system", tokens=SYS)
    pc.insert(bind.namespace, call_keys(SYS, prefill.call_starts(a)), a.cache)
    claim.release()
    worker.join(30)
    assert done.is_set() and b.prefix_hit_tokens == len(SYS)
    assert b.fingerprint() == a.fingerprint()
    st = pc.stats_for(bind.namespace)
    assert (st.waits, st.served_tokens, st.computed_tokens) == (1, len(SYS), 0)
    b.append("user", tokens=USER)  # nothing in flight: computed, counted
    alone = Session(model, chunk_size=16)
    for kind, t in (("system", SYS), ("user", USER)):
        alone.append(kind, tokens=t)
    assert b.fingerprint() == alone.fingerprint() and torch.equal(b.last_logits, alone.last_logits)
    assert pc.stats_for(bind.namespace).computed_tokens == len(USER)


def test_another_tenant_never_waits() -> None:
    model = tiny_model()
    pc = PrefixCache()
    acme, globex = binding(pc, model, "acme"), binding(pc, model, "globex")
    claim = pc.flights.take(acme.namespace, names(SYS, 16), claim=True)
    other = Session(model, prefix=globex, chunk_size=16)
    other.append("system", tokens=SYS)  # returns at once: acme's flight is not globex's
    assert other.prefix_hit_tokens == 0 and pc.stats_for(globex.namespace).waits == 0
    assert isinstance(claim, Claim)
    claim.release()


def test_waiter_gives_up_after_the_wait_and_computes(monkeypatch) -> None:
    monkeypatch.setattr(prefill, "WAIT_S", 0.2)
    model = tiny_model()
    pc = PrefixCache()
    bind = binding(pc, model, "acme")
    stuck = pc.flights.take(bind.namespace, names(SYS, 16), claim=True)  # never released
    s = Session(model, prefix=bind, chunk_size=16)
    s.append("system", tokens=SYS)
    alone = Session(model, chunk_size=16)
    alone.append("system", tokens=SYS)
    assert s.prefix_hit_tokens == 0 and s.fingerprint() == alone.fingerprint()
    assert pc.stats_for(bind.namespace).waits == 1
    assert isinstance(stuck, Claim)
    stuck.release()


def test_a_failed_prefill_ends_its_claim(monkeypatch) -> None:
    model = tiny_model()
    pc = PrefixCache()
    bind = binding(pc, model, "acme")
    s = Session(model, prefix=bind, chunk_size=16)

    def boom(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("forward failed")

    monkeypatch.setattr(model, "forward", boom)
    with pytest.raises(RuntimeError, match="forward failed"):
        s.append("system", tokens=SYS)
    assert pc.flights.open_count(bind.namespace) == 0 and s.cache.length == 0
    monkeypatch.undo()
    s.append("system", tokens=SYS)  # no stale flight to wait for
    assert pc.stats_for(bind.namespace).waits == 0


def test_sessions_started_together_compute_the_shared_prefix_once() -> None:
    """Four sessions of one tenant append the same system prompt and then their own message at
    the same moment: the system prompt's rows are computed once in all, and each session's KV
    is the bytes it computes alone."""
    model = tiny_model()
    pc = PrefixCache()
    bind = binding(pc, model, "acme")
    users = [ids(12, 20 + i) for i in range(4)]
    sessions = [Session(model, prefix=bind, chunk_size=16) for _ in users]
    start = threading.Barrier(len(sessions))

    def run(s: Session, user: list[int]) -> None:
        start.wait()
        s.append("system", tokens=SYS)
        s.append("user", tokens=user)

    threads = [threading.Thread(target=run, args=(s, u)) for s, u in zip(sessions, users, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    st = pc.stats_for(bind.namespace)
    assert st.computed_tokens == len(SYS) + sum(map(len, users))
    assert st.served_tokens == 3 * len(SYS)
    for s, user in zip(sessions, users, strict=True):
        alone = Session(model, chunk_size=16)
        alone.append("system", tokens=SYS)
        alone.append("user", tokens=user)
        assert s.fingerprint() == alone.fingerprint()
