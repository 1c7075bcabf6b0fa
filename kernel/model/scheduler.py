"""The engine loop: one thread runs every forward call of the served model, batching the
decode steps of all sessions that are generating into one call per step.

Requests still run on their own threads, and so does everything that governs them
(admission gates, audit events, withdrawals, tool-call decisions, sampling): only the
model's arithmetic moves. A session's ``Llama.forward`` call made on a request thread is
handed to the engine (``Llama.router``) and the thread waits for its logits. Each step
the engine takes

- the pending one-token decode steps of every session (up to ``max_batch`` rows, round
  robin over tenants when more wait) and runs them as one ``Llama.forward_batch`` call:
  one pass over the weights for all of them; then
- other forward calls (prefill chunks of admissions and new turns, recomputations,
  captured evidence passes) in the order their requests came (``_PrefillOrder``: a
  session's calls carry the time its first waiting call arrived): one call a step, the
  oldest request's. A request's prefill is several calls (its segments' chunks) made one
  after the other by its thread, so while the oldest request's thread prepares its next
  call (up to ``prefill_wait_s``) the engine runs decode rows only, or waits: the first
  request's prefill finishes before the sixteenth's starts, instead of all of them finishing
  together. Decode rows still run every step, so a long prompt delays running sessions by
  at most one call a step.

Sessions join and leave between steps: a session's next token joins the step after its
last one returned; a generation that ends or a client that disconnects simply sends no
more rows (its turn is rolled back by its own thread, as without the engine); a stream paused
for a slow reader says so (``rows_paused``), so no step waits for its row.

Exactness: a call runs exactly as it would alone (prefill chunks are the segment's own
recorded chunks), and a batched decode row is the bytes its own step computes
(``fak_decode_batch``), so every bit-exact claim holds under batching
(``tests/kernel/model/test_scheduler.py``). Formats whose decode products depend on the other rows of
a call (float32/float16/bfloat16/int8 GEMMs) are not batched: their steps run one call
each, still on the engine's thread (``Llama.batches_decode``).

``GenerationSlots`` bounds the work in flight: per-tenant and total limits on generating
requests, a bounded fair queue beyond them, and ``Overloaded`` (HTTP 429 with
``Retry-After``) beyond the queue.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

import torch

from fak.errors import FakError
from fak.kernel.model.kv_cache import KVCache
from fak.kernel.model.llama import AttentionCapture, Llama

_tenant: contextvars.ContextVar[str] = contextvars.ContextVar("fak_scheduler_tenant", default="")
_rows = threading.local()  # .last: (scheduler, cache id) of the calling thread's last decode row

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
TOKEN_BUCKETS = (1, 8, 32, 64, 128, 256, 512, 1024, 2048)


@contextmanager
def tenant_scope(tenant: str) -> Iterator[None]:
    """Forward calls made inside are the tenant's (for fairness and per-tenant figures)."""
    token = _tenant.set(tenant)
    try:
        yield
    finally:
        with suppress(ValueError):  # a generator finalised in another context: that one keeps its value
            _tenant.reset(token)


def rows_paused() -> None:
    """The calling thread sends no decode row for a while (its stream's reader is slow and the
    stream's buffer full): the engine's next step does not wait for the row of its session's
    last step (a step waits up to ``gather_s`` for the rows of the last one). Its next row, when
    it sends one, joins the step after it arrives, as any row does."""
    last: tuple[Scheduler, int] | None = getattr(_rows, "last", None)
    if last is not None:
        last[0].not_expecting(last[1])


class Overloaded(FakError, code="overloaded", status=429):
    """The server has more work queued than it takes: retry after ``retry_after`` seconds."""

    public = True

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class SchedulerLimits:
    max_batch: int = 32  # decode rows in one step
    prefill_wait_s: float = 0.05  # how long the oldest request's next call is waited for before the next request's
    gather_s: float = 0.004  # how long a step waits for the rows of the previous step to come back (at least)
    gather_share: float = 0.1  # ... or this share of the last step's time, if longer (at most 10 x gather_s)


