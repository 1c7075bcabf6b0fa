"""Prometheus metrics on a private registry per app: ``install(app)`` adds the request
middleware and ``GET /metrics`` (role auditor).

Tenants never see each other's activity, so every series is recorded with the tenant
of the API key that made it and ``/metrics`` shows the caller's tenant only (the label
is dropped from the output). Requests without a valid key belong to no tenant and
appear in no tenant's scrape (they are audited as ``auth_failure`` events). The one global
figure is the audit log size, which every signed checkpoint publishes anyway.

The deployment's operator (an auditor or admin key of ``operator_tenant``) may ask for
``/metrics?scope=deployment``: every tenant's series, each labelled with its tenant (``""``:
requests without a valid key), for the dashboards and alerts of whoever runs the server.

Routes are labelled by their template (``/v1/sessions/{sid}``), never the raw path, so
ids do not multiply series. Counters the middleware cannot see are fed by hooks the
routes call and typed Kernel events feed (``fak.kernel.events``): ``record_verdict``, ``record_eviction``,
``record_forget``, ``record_decode``, ``record_tool_call``, ``record_late``, ``record_token_times``.
Kernel figures (prefix cache, PIC registry, loaded sessions, KV bytes) are read at scrape time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from fastapi import Depends, FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fak.api.engine_metrics import engine_series
from fak.api.keys import Principal
from fak.errors import Forbidden
from fak.kernel.events import (
    AdmissionDecided,
    ApprovalNotified,
    EventBus,
    ForgetDone,
    LateOutcome,
    SpanEvicted,
    TokensDecoded,
    TokensTimed,
    ToolCallDecided,
)

if TYPE_CHECKING:
    from fak.kernel.facade import Kernel

UNMATCHED = "<unmatched>"  # requests no route matched (404 and the like)
LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
VERDICTS = frozenset({"ALLOW", "REDACT", "QUARANTINE", "DENY"})
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})  # a label's values stay few
EVICT_MODES = frozenset({"write_time", "recompute", "rerope", "truncate"})
CALL_VERDICTS = frozenset({"ALLOW", "CONFIRM", "DENY"})
LATE_OUTCOMES = frozenset({"fired", "error", "dropped"})
WEBHOOK_OUTCOMES = frozenset({"delivered", "refused", "failed", "dropped"})


class Metrics:
    """The app's collectors; every one carries a ``tenant`` label first."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter("fak_http_requests", "HTTP requests by method, route template and status",
                                ["tenant", "method", "route", "status"], registry=r)
        self.latency = Histogram("fak_http_request_duration_seconds",
                                 "HTTP request latency (until the last body byte) by method and route template",
                                 ["tenant", "method", "route"], buckets=LATENCY_BUCKETS, registry=r)
        self.verdicts = Counter("fak_admission_verdicts", "tool-result admission verdicts by kind",
                                ["tenant", "kind"], registry=r)
        self.evictions = Counter("fak_evictions", "segment evictions by mode", ["tenant", "mode"], registry=r)
        self.forgets = Counter("fak_forgets", "completed forgets (signed receipts)", ["tenant"], registry=r)
        self.forget_seconds = Histogram("fak_forget_duration_seconds",
                                        "a forget's time from its start (or resumption) to its signed completion",
                                        ["tenant"], buckets=LATENCY_BUCKETS, registry=r)
        self.decode_tokens = Counter("fak_decode_tokens", "tokens generated", ["tenant"], registry=r)
        self.decode_seconds = Counter("fak_decode_seconds", "seconds spent generating them", ["tenant"], registry=r)
        self.tool_calls = Counter("fak_tool_call_decisions", "tool-call authorization decisions by verdict",
                                  ["tenant", "verdict"], registry=r)
        self.first_token = Histogram("fak_time_to_first_token_seconds",
                                     "from a request's start to the first token it generated, by route template",
                                     ["tenant", "route"], buckets=LATENCY_BUCKETS, registry=r)
        self.per_token = Histogram("fak_time_per_output_token_seconds",
                                   "a generation's (last token - first token) / (tokens - 1), by route template",
                                   ["tenant", "route"], buckets=TOKEN_BUCKETS, registry=r)
        self.late = Counter("fak_late_detections", "late-detector outcomes: fired (the ref was quarantined), "
                            "error (a detector failed on it), dropped (the queue was full)",
                            ["tenant", "outcome"], registry=r)
        self.approval_webhooks = Counter("fak_approval_webhooks", "the approvals webhook's notices of held calls by "
                                         "outcome: delivered, refused (a 4xx), failed (every try), dropped (queue full)",
                                         ["tenant", "outcome"], registry=r)

    def observe(self, tenant: str, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(tenant, method, route, str(status)).inc()
        self.latency.labels(tenant, method, route).observe(seconds)


@dataclass
class _Door:
    """The request being served, for the generations it runs (``record_token_times``): the
    context variable below holds it while the request runs, in the worker and stream threads
    too (they run in a copy of the request's context)."""

    metrics: Metrics
    scope: Scope
    started: float  # time.perf_counter() at the request's start
    first_timed: bool = False  # its time to first token is observed (an answer's retry or n-th choice is not first)


_DOOR: ContextVar[_Door | None] = ContextVar("fak_door", default=None)


def _template(scope: Scope) -> str:
    route = scope.get("route")
    return getattr(route, "path_format", None) or getattr(route, "path", None) or UNMATCHED


class _Middleware:
    """Counts each HTTP request once it has ended (body sent, or the client gone)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state = scope.setdefault("state", {})  # the dict Request.state writes the principal into
        started = time.perf_counter()
        status = 500  # an exception with no response sent is answered 500 outside

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        door = _DOOR.set(_Door(self.metrics, scope, started))
        try:
            await self.app(scope, receive, sending)
        finally:
            _DOOR.reset(door)
            template = _template(scope)
            who = state.get("principal") if isinstance(state, dict) else None
            tenant = who.tenant if isinstance(who, Principal) else ""
            method = scope.get("method", "")
            self.metrics.observe(tenant, method if method in HTTP_METHODS else "OTHER", template, status,
                                 time.perf_counter() - started)


class _TenantView:
    """What one tenant's scrape shows: its own series (label dropped) and Kernel figures."""

    def __init__(self, metrics: Metrics, kernel: Kernel, tenant: str) -> None:
        self.metrics, self.kernel, self.tenant = metrics, kernel, tenant

    def collect(self) -> Iterator[Metric]:
        totals: dict[str, float] = {}
        for family in self.metrics.registry.collect():
            out = Metric(family.name, family.documentation, family.type, family.unit)
            for s in family.samples:
                if s.labels.get("tenant") != self.tenant or s.name.endswith("_created"):
                    continue
                labels = {k: v for k, v in s.labels.items() if k != "tenant"}
                out.add_sample(s.name, labels, s.value, s.timestamp, s.exemplar)
                totals[s.name] = totals.get(s.name, 0.0) + s.value
            yield out
        yield from _kernel_families(self.kernel, self.tenant)
        yield _audit_log_size(self.kernel)
        tokens, seconds = totals.get("fak_decode_tokens_total", 0.0), totals.get("fak_decode_seconds_total", 0.0)
        yield GaugeMetricFamily("fak_decode_tokens_per_second",
                                "mean decode speed since start (rate(fak_decode_tokens_total) / "
                                "rate(fak_decode_seconds_total) gives it over a window)",
                                value=tokens / seconds if seconds > 0 else 0.0)


class _DeploymentView:
    """What the operator's scrape shows: every series with its ``tenant`` label, and the Kernel
    figures of every tenant that made a request since the server started."""

    def __init__(self, metrics: Metrics, kernel: Kernel) -> None:
        self.metrics, self.kernel = metrics, kernel

    def collect(self) -> Iterator[Metric]:
        tenants: set[str] = set()
        for family in self.metrics.registry.collect():
            out = Metric(family.name, family.documentation, family.type, family.unit)
            for s in family.samples:
                if not s.name.endswith("_created"):
                    out.add_sample(s.name, s.labels, s.value, s.timestamp, s.exemplar)
                    tenants.add(s.labels.get("tenant", ""))
            yield out
        merged: dict[str, Metric] = {}
        for tenant in sorted(tenants - {""}):
            for family in _kernel_families(self.kernel, tenant):
                into = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type,
                                                             family.unit))
                for s in family.samples:
                    into.add_sample(s.name, {"tenant": tenant, **s.labels}, s.value, s.timestamp, s.exemplar)
        yield from merged.values()
        yield _audit_log_size(self.kernel)


