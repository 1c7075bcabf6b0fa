"""A paused stream does not hold the engine's steps (``rows_paused``): a step waits up to
``gather_s`` for the rows of the last one, and a session whose reader is slow sends no row for
a while; once its thread says so, the others' next step runs without waiting for it."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from support.kernel_helpers import random_weights, tiny_config

from fak.kernel.model.llama import Llama
from fak.kernel.model.scheduler import Scheduler, SchedulerLimits, rows_paused

GATHER_S = 1.5  # long, so a step that waits for a missing row is plain to see


@pytest.fixture(scope="module")
def model() -> Llama:
    cfg = tiny_config()
    return Llama(cfg, random_weights(cfg, seed=3), model_id="tiny-3", weight_format="gguf")


def _second_row_s(model: Llama, *, pause: bool) -> float:
    """Two sessions' rows run in one step; then A's thread stops sending rows (saying so when
    ``pause``) and B sends its next one: seconds until B's next logits came back."""
    engine = Scheduler(model, SchedulerLimits(gather_s=GATHER_S))
    account = engine._account

    def settle_then_account(decode: list, calls: list) -> None:  # noqa: ANN001
        # the engine returns to its next step after the sessions' threads did (as with many
        # rows, where some are always back by then): an idle engine forgets what it expected
        time.sleep(0.1)
        account(decode, calls)

    engine._account = settle_then_account  # type: ignore[method-assign]
    a, b = model.new_cache(), model.new_cache()
    for cache in (a, b):
        model.forward([5, 6, 7], cache)  # no engine yet: on this thread
    first = threading.Barrier(3)
    took: list[float] = []

    def session_a() -> None:
        first.wait()
        engine.run(model, [8], a, None, False, None)
        if pause:
            rows_paused()

    def session_b() -> None:
        first.wait()
        logits = engine.run(model, [9], b, None, False, None)
        t0 = time.monotonic()
        engine.run(model, [int(logits[-1].argmax())], b, None, False, None)
        took.append(time.monotonic() - t0)

    threads = [threading.Thread(target=session_a), threading.Thread(target=session_b)]
    for t in threads:
        t.start()
    first.wait()
    while len(engine._decode) < 2:  # both first rows queued before the engine starts: one step
        time.sleep(0.001)
    engine.start()
    try:
        for t in threads:
            t.join(timeout=30)
    finally:
        engine.close()
    assert engine.steps == 2 and a.length == b.length - 1 == 4  # A and B in the first step, B alone in the second
    return took[0]


def test_a_paused_session_does_not_make_the_next_step_wait(model: Llama) -> None:
    assert _second_row_s(model, pause=True) < GATHER_S / 3


def test_without_the_pause_the_step_waits_for_the_missing_row(model: Llama) -> None:
    """The witness above can fail: a session that stops sending rows unannounced costs the next
    step the whole gather (why a stream's thread announces its pause)."""
    assert _second_row_s(model, pause=False) >= GATHER_S * 0.9


def test_a_paused_session_sends_rows_again_as_any_session_does(model: Llama) -> None:
    """Pausing drops only the engine's wait for the session's last step: its next row, when it
    comes, runs as any row does, and is the bytes of its own step."""
    alone, served = model.new_cache(), model.new_cache()
    for cache in (alone, served):
        model.forward([5, 6, 7], cache)
    engine = Scheduler(model, SchedulerLimits(gather_s=GATHER_S)).start()
    try:
        got = [model.forward([8], served)]  # through the engine
        rows_paused()
        got.append(model.forward([9], served))
    finally:
        engine.close()
    want = [model.forward([8], alone), model.forward([9], alone)]
    assert all(torch.equal(x, y) for x, y in zip(got, want, strict=True))
    assert served.fingerprint() == alone.fingerprint()
