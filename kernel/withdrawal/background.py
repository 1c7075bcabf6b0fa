"""The kernel's background work on withdrawals: the expiry sweeper (a thread that executes
every expiry whose time has come, every ``settings.expiry_sweep_s``) and the late detectors
of the active policy (``fak.policy.late.LateRunner``: a detector that fires quarantines the
ref it fired on). ``Kernel.open`` starts both, a policy reload rebuilds the detectors,
``Kernel.close`` stops them."""

from __future__ import annotations

import threading
from collections.abc import Callable

from fak.errors import FakError
from fak.kernel.events import LateOutcome
from fak.kernel.services import Services
from fak.kernel.withdrawal import quarantine
from fak.policy.late import LateJob, LateRunner, build_detectors
from fak.policy.late_detector import LateFinding


class ExpirySweeper:
    """The expiry thread: ``start`` once the kernel is open; ``stop`` then ``join`` when it closes.
    A failed sweep is retried on the next one, and said on ``warn``."""

    def __init__(self, svc: Services, warn: Callable[[str], None]) -> None:
        self._svc, self._warn = svc, warn
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        svc = self._svc
        withdrawals = svc.withdrawals
        withdrawals.set_next_expiry(svc.state.next_expiry())

        def sweep() -> None:
            while not self._stop.wait(svc.settings.expiry_sweep_s):
                if withdrawals.expiry_due():
                    try:
                        quarantine.expire_due(svc, None, None)
                    except Exception as exc:  # noqa: BLE001 - retried on the next sweep; said loudly
                        self._warn(f"expiry sweep failed (retried): {type(exc).__name__}: {exc}")

        self._thread = threading.Thread(target=sweep, name="fak-expiry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float = 5) -> None:
        if self._thread is not None:
            self._thread.join(timeout=timeout)


def start_late(svc: Services, warn: Callable[[str], None]) -> None:
    """(Re)build the late detectors of the active policy; a policy without any runs none."""
    late = svc.late
    rules = svc.policy.spec.late_detectors
    if not rules:
        if late.runner is not None:
            late.runner.set_detectors([])
        return
    detectors = build_detectors(list(rules), svc.judge_egress)
    if late.runner is None:
        late.runner = LateRunner(lambda job, finding: late_fired(svc, warn, job, finding),
                                 lambda job, detector_id, exc: late_failed(svc, warn, job, detector_id, exc),
                                 workers=svc.settings.late_workers, queue_max=svc.settings.late_queue)
    late.runner.set_detectors(detectors)


def late_fired(svc: Services, warn: Callable[[str], None], job: LateJob, finding: LateFinding) -> None:
    """A detector fired: quarantine the ref (``fak.kernel.withdrawal.quarantine``)."""
    svc.events.publish(LateOutcome(job.tenant, "fired"))
    reason = f"late:{finding.detector_id}:{finding.label}"
    try:
        quarantine.quarantine(svc, job.tenant, job.ref, reason=reason, principal=f"detector:{finding.detector_id}")
    except FakError as exc:  # e.g. forgotten meanwhile: nothing left to evict
        warn(f"late detector {finding.detector_id} fired on {job.ref[:24]}…, quarantine failed: {exc}")


def late_failed(svc: Services, warn: Callable[[str], None], job: LateJob, detector_id: str,
                exc: BaseException) -> None:
    svc.events.publish(LateOutcome(job.tenant, "error"))
    warn(f"late detector {detector_id} failed on {job.ref[:24]}…: {type(exc).__name__}: {exc}")