def _audit_log_size(k: Kernel) -> Metric:
    """The one figure of every tenant's: the log is shared, and its size is public in every checkpoint."""
    return GaugeMetricFamily("fak_audit_log_size", "entries in the audit log shared by every tenant "
                                                   "(the tree size signed checkpoints publish)", value=k.audit.size())


def _kernel_families(k: Kernel, tenant: str) -> Iterator[Metric]:
    if k.prefix is not None:
        st = k.prefix.stats_for(k.namespace(tenant))
        yield CounterMetricFamily("fak_prefix_cache_hit_tokens", "prompt tokens matched by prefix-cache lookups "
                                  "(a lookup matches the session's own earlier rows too)", value=st.hit_tokens)
        yield CounterMetricFamily("fak_prefix_cache_miss_tokens", "prompt tokens prefix-cache lookups did not match",
                                  value=st.miss_tokens)
        yield CounterMetricFamily("fak_prefix_cache_served_tokens", "prompt rows copied into sessions from the prefix "
                                  "cache (whole prefill calls; not computed again)", value=st.served_tokens)
        yield CounterMetricFamily("fak_prefix_cache_computed_tokens", "prompt rows sessions bound to the prefix cache "
                                  "prefilled themselves (the cache did not hold them)", value=st.computed_tokens)
        yield CounterMetricFamily("fak_prefix_cache_waits", "lookups that waited for another of the tenant's sessions "
                                  "computing the same prefill calls", value=st.waits)
        yield CounterMetricFamily("fak_prefix_cache_evictions", "prefix-cache nodes evicted by a byte budget",
                                  value=st.evictions)
        yield CounterMetricFamily("fak_prefix_cache_evicted_bytes", "bytes of KV those evictions freed",
                                  value=st.evicted_bytes)
        yield CounterMetricFamily("fak_prefix_cache_expired", "prefix-cache nodes removed by their TTL",
                                  value=st.expired)
        yield GaugeMetricFamily("fak_prefix_cache_bytes", "KV bytes the prefix cache holds", value=st.bytes)
        yield GaugeMetricFamily("fak_prefix_cache_nodes", "nodes of the prefix cache", value=st.nodes)
    pic = k.pic.stats_for(k.namespace(tenant))
    yield CounterMetricFamily("fak_pic_hit_tokens", "prompt tokens served from PIC chunks (approximate; "
                              "recomputed tokens included)", value=pic.hit_tokens)
    yield CounterMetricFamily("fak_pic_lookups", "PIC chunk lookups", value=pic.lookups)
    yield CounterMetricFamily("fak_pic_hits", "PIC chunk lookups that hit", value=pic.hits)
    yield CounterMetricFamily("fak_pic_evictions", "PIC chunks evicted by a byte budget", value=pic.evicted)
    yield CounterMetricFamily("fak_pic_dropped", "PIC chunks dropped by eviction, quarantine, expiry or forget",
                              value=pic.dropped)
    yield GaugeMetricFamily("fak_pic_bytes", "bytes of PIC chunks held", value=pic.bytes)
    loaded = k.loaded_sessions(tenant)
    yield GaugeMetricFamily("fak_sessions_loaded", "sessions whose KV is in memory", value=len(loaded))
    yield GaugeMetricFamily("fak_kv_bytes", "KV bytes allocated by loaded sessions",
                            value=sum(ks.kv_bytes for ks in loaded))
    yield from engine_series(k, tenant)  # the engine loop and the generation queue (api/engine_metrics.py)