class _Job:
    """One forward call waiting for the engine."""

    __slots__ = ("all_logits", "cache", "capture", "done", "error", "positions", "result", "tenant", "tokens")

    def __init__(self, tokens: torch.Tensor | list[int], cache: KVCache, positions: torch.Tensor | None,
                 all_logits: bool, capture: AttentionCapture | None, tenant: str) -> None:
        self.tokens, self.cache, self.positions = tokens, cache, positions
        self.all_logits, self.capture, self.tenant = all_logits, capture, tenant
        self.done = threading.Event()
        self.result: torch.Tensor | None = None
        self.error: BaseException | None = None

    @property
    def size(self) -> int:
        return len(self.tokens)


@dataclass
class _Histogram:
    """Cumulative bucket counts (Prometheus style) and a sum, per tenant."""

    buckets: tuple[int, ...]
    counts: dict[str, list[int]] = field(default_factory=dict)
    sums: dict[str, float] = field(default_factory=dict)

    def observe(self, tenant: str, value: float) -> None:
        counts = self.counts.setdefault(tenant, [0] * (len(self.buckets) + 1))
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                counts[i] += 1
        counts[-1] += 1  # +Inf
        self.sums[tenant] = self.sums.get(tenant, 0.0) + value


@dataclass(frozen=True)
class TenantFigures:
    """One tenant's view of the engine: nothing about other tenants' work."""

    waiting_calls: int  # forward calls of this tenant waiting for a step
    queued_requests: int  # generating requests of this tenant waiting for a generation slot
    active_requests: int
    rows: tuple[tuple[float, int], ...]  # histogram of this tenant's decode rows per step: (bound, cumulative)
    rows_sum: float
    tokens: tuple[tuple[float, int], ...]  # histogram of this tenant's tokens per step (decode + other calls)
    tokens_sum: float
    rejected: int  # requests answered 429

    @classmethod
    def idle(cls, queued: int, active: int, rejected: int) -> TenantFigures:
        """The figures of a kernel that runs no engine (batching off): the generation slots only."""
        return cls(0, queued, active, ((float("inf"), 0),), 0.0, ((float("inf"), 0),), 0.0, rejected)


