"""The engine loop (``fak.kernel.model.scheduler``): sessions batched into one forward call per
step compute the bytes they compute alone, in every weight format; admission is fair and
bounded (429 with Retry-After beyond the queue)."""

from __future__ import annotations

import random
import threading
import time
from collections import deque

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.kernel_helpers import random_weights, tiny_config

from fak.kernel.model.kv_cache import KVCache
from fak.kernel.model.llama import Llama
from fak.kernel.model.quant import fbgemm_supported, int8_supported
from fak.kernel.model.scheduler import (
    GenerationSlots,
    Overloaded,
    Scheduler,
    SchedulerLimits,
    _Job,
    _PrefillOrder,
    tenant_scope,
)

VOCAB = 257


def _model(fmt: str) -> Llama:
    cfg = tiny_config()
    return Llama(cfg, random_weights(cfg, seed=3), model_id="tiny-3", weight_format=fmt)


FORMATS = [
    "gguf",
    "float32",
    "bfloat16",
    pytest.param("float16", marks=pytest.mark.skipif(not fbgemm_supported(), reason="float16 needs fbgemm")),
    pytest.param("int8", marks=pytest.mark.skipif(not int8_supported(), reason="int8 needs a quantized engine")),
]
_models: dict[str, Llama] = {}


def model_of(fmt: str) -> Llama:
    if fmt not in _models:
        _models[fmt] = _model(fmt)
    return _models[fmt]


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _run(model: Llama, prompt: list[int], chunk: int, steps: int, delay: float = 0.0) -> tuple[list[torch.Tensor], KVCache]:
    """Prefill ``prompt`` in chunks of ``chunk``, then ``steps`` greedy decode steps: every
    call's logits and the cache (through the model's router when a scheduler runs it)."""
    time.sleep(delay)
    cache = model.new_cache()
    out = [model.forward(prompt[i : i + chunk], cache) for i in range(0, len(prompt), chunk)]
    for _ in range(steps):
        out.append(model.forward([int(out[-1][-1].argmax())], cache))
    return out, cache


def _at_once(model: Llama, plans: list[tuple[list[int], int, int]]) -> list[tuple[list[torch.Tensor], KVCache]]:
    """``_run`` of every plan, each on its own thread, all started at the same moment."""
    together: list[tuple[list[torch.Tensor], KVCache] | None] = [None] * len(plans)
    start = threading.Barrier(len(plans))

    def worker(i: int) -> None:
        start.wait()
        together[i] = _run(model, *plans[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(plans))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r is not None for r in together), "a session's thread failed"
    return [r for r in together if r is not None]


def _same(a: tuple[list[torch.Tensor], KVCache], b: tuple[list[torch.Tensor], KVCache]) -> None:
    (la, ca), (lb, cb) = a, b
    assert len(la) == len(lb)
    for x, y in zip(la, lb, strict=True):
        assert torch.equal(x, y)
    assert ca.fingerprint() == cb.fingerprint()
    n = ca.length
    for name in ("k", "kraw", "v"):
        assert torch.equal(getattr(ca, name)[:, :n], getattr(cb, name)[:, :n])


sessions_st = st.lists(
    st.tuples(st.integers(1, 40), st.integers(1, 24), st.integers(0, 12), st.floats(0, 0.02)),
    min_size=1, max_size=16,
)


@pytest.mark.parametrize("fmt", FORMATS)
def test_batched_equals_alone(fmt: str) -> None:
    """1–16 sessions of random prompt lengths, chunkings, answer lengths and arrival times run
    on their own threads through one engine: each session's logits and cache are the bytes of
    its solo run (a batched decode row is its own step's bytes; other calls run as alone).
    gguf batches its decode rows; the other formats run each call alone on the engine thread,
    and fewer examples of them are drawn (their products are slower on the tiny model)."""
    model = model_of(fmt)

    @settings(max_examples=12 if model.batches_decode else 4, deadline=None)
    @given(sessions=sessions_st, seed=st.integers(0, 2**16))
    def check(sessions: list[tuple[int, int, int, float]], seed: int) -> None:
        _batched_equals_alone(model, sessions, seed)

    check()


def _batched_equals_alone(model: Llama, sessions: list[tuple[int, int, int, float]], seed: int) -> None:
    plans = [(_prompt(n, seed + i), chunk, steps, delay) for i, (n, chunk, steps, delay) in enumerate(sessions)]
    alone = [_run(model, p, c, k) for p, c, k, _ in plans]
    together: list[tuple[list[torch.Tensor], KVCache] | None] = [None] * len(plans)
    engine = Scheduler(model, SchedulerLimits(max_batch=random.Random(seed).choice([2, 5, 32]))).start()
    try:
        def worker(i: int) -> None:
            p, c, k, d = plans[i]
            with tenant_scope(f"t{i % 3}"):
                together[i] = _run(model, p, c, k, d)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(plans))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        engine.close()
    assert model.router is None
    for a, b in zip(alone, together, strict=True):
        assert b is not None
        _same(a, b)


