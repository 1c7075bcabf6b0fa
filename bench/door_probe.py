"""The server side of ``bench/door.py``: fak's API on uvicorn in this process, on the real model,
with spans wrapped around the path from a decode step's logits to the bytes on the socket (the
functions are wrapped here, at start-up, so this file reaches into private names; fak's own code
carries no probe). Driven over stdin/stdout by ``bench/door.py``: it prints ``READY <url> <key>``,
then answers ``reset`` (zero every figure) and ``dump`` (one JSON line of figures) until stdin
closes.

Spans, summed per name as [count, wall ns, thread CPU ns (where it says CPU)]:

- ``engine.decode``: a decode step (``Scheduler._run_decode``), wall; ``engine.rows`` its rows;
- ``engine.call``: another forward call (a prefill chunk, a turn's closing tokens), wall;
- ``engine.gather``: the engine between two steps while rows of the last are expected (its
  wait for them, or for any work), wall;
- ``turnaround``: from the end of the decode step that computed a session's token to its next
  row handed to the engine (what the stream thread did with the logits in between, and its
  waits for a core and the interpreter), wall; ``turnaround.late`` those over ``gather_s``;
- ``rows.followed``: decode rows whose session had a row in an earlier step; ``rows.missed``
  those not in the very next step (their thread came back too late, or was paused);
- ``step``: one ``ChatStream.next_chunks`` on a stream thread (wall, CPU), and inside it
  ``step.engine``: waiting for the forward call (``Scheduler.run``; CPU too), ``step.sample``
  (``generate.sample``), ``step.detok`` (``TextDecoder.push``), ``step.shown`` (``Shown.feed``),
  and the turn's end: ``end.commit`` (the ledger written), ``end.prefix`` (the prefix cache's
  insert), ``end.fingerprint`` (the answer's fingerprint), CPU;
- ``stream``: a stream thread's whole life (``_Steps._run``), CPU; ``stream.pause``: a stream
  paused for its reader (``_Steps._pause``);
- ``sse.encode``: the event loop turning a chunk into its SSE line (``as_dict``, ``json.dumps``),
  wall (the loop is one thread: its wall is its CPU unless the OS takes the core away);
- ``http <method> <path>``: the requests served;
- and, between ``reset`` and ``dump``, the CPU of the event-loop thread and of the engine
  thread (``pthread_getcpuclockid``) and of the process.

``FAK_DOOR_PROFILE=<folder>`` also runs cProfile (CPU time) on the stream threads and the
loop and writes their stats there (``stream.txt``, ``loop.txt``): it slows them several times.

    python bench/door_probe.py MODEL.gguf DATA_DIR   # started by bench/door.py
"""
# ruff: noqa: SLF001 - a probe wraps private functions of the path it measures

from __future__ import annotations

import asyncio
import cProfile
import json
import os
import pstats
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PROFILE = os.environ.get("FAK_DOOR_PROFILE")
_local = threading.local()
_tables: list[dict[str, list[int]]] = []  # one per thread: name -> [count, wall ns, cpu ns]
_tables_lock = threading.Lock()
_profiles: dict[str, list[cProfile.Profile]] = {"stream": [], "loop": []}
_loops: set[asyncio.AbstractEventLoop] = set()
_decoded: dict[int, int] = {}  # id(cache) -> when the decode step with its last row ended (ns)
_in_step: dict[int, int] = {}  # id(cache) -> the engine step (``_turn``) that had its last row


def _table() -> dict[str, list[int]]:
    table = getattr(_local, "table", None)
    if table is None:
        table = _local.table = {}
        with _tables_lock:
            _tables.append(table)
    return table


def add(name: str, wall: int, cpu: int = 0, count: int = 1) -> None:
    row = _table().setdefault(name, [0, 0, 0])
    row[0] += count
    row[1] += wall
    row[2] += cpu


@contextmanager
def span(name: str, cpu: bool = False) -> Iterator[None]:
    c0 = time.thread_time_ns() if cpu else 0
    t0 = time.perf_counter_ns()
    try:
        yield
    finally:
        add(name, time.perf_counter_ns() - t0, time.thread_time_ns() - c0 if cpu else 0)


