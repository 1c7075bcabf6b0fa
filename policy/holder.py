"""Atomic policy reload: readers always see one whole policy; a bad file keeps
the old one and the error is kept for whoever asks."""

from __future__ import annotations

import threading
from pathlib import Path

from fak.policy.egress import JudgeEgress
from fak.policy.errors import PolicyError
from fak.policy.policy import Policy, load_policy


class PolicyHolder:
    """Holds the current policy. ``reload()`` validates first and swaps only on success."""

    def __init__(self, path: str | Path, policy: Policy | None = None, egress: JudgeEgress | None = None) -> None:
        self.path = Path(path)
        self.egress = egress  # the deployment's judge allow-lists, checked on every (re)load
        self._lock = threading.Lock()
        self._policy = policy if policy is not None else load_policy(self.path, egress)
        self.last_error: PolicyError | None = None

    @property
    def policy(self) -> Policy:
        return self._policy  # a single reference read: atomic

    def restore(self, policy: Policy) -> None:
        """Put ``policy`` back in force (a reload whose audit event could not be written)."""
        with self._lock:
            self._policy = policy

    def reload(self) -> PolicyError | None:
        """Load the file again. Returns None on success, else the error (old policy kept)."""
        with self._lock:
            try:
                fresh = load_policy(self.path, self.egress)
            except PolicyError as exc:
                self.last_error = exc
                return exc
            self._policy = fresh
            self.last_error = None
            return None