def test_gguf_steps_of_many_sessions_do_run_batched() -> None:
    """The property above is not vacuous: with sessions decoding at once, the engine runs
    their steps as batches of several rows (and the bytes still equal the solo runs)."""
    model = model_of("gguf")
    assert model.batches_decode
    plans = [(_prompt(5 + 3 * i, i), 8, 30) for i in range(8)]
    alone = [_run(model, *p) for p in plans]
    engine = Scheduler(model).start()
    try:
        together = _at_once(model, plans)
    finally:
        engine.close()
    assert engine.batched_rows >= 8 * 10, engine.batched_rows  # most steps ran with others
    for a, b in zip(alone, together, strict=True):
        _same(a, b)


def test_prefill_finishes_requests_in_the_order_they_came() -> None:
    """Sessions that all start prefilling at once (several calls each, one at a time from
    their threads) have their prefills run one request after the other, oldest first: the
    engine's log of calls never interleaves two sessions' prefills, so the first request's
    first token does not wait for the later requests' prompts. (Round robin over calls, as
    before, ran every session's k-th chunk in one step: all prefills finished together.)
    Every session's bytes still equal its solo run."""
    model = _model("gguf")
    plans = [(_prompt(48, 40 + i), 8, 3) for i in range(5)]
    alone = [_run(model, *p) for p in plans]
    engine = Scheduler(model, SchedulerLimits(prefill_wait_s=0.5)).start()  # generous: CI threads may lag
    log: list[tuple[int, int]] = []  # (cache id, tokens) of each call the engine ran
    forward = model.forward

    def logged(tokens, cache, *args, **kwargs):  # type: ignore[no-untyped-def]
        if threading.get_ident() == engine._thread.ident:  # type: ignore[union-attr]
            log.append((id(cache), len(tokens)))
        return forward(tokens, cache, *args, **kwargs)

    model.forward = logged  # type: ignore[method-assign]
    try:
        together = _at_once(model, plans)
    finally:
        engine.close()
        del model.forward
    prefill_runs = [cache for cache, n in log if n > 1]
    order = list(dict.fromkeys(prefill_runs))  # sessions in the order their prefill began
    assert len(order) == len(plans)
    assert prefill_runs == [c for c in order for _ in range(6)], "two sessions' prefills interleaved"
    for a, b in zip(alone, together, strict=True):
        _same(a, b)


def test_a_session_slow_between_calls_goes_behind_the_waiting_ones() -> None:
    """A run keeps its place only while each call follows the last within ``wait_s``: a
    session whose next call comes later (another request on the same session, say) queues
    behind the runs that waited meanwhile, so it cannot stay ahead of everyone by appending."""
    model = model_of("gguf")
    a, b = model.new_cache(), model.new_cache()
    order = _PrefillOrder(wait_s=0.05)
    jobs = {c: _Job([1, 2], c, None, False, None, "") for c in (a, b)}
    order.arrived(id(a))
    queue = deque([jobs[a]])
    assert order.take(queue, time.monotonic()) == [jobs[a]]
    order.ran(id(a), time.monotonic())
    order.arrived(id(b))  # b waits while a's thread prepares its next call
    queue.append(jobs[b])
    assert order.take(queue, time.monotonic()) == []
    order.arrived(id(a))  # within wait_s: a keeps its place
    queue.append(jobs[a])
    assert order.take(queue, time.monotonic()) == [jobs[a]]
    order.ran(id(a), time.monotonic())
    time.sleep(0.1)
    order.arrived(id(a))  # too late: a new run, behind b
    queue.append(jobs[a])
    assert order.take(queue, time.monotonic()) == [jobs[b]]
    assert order.take(queue, time.monotonic()) == [jobs[a]]


@settings(max_examples=10, deadline=None)
@given(lengths=st.lists(st.integers(1, 60), min_size=1, max_size=12), data=st.data())
def test_forward_batch_rows_are_their_own_steps(lengths: list[int], data: st.DataObject) -> None:
    """Directly: any subset of sessions, at any positions, batched in any order: every row's
    logits and cache rows equal a one-token ``forward`` of that session alone."""
    model = model_of("gguf")
    caches = [model.new_cache() for _ in lengths]
    twins = [model.new_cache() for _ in lengths]
    for i, n in enumerate(lengths):
        for c in (caches[i], twins[i]):
            model.forward(_prompt(n, i), c)
    for _ in range(3):
        order = data.draw(st.permutations(range(len(lengths))))
        chosen = order[: data.draw(st.integers(1, len(lengths)))]
        tokens = {i: data.draw(st.integers(0, VOCAB - 1)) for i in chosen}
        batched = model.forward_batch([(tokens[i], caches[i]) for i in chosen])
        for i, got in zip(chosen, batched, strict=True):
            assert torch.equal(got, model.forward([tokens[i]], twins[i]))
    for a, b in zip(caches, twins, strict=True):
        assert a.fingerprint() == b.fingerprint()


