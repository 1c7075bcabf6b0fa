"""Late (asynchronous) detectors: slow but better detectors that run after admission.

The gate decides synchronously and cheaply; a late detector (a local classifier, an
LLM judge) judges the admitted text on a worker thread while the session carries on,
and when it fires the Kernel quarantines the ref, which evicts it exactly from every
live session of the tenant (docs/design.md, Policy). So a detector that takes a second
costs the admission path nothing: ``LateRunner.submit`` only enqueues, and a full
queue refuses the job (the caller audits that) instead of making the caller wait.

Nothing here imports torch: the classifier (``fak.policy.classifier``) is imported only
when a policy configures one.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatchcase

from fak.policy.egress import CLOSED, JudgeEgress
from fak.policy.late_detector import LateDetector, LateDetectorFailed, LateDetectorInvalid, LateFinding
from fak.policy.schema import LateDetectorRule

log = logging.getLogger("fak.policy.late")


@dataclass(frozen=True)
class LateJob:
    """One admitted tool result to judge late: where it lives and what was admitted."""

    tenant: str
    session: str
    ref: str
    tool: str
    trust: str
    text: str
    admitted_at: float


def applies(rule: LateDetectorRule, tool: str, trust: str, tenant: str) -> bool:
    """The rule covers this tool (exact name or glob) at this trust level, and may see this
    tenant's results (a judge only those of its ``tenants``)."""
    return trust in rule.trust and rule.sees(tenant) and any(fnmatchcase(tool, pattern) for pattern in rule.tools)