def timed(name: str, fn: Callable[..., Any], *, cpu: bool = False, only_in_step: bool = False) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if only_in_step and not getattr(_local, "in_step", False):
            return fn(*args, **kwargs)
        with span(name, cpu):
            return fn(*args, **kwargs)

    return wrapper


def _wrap_engine() -> None:
    from fak.kernel.model import scheduler

    S = scheduler.Scheduler
    run_decode, run_call, run, next_step = S._run_decode, S._run_call, S.run, S._next_step

    def _run_decode(self: Any, jobs: list[Any]) -> None:
        _local.in_decode = True
        try:
            with span("engine.decode"):
                run_decode(self, jobs)
            add("engine.rows", 0, 0, len(jobs))
            end = time.perf_counter_ns()
            for job in jobs:
                _decoded[id(job.cache)] = end
        finally:
            _local.in_decode = False

    def _run_call(self: Any, job: Any) -> None:
        if getattr(_local, "in_decode", False):
            return run_call(self, job)
        with span("engine.call"):
            return run_call(self, job)

    def _next_step(self: Any) -> Any:
        waiting = bool(self._expected)
        t0 = time.perf_counter_ns()
        decode, calls = next_step(self)
        if waiting:
            add("engine.gather", time.perf_counter_ns() - t0)
        for job in decode or ():
            last = _in_step.get(id(job.cache))
            if last is not None:
                add("rows.followed", 0)
                if self._turn - last > 1:
                    add("rows.missed", 0)
            _in_step[id(job.cache)] = self._turn
        return decode, calls

    def _run(self: Any, model: Any, tokens: Any, cache: Any, *rest: Any) -> Any:
        last = _decoded.pop(id(cache), None) if len(tokens) == 1 else None
        if last is not None:
            wall = time.perf_counter_ns() - last
            add("turnaround", wall)
            if wall > self.limits.gather_s * 1e9:
                add("turnaround.late", wall)
        if not getattr(_local, "in_step", False):
            return run(self, model, tokens, cache, *rest)
        with span("step.engine", cpu=True):
            return run(self, model, tokens, cache, *rest)

    S._run_decode, S._run_call, S._next_step, S.run = _run_decode, _run_call, _next_step, _run  # type: ignore[method-assign]


def _wrap_stream() -> None:
    from fak.api import streaming
    from fak.kernel.kv import generation
    from fak.kernel.model import generate
    from fak.kernel.openai import answer, chat
    from fak.kernel.session import tokens, transaction

    generate.sample = timed("step.sample", generate.sample, only_in_step=True)
    tokens.TextDecoder.push = timed("step.detok", tokens.TextDecoder.push, only_in_step=True)  # type: ignore[method-assign]
    answer.Shown.feed = timed("step.shown", answer.Shown.feed, only_in_step=True)  # type: ignore[method-assign]
    transaction.Transaction.commit = timed("end.commit", transaction.Transaction.commit,  # type: ignore[method-assign]
                                           cpu=True, only_in_step=True)
    generation.insert_prefix = timed("end.prefix", generation.insert_prefix, cpu=True, only_in_step=True)
    chat.ChatTurn.fingerprint = timed("end.fingerprint", chat.ChatTurn.fingerprint,  # type: ignore[method-assign]
                                      cpu=True, only_in_step=True)
    next_chunks = chat.ChatStream.next_chunks

    def _next_chunks(self: Any) -> Any:
        _local.in_step = True
        try:
            with span("step", cpu=True):
                return next_chunks(self)
        finally:
            _local.in_step = False

    chat.ChatStream.next_chunks = _next_chunks  # type: ignore[method-assign]
    steps = streaming._Steps
    run_steps, steps_init = steps._run, steps.__init__

    def _run_steps(self: Any) -> None:
        profile = cProfile.Profile(time.thread_time_ns, 1e-9) if PROFILE else None
        with span("stream", cpu=True):
            if profile is None:
                return run_steps(self)
            try:
                return profile.runcall(run_steps, self)
            finally:
                with _tables_lock:
                    _profiles["stream"].append(profile)

    def _steps_init(self: Any, step: Callable[[], Any]) -> None:
        _loops.add(asyncio.get_running_loop())
        steps_init(self, step)

    steps._run, steps.__init__ = _run_steps, _steps_init  # type: ignore[method-assign]
    steps._pause = timed("stream.pause", steps._pause)  # type: ignore[method-assign]