class Scheduler:
    """Runs a model's forward calls on one engine thread (``start``), batching decode steps."""

    def __init__(self, model: Llama, limits: SchedulerLimits | None = None) -> None:
        self.model = model
        self.limits = limits or SchedulerLimits()
        self._cond = threading.Condition()
        self._decode: deque[_Job] = deque()
        self._calls: deque[_Job] = deque()
        self._expected: set[int] = set()  # caches run in the last step, expected back (next row or call)
        self._order = _PrefillOrder(self.limits.prefill_wait_s)
        self._turn = 0  # rotates the tenant served first
        self._closed = False
        self._thread: threading.Thread | None = None
        self._ident: int | None = None
        self._rows = _Histogram(BATCH_BUCKETS)
        self._tokens = _Histogram(TOKEN_BUCKETS)
        self._last_step_s = 0.0
        self.steps = 0
        self.batched_rows = 0  # decode rows run in steps of two or more

    # --- life cycle -------------------------------------------------------------
    def start(self) -> Scheduler:
        if self._thread is not None:
            raise RuntimeError("the scheduler is already running")
        self._thread = threading.Thread(target=self._loop, name="fak-engine", daemon=True)
        self._thread.start()
        self.model.router = self
        return self

    def close(self) -> None:
        """Stop taking calls (later ones run on their callers' threads), finish those queued."""
        if self.model.router is self:
            self.model.router = None
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None and self._thread.ident != threading.get_ident():
            self._thread.join()

    # --- the model's router ---------------------------------------------------------
    def routes_here(self) -> bool:
        return not self._closed and threading.get_ident() != self._ident

    def run(self, model: Llama, tokens: torch.Tensor | list[int], cache: KVCache, positions: torch.Tensor | None,
            all_logits: bool, capture: AttentionCapture | None) -> torch.Tensor:
        if model is not self.model:
            raise ValueError("this scheduler runs another model's calls")
        job = _Job(tokens, cache, positions, all_logits, capture, _tenant.get())
        with self._cond:
            if self._closed:
                return model.forward(tokens, cache, positions, all_logits, capture)
            batch = model.batchable(tokens, positions, all_logits, capture)
            if batch:
                self._order.generating(id(cache))
                self._decode.append(job)
                _rows.last = (self, id(cache))
            else:
                self._order.arrived(id(cache))
                self._calls.append(job)
            self._cond.notify_all()
        job.done.wait()
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

    def not_expecting(self, cache: int) -> None:
        """``rows_paused`` for one session (by its cache's id)."""
        with self._cond:
            self._expected.discard(cache)
            self._cond.notify_all()

    # --- figures -----------------------------------------------------------------
    def figures(self, tenant: str, slots: GenerationSlots) -> TenantFigures:
        with self._cond:
            waiting = sum(1 for j in (*self._decode, *self._calls) if j.tenant == tenant)
            rows, toks = self._rows, self._tokens
            row_counts = rows.counts.get(tenant, [0] * (len(rows.buckets) + 1))
            tok_counts = toks.counts.get(tenant, [0] * (len(toks.buckets) + 1))
            return TenantFigures(
                waiting_calls=waiting,
                queued_requests=slots.queued(tenant),
                active_requests=slots.active(tenant),
                rows=(*zip(map(float, rows.buckets), row_counts, strict=False), (float("inf"), row_counts[-1])),
                rows_sum=rows.sums.get(tenant, 0.0),
                tokens=(*zip(map(float, toks.buckets), tok_counts, strict=False), (float("inf"), tok_counts[-1])),
                tokens_sum=toks.sums.get(tenant, 0.0),
                rejected=slots.rejected(tenant),
            )

    # --- the engine loop -------------------------------------------------------------
    def _loop(self) -> None:
        self._ident = threading.get_ident()
        while True:
            with self._cond:
                decode, calls = self._next_step()
                if decode is None:
                    return
            try:
                began = time.monotonic()
                if decode:
                    self._run_decode(decode)
                for job in calls:
                    self._run_call(job)
                self._last_step_s = time.monotonic() - began
                self._account(decode, calls)
            except BaseException as exc:  # noqa: BLE001 - a waiter must never wait forever
                for job in (*decode, *calls):
                    if not job.done.is_set():
                        job.error = exc
                        job.done.set()

    def _next_step(self) -> tuple[list[_Job] | None, list[_Job]]:
        """Wait for work (holding the condition) and take one step's: (None, []) once closed and drained."""
        while True:
            while not self._decode and not self._calls:
                if self._closed:
                    return None, []
                self._expected.clear()
                self._cond.wait()
            # the rows of the last step come back within a few ms (their threads sample the next
            # token): wait for them, so one step serves them all instead of several small ones
            deadline = time.monotonic() + self._gather()
            while self._expected and not self._closed:
                back = {id(j.cache) for j in (*self._decode, *self._calls)}
                if self._expected <= back:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            self._turn += 1
            decode = _fair(self._decode, self.limits.max_batch, self._turn)
            calls = self._order.take(self._calls, time.monotonic())
            if decode or calls or self._closed:
                self._expected = {id(j.cache) for j in (*decode, *calls)}
                return decode, calls
            # only younger requests' calls wait, while the oldest prepares its next: wait for it
            self._cond.wait(self._order.patience(time.monotonic()))

    def _gather(self) -> float:
        """How long a step waits for the last step's rows: their threads take a few ms to come
        back (sampling, the door's work for the token), longer under load; a row that misses a
        step waits a whole step, so the wait grows with the step (a share of it, bounded)."""
        lim = self.limits
        return min(max(lim.gather_s, lim.gather_share * self._last_step_s), 10 * lim.gather_s)

    def _run_decode(self, jobs: list[_Job]) -> None:
        if len(jobs) == 1:
            self._run_call(jobs[0])
            return
        try:
            results = self.model.forward_batch([(int(torch.as_tensor(j.tokens).reshape(-1)[0]), j.cache) for j in jobs])
        except Exception:  # noqa: BLE001 - a bad row fails alone: run each as its own call
            for job in jobs:
                self._run_call(job)
            return
        self.batched_rows += len(jobs)
        for job, logits in zip(jobs, results, strict=True):
            job.result = logits
            job.done.set()

    def _run_call(self, job: _Job) -> None:
        try:
            job.result = self.model.forward(job.tokens, job.cache, job.positions, job.all_logits, job.capture)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, which raises it
            job.error = exc
        job.done.set()

    def _account(self, decode: list[_Job], calls: list[_Job]) -> None:
        rows: dict[str, int] = {}
        tokens: dict[str, int] = {}
        for job in decode:
            rows[job.tenant] = rows.get(job.tenant, 0) + 1
            tokens[job.tenant] = tokens.get(job.tenant, 0) + 1
        for job in calls:
            tokens[job.tenant] = tokens.get(job.tenant, 0) + job.size
        with self._cond:
            self.steps += 1
            for job in calls:
                self._order.ran(id(job.cache), time.monotonic())
            for tenant, n in rows.items():
                self._rows.observe(tenant, n)
            for tenant, n in tokens.items():
                self._tokens.observe(tenant, n)


