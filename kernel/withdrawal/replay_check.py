"""The independent replay that completes a forget's receipt, run after the forget returns.

Why after: a forget's guarantee has two parts. The erasure (every derived unit dropped, the
data key shredded, ``ForgetCompleted`` with each session's KV fingerprint after the drop) is
what the caller waits for. The proof that each session's state after the drop equals that of
a session that never saw the ref (its survivors replayed in a fresh session, fingerprints
compared) is a full prefill of every survivor, about twice the RECOMPUTE evictions the forget
performs; it runs on one worker thread, beside the next requests, and ends in a second signed
event, ``ReplayVerified``, that the receipt carries once logged (``fak.audit.receipt``).
A replay that differs logs ``ReplayVerified(verified=false)`` and an ``AuditAlarm``
(``forget_replay_mismatch``), and the receipt stops verifying.

The replay works on a copy of the survivors taken under the session's lock at the drop, so
later turns do not change what it proves. The forget's row stays ``replaying`` (its sessions
keep the survivors' segment ids) until ``ReplayVerified`` is logged: after a crash,
``Kernel.open`` runs it again from the durable ledger (``KernelSession.replay_of``; a
survivor evicted in between leaves that session's replay fingerprint empty: not verified).
"""

from __future__ import annotations

import queue
import sys
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING

from fak.audit import AuditAlarm, ReplayVerified
from fak.audit.events import SessionReplay
from fak.audit.receipt import find_replay
from fak.errors import NotFound
from fak.faults import fault_point
from fak.kernel.services import ReplayJob, Services, SessionJob
from fak.kernel.withdrawal.records import STORED_SESSIONS
from fak.state.replicas import DONE as TASK_DONE

if TYPE_CHECKING:
    from fak.state.schema import ForgetRow

__all__ = ["DONE", "ReplayChecker", "ReplayJob", "SessionJob", "jobs_from_row", "resume", "run"]

DONE = ("replaying", "completed")  # forget row states once the erasure is done (the receipt exists)


def jobs_from_row(row: ForgetRow, fresh: dict[str, SessionJob]) -> list[SessionJob]:
    """Every session of the row: the in-memory copy where this run took one, else by ids."""
    return [fresh.get(x.session_id) or x.job() for x in STORED_SESSIONS.load(row.sessions)]


