"""What the Kernel tells observers (metrics, benches) after each decision: typed, in process.

These are *not* audit records (``fak.audit.events``): nothing here is signed, logged or
kept. They exist so that a counter can follow the Kernel without the Kernel knowing about
counters. The Kernel builds one ``EventBus`` (``Kernel.events``) and the modules that
decide (sessions, withdrawal, forget, materialisation, late detection) publish on it;
a subscriber names the event type it wants, so nothing decodes strings.

    k.events.subscribe(TokensDecoded, lambda e: print(e.tenant, e.tokens / e.seconds))

A subscriber that raises never fails the decision it hears about (it has already been
made and recorded); the failure is logged and the other subscribers still run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeVar, cast

if TYPE_CHECKING:
    from fak.kernel.calls.webhook import Outcome as ApprovalOutcome
    from fak.policy import VerdictKind
    from fak.policy.schema import ToolCallVerdict

log = logging.getLogger("fak.events")

LateOutcomeKind = Literal["fired", "dropped", "error"]


@dataclass(frozen=True, slots=True)
class KernelEvent:
    """Base of every event: the tenant the decision was for. Subscribe to it to hear all."""

    tenant: str


@dataclass(frozen=True, slots=True)
class AdmissionDecided(KernelEvent):
    """A tool result went through the gate (recorded: the audit entry is appended)."""

    verdict: VerdictKind


@dataclass(frozen=True, slots=True)
class SpanEvicted(KernelEvent):
    """One segment left a session's KV; ``mode`` as the report says it (``EvictMode.value``:
    ``write_time``, ``recompute``, ``rerope`` or ``truncate``)."""

    mode: str


@dataclass(frozen=True, slots=True)
class ForgetDone(KernelEvent):
    """A forget completed (a repeat that only returns the receipt publishes nothing), with the
    seconds this process spent on it (from its start or its resumption to its signed completion)."""

    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class ToolCallDecided(KernelEvent):
    """A proposed tool call was authorized (``ALLOW``, ``CONFIRM`` or ``DENY``)."""

    verdict: ToolCallVerdict


@dataclass(frozen=True, slots=True)
class LateOutcome(KernelEvent):
    """A late-detector job ended: it ``fired``, was ``dropped`` (queue full) or hit an ``error``."""

    outcome: LateOutcomeKind


@dataclass(frozen=True, slots=True)
class ApprovalNotified(KernelEvent):
    """The approvals webhook's notice of one of the tenant's held calls ended: ``delivered``
    (a 2xx), ``refused`` (another 4xx), ``failed`` (every try failed) or ``dropped`` (queue full)."""

    outcome: ApprovalOutcome


@dataclass(frozen=True, slots=True)
class TokensDecoded(KernelEvent):
    """One generate call produced ``tokens`` in ``seconds`` (JSON or stream)."""

    tokens: int
    seconds: float


@dataclass(frozen=True, slots=True)
class TokensTimed(KernelEvent):
    """A generation that the API's operations drive (a REST turn, streamed or not; an attempt
    of an OpenAI answer) produced ``tokens``, the first at ``first_at`` and the last at
    ``last_at`` (``time.perf_counter`` stamps of this process): what a door's time to first
    token and time per output token are read from. Published when the generation ends, also
    one given up part way (``fak.kernel.session.tokens.timed_tokens``)."""

    tokens: int
    first_at: float
    last_at: float


EVENT_TYPES: tuple[type[KernelEvent], ...] = (
    AdmissionDecided, SpanEvicted, ForgetDone, ToolCallDecided, LateOutcome, TokensDecoded, TokensTimed,
)  # fmt: skip

E = TypeVar("E", bound=KernelEvent)


class EventBus:
    """Synchronous publish/subscribe by event type; safe to use from several threads (the late
    detectors publish from their workers). A subscriber of a base class hears its subclasses."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: dict[type, tuple[Callable[[KernelEvent], None], ...]] = {}

    def subscribe(self, event_type: type[E], callback: Callable[[E], None]) -> None:
        """Call ``callback(event)`` for each published event that is an ``event_type``."""
        if not (isinstance(event_type, type) and issubclass(event_type, KernelEvent)):
            raise TypeError(f"subscribe to a KernelEvent type, not {event_type!r}")
        with self._lock:  # copy on write: publish reads a tuple without the lock
            held = self._subscribers.get(event_type, ())
            # only events of event_type reach it (publish walks the event's own MRO)
            self._subscribers[event_type] = (*held, cast("Callable[[KernelEvent], None]", callback))

    def publish(self, event: KernelEvent) -> None:
        """Deliver ``event`` to its subscribers, in order of subscription per type, most
        specific type first. Never raises on a subscriber's failure: logs it."""
        for cls in type(event).__mro__:
            for callback in self._subscribers.get(cls, ()):
                try:
                    callback(event)
                except Exception:  # an observer must never break a decision already made
                    log.exception("subscriber %r failed on %s", callback, type(event).__name__)
            if cls is KernelEvent:
                break