def install(app: FastAPI) -> None:
    from fak.api.deps import AUDITOR

    metrics = app.state.metrics = Metrics()
    app.add_middleware(_Middleware, metrics=metrics)
    _subscribe(app, app.state.kernel.events)

    @app.get("/metrics", tags=["health"], response_class=Response,
             responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {}}}})
    def scrape(request: Request, who: Principal = Depends(AUDITOR),  # noqa: B008
               scope: Literal["tenant", "deployment"] = "tenant") -> Response:
        """Prometheus text exposition of the caller tenant's series (role auditor); with
        ``scope=deployment``, every tenant's, labelled (the operator tenant's auditors and admins only)."""
        kernel = request.app.state.kernel
        view: _TenantView | _DeploymentView
        if scope == "deployment":
            if kernel.settings.operator_tenant is None or who.tenant != kernel.settings.operator_tenant:
                raise Forbidden("a deployment-wide scrape is the operator's: only auditor or admin keys of the "
                                "operator tenant (setting operator_tenant, FAK_OPERATOR_TENANT) may ask for it")
            view = _DeploymentView(metrics, kernel)
        else:
            view = _TenantView(metrics, kernel, who.tenant)
        return Response(generate_latest(view), media_type=CONTENT_TYPE_LATEST)


# --- the Kernel's decisions, observed ------------------------------------------------------
def _subscribe(app: object, bus: EventBus) -> None:
    """One typed subscription per counter the Kernel feeds (fak.kernel.events)."""
    bus.subscribe(AdmissionDecided, lambda e: record_verdict(app, e.verdict, tenant=e.tenant))
    bus.subscribe(SpanEvicted, lambda e: record_eviction(app, e.mode, tenant=e.tenant))
    bus.subscribe(ForgetDone, lambda e: record_forget(app, e.seconds, tenant=e.tenant))
    bus.subscribe(TokensDecoded, lambda e: record_decode(app, e.tokens, e.seconds, tenant=e.tenant))
    bus.subscribe(TokensTimed, lambda e: record_token_times(app, e.tokens, e.first_at, e.last_at, tenant=e.tenant))
    bus.subscribe(ToolCallDecided, lambda e: record_tool_call(app, e.verdict, tenant=e.tenant))
    bus.subscribe(LateOutcome, lambda e: record_late(app, e.outcome, tenant=e.tenant))
    bus.subscribe(ApprovalNotified, lambda e: record_approval_webhook(app, e.outcome, tenant=e.tenant))


