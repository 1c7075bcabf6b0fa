"""This kernel's place in a replicated deployment (docs/scale-out.md).

A replica is one Kernel (its model, sessions, KV, prefix and PIC caches) among several that
share one governance plane on PostgreSQL. Three things make that safe:

- **Who runs.** Each replica holds a PostgreSQL advisory lock named after it for its whole
  life, on a connection of its own. The server drops the lock when the process dies
  (SIGKILL included), so "replica R is down" is "R's lock is free": no clock, no lease to
  tune, valid across machines. A restarted R waits for its lock before it serves.
- **Where a session lives.** ``fak_sessions.replica`` names it. A replica asked for a
  session placed on a peer that runs answers ``SessionElsewhere`` (421, naming the peer: the
  router sends the request there); a session of a peer that is down is taken over (its
  placement moved here, under the peer's lock) and rebuilt from its ledger, checked against
  the recorded fingerprint, as after any restart.
- **Withdrawals reach everyone.** A forget, quarantine, expiry or tenant erase writes one
  task per replica (``fak_withdrawal_tasks``); every replica tails its tasks and applies
  them; the one that started a forget waits for every task, standing in (under the peer's
  lock) for a peer that is down, and signs one receipt naming every replica. Why a table
  and not calls from a controller: a task survives the replica it is for. A replica killed
  half way finds its task on the way back and applies it before it serves, and nothing
  outside the database has to remember what is owed to whom.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy.engine import Engine

from fak.db import AdvisoryLock
from fak.errors import Conflict, FakError, Unavailable
from fak.state.replicas import DONE, DROPPED, PENDING, ReplicaStore
from fak.state.schema import WithdrawalTaskRow

log = logging.getLogger("fak.replicas")

TAIL_S = 0.05  # how often a replica looks for its tasks when it gets no notifications
LISTEN_FALLBACK_S = 1.0  # how often it looks anyway while notifications arrive
JOIN_WAIT_S = 60.0  # a restarted replica waits this long for its lock (a peer may stand in for it)
SETTLE_WAIT_S = 300.0  # a withdrawal waits this long for a replica that runs but has not applied it


class SessionElsewhere(FakError, code="session_elsewhere", status=421):
    """The session lives on another replica that runs (RFC 9110's Misdirected Request):
    ``replica`` names it, and the router sends the request there."""

    def __init__(self, session_id: str, replica: str) -> None:
        super().__init__(f"session {session_id!r} lives on replica {replica!r}")
        self.replica = replica

    def problem_members(self) -> dict[str, object]:
        return {"replica": self.replica}


class WithdrawalPending(Unavailable, code="withdrawal_pending", status=503):
    """A withdrawal is written and partly applied; a replica has not applied its part yet.
    It stays pending (no receipt is signed without every replica); asking again resumes it."""


class ReportForged(FakError, code="withdrawal_report_forged", status=500):
    """A replica's withdrawal report fails its MAC: no receipt is signed from it."""


# (task, the replica whose part it is: this one, or a peer that is down) -> None; the
# applier moves the task's state on (pending -> done, or pending -> dropped -> done)
Applier = Callable[[WithdrawalTaskRow, str], None]


def lock_name(scope: str, replica: str) -> str:
    """``scope``: the deployment's (derived from its master secret), so deployments sharing one
    PostgreSQL server never take each other's locks."""
    return f"fak-replica:{scope}:{replica}"


class Replication:
    """A replica's membership, its withdrawal tasks and its stand-ins for peers that are down."""

    def __init__(self, engine: Engine, name: str, scope: str, mac_key: bytes) -> None:
        self.name, self.scope = name, scope
        self.store = ReplicaStore(engine, mac_key, channel=f"fak_withdrawals_{scope}")
        self._engine = engine
        self._own = AdvisoryLock(engine, lock_name(scope, name))
        self._standing: set[str] = set()  # peers this process stands in for now (their lock held here)
        self._mutex = threading.Lock()
        self._apply_lock = threading.RLock()  # one task applied at a time in this process
        self._appliers: dict[str, Applier] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._woke = threading.Condition()  # notified whenever a task of the deployment changed
        # (request id, replica) -> the survivors' copies a forget's drop took here, for its replay
        self.copies: dict[tuple[str, str], dict[str, Any]] = {}

    # --- membership -------------------------------------------------------------
    def join(self, wait_s: float = JOIN_WAIT_S) -> None:
        """Take this replica's lock (waiting while a previous process of it exits, or a peer
        stands in for it) and record the start. Refuses a second process of one replica."""
        if not self._own.acquire(wait_s):
            raise Conflict(f"replica {self.name!r} runs already (its lock is held): give each replica its own name")
        self.store.join(self.name, os.getpid(), socket.gethostname())

    def names(self) -> list[str]:
        """Every replica that ever joined (a withdrawal must reach each one)."""
        return self.store.names()

    def alive(self, name: str) -> bool:
        """Whether ``name`` runs now (its lock is held by it). This replica runs; a peer this
        process stands in for does not."""
        if name == self.name:
            return True
        with self._mutex:
            if name in self._standing:
                return False
        probe = AdvisoryLock(self._engine, lock_name(self.scope, name))
        if probe.try_acquire():
            probe.release()
            return False
        return True

    @contextlib.contextmanager
    def stand_in(self, name: str) -> Iterator[bool]:
        """Hold ``name``'s lock while acting for it (it cannot start meanwhile); yields False if
        it runs (or another replica stands in for it already)."""
        lock = AdvisoryLock(self._engine, lock_name(self.scope, name))
        if name == self.name or not lock.try_acquire():
            yield False
            return
        with self._mutex:
            self._standing.add(name)
        try:
            yield True
        finally:
            with self._mutex:
                self._standing.discard(name)
            lock.release()

    def may_take(self, owner: str) -> bool:
        """Whether a session placed on ``owner`` may move here now: this process stands in for
        ``owner`` (a withdrawal acting for it), or ``owner`` is down (checked under its lock by
        ``take``)."""
        with self._mutex:
            return owner in self._standing

    def take(self, owner: str, move: Callable[[], bool]) -> bool:
        """Run ``move`` (a placement update from ``owner`` to here) while ``owner`` cannot
        start: under its lock, or inside a stand-in already holding it. The owner's pending
        tasks are applied first, on its behalf: a session never carries a withdrawn ref to
        its new home. Whether it moved."""
        if self.may_take(owner):
            return move()
        with self.stand_in(owner) as got:
            if not got:
                return False
            for task in self.store.pending(owner):
                self.apply(task, owner)
            return move()

    @contextlib.contextmanager
    def cluster_lock(self, what: str, wait_s: float = 60.0) -> Iterator[None]:
        """One holder across the deployment (the forget lock, the expiry sweep)."""
        lock = AdvisoryLock(self._engine, f"fak-cluster:{self.scope}:{what}")
        if not lock.acquire(wait_s):
            raise Unavailable(f"another replica holds the deployment's {what} lock; retry")
        try:
            yield
        finally:
            lock.release()

    # --- withdrawal tasks -------------------------------------------------------
    def on(self, kind: str, applier: Applier) -> None:
        """Apply tasks of ``kind`` with ``applier`` (the façade registers one per withdrawal)."""
        self._appliers[kind] = applier

    def publish(self, request_id: str, kind: str, tenant: str, refs: list[str]) -> list[str]:
        """One task per replica that ever joined; the replicas it was written for."""
        names = self.names()
        self.store.add_tasks(request_id, kind, tenant, refs, names)
        return names

    def apply(self, task: WithdrawalTaskRow, acting_for: str) -> None:
        """Move one task on (re-read under the apply lock: the tailer and a waiting forget may
        both reach it)."""
        with self._apply_lock:
            fresh = self.store.task(task.request_id, task.replica)
            if fresh is None or fresh.state == DONE:
                return
            if fresh.state == DROPPED and fresh.applied_by != self.name:
                return  # its replay belongs to whoever dropped it
            applier = self._appliers.get(fresh.kind)
            if applier is None:
                raise RuntimeError(f"no applier for withdrawal tasks of kind {fresh.kind!r}")
            applier(fresh, acting_for)

    def run_pending(self) -> int:
        """Apply this replica's pending tasks (drops first, then replays it owes); how many moved."""
        moved = 0
        for task in self.store.pending(self.name):
            self.apply(task, self.name)
            moved += 1
        for task in self.store.owed_replays(self.name):
            self.apply(task, task.replica)
            moved += 1
        return moved

    def settle(self, request_id: str, until: str, wait_s: float = SETTLE_WAIT_S) -> list[WithdrawalTaskRow]:
        """Wait until every replica's task of ``request_id`` has reached ``until`` (``dropped``
        or ``done``), applying this replica's own and standing in for peers that are down;
        ``WithdrawalPending`` past ``wait_s`` (the tasks stay: asking again resumes)."""
        order = (PENDING, DROPPED, DONE)
        deadline = time.monotonic() + wait_s
        while True:
            tasks = self.store.tasks(request_id)
            forged = [t.replica for t in tasks if not self.store.verified(t)]
            if forged:  # written by someone without the deployment's key: nothing is signed from it
                raise ReportForged(f"withdrawal {request_id}: the report of replica(s) {', '.join(forged)} does not "
                                   "carry this deployment's MAC: the database was written by someone without the key")
            behind = [t for t in tasks if order.index(t.state) < order.index(until)]
            if not behind:
                return tasks
            for t in behind:
                if t.replica == self.name or (t.state == DROPPED and t.applied_by == self.name):
                    self.apply(t, t.replica)
                elif t.state == PENDING and not self.alive(t.replica):
                    with self.stand_in(t.replica) as got:
                        if got:
                            self.apply(t, t.replica)
            if time.monotonic() >= deadline:
                late = ", ".join(sorted({t.replica for t in behind}))
                raise WithdrawalPending(f"withdrawal {request_id}: replica(s) {late} have not applied it yet; "
                                        "it stays pending: ask again to resume it")
            with self._woke:  # a peer's report wakes this at once; the timeout is the fallback
                self._woke.wait(TAIL_S)

    def start(self) -> None:
        """Tail this replica's tasks in a thread (after ``run_pending`` has cleared the backlog)."""
        self._thread = threading.Thread(target=self._tail, name=f"fak-replica-{self.name}", daemon=True)
        self._thread.start()

    def _tail(self) -> None:
        listener: Any = None
        while not self._stop.is_set():
            if listener is None:
                listener = self._listen()
            if listener is None:  # no notifications: poll
                self._stop.wait(TAIL_S)
            else:
                try:  # a task's change is announced on commit; the timeout is the fallback
                    for _ in listener.notifies(timeout=LISTEN_FALLBACK_S, stop_after=1):
                        pass
                except Exception:  # the connection broke: listen again (or poll meanwhile)
                    log.warning("replica %s: lost the withdrawal notifications; listening again", self.name)
                    with contextlib.suppress(Exception):
                        listener.close()
                    listener = None
            with self._woke:
                self._woke.notify_all()
            try:
                self.run_pending()
            except Exception:  # the task stays pending: the next round (or the next start) retries it
                log.exception("replica %s: applying a withdrawal task failed; retrying", self.name)
                self._stop.wait(1.0)
        if listener is not None:
            with contextlib.suppress(Exception):
                listener.close()

    def _listen(self) -> Any:
        """A connection of its own listening on the deployment's channel (psycopg), or None."""
        try:
            import psycopg

            url = self._engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
            conn = psycopg.connect(url, autocommit=True)
            conn.execute(f'LISTEN "{self.store.channel}"')
            return conn
        except Exception as exc:  # another driver, or the server refuses: polling still works
            log.warning("replica %s: no withdrawal notifications (%s); polling every %.2f s", self.name, exc, TAIL_S)
            return None

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._own.release()
