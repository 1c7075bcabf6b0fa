"""The audit log's witness cosigner: asks each witness (C2SP tlog-witness) to cosign each new
checkpoint, from a thread of its own, so a slow or absent witness never delays appends.

What a witness gives (and a verifier needs) is coverage, not a line on every checkpoint: when
checkpoints are signed faster than a witness answers, only the newest is sent, and its
cosignature covers the ones before it; ``WitnessStats`` measures how long each signed
checkpoint waits for that. The cosigner never writes the database: it hands the verified lines
to the log's writer thread (``hand_over``), which stores them with the next batch and tells it
(``covered``). On open, the newest checkpoint a witness lacks is sent to it (``ask_latest``).
"""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from sqlalchemy.engine import Engine

from fak.audit import merkle, store
from fak.audit.errors import AuditError
from fak.audit.witness import WitnessClient, WitnessConflict, WitnessEndpoint

Cosignature = tuple[int, str, str]  # size, witness vkey, cosignature line


@dataclass
class _Cosign:
    size: int
    note: str
    done: Future[None]


@dataclass
class WitnessStats:
    """Per witness: checkpoints cosigned, failures (down, refused, bad answer), latencies
    (``latency_ms``: proof, HTTP round trip and the witness's fsync, answer verified;
    ``store_ms``: then until the line is committed with the checkpoint)."""

    cosigned: int = 0
    failures: int = 0
    last_error: str | None = None
    latency_ms: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))
    store_ms: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))
    # coverage (what a verifier relies on: the newest cosigned checkpoint covers every entry):
    # the largest size whose cosignature is stored; per signed checkpoint, the seconds and entries
    # until a stored cosignature covered it (it, or a later one: only the newest is sent)
    covered_size: int = 0
    cover_lag_ms: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))
    cover_lag_entries: deque[int] = field(default_factory=lambda: deque(maxlen=10_000))
    uncovered: deque[tuple[int, float]] = field(default_factory=deque)  # (size, monotonic time signed), not yet covered

    def signed(self, size: int, at: float) -> None:
        """A checkpoint of ``size`` was signed (or asked again) at ``at``: it waits for coverage."""
        if size > self.covered_size and (not self.uncovered or self.uncovered[-1][0] < size):
            self.uncovered.append((size, at))

    def covered(self, size: int, at: float) -> None:
        """A cosignature of ``size`` was stored at ``at``: every checkpoint up to it is covered."""
        self.covered_size = max(self.covered_size, size)
        while self.uncovered and self.uncovered[0][0] <= size:
            s, t = self.uncovered.popleft()
            self.cover_lag_ms.append((at - t) * 1000)
            self.cover_lag_entries.append(size - s)