class ReplayChecker:
    """One worker thread running replay checks in order; ``wait`` for one or all of them.
    ``bind`` it to the services it replays with (they hold it) before the first job."""

    def __init__(self) -> None:
        self._svc: Services | None = None
        self._q: queue.SimpleQueue[ReplayJob | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending: dict[str, ReplayJob] = {}
        self._thread: threading.Thread | None = None

    def bind(self, svc: Services) -> None:
        self._svc = svc

    def submit(self, job: ReplayJob) -> Future[int]:
        with self._lock:
            if job.request_id in self._pending:
                return self._pending[job.request_id].done
            self._pending[job.request_id] = job
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fak-forget-replay", daemon=True)
                self._thread.start()
        self._q.put(job)
        return job.done

    def pending(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._pending

    def wait(self, request_id: str | None = None, timeout: float | None = None) -> bool:
        """Wait for the replay of ``request_id`` (default: every one queued now); True if done.
        A replay that failed (its row stays ``replaying``: the next open runs it again) counts as done."""
        with self._lock:
            jobs = [j for r, j in self._pending.items() if request_id is None or r == request_id]
        for j in jobs:
            try:
                j.done.exception(timeout=timeout)
            except TimeoutError:
                return False
        return True

    def close(self, timeout: float = 600.0) -> None:
        """Finish the queued replays (bounded), then stop the worker."""
        self.wait(timeout=timeout)
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._q.put(None)
            thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            try:
                if self._svc is None:
                    raise RuntimeError("ReplayChecker used before bind()")
                job.done.set_result(run(self._svc, job))
            except BaseException as exc:  # the row stays replaying; the next open runs it again
                print(f"fak: the replay of forget {job.request_id} failed: {exc}", file=sys.stderr, flush=True)
                job.done.set_exception(exc)
            finally:
                with self._lock:
                    self._pending.pop(job.request_id, None)


def run(svc: Services, job: ReplayJob) -> int:
    """Replay each session's survivors, log ``ReplayVerified`` (and an alarm on a mismatch),
    mark the forget completed; the index of ``ReplayVerified``."""
    fault_point("forget.before_replay")
    rep = svc.replication
    if rep is None:
        found = [SessionReplay(session_id=sj.session_id, fingerprint_replay=replay_session(svc, job.tenant, sj))
                 for sj in job.sessions]
    else:  # each replica replays the sessions it dropped from (docs/scale-out.md): collect them
        tasks = rep.settle(job.request_id, until=TASK_DONE)
        found = [SessionReplay(session_id=x.session_id, fingerprint_replay=x.fingerprint_replay)
                 for t in tasks for x in STORED_SESSIONS.load(t.sessions)]
        with rep.cluster_lock("forget"):  # one replay event, whoever else resumed the same forget
            return _log_replay(svc, job, found, resumed=True)
    return _log_replay(svc, job, found, job.resumed)


def replay_session(svc: Services, tenant: str, sj: SessionJob) -> str | None:
    """The keyed fingerprint of an independent replay of one session's survivors: from the copy
    taken at the drop, else from the durable ledger (None: a survivor is gone, or the session)."""
    if sj.segments is not None and sj.mech is not None:
        raw: str | None = sj.mech.replay_fingerprint(sj.segments)
    else:
        try:
            raw = svc.sessions.session(tenant, sj.session_id).replay_of(sj.survivors)
        except NotFound:  # deleted since: nothing left to replay
            raw = None
    return None if raw is None else svc.keys.audit_fingerprint(tenant, raw)


def _log_replay(svc: Services, job: ReplayJob, found: list[SessionReplay], resumed: bool) -> int:
    """Log ``ReplayVerified`` (once: a resumed job finds an earlier one) and mark the forget completed."""
    after = {sj.session_id: sj.fingerprint_after for sj in job.sessions}
    differ = [x.session_id for x in found if x.fingerprint_replay is not None
              and x.fingerprint_replay != after[x.session_id]]
    verified = not differ and all(x.fingerprint_replay is not None for x in found)
    index = find_replay(svc.audit, job.tenant, job.request_id, job.completed_index) if resumed else None
    if index is None:
        index = svc.audit.append(ReplayVerified(tenant=job.tenant, request_id=job.request_id, ref=job.ref,
                                              completed_index=job.completed_index, sessions=found,
                                              verified=verified))
        if differ:
            print(f"fak: ALARM (forget_replay_mismatch): forget {job.request_id}: sessions {differ} differ "
                  "from an independent replay of their survivors", file=sys.stderr, flush=True)
            svc.audit.append(AuditAlarm(kind="forget_replay_mismatch", found_size=svc.audit.size(),
                                      request_id=job.request_id))
    elif not verified:
        print(f"fak: the replay of forget {job.request_id} did not verify", file=sys.stderr, flush=True)
    fault_point("forget.after_replay_verified")
    row = svc.state.forget_by_request(job.tenant, job.request_id)
    sessions = [x.settled() for x in STORED_SESSIONS.load(row.sessions)] if row is not None else []
    svc.state.update_forget(job.request_id, state="completed", sessions=STORED_SESSIONS.dump(sessions))
    return index


def resume(svc: Services) -> None:
    """Queue the replays a crash (or a close that could not wait) left pending."""
    for row in svc.state.forgets_replaying():
        if row.completed_index is None:  # pragma: no cover - a replaying row has its completion
            continue
        svc.replays.submit(ReplayJob(row.tenant, row.request_id, row.ref, row.completed_index,
                                   jobs_from_row(row, {}), resumed=True))
