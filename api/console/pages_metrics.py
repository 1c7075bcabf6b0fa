"""The console's metrics page: the tenant's figures since the server started, and its charts."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import Response

from fak.api.console import auth
from fak.api.console.common import page, render
from fak.api.console.history import MetricsHistory, Sample, series, sparkline, tenant_totals
from fak.kernel.facade import Kernel
from fak.kernel.session.caller import Caller, Right

router = APIRouter(prefix="/console", include_in_schema=False)


def _series(request: Request, tenant: str) -> dict[str, dict[str, float]]:
    """The tenant's samples of the app's collectors (``Metrics.registry``, as /metrics shows
    them): sample name -> the sample's other label values joined -> value."""
    out: dict[str, dict[str, float]] = {}
    registry = getattr(getattr(request.app.state, "metrics", None), "registry", None)
    if registry is None:
        return out
    for family in registry.collect():
        for sample in family.samples:
            if sample.labels.get("tenant") != tenant or sample.name.endswith("_created"):
                continue
            label = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k not in ("tenant", "le"))
            if "le" in sample.labels:
                continue  # histogram buckets: the page shows counts and sums
            bucket = out.setdefault(sample.name, {})
            bucket[label] = bucket.get(label, 0.0) + sample.value
    return out


def _rate(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "—"


@router.get("/metrics")
def metrics_page(request: Request) -> Response:
    """The tenant's figures since the server started: verdict rates, prefix and PIC hit rates,
    forgets, decode throughput, time to first token (what ``GET /metrics`` exposes)."""
    def run(s: auth.ConsoleSession, c: Caller, k: Kernel) -> Response:
        c.require(Right.AUDIT)  # as GET /metrics
        m = _series(request, c.tenant)
        verdicts = {key.removeprefix("kind="): v for key, v in m.get("fak_admission_verdicts_total", {}).items()}
        calls = {key.removeprefix("verdict="): v for key, v in m.get("fak_tool_call_decisions_total", {}).items()}
        total_v, total_c = sum(verdicts.values()), sum(calls.values())
        rows: list[tuple[str, str]] = []
        rows += [(f"admission {kind}", f"{int(n)} ({_rate(n, total_v)})") for kind, n in sorted(verdicts.items())]
        rows += [(f"tool call {v}", f"{int(n)} ({_rate(n, total_c)})") for v, n in sorted(calls.items())]
        rows += [(f"evictions {key.removeprefix('mode=')}", str(int(n)))
                 for key, n in sorted(m.get("fak_evictions_total", {}).items())]
        rows.append(("forgets completed", str(int(sum(m.get("fak_forgets_total", {}).values())))))
        n_f, sum_f = (sum(m.get(f"fak_forget_duration_seconds_{x}", {}).values()) for x in ("count", "sum"))
        rows.append(("forget latency (mean)", f"{1000 * sum_f / n_f:.0f} ms" if n_f else "—"))
        tokens = sum(m.get("fak_decode_tokens_total", {}).values())
        seconds = sum(m.get("fak_decode_seconds_total", {}).values())
        rows.append(("decode throughput", f"{tokens / seconds:.1f} tokens/s ({int(tokens)} tokens)" if seconds
                     else "—"))
        n_ft, sum_ft = (sum(m.get(f"fak_time_to_first_token_seconds_{x}", {}).values()) for x in ("count", "sum"))
        rows.append(("time to first token (mean)", f"{1000 * sum_ft / n_ft:.0f} ms" if n_ft else "—"))
        if k.prefix is not None:
            st = k.prefix.stats_for(k.namespace(c.tenant))
            rows.append(("prefix-cache hit rate", _rate(st.hit_tokens, st.hit_tokens + st.miss_tokens)))
            rows.append(("prefill rows served from the prefix cache",
                         _rate(st.served_tokens, st.served_tokens + st.computed_tokens)))
        pic = k.pic.stats_for(k.namespace(c.tenant))
        rows.append(("PIC chunk hit rate", _rate(pic.hits, pic.lookups)))
        rows += [(f"late detections {key.removeprefix('outcome=')}", str(int(n)))
                 for key, n in sorted(m.get("fak_late_detections_total", {}).items())]
        history: MetricsHistory = request.app.state.metrics_history
        now = Sample(time.time(), tenant_totals(request.app.state.metrics.registry, k).get(c.tenant, {}))
        charts = [(x, sparkline(x)) for x in series([*history.samples(c.tenant), now])]
        return render(request, "metrics.html", s=s, rows=rows, charts=charts, interval=int(history.interval_s))

    return page(request, (), run)
