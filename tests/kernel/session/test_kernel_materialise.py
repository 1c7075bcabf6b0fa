"""Materialisation: one working set, every verdict with its reason, and a context
that afterwards is bit-exact to a fresh replay of what it holds."""

from __future__ import annotations

import shutil

import pytest
from support.kernel_facade_helpers import CLEAN, LOUNGE, POISON, WEATHER, events

from fak import Kernel, WorkingSet
from fak.errors import InvalidInput
from fak.kernel.facade import default_policy_path

GATE = b"Gate change: LH123 now departs from gate B44, boarding at 13:35."
BIG = b"Timetable: " + b"LH400 Frankfurt-New York 10:15; " * 40
EXTRA = b"Baggage: one checked bag of 23 kg is included in the fare."


def _table(result) -> list[tuple[str, str]]:  # noqa: ANN001
    return [(p.verdict.value, p.reason) for p in result.pieces]


def test_materialise_verdicts(kernel) -> None:
    k = kernel
    s = k.session("acme")
    s.append("system", "You are a travel assistant.")
    s.append("user", "Plan my trip.")
    hit = s.admit("flight_status", CLEAN).ref  # stays, nothing before it changes: HIT
    dropped = s.admit("lounge", LOUNGE).ref  # not in the working set: evicted
    moved = s.admit("weather", WEATHER).ref  # stays, but after the evicted span: RECOMPUTE
    quarantined = s.admit("web_search", POISON).ref
    elsewhere_s = k.session("acme")
    elsewhere_s.append("system", "Another conversation.")
    elsewhere = elsewhere_s.admit("gate_info", GATE).ref  # live in another session: RECOMPUTE
    paged = k.session("acme")
    paged.append("system", "A third conversation.")
    seg = paged.admit("baggage", EXTRA)
    paged.evict(seg.segment.id)  # no KV of it anywhere now: FAULT
    cold = seg.ref
    big = elsewhere_s.admit("timetable", BIG).ref
    forgotten = elsewhere_s.admit("tmp", b"A result that will be forgotten.").ref
    k.forget("acme", forgotten)
    unknown = "blake3k:" + "ab" * 32
    budget = 600  # tokens: room for the four small pieces (~100 each), not for BIG (~1300) as well
    ws = WorkingSet(refs=[hit, moved, elsewhere, cold, quarantined, forgotten, unknown, "tag:nothing", big],
                    budget_tokens=budget)  # fmt: skip
    result = s.materialise(ws)
    assert _table(result) == [
        ("HIT", "live"),
        ("RECOMPUTE", "upstream_evicted"),
        ("RECOMPUTE", "position_changed"),
        ("FAULT", "paged_in"),
        ("REFUSE", "quarantined"),
        ("REFUSE", "forgotten"),
        ("ABSTAIN", "unknown_ref"),
        ("ABSTAIN", "unknown_tag"),
        ("REFUSE", "over_budget"),
    ]
    assert all(p.exact for p in result.pieces if p.verdict.value in ("HIT", "RECOMPUTE", "FAULT"))
    live_tools = [x["ref"] for x in s.ledger() if x["kind"] == "tool" and x["state"] == "live"]
    assert live_tools == [hit, moved, elsewhere, cold]  # exactly the placed pieces, in order
    assert dropped not in s.refs() and result.evicted
    assert sum(p.tokens for p in result.pieces) <= budget
    assert s.fingerprint() == result.fingerprint == s.replay_fingerprint()
    (ev,) = events(k, "materialisation")
    assert [(p.verdict, p.reason) for p in ev.pieces] == _table(result)
    assert ev.session_id == s.id and ev.fingerprint_after == k.audit_fingerprint("acme", result.fingerprint)
    assert ev.fingerprint_after.startswith("blake3k:") and result.fingerprint not in ev.model_dump_json()
    assert ev.evicted == result.evicted and not events(k, "eviction")[1:]  # one event: the paged evict only
    # the same working set again: everything placed is a HIT now
    again = s.materialise(WorkingSet(refs=[hit, moved, elsewhere, cold]))
    assert _table(again) == [("HIT", "live")] * 4 and not again.evicted


def test_prefix_cache_serves_a_piece(kernel) -> None:
    first = kernel.session("acme")
    first.append("system", "You are a travel assistant.")
    ref = first.admit("flight_status", CLEAN).ref
    second = kernel.session("acme")
    second.append("system", "You are a travel assistant.")
    result = second.materialise({"refs": [ref]})
    assert _table(result) == [("HIT", "prefix_cache")]
    assert second.fingerprint() == first.fingerprint() == second.replay_fingerprint()
    # the other tenant's cache is not this tenant's: same bytes, no hit
    third = kernel.session("globex")
    third.append("system", "You are a travel assistant.")
    assert _table(third.materialise({"refs": [ref]})) == [("ABSTAIN", "unknown_ref")]


def test_policy_drift_and_mismatch(tmp_path, settings, tiny_lm) -> None:
    policy = tmp_path / "policy.yaml"
    shutil.copy(default_policy_path(), policy)
    settings.policy_path = policy
    with Kernel.open(settings, model=tiny_lm, progress=None) as k:
        s = k.session("acme")
        s.append("system", "You are a travel assistant.")
        ok = s.admit("flight_status", CLEAN).ref
        blocked = s.admit("lounge_info", LOUNGE).ref
        text = policy.read_text().replace("name: default", "name: default-v2")
        text = text.replace("  tools:\n", "  tools:\n    - name: lounge_info\n      max_bytes: 16\n")
        policy.write_text(text)
        k.reload_policy(principal="ops")
        result = s.materialise({"refs": [ok, blocked]})
        assert _table(result) == [("RECOMPUTE", "policy_drift"), ("REFUSE", "policy_refused")]
        assert s.fingerprint() == s.replay_fingerprint()
        assert [e.policy_id for e in events(k, "policy_loaded")] == ["default", "default-v2"]
        planned = s.materialise({"refs": [ok], "model_id": "gguf:some-other-model"})
        assert _table(planned) == [("ABSTAIN", "model_mismatch")]
        with pytest.raises(InvalidInput):
            s.materialise({"refs": ["not-a-digest"]})
