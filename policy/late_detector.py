"""What a late detector is, returns and raises: the ground that ``fak.policy.late`` (which
builds and runs detectors) and the detectors themselves (``fak.policy.classifier``,
``fak.policy.judge``) share, so a detector does not import the module that builds it.
``fak.policy.late`` re-exports every name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from fak.errors import InvalidInput, Unavailable
from fak.policy.schema import LateDetectorRule


class LateDetectorInvalid(InvalidInput):
    """A late detector that cannot be built: a missing or wrong model folder, a missing
    optional dependency, an unset key variable. Raised when the policy is applied, not
    when the first tool result arrives."""


class LateDetectorFailed(Unavailable):
    """One detection did not produce a verdict (the judge answered non-2xx or garbage, the
    classifier raised, the time ran out). Reported through ``on_error``; it never fires."""


@dataclass(frozen=True)
class LateFinding:
    """A late detector fired on a job: its score (0..1) reached the rule's threshold."""

    detector_id: str
    score: float
    label: str
    detail: str = ""


@runtime_checkable
class LateDetector(Protocol):
    """A blocking, possibly slow detector. ``detect`` returns None when it did not fire and
    raises when it could not decide (never a finding by accident)."""

    rule: LateDetectorRule

    def detect(self, text: str) -> LateFinding | None: ...