class _PrefillOrder:
    """The order of other calls: by the time each session's run of calls began.

    A request's prefill is a run of calls from one thread, one at a time, on its session's
    cache: the session keeps the time its run began while each call follows the last within
    ``wait_s``, until it generates (its next step is a decode row). Each step
    takes one call, the oldest run's; while that run's thread prepares its next call (within
    ``wait_s`` of its last one) no other run's call is taken, so the oldest request's prefill
    finishes first. A run whose thread takes longer yields its turn until it calls again."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self._since: dict[int, float] = {}  # cache id -> when its run of calls began
        self._seen: dict[int, float] = {}  # cache id -> when its last call arrived or ran

    def arrived(self, cache: int) -> None:
        """A call of the session's arrived: it continues the session's run if its last call ran
        within ``wait_s``, else it begins a new run, at the back. So a session that keeps
        appending (one request after another) is not one endless run ahead of everyone."""
        now = time.monotonic()
        if cache not in self._since or now - self._seen[cache] > self.wait_s:
            self._since[cache] = now
        self._seen[cache] = now

    def ran(self, cache: int, now: float) -> None:
        if cache in self._since:
            self._seen[cache] = now

    def generating(self, cache: int) -> None:
        """The session's prefill is over: its next calls (a new turn) start a new run."""
        self._since.pop(cache, None)
        self._seen.pop(cache, None)

    def _waited_for(self, queue: deque[_Job], now: float) -> int | None:
        """The oldest run with a call queued, or between two calls within ``wait_s``."""
        queued = {id(j.cache) for j in queue}
        for cache in [c for c, t in self._seen.items() if now - t > self.wait_s and c not in queued]:
            self.generating(cache)  # between calls too long: its next call begins a new run
        live = [c for c in self._since if c in queued or now - self._seen[c] <= self.wait_s]
        return min(live, key=lambda c: self._since[c], default=None)

    def take(self, queue: deque[_Job], now: float) -> list[_Job]:
        """The call of one step, off ``queue``: the oldest run's, or none while it is between calls."""
        oldest = self._waited_for(queue, now)
        for job in queue:
            if id(job.cache) == oldest:
                queue.remove(job)
                return [job]
        return []

    def patience(self, now: float) -> float:
        """How long until the run waited for now yields its turn (at least a millisecond)."""
        waits = [self._seen[c] + self.wait_s - now for c in self._since if now - self._seen[c] <= self.wait_s]
        return max(0.001, min(waits, default=0.001))


def _fair(queue: deque[_Job], limit: int, turn: int) -> list[_Job]:
    """Up to ``limit`` jobs off ``queue``: all if they fit, else one per tenant in turn
    (starting at a rotating tenant), oldest first within a tenant. Taken jobs leave the queue."""
    if len(queue) <= limit:
        everything = list(queue)
        queue.clear()
        return everything
    by_tenant: dict[str, deque[_Job]] = {}
    for job in queue:
        by_tenant.setdefault(job.tenant, deque()).append(job)
    order = sorted(by_tenant)
    start = turn % len(order)
    order = order[start:] + order[:start]
    taken: list[_Job] = []
    while len(taken) < limit:
        for tenant in order:
            if by_tenant[tenant] and len(taken) < limit:
                taken.append(by_tenant[tenant].popleft())
    chosen = set(map(id, taken))
    kept = [j for j in queue if id(j) not in chosen]
    queue.clear()
    queue.extend(kept)
    return taken


