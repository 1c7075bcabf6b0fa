"""The metrics page's figures over time: each tenant's counters sampled every ``INTERVAL_S``
into a bounded ring, so the console draws the last hour without a Prometheus server.

The samples are the same series ``GET /metrics`` exposes (``fak.api.metrics``); a rate over an
interval comes from two samples' difference, as PromQL's ``rate()`` would compute it. What is
kept is per tenant and only totals (no ids), read only by that tenant's console pages. A
counter that went backwards (a restart of the process is a new history) yields no point."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

if TYPE_CHECKING:
    from fak.kernel.facade import Kernel

INTERVAL_S = 10.0  # seconds between samples
KEEP = 360  # samples kept per tenant: an hour at the default interval
MAX_TENANTS = 1_000  # tenants tracked at most (the oldest-seen dropped first)
# the series the charts read (``series``); only these are kept, so a sample is ~15 numbers, not
# every route's request counts: 1,000 tenants x 360 samples stay in the tens of MB
CHARTED = ("fak_admission_verdicts_total", "fak_tool_call_decisions_total", "fak_forget_duration_seconds_sum",
           "fak_forget_duration_seconds_count", "fak_decode_tokens_total", "fak_decode_seconds_total")

Totals = dict[str, float]  # series name (labels folded in) -> value


@dataclass(frozen=True)
class Sample:
    at: float  # wall-clock seconds
    totals: Totals


@dataclass(frozen=True)
class Series:
    """One chart: a name, its unit, and (time, value) points, None where the interval had no data."""

    name: str
    unit: str
    points: list[tuple[float, float | None]]


def registry_totals(registry: CollectorRegistry) -> dict[str, Totals]:
    """Every tenant's samples of the ``CHARTED`` series, by tenant: the sample name with its
    other labels folded in (``fak_admission_verdicts_total{kind=ALLOW}``)."""
    out: dict[str, Totals] = {}
    for family in registry.collect():
        for s in family.samples:
            tenant = s.labels.get("tenant")
            if tenant is None or s.name not in CHARTED or "le" in s.labels:
                continue
            rest = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "tenant")
            key = f"{s.name}{{{rest}}}" if rest else s.name
            totals = out.setdefault(tenant, {})
            totals[key] = totals.get(key, 0.0) + s.value
    return out


def tenant_totals(registry: CollectorRegistry, k: Kernel) -> dict[str, Totals]:
    """``registry_totals`` with each tenant's prefix-cache and PIC figures (read from the kernel at
    scrape time, as ``/metrics`` reads them)."""
    out = registry_totals(registry)
    for tenant, totals in out.items():
        ns = k.namespace(tenant)
        if k.prefix is not None:
            st = k.prefix.stats_for(ns)
            totals["fak_prefix_cache_hit_tokens"], totals["fak_prefix_cache_miss_tokens"] = st.hit_tokens, st.miss_tokens
        pic = k.pic.stats_for(ns)
        totals["fak_pic_hits"], totals["fak_pic_lookups"] = pic.hits, pic.lookups
    return out


class MetricsHistory:
    """The ring of samples per tenant, filled by ``sample()`` (a daemon thread calls it every
    ``interval_s`` once ``start()``ed; tests call it directly)."""

    def __init__(self, read: Callable[[], dict[str, Totals]], *, interval_s: float = INTERVAL_S,
                 keep: int = KEEP) -> None:
        self._read, self.interval_s, self._keep = read, interval_s, keep
        self._rings: dict[str, deque[Sample]] = {}
        self._last_at: float | None = None  # the previous sample's time (a new tenant's zero baseline)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self, now: float | None = None) -> None:
        at = time.time() if now is None else now
        read = self._read()
        with self._lock:
            for tenant, totals in read.items():
                ring = self._rings.get(tenant)
                if ring is None:
                    if len(self._rings) >= MAX_TENANTS:
                        self._rings.pop(next(iter(self._rings)))
                    ring = self._rings[tenant] = deque(maxlen=self._keep)
                    if self._last_at is not None:  # absent from the previous sample: its counters were 0
                        ring.append(Sample(self._last_at, {}))
                ring.append(Sample(at, totals))
            self._last_at = at

    def samples(self, tenant: str) -> list[Sample]:
        """The tenant's samples, oldest first; a tenant not seen yet has the latest sample's
        zero baseline (none before the first sample)."""
        with self._lock:
            ring = self._rings.get(tenant)
            if ring:
                return list(ring)
            return [] if self._last_at is None else [Sample(self._last_at, {})]

    def start(self) -> None:
        """Sample now (the baseline every tenant's first interval is measured from), then every
        ``interval_s`` in a daemon thread."""
        if self._thread is None:
            self.sample()
            self._thread = threading.Thread(target=self._run, name="fak-console-metrics", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a failed sample is a gap in the chart, never a dead thread
                continue


def _delta(a: Totals, b: Totals, prefix: str) -> float | None:
    """The increase of every series starting with ``prefix`` between two samples (None: a reset)."""
    keys = {k for k in (*a, *b) if k.startswith(prefix)}
    d = sum(b.get(k, 0.0) - a.get(k, 0.0) for k in keys)
    return None if d < 0 else d


def _ratio(part: float | None, whole: float | None, scale: float = 1.0) -> float | None:
    return None if part is None or not whole else scale * part / whole


def series(samples: list[Sample]) -> list[Series]:
    """The charts of the metrics page from consecutive samples: verdicts and decisions per minute,
    quarantine share, prefix and PIC hit rates, forget latency, decode throughput."""
    charts: dict[str, tuple[str, list[tuple[float, float | None]]]] = {
        "admission verdicts": ("per min", []),
        "quarantined or denied": ("% of verdicts", []),
        "tool calls held or denied": ("% of decisions", []),
        "prefix-cache hit rate": ("% of prompt tokens", []),
        "PIC chunk hit rate": ("% of lookups", []),
        "forget latency (mean)": ("ms", []),
        "decode throughput": ("tokens/s", []),
    }
    for a, b in zip(samples, samples[1:], strict=False):
        minutes = (b.at - a.at) / 60
        if minutes <= 0:
            continue
        verdicts = _delta(a.totals, b.totals, "fak_admission_verdicts_total")
        bad = sum(x for x in (_delta(a.totals, b.totals, f"fak_admission_verdicts_total{{kind={k}}}")
                              for k in ("QUARANTINE", "DENY")) if x is not None)
        calls = _delta(a.totals, b.totals, "fak_tool_call_decisions_total")
        held = sum(x for x in (_delta(a.totals, b.totals, f"fak_tool_call_decisions_total{{verdict={v}}}")
                               for v in ("CONFIRM", "DENY")) if x is not None)
        hit = _delta(a.totals, b.totals, "fak_prefix_cache_hit_tokens")
        miss = _delta(a.totals, b.totals, "fak_prefix_cache_miss_tokens")
        values = {
            "admission verdicts": None if verdicts is None else verdicts / minutes,
            "quarantined or denied": _ratio(bad, verdicts, 100),
            "tool calls held or denied": _ratio(held, calls, 100),
            "prefix-cache hit rate": _ratio(hit, None if hit is None or miss is None else hit + miss, 100),
            "PIC chunk hit rate": _ratio(_delta(a.totals, b.totals, "fak_pic_hits"),
                                         _delta(a.totals, b.totals, "fak_pic_lookups"), 100),
            "forget latency (mean)": _ratio(_delta(a.totals, b.totals, "fak_forget_duration_seconds_sum"),
                                            _delta(a.totals, b.totals, "fak_forget_duration_seconds_count"), 1000),
            "decode throughput": _ratio(_delta(a.totals, b.totals, "fak_decode_tokens_total"),
                                        _delta(a.totals, b.totals, "fak_decode_seconds_total")),
        }
        for name, (_unit, points) in charts.items():
            points.append((b.at, values[name]))
    return [Series(name, unit, points) for name, (unit, points) in charts.items()]


def sparkline(s: Series, width: int = 480, height: int = 60) -> str:
    """An inline SVG chart of ``s`` (gaps where an interval had no data), its last and top values."""
    known = [(t, v) for t, v in s.points if v is not None]
    if not known:
        return f'<svg class="spark" width="{width}" height="{height}" role="img" aria-label="{s.name}: no data">' \
               f'<text x="4" y="{height // 2}">no data yet</text></svg>'
    t0, t1 = s.points[0][0], s.points[-1][0]
    top = max(v for _t, v in known)
    scale, span = top or 1.0, t1 - t0

    def xy(t: float, v: float) -> str:  # one interval so far: its point at the right, where the newest go
        x = (t - t0) / span * (width - 8) + 4 if span > 0 else width - 4
        return f"{x:.1f},{height - 4 - v / scale * (height - 16):.1f}"

    runs: list[list[str]] = [[]]
    for t, v in s.points:
        if v is None:
            runs.append([])
        else:
            runs[-1].append(xy(t, v))
    lines = "".join(f'<polyline points="{" ".join(r)}"/>' if len(r) > 1 else
                    f'<circle cx="{r[0].split(",")[0]}" cy="{r[0].split(",")[1]}" r="2"/>' for r in runs if r)
    last = known[-1][1]
    return (f'<svg class="spark" width="{width}" height="{height}" role="img" '
            f'aria-label="{s.name}: last {last:.1f} {s.unit}, top {top:.1f}">'
            f'<text x="4" y="10">top {top:.1f} {s.unit}</text>{lines}</svg>')
