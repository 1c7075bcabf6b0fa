"""The console's metrics history (api/console/history.py): rates between samples, gaps where an
interval has nothing to measure or a counter went backwards, the ring bounded, the SVG sane."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from fak.api.console.history import MetricsHistory, Sample, registry_totals, series, sparkline

V = "fak_admission_verdicts_total"


def test_rates_between_samples_and_gaps() -> None:
    samples = [
        Sample(0, {f"{V}{{kind=ALLOW}}": 0, "fak_decode_tokens_total": 0, "fak_decode_seconds_total": 0}),
        Sample(60, {f"{V}{{kind=ALLOW}}": 3, f"{V}{{kind=QUARANTINE}}": 1, "fak_decode_tokens_total": 100,
                    "fak_decode_seconds_total": 4}),
        Sample(120, {f"{V}{{kind=ALLOW}}": 3, f"{V}{{kind=QUARANTINE}}": 1, "fak_decode_tokens_total": 100,
                     "fak_decode_seconds_total": 4}),
        Sample(150, {f"{V}{{kind=ALLOW}}": 1}),  # a restart: counters went back
    ]
    by = {s.name: s.points for s in series(samples)}
    assert by["admission verdicts"] == [(60, 4.0), (120, 0.0), (150, None)]
    assert by["quarantined or denied"] == [(60, 25.0), (120, None), (150, None)]
    assert by["decode throughput"] == [(60, 25.0), (120, None), (150, None)]
    assert by["forget latency (mean)"] == [(60, None), (120, None), (150, None)]


def test_registry_totals_by_tenant_and_the_ring_is_bounded() -> None:
    r = CollectorRegistry(auto_describe=False)
    c = Counter("fak_admission_verdicts", "x", ["tenant", "kind"], registry=r)
    c.labels("acme", "ALLOW").inc(2)
    c.labels("evil", "DENY").inc()
    totals = registry_totals(r)
    assert totals == {"acme": {f"{V}{{kind=ALLOW}}": 2.0}, "evil": {f"{V}{{kind=DENY}}": 1.0}}
    h = MetricsHistory(lambda: registry_totals(r), keep=3)
    for t in range(5):
        h.sample(now=float(t))
    assert [s.at for s in h.samples("acme")] == [2.0, 3.0, 4.0] and h.samples("nobody") == [Sample(4.0, {})]
    assert MetricsHistory(lambda: {}).samples("acme") == []  # nothing sampled yet
    c.labels("new", "ALLOW").inc(3)  # a tenant first seen now: its counters were 0 at the previous sample
    h.sample(now=5.0)
    first = h.samples("new")
    assert [(s.at, s.totals) for s in first] == [(4.0, {}), (5.0, {f"{V}{{kind=ALLOW}}": 3.0})]
    assert {s.name: s.points for s in series(first)}["admission verdicts"] == [(5.0, 180.0)]


def test_sparkline_draws_runs_and_says_no_data() -> None:
    by = {s.name: s for s in series([Sample(0, {V: 0}), Sample(60, {V: 6}), Sample(120, {V: 12})])}
    svg = sparkline(by["admission verdicts"])
    assert svg.startswith("<svg") and "<polyline" in svg and 'last 6.0 per min, top 6.0' in svg
    assert "no data yet" in sparkline(by["forget latency (mean)"])
