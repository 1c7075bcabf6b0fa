"""The engine loop's series for ``/metrics`` (``fak.kernel.model.scheduler``), read at scrape time.

Per tenant, like every series: the caller's generations waiting for room and running, its
forward calls waiting for a step, histograms of its decode rows and of its tokens per
engine step, and its requests refused with 429. The engine's total load (other tenants'
rows in the same steps) is not shown: it would tell one tenant how busy the others are.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

if TYPE_CHECKING:
    from fak.kernel.facade import Kernel


def engine_series(k: Kernel, tenant: str) -> Iterator[Metric]:
    f = k.engine_figures(tenant)
    yield GaugeMetricFamily("fak_generation_queue_depth", "this tenant's generations waiting for room to run",
                            value=f.queued_requests)
    yield GaugeMetricFamily("fak_generations_running", "this tenant's generations running", value=f.active_requests)
    yield GaugeMetricFamily("fak_engine_waiting_calls", "this tenant's forward calls waiting for an engine step",
                            value=f.waiting_calls)
    yield CounterMetricFamily("fak_generations_rejected", "this tenant's generations refused (429: the queue was full "
                                                          "or the wait too long)", value=f.rejected)
    yield HistogramMetricFamily("fak_engine_batch_rows", "this tenant's decode rows in each engine step it took part in",
                                buckets=[(_le(b), c) for b, c in f.rows], sum_value=f.rows_sum)
    yield HistogramMetricFamily("fak_engine_step_tokens", "this tenant's tokens (decode rows and prefill) in each "
                                                          "engine step it took part in",
                                buckets=[(_le(b), c) for b, c in f.tokens], sum_value=f.tokens_sum)


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else f"{bound:g}"