class Cosigner:
    """The witnesses of one log and the thread that asks them. ``hand_over(lines)`` queues
    verified cosignature lines for the log's writer and returns a future resolved once they are
    stored (the writer then calls ``covered``)."""

    def __init__(self, engine: Engine, witnesses: Sequence[WitnessEndpoint | str], timeout: float,
                 hand_over: Callable[[list[Cosignature]], Future[None]]) -> None:
        self._engine = engine
        self.witnesses = [WitnessEndpoint.parse(w) for w in witnesses]
        self.stats = {w.url: WitnessStats() for w in self.witnesses}
        self.timeout = timeout
        self._hand_over = hand_over
        self.asked: dict[str, int] = {}  # vkey -> last size it cosigned (as far as we know)
        self._jobs: queue.SimpleQueue[_Cosign | None] = queue.SimpleQueue()  # None: stop
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (with witnesses only) and ask for the newest checkpoint any lacks."""
        if self.witnesses:
            self._thread = threading.Thread(target=self._run, name="fak-audit-cosigner", daemon=True)
            self._thread.start()
            self.ask_latest()

    def stop(self) -> None:
        """Finish the jobs queued (their cosignatures are handed over), then stop the thread."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()

    def send(self, size: int, signed: str) -> Future[None]:
        """Have a newly signed checkpoint cosigned; the future resolves once the lines are stored."""
        done: Future[None] = Future()
        now = time.monotonic()
        for stats in self.stats.values():
            stats.signed(size, now)
        self._jobs.put(_Cosign(size, signed, done))
        return done

    def covered(self, rows: Sequence[Cosignature]) -> None:
        """The writer stored these cosignature lines: the checkpoints up to them are covered."""
        now = time.monotonic()
        url = {w.vkey: w.url for w in self.witnesses}
        for size, vkey, _ in rows:
            self.stats[url[vkey]].covered(size, now)

    def ask_latest(self) -> None:
        """On open: ask the witnesses that have not cosigned the newest stored checkpoint (a
        crash or a shutdown before their answer) to cosign it, so coverage resumes at once."""
        with self._engine.connect() as conn:
            row = store.latest_checkpoint(conn)
            if row is None:
                return
            have = {w for w, _ in store.cosignature_lines(conn, row[0])}
        lacking = [w for w in self.witnesses if w.vkey not in have]
        if lacking:
            now = time.monotonic()
            for w in lacking:
                self.stats[w.url].signed(row[0], now)
            self._jobs.put(_Cosign(row[0], row[2], Future()))

    def _run(self) -> None:
        """Cosigner thread: ask each witness to cosign each new checkpoint. When checkpoints
        queue up behind a slow witness, only the newest is sent (its proof covers the rest)."""
        clients = {w.vkey: WitnessClient(w, self.timeout) for w in self.witnesses}
        try:
            while True:
                job = self._jobs.get()
                if job is None:
                    return
                jobs = [job]
                with contextlib.suppress(queue.Empty):
                    while True:
                        nxt = self._jobs.get_nowait()
                        if nxt is None:
                            self._jobs.put(None)
                            break
                        jobs.append(nxt)
                newest = max(jobs, key=lambda j: j.size)
                got = []
                for w in self.witnesses:
                    line = self._cosign_one(clients[w.vkey], w, newest.size, newest.note)
                    if line is not None:
                        got.append((newest.size, w.vkey, line))
                self._store_later(got, jobs)
        finally:
            for c in clients.values():
                c.close()

    def _store_later(self, got: list[Cosignature], jobs: list[_Cosign]) -> None:
        """Hand the cosignatures to the writer thread (one writer, no lock contention) without
        waiting: the cosigner moves on; the jobs' waiters are released once they are stored.
        With nothing new (a line already asked for), the jobs still go through the writer's
        queue: it releases them after any line still on its way, so ``checkpoint()`` serves it."""
        t0 = time.perf_counter()

        def finish(f: Future[None]) -> None:
            for j in jobs:
                if f.exception() is None:
                    j.done.set_result(None)
                else:
                    j.done.set_exception(f.exception())
            for _, vkey, _ in got:
                url = next(w.url for w in self.witnesses if w.vkey == vkey)
                self.stats[url].store_ms.append((time.perf_counter() - t0) * 1000)

        self._hand_over(got).add_done_callback(finish)

    def _cosign_one(self, client: WitnessClient, w: WitnessEndpoint, size: int, signed: str) -> str | None:
        """Ask one witness; its verified cosignature line, or None (failure counted, stderr)."""
        stats = self.stats[w.url]
        t0 = time.perf_counter()
        try:
            old = self.asked.get(w.vkey)
            if old == size:
                return None  # asked already (its line is stored or on its way)
            with self._engine.connect() as conn:
                if any(v == w.vkey for v, _ in store.cosignature_lines(conn, size)):
                    return None
                if old is None:
                    old = store.latest_cosigned_size(conn, w.vkey) or 0
            for attempt in range(3):
                if old > size:
                    raise AuditError(f"the witness has cosigned size {old}, beyond this checkpoint ({size})")
                with self._engine.connect() as conn:
                    proof = merkle.consistency_proof(old, size, lambda ids: store.get_nodes(conn, ids))
                try:
                    lines = client.add_checkpoint(old, proof, signed)
                    break
                except WitnessConflict as exc:
                    if attempt == 2:
                        raise
                    old = exc.size
            self.asked[w.vkey] = size
            stats.cosigned += 1
            stats.latency_ms.append((time.perf_counter() - t0) * 1000)
            return lines[0]
        except Exception as exc:
            stats.failures += 1
            stats.last_error = str(exc)
            print(f"fak audit: witness {w.url} did not cosign checkpoint {size}: {exc}", file=sys.stderr, flush=True)
            return None