def truncate_utf8(text: str, max_bytes: int) -> str:
    """At most ``max_bytes`` of UTF-8, cut on a character boundary (a cut never makes a
    replacement character a detector could trip on)."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes].decode("utf-8", "ignore")


def build_detectors(rules: list[LateDetectorRule], egress: JudgeEgress | None = None) -> list[LateDetector]:
    """One detector per rule, in policy order. The classifier module (torch, transformers)
    and the judge's HTTP client are imported only when a rule needs them; building checks
    what can be checked now (model folder, key variable, and a judge's URL and variable
    against ``egress``, the deployment's allow-lists: None allows no judge) so a bad policy
    fails on load."""
    built: list[LateDetector] = []
    try:
        for rule in rules:
            if rule.kind == "classifier":
                from fak.policy.classifier import ClassifierDetector

                built.append(ClassifierDetector(rule))
            elif rule.kind == "judge":
                from fak.policy.judge import JudgeDetector

                built.append(JudgeDetector(rule, egress or CLOSED))
            else:  # pragma: no cover - the schema allows only the two kinds
                raise LateDetectorInvalid(f"late detector {rule.id!r}: unknown kind {rule.kind!r}")
    except BaseException:
        close_detectors(built)
        raise
    return built


def close_detectors(detectors: list[LateDetector]) -> None:
    """Release what detectors hold (HTTP connections); a detector without ``close`` holds nothing."""
    for detector in detectors:
        closer = getattr(detector, "close", None)
        if callable(closer):
            try:
                closer()
            except Exception:  # noqa: BLE001 - closing is best effort
                log.exception("closing late detector %s failed", detector.rule.id)


_POLL_S = 0.1  # how soon an idle worker notices close()


class LateRunner:
    """Worker threads that run every applicable late detector on each submitted job.

    ``on_fire(job, finding)`` is called at most once per job (the first detector that
    fires, in policy order); ``on_error(job, detector_id, exc)`` for each detector that
    raised or ran out of time, and for a failing ``on_fire``. Neither ever kills a worker.
    """

    def __init__(
        self,
        on_fire: Callable[[LateJob, LateFinding], None],
        on_error: Callable[[LateJob, str, BaseException], None] | None = None,
        workers: int = 1,
        queue_max: int = 1024,
    ) -> None:
        if workers < 1 or queue_max < 1:
            raise ValueError("a LateRunner needs at least one worker and room for one job")
        self._on_fire = on_fire
        self._on_error = on_error
        self._queue: queue.Queue[LateJob] = queue.Queue(maxsize=queue_max)
        self._detectors: tuple[LateDetector, ...] = ()
        self._running: dict[int, int] = {}  # id(detector) -> jobs running it now
        self._retired: list[LateDetector] = []  # replaced, closed once no job runs them
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0  # submitted and not finished (queued or running)
        self._closed = False
        self._counts = {"submitted": 0, "fired": 0, "errors": 0, "dropped": 0, "skipped": 0, "done": 0}
        self._threads = [
            threading.Thread(target=self._work, name=f"fak-late-{i}", daemon=True) for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    # --- configuration -------------------------------------------------------------
    def set_detectors(self, detectors: list[LateDetector]) -> None:
        """Swap the detector set at once (a policy reload): jobs that start after this run the
        new set; a job already running finishes with the set it started with. The runner owns
        the detectors it is given: replaced ones are closed once no job runs them."""
        with self._lock:
            keep = {id(d) for d in detectors}
            self._retired += [d for d in self._detectors if id(d) not in keep]
            self._detectors = tuple(detectors)
        self._reap()

    def _reap(self) -> None:
        with self._lock:
            idle = [d for d in self._retired if not self._running.get(id(d))]
            self._retired = [d for d in self._retired if self._running.get(id(d))]
        close_detectors(idle)

    @property
    def detectors(self) -> tuple[LateDetector, ...]:
        return self._detectors

    # --- the admission side: never blocks ------------------------------------------
    def submit(self, job: LateJob) -> bool:
        """Enqueue ``job``; False (nothing queued) when no detector applies to its tool and
        trust, when the queue is full or when the runner is closed. Never waits."""
        with self._lock:
            if self._closed or not any(applies(d.rule, job.tool, job.trust, job.tenant) for d in self._detectors):
                self._counts["skipped"] += 1
                return False
            try:
                self._queue.put_nowait(job)
            except queue.Full:
                self._counts["dropped"] += 1
                return False
            self._counts["submitted"] += 1
            self._pending += 1
            return True

    # --- tests and benchmarks --------------------------------------------------------
    def wait_idle(self, timeout: float) -> bool:
        """True once every submitted job has finished (False if ``timeout`` passed first)."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
            return True

    @property
    def stats(self) -> dict[str, int]:
        with self._lock:
            return {**self._counts, "queued": self._queue.qsize(), "pending": self._pending}

    def close(self) -> None:
        """Stop the workers, drop queued jobs (counted as dropped) and close the detectors. A
        detection already running is not waited for; its result is ignored."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while True:
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
                self._counts["dropped"] += 1
                self._pending -= 1
            self._idle.notify_all()
            owned, self._detectors, self._retired = [*self._detectors, *self._retired], (), []
        for thread in self._threads:
            thread.join(timeout=0.5)
        close_detectors(owned)

    # --- the worker side ---------------------------------------------------------------
    def _work(self) -> None:
        while not self._closed:
            try:
                job = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            try:
                self._run(job)
            except BaseException:  # noqa: BLE001 - a worker must outlive anything a job does
                log.exception("late detection of %s failed", job.ref)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._counts["done"] += 1
                    self._idle.notify_all()

    def _run(self, job: LateJob) -> None:
        with self._lock:
            detectors = self._detectors
            for d in detectors:
                self._running[id(d)] = self._running.get(id(d), 0) + 1
        try:
            self._run_with(job, detectors)
        finally:
            with self._lock:
                for d in detectors:
                    self._running[id(d)] -= 1
                    if not self._running[id(d)]:
                        del self._running[id(d)]
            if self._retired:
                self._reap()

    def _run_with(self, job: LateJob, detectors: tuple[LateDetector, ...]) -> None:
        for detector in detectors:
            rule = detector.rule
            if self._closed:
                return
            if not applies(rule, job.tool, job.trust, job.tenant):
                continue  # not its tool or trust, or (a judge) not a tenant it may be shown
            try:
                finding = _bounded(detector, truncate_utf8(job.text, rule.max_bytes), rule.timeout_s)
            except Exception as exc:  # noqa: BLE001 - reported, and the next detector still runs
                self._error(job, rule.id, exc)
                continue
            if finding is None:
                continue
            with self._lock:
                self._counts["fired"] += 1
            try:
                self._on_fire(job, finding)
            except Exception as exc:  # noqa: BLE001
                self._error(job, rule.id, exc)
            return  # one fire per job: the ref is quarantined once

    def _error(self, job: LateJob, detector_id: str, exc: BaseException) -> None:
        if self._closed:
            return  # close() abandoned this job; its detector's failure (a closed client) is not news
        with self._lock:
            self._counts["errors"] += 1
        log.warning("late detector %s on %s: %s: %s", detector_id, job.ref, type(exc).__name__, exc)
        if self._on_error is None:
            return
        try:
            self._on_error(job, detector_id, exc)
        except Exception:  # noqa: BLE001
            log.exception("on_error of late detector %s failed", detector_id)


def _bounded(detector: LateDetector, text: str, timeout_s: float) -> LateFinding | None:
    """``detector.detect(text)`` with a hard time limit. A detect that overruns is left to
    finish on its own daemon thread (Python cannot stop a thread); its result is ignored."""
    box: dict[str, object] = {}
    done = threading.Event()

    def call() -> None:
        try:
            box["result"] = detector.detect(text)
        except BaseException as exc:  # noqa: BLE001 - handed to the worker
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=call, name=f"fak-late-{detector.rule.id}", daemon=True).start()
    if not done.wait(timeout_s):
        raise LateDetectorFailed(f"late detector {detector.rule.id!r} gave no verdict within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    result = box.get("result")
    if result is not None and not isinstance(result, LateFinding):
        raise LateDetectorFailed(f"late detector {detector.rule.id!r} returned {type(result).__name__}, "
                                 "not a LateFinding or None")
    return result