def test_forward_batch_refuses_what_it_cannot_batch() -> None:
    model = model_of("gguf")
    cache = model.new_cache()
    model.forward([1, 2, 3], cache)
    with pytest.raises(ValueError, match="at most once"):
        model.forward_batch([(4, cache), (5, cache)])
    with pytest.raises(ValueError, match="token ids"):
        model.forward_batch([(VOCAB + 5, cache)])
    assert not model_of("float32").batches_decode
    with pytest.raises(ValueError, match="does not batch"):
        model_of("float32").forward_batch([(4, model_of("float32").new_cache())])


def test_an_error_in_a_call_reaches_its_own_caller_only() -> None:
    model = model_of("gguf")
    engine = Scheduler(model).start()
    try:
        cache = model.new_cache()
        with pytest.raises(ValueError, match="token ids"):
            model.forward([VOCAB + 1], cache)
        assert model.forward([1, 2], cache).shape == (1, VOCAB)  # the engine goes on
    finally:
        engine.close()


# --- admission ----------------------------------------------------------------------


def test_admission_bounds_a_tenant_and_refuses_beyond_the_queue() -> None:
    adm = GenerationSlots(total=3, per_tenant=2, queue=1, wait_s=5)
    held = [adm.slot("a"), adm.slot("a")]
    for h in held:
        h.__enter__()
    assert adm.active("a") == 2
    got: list[str] = []

    def third_of_a() -> None:
        with adm.slot("a"):
            got.append("a")

    waiter = threading.Thread(target=third_of_a)
    waiter.start()
    while adm.queued("a") != 1:
        time.sleep(0.001)
    with pytest.raises(Overloaded) as exc, adm.slot("b"):  # the queue (one place) is full
        pass
    assert exc.value.status == 429 and exc.value.retry_after >= 1
    assert adm.rejected("b") == 1
    held[0].__exit__(None, None, None)  # a's place frees: its waiter runs
    waiter.join(5)
    assert got == ["a"]
    held[1].__exit__(None, None, None)
    assert adm.active("a") == 0


def test_admission_serves_the_tenant_with_fewer_running_first() -> None:
    """With the whole server busy, the next free place goes to a tenant with nothing running,
    not to the tenant that queued first with many running (a tenant cannot starve others)."""
    adm = GenerationSlots(total=2, per_tenant=2, queue=8, wait_s=5)
    a1, a2 = adm.slot("a"), adm.slot("a")
    a1.__enter__()
    a2.__enter__()
    order: list[str] = []

    def wait_for(tenant: str) -> None:
        with adm.slot(tenant):
            order.append(tenant)
            time.sleep(0.05)

    first = threading.Thread(target=wait_for, args=("a",))
    first.start()
    while adm.queued("a") != 1:
        time.sleep(0.001)
    second = threading.Thread(target=wait_for, args=("b",))
    second.start()
    while adm.queued("b") != 1:
        time.sleep(0.001)
    a1.__exit__(None, None, None)  # one place: b (nothing running) before a (one still running)
    second.join(5)
    a2.__exit__(None, None, None)
    first.join(5)
    assert order == ["b", "a"]


def test_a_tenant_cannot_fill_the_queue_for_others() -> None:
    """One tenant holds at most its share of the queue (per_tenant places): with the server
    full and that tenant's share waiting, its next request is refused, another tenant's waits."""
    adm = GenerationSlots(total=1, per_tenant=1, queue=8, wait_s=5)
    held: dict[str, object] = {}

    def enter(name: str, tenant: str) -> None:
        cm = adm.slot(tenant)
        cm.__enter__()
        held[name] = cm  # kept: a dropped context manager gives its place back when collected

    enter("busy", "a")
    waiter = threading.Thread(target=enter, args=("a2", "a"))
    waiter.start()
    while adm.queued("a") != 1:
        time.sleep(0.001)
    with pytest.raises(Overloaded, match="1 of your requests"), adm.slot("a"):
        pass
    other = threading.Thread(target=enter, args=("b", "b"))
    other.start()
    while adm.queued("b") != 1:  # b still gets a place in the queue
        time.sleep(0.001)
    assert adm.rejected("a") == 1 and adm.rejected("b") == 0
    held.pop("busy").__exit__(None, None, None)  # type: ignore[attr-defined]
    waiter.join(5)  # neither tenant runs anything now: the older request goes first
    assert adm.active("a") == 1 and adm.queued("b") == 1
    held.pop("a2").__exit__(None, None, None)  # type: ignore[attr-defined]
    other.join(5)
    assert adm.active("b") == 1
    held.pop("b").__exit__(None, None, None)  # type: ignore[attr-defined]


def test_a_wait_past_its_limit_is_refused() -> None:
    adm = GenerationSlots(total=1, per_tenant=1, queue=4, wait_s=0.05)
    with adm.slot("a"), pytest.raises(Overloaded, match="retry"), adm.slot("a"):
        pass
    assert adm.queued("a") == 0 and adm.active("a") == 0
