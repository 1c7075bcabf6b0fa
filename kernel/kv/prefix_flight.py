"""Prefix computations in flight: the calls one session of a namespace is computing now, so
that another session of the same namespace that needs the same calls waits for them and is
served from the prefix cache instead of computing them a second time.

Without it a burst of agents that share a system prompt and a tools block (sixteen requests
arriving together) computes the shared prefix once per request: each looks the prefix cache
up before the first one inserted it. With it the first computes, the others wait and copy.

A flight is named by the digest of the *call keys* up to the end of one call
(``prefix_tree.call_keys``: token ids and the calls that computed them, from position 0), so a
session waits only for rows the prefix cache would serve it (the same tokens computed by the
same calls) and only for flights of its own namespace: one tenant never waits for, nor learns
of, another tenant's work. A session that holds flights is computing and never waits while it
holds them, so no two sessions wait for each other; a claim is released when its segment's
prefill ends however it ends (rows inserted, or an error), and a waiter gives up after
``WAIT_S`` and computes the rows itself.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

import blake3

WAIT_S = 120.0  # the longest a session waits for another's computation before computing itself


def flight_key(keys: Sequence[int]) -> bytes:
    """The name of the rows of ``keys`` (call keys from position 0 to the end of a call)."""
    return blake3.blake3(array("q", keys).tobytes()).digest()


@dataclass(eq=False)
class Flight:
    """Rows one claim is computing; ``done`` is set when its claim is released."""

    done: threading.Event = field(default_factory=threading.Event)

    def wait(self, timeout: float) -> bool:
        return self.done.wait(max(timeout, 0.0))


@dataclass(eq=False)
class Claim:
    """The flights one session registered for the calls of a segment it is about to compute.
    ``release`` (idempotent) ends them and wakes their waiters."""

    flights: Flights
    ns: bytes
    names: list[bytes]
    flight: Flight = field(default_factory=Flight)
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.flights.end(self)


class Flights:
    """The flights of every namespace of one prefix cache (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[tuple[bytes, bytes], Flight] = {}

    def take(self, ns: bytes, names: Sequence[bytes], *, claim: bool) -> Flight | Claim | None:
        """For a segment whose next uncached calls end at the rows named ``names`` (in order):
        the flight computing the first of them, to wait for; else, with ``claim``, a claim on
        those that no one computes (the caller computes them and releases it); else None."""
        if not names:
            return None
        with self._lock:
            busy = self._open.get((ns, names[0]))
            if busy is not None:
                return busy
            if not claim:
                return None
            mine = Claim(self, ns, [])
            for name in names:
                if (ns, name) not in self._open:
                    self._open[ns, name] = mine.flight
                    mine.names.append(name)
            return mine

    def end(self, claim: Claim) -> None:
        with self._lock:
            for name in claim.names:
                if self._open.get((claim.ns, name)) is claim.flight:
                    del self._open[claim.ns, name]
        claim.flight.done.set()

    def open_count(self, ns: bytes) -> int:
        """Rows named in flight in ``ns`` now (tests)."""
        with self._lock:
            return sum(1 for key in self._open if key[0] == ns)