# --- recorders ----------------------------------------------------------------------------
def _metrics(app: object) -> Metrics | None:
    return getattr(getattr(app, "state", None), "metrics", None)


def _name(value: object) -> str:
    return str(getattr(value, "value", value))


def record_verdict(app: object, kind: object, *, tenant: str) -> None:
    """One admission verdict (``ALLOW | REDACT | QUARANTINE | DENY``, enum or string)."""
    m = _metrics(app)
    if m is not None:
        name = _name(kind).upper()
        m.verdicts.labels(tenant, name if name in VERDICTS else "OTHER").inc()


def record_eviction(app: object, mode: object, *, tenant: str) -> None:
    """One eviction; ``mode`` as the report says it (``EvictMode`` or its value)."""
    m = _metrics(app)
    if m is not None:
        name = _name(mode).lower()
        m.evictions.labels(tenant, name if name in EVICT_MODES else "other").inc()


def record_forget(app: object, seconds: float = 0.0, *, tenant: str) -> None:
    """One completed forget and how long it took."""
    m = _metrics(app)
    if m is not None:
        m.forgets.labels(tenant).inc()
        m.forget_seconds.labels(tenant).observe(seconds)


def record_decode(app: object, tokens: int, seconds: float, *, tenant: str) -> None:
    """``tokens`` generated in ``seconds`` of one generate call (JSON or stream)."""
    m = _metrics(app)
    if m is not None and tokens >= 0 and seconds >= 0:
        m.decode_tokens.labels(tenant).inc(tokens)
        m.decode_seconds.labels(tenant).inc(seconds)


def record_token_times(app: object, tokens: int, first_at: float, last_at: float, *, tenant: str) -> None:
    """One generation of the request being served (``perf_counter`` stamps of its first and
    last token): the request's time to first token (its first generation only) and the
    generation's time per output token. Generations outside this app's requests are not
    timed (no door: an in-process client, another app on the same Kernel)."""
    m, door = _metrics(app), _DOOR.get()
    if m is None or door is None or door.metrics is not m or tokens < 1:
        return
    route = _template(door.scope)
    if not door.first_timed:
        door.first_timed = True
        m.first_token.labels(tenant, route).observe(max(0.0, first_at - door.started))
    if tokens > 1:
        m.per_token.labels(tenant, route).observe(max(0.0, last_at - first_at) / (tokens - 1))


def record_tool_call(app: object, verdict: str, *, tenant: str) -> None:
    """One tool-call authorization (``ALLOW | CONFIRM | DENY``)."""
    m = _metrics(app)
    if m is not None:
        m.tool_calls.labels(tenant, verdict if verdict in CALL_VERDICTS else "other").inc()


def record_late(app: object, outcome: str, *, tenant: str) -> None:
    """One late-detector job's end (``fired | error | dropped``)."""
    m = _metrics(app)
    if m is not None:
        m.late.labels(tenant, outcome if outcome in LATE_OUTCOMES else "other").inc()


def record_approval_webhook(app: object, outcome: str, *, tenant: str) -> None:
    """One approvals-webhook notice's end (``delivered | refused | failed | dropped``)."""
    m = _metrics(app)
    if m is not None:
        m.approval_webhooks.labels(tenant, outcome if outcome in WEBHOOK_OUTCOMES else "other").inc()
