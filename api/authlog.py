"""Authentication failures, counted per window rather than logged one by one (issue 25.5).

Every refused request used to append an ``auth_failure`` entry: 2,000 requests with bogus
keys added 2,000 entries (4.4 MB) to a log that is kept for ever. Now, per tenant (the
system's for requests without a valid key) and window (setting ``auth_failure_window_s``),
the first failure of each reason is logged at once, as before, so a probe shows up without
delay; the rest are counted and logged as one ``auth_failures`` entry when the window ends
(a timer) or the log closes, with keyed fingerprints of the keys and clients they came from.
The memory this takes is bounded (``TRACKED`` fingerprints a window), and the first-of-reason
entries are handed to the log with ``try_submit``: when its queue is full they are counted,
never waited for.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import threading
from collections import Counter
from dataclasses import dataclass, field

from fak.audit import AuditLog, AuthFailure, AuthFailures
from fak.audit.errors import AuditError
from fak.audit.events import MAX_FINGERPRINTS, AuthReason, now_ms

LABEL = "fak/api/auth-failure-fingerprint"  # the server key the fingerprints are made under
PREFIX_CHARS = 21  # of a presented key: fak_<16 hex key id>_
TRACKED = 4096  # distinct fingerprints of each kind counted in one window; more are not told apart


@dataclass
class _Window:
    start_ms: int
    firsts: set[str] = field(default_factory=set)
    reasons: Counter[str] = field(default_factory=Counter)
    keys: Counter[str] = field(default_factory=Counter)
    clients: Counter[str] = field(default_factory=Counter)
    dropped: int = 0
    timer: threading.Timer | None = None

    def count(self) -> int:
        return sum(self.reasons.values())


class AuthFailureWindow:
    """Counts authentication failures per tenant and window; see the module doc."""

    def __init__(self, audit: AuditLog, key: bytes, window_s: float) -> None:
        self._audit = audit
        self._key = key
        self._window_s = window_s
        self._lock = threading.Lock()
        self._windows: dict[str, _Window] = {}
        self._closed = False
        audit.on_close(self.close)  # the last window is logged before the log closes

    def _fingerprint(self, kind: bytes, value: str) -> str:
        mac = hmac.new(self._key, kind + b"\0" + value.encode("utf-8", "surrogatepass"), hashlib.sha256)
        return "hmac-sha256:" + mac.hexdigest()

    def record(self, reason: AuthReason, *, tenant: str = "", route: str | None = None,
               key_fingerprint: str | None = None, presented: str | None = None,
               client: str | None = None) -> None:
        """One refused request: logged at once if it is its window's first of ``reason``,
        counted otherwise. Never waits on the log."""
        with self._lock:
            window = self._windows.get(tenant)
            if window is None:
                window = self._windows[tenant] = _Window(now_ms())
                if not self._closed:
                    window.timer = threading.Timer(self._window_s, self._end, (tenant, window))
                    window.timer.daemon = True
                    window.timer.start()
            first = reason not in window.firsts
            if first:
                window.firsts.add(reason)
            else:
                self._count(window, reason, presented, client)
        if first:
            event = AuthFailure(tenant=tenant, reason=reason, key_fingerprint=key_fingerprint, route=route)
            taken = None
            with contextlib.suppress(AuditError):  # a closed log: counted, like a full queue
                taken = self._audit.try_submit(event)
            if taken is None:
                with self._lock:
                    window.dropped += 1
                    self._count(window, reason, presented, client)

    def _count(self, window: _Window, reason: str, presented: str | None, client: str | None) -> None:
        window.reasons[reason] += 1
        for counter, kind, value in ((window.keys, b"key", presented and presented[:PREFIX_CHARS]),
                                     (window.clients, b"client", client)):
            if value:
                fp = self._fingerprint(kind, value)
                if fp in counter or len(counter) < TRACKED:
                    counter[fp] += 1

    def _end(self, tenant: str, window: _Window) -> None:
        with self._lock:
            if self._windows.get(tenant) is not window:
                return  # flushed already
            del self._windows[tenant]
        self._log(tenant, window)

    def _log(self, tenant: str, window: _Window) -> None:
        if window.timer is not None:
            window.timer.cancel()
        if not window.count():
            return
        keys = [fp for fp, _ in window.keys.most_common(MAX_FINGERPRINTS)]
        clients = [fp for fp, _ in window.clients.most_common(MAX_FINGERPRINTS)]
        event = AuthFailures(tenant=tenant, window_start_ms=window.start_ms, window_end_ms=now_ms(),
                             count=window.count(), reasons=dict(window.reasons), key_fingerprints=keys,
                             more_keys=len(window.keys) - len(keys), client_fingerprints=clients,
                             more_clients=len(window.clients) - len(clients), dropped=window.dropped)
        with contextlib.suppress(AuditError):  # a closed log: nothing more can be written
            self._audit.submit(event)  # few (one a tenant and window): these wait for room

    def flush(self) -> None:
        """End every open window now (their counts logged); new failures open new ones."""
        with self._lock:
            windows, self._windows = self._windows, {}
        for tenant, window in windows.items():
            self._log(tenant, window)

    def close(self) -> None:
        """Log what is counted and stop timing windows (at shutdown, before the log closes)."""
        self._closed = True
        self.flush()
