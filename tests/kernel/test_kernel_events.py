"""Typed Kernel events (fak.kernel.events): each kind the Kernel publishes reaches a subscriber
of its type through the real decisions (tiny model, a real judge on loopback for the late one),
a subscriber that raises never fails the decision, and no string-keyed ``_notify`` is left."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from support.kernel_facade_helpers import CLEAN, WEATHER, events
from support.late_models import POLITE, JudgeStub, open_late_kernel

from fak import Kernel
from fak import wire as w
from fak.kernel import operations as ops
from fak.kernel.events import (
    EVENT_TYPES,
    AdmissionDecided,
    EventBus,
    ForgetDone,
    KernelEvent,
    LateOutcome,
    SpanEvicted,
    TokensDecoded,
    TokensTimed,
    ToolCallDecided,
)
from fak.kernel.session.caller import Caller

ROOT = Path(__file__).resolve().parents[2]

def test_every_event_type_reaches_its_typed_subscriber(tmp_path: Path, tiny_dir: Path, tiny_lm,
                                                       judge_stub: JudgeStub) -> None:
    k = open_late_kernel(tmp_path, tiny_dir, tiny_lm, judge_stub.url)
    try:
        heard: dict[type[KernelEvent], list[KernelEvent]] = {t: [] for t in EVENT_TYPES}
        k.events.subscribe(KernelEvent, lambda e: 1 / 0)  # first in line, and it always fails
        for t in EVENT_TYPES:
            k.events.subscribe(t, heard[t].append)
        s = k.session("acme")
        s.append("system", "You are a billing assistant.")
        s.append("user", "Summarise my invoices.")
        kept = s.admit("weather", WEATHER)  # trusted: never judged
        s.admit("web_fetch", POLITE)  # the gate allows it; the judge fires later
        assert k.wait_late(20)
        list(s.generate(max_tokens=3, min_tokens=3))
        ops.generate(k, Caller("acme", "test"), s.id, w.GenerateIn(max_tokens=2, min_tokens=2))  # the API's
        s.authorize_tool_call("send_email", {"to": "x@example.net"})
        s.evict(kept.segment.id, "recompute")
        k.forget("acme", kept.ref)

        assert {t for t, got in heard.items() if got} == set(EVENT_TYPES)  # every kind published, heard
        for t, got in heard.items():
            assert all(type(e) is t and e.tenant == "acme" for e in got), t
        assert [e.verdict for e in heard[AdmissionDecided]] == ["ALLOW", "ALLOW"]  # type: ignore[attr-defined]
        assert [e.outcome for e in heard[LateOutcome]] == ["fired"]  # type: ignore[attr-defined]
        assert [e.tokens for e in heard[TokensDecoded]] == [3, 2]  # type: ignore[attr-defined]
        timed = heard[TokensTimed]
        assert [e.tokens for e in timed] == [2] and timed[0].first_at < timed[0].last_at  # type: ignore[attr-defined]
        assert [e.verdict for e in heard[ToolCallDecided]] == ["ALLOW"]  # type: ignore[attr-defined]  # unlisted
        assert "recompute" in [e.mode for e in heard[SpanEvicted]]  # type: ignore[attr-defined]
        assert len(heard[ForgetDone]) == 1
    finally:
        k.close()


def test_a_raising_subscriber_does_not_fail_an_admission(kernel: Kernel, caplog: pytest.LogCaptureFixture) -> None:
    after: list[AdmissionDecided] = []

    def broken(event: AdmissionDecided) -> None:
        raise RuntimeError("metrics backend down")

    kernel.events.subscribe(AdmissionDecided, broken)
    kernel.events.subscribe(AdmissionDecided, after.append)
    s = kernel.session("acme")
    s.append("user", "Is my flight on time?")
    with caplog.at_level(logging.ERROR, logger="fak.events"):
        a = s.admit("flight_status", CLEAN)
    assert a.verdict.kind == "ALLOW" and a.segment.live and a.ref in s.refs()
    assert len(events(kernel, "admission_verdict")) == 1  # decided, recorded once
    assert [e.verdict for e in after] == ["ALLOW"]  # the next subscriber still heard it
    assert any("metrics backend down" in (r.exc_text or "") or r.exc_info for r in caplog.records)


def test_bus_delivers_by_type() -> None:
    bus = EventBus()
    all_, decoded, evicted = [], [], []
    bus.subscribe(KernelEvent, all_.append)
    bus.subscribe(TokensDecoded, decoded.append)
    bus.subscribe(SpanEvicted, evicted.append)
    bus.publish(TokensDecoded("acme", 4, 0.5))
    bus.publish(ForgetDone("acme"))
    assert decoded == [TokensDecoded("acme", 4, 0.5)] and evicted == []
    assert [type(e) for e in all_] == [TokensDecoded, ForgetDone]  # a base-type subscriber hears every kind
    with pytest.raises(TypeError, match="KernelEvent"):
        bus.subscribe(str, print)  # type: ignore[type-var]
    with pytest.raises(AttributeError):
        ForgetDone("acme").tenant = "evil"  # type: ignore[misc]  # frozen


def test_no_string_keyed_notify_is_left() -> None:
    hits = [f"{p.relative_to(ROOT)}:{n}" for d in ("fak", "api") for p in sorted((ROOT / d).rglob("*.py"))
            for n, line in enumerate(p.read_text().splitlines(), 1)
            if re.search(r"(?<!pg)_notify", line)]  # PostgreSQL's pg_notify is another thing (kernel/withdrawal/replicas.py)
    assert hits == []


def test_metrics_count_each_event_type() -> None:
    """api/metrics subscribes per type: each published kind moves its (unchanged) series."""
    from types import SimpleNamespace

    from fastapi import FastAPI

    from fak.api import metrics
    from fak.policy.schema import VerdictKind

    bus = EventBus()
    app = FastAPI()
    app.state.kernel = SimpleNamespace(events=bus)  # install() only subscribes to the kernel's bus
    metrics.install(app)
    for e in (AdmissionDecided("acme", VerdictKind.QUARANTINE), SpanEvicted("acme", "rerope"), ForgetDone("acme"),
              TokensDecoded("acme", 7, 0.5), ToolCallDecided("acme", "CONFIRM"), LateOutcome("acme", "dropped"),
              LateOutcome("acme", "fired"), TokensTimed("acme", 3, 1.0, 1.2)):
        bus.publish(e)
    reg = app.state.metrics.registry
    assert reg.get_sample_value("fak_admission_verdicts_total", {"tenant": "acme", "kind": "QUARANTINE"}) == 1
    assert reg.get_sample_value("fak_evictions_total", {"tenant": "acme", "mode": "rerope"}) == 1
    assert reg.get_sample_value("fak_forgets_total", {"tenant": "acme"}) == 1
    assert reg.get_sample_value("fak_decode_tokens_total", {"tenant": "acme"}) == 7
    assert reg.get_sample_value("fak_decode_seconds_total", {"tenant": "acme"}) == 0.5
    assert reg.get_sample_value("fak_tool_call_decisions_total", {"tenant": "acme", "verdict": "CONFIRM"}) == 1
    for outcome in ("dropped", "fired"):
        assert reg.get_sample_value("fak_late_detections_total", {"tenant": "acme", "outcome": outcome}) == 1
    # token times are a served request's (they are read from its start): none outside a request
    assert not [s for f in reg.collect() if f.name.startswith("fak_time_") for s in f.samples]