def _wrap_loop() -> None:
    from fak.api import metrics
    from fak.api.routes import openai as chat_route
    from fak.kernel.openai import chunks

    door_call = metrics._Middleware.__call__

    async def _door(self: Any, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            add(f"http {scope.get('method')} {scope.get('path')}", 0)
        await door_call(self, scope, receive, send)

    metrics._Middleware.__call__ = _door  # type: ignore[method-assign]

    class _Json:  # the chat route's ``json``: dumps timed, the rest json's own
        def __getattr__(self, name: str) -> Any:
            return getattr(json, name)

        @staticmethod
        def dumps(obj: Any, **kw: Any) -> str:
            with span("sse.encode"):
                return json.dumps(obj, **kw)

    chunks.ChatChunk.as_dict = timed("sse.encode", chunks.ChatChunk.as_dict)  # type: ignore[method-assign]
    chat_route.json = _Json()  # type: ignore[assignment]


def thread_cpu_ns(ident: int | None) -> int:
    if ident is None:
        return 0
    try:
        return time.clock_gettime_ns(time.pthread_getcpuclockid(ident))
    except OSError:  # the thread is gone
        return 0


def _figures(base: dict[str, int], now: dict[str, int]) -> dict[str, Any]:
    spans: dict[str, list[int]] = {}
    with _tables_lock:
        for table in _tables:
            for name, row in list(table.items()):
                total = spans.setdefault(name, [0, 0, 0])
                for i in range(3):
                    total[i] += row[i]
    return {"spans": spans, "cpu_ns": {name: now[name] - base.get(name, 0) for name in now}, "pid": os.getpid()}


def _reset() -> None:
    with _tables_lock:
        for table in _tables:
            table.clear()
        _profiles["stream"].clear()
    if PROFILE:
        for loop in _loops:
            _profiles["loop"] = [cProfile.Profile(time.thread_time_ns, 1e-9)]
            loop.call_soon_threadsafe(_profiles["loop"][0].enable)


def _write_profiles(folder: Path) -> None:
    """The stream threads' merged stats and the loop's, as pstats files and as text (by own time)."""
    for loop in _loops:
        done = threading.Event()
        for profile in _profiles["loop"]:
            loop.call_soon_threadsafe(profile.disable)
        loop.call_soon_threadsafe(done.set)
        done.wait(10)
    folder.mkdir(parents=True, exist_ok=True)
    for name, profiles in _profiles.items():
        if not profiles:
            continue
        stats = pstats.Stats(profiles[0])
        for more in profiles[1:]:
            stats.add(more)
        stats.dump_stats(str(folder / f"{name}.pstats"))
        with open(folder / f"{name}.txt", "w") as out:
            pstats.Stats(str(folder / f"{name}.pstats"), stream=out).sort_stats("tottime").print_stats(60)


def main() -> None:
    model_path, data_dir = Path(sys.argv[1]), Path(sys.argv[2])
    _wrap_engine()
    _wrap_stream()
    _wrap_loop()
    from fak import Kernel, Settings
    from fak.api.server import serve

    k = Kernel.open(Settings(data_dir=data_dir, model_path=model_path), progress=None)
    try:
        with serve(k) as live:
            engine = k.services.engine
            engine_thread = engine._thread if engine is not None else None
            threads = {"loop": live.thread.ident, "engine": engine_thread.ident if engine_thread else None}
            print(f"READY {live.url} {live.key('door', 'agent')}", flush=True)
            base: dict[str, int] = {}
            for line in sys.stdin:
                now = {name: thread_cpu_ns(ident) for name, ident in threads.items()}
                now["process"] = time.process_time_ns()
                if line.strip() == "reset":
                    _reset()
                    base = now
                    print("OK", flush=True)
                elif line.strip() == "dump":
                    if PROFILE:
                        _write_profiles(Path(PROFILE))
                    print(json.dumps(_figures(base, now)), flush=True)
    finally:
        k.close()


if __name__ == "__main__":
    main()