class GenerationSlots:
    """How many generating requests run at once: at most ``per_tenant`` of one tenant and
    ``total`` in all; beyond that a request waits in a queue of at most ``queue`` requests,
    of which at most ``per_tenant`` are one tenant's (at most ``wait_s`` seconds), served fairly (the tenant with the fewest running first,
    then the oldest), and beyond the queue it is refused with ``Overloaded``."""

    def __init__(self, total: int = 32, per_tenant: int = 16, queue: int = 64, wait_s: float = 30.0) -> None:
        if min(total, per_tenant) < 1 or queue < 0 or wait_s < 0:
            raise ValueError("generation slot limits must be positive")
        self.total, self.per_tenant, self.queue_limit, self.wait_s = total, per_tenant, queue, wait_s
        self._cond = threading.Condition()
        self._active: dict[str, int] = {}
        self._waiting: deque[tuple[str, object]] = deque()
        self._rejected: dict[str, int] = {}

    def active(self, tenant: str) -> int:
        with self._cond:
            return self._active.get(tenant, 0)

    def running(self) -> int:
        """Generations of every tenant running now (a replica's load, for the router only)."""
        with self._cond:
            return sum(self._active.values())

    def queued(self, tenant: str) -> int:
        with self._cond:
            return sum(1 for t, _ in self._waiting if t == tenant)

    def rejected(self, tenant: str) -> int:
        with self._cond:
            return self._rejected.get(tenant, 0)

    @contextmanager
    def slot(self, tenant: str) -> Iterator[None]:
        """Hold one of the tenant's places while generating (waits in the queue if none is free)."""
        self._enter(tenant)
        try:
            yield
        finally:
            with self._cond:
                self._active[tenant] -= 1
                if not self._active[tenant]:
                    del self._active[tenant]
                self._cond.notify_all()

    def _free_for(self, tenant: str) -> bool:
        return self._active.get(tenant, 0) < self.per_tenant and sum(self._active.values()) < self.total

    def _next_up(self) -> object | None:
        """The waiter served next: among tenants with room, the fewest running, then the oldest."""
        best: tuple[int, int] | None = None
        chosen: object | None = None
        for i, (tenant, ticket) in enumerate(self._waiting):
            if not self._free_for(tenant):
                continue
            rank = (self._active.get(tenant, 0), i)
            if best is None or rank < best:
                best, chosen = rank, ticket
        return chosen

    def _enter(self, tenant: str) -> None:
        with self._cond:
            if not self._waiting and self._free_for(tenant):
                self._active[tenant] = self._active.get(tenant, 0) + 1
                return
            mine = sum(1 for t, _ in self._waiting if t == tenant)
            if len(self._waiting) >= self.queue_limit or mine >= self.per_tenant:
                # a tenant holds at most per_tenant places of the queue: it cannot fill it for others
                self._rejected[tenant] = self._rejected.get(tenant, 0) + 1
                raise Overloaded(f"the server is busy ({mine} of your requests and {len(self._waiting)} in all "
                                 "already wait): retry shortly", retry_after=1)
            ticket = object()
            self._waiting.append((tenant, ticket))
            deadline = time.monotonic() + self.wait_s
            try:
                while self._next_up() is not ticket:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._rejected[tenant] = self._rejected.get(tenant, 0) + 1
                        raise Overloaded(f"no room to generate within {self.wait_s:g} s: retry shortly",
                                         retry_after=max(1, round(self.wait_s / 10)))
                    self._cond.wait(left)
                self._active[tenant] = self._active.get(tenant, 0) + 1
            finally:
                self._waiting.remove((tenant, ticket))
                self._cond.notify_all()
