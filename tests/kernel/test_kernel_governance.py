"""Governance beyond detection (issue 15): tool-call authorization from the attention
provenance with an exact remedy, and expiry of refs in seconds or model turns. Every
test here fails without its capability: the injection below passes the gate (nothing
detects it), and only provenance or a lifetime removes it."""

from __future__ import annotations

import time

import pytest
from support.governance import INJECTION, POLICY
from support.kernel_facade_helpers import WEATHER, events

from fak import Kernel, Settings
from fak.kernel.kv.ledger import SegmentKind
from fak.kernel.kv.session import Session
from fak.state.store import now_us

OTP = b"Your one-time sign-in code is 482913. It is valid for ten minutes."
VAULT = b"db password for the reporting replica: Hx9-qq2-Lm4 (rotate monthly)"


@pytest.fixture
def gov(tmp_path, tiny_dir, tiny_lm):
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    settings = Settings(data_dir=tmp_path / "data", model_path=tiny_dir, chunk_size=16, policy_path=policy)
    k = Kernel.open(settings, model=tiny_lm, progress=None)
    yield k
    k.close()


def _never_saw(k: Kernel, ks) -> str:  # noqa: ANN001
    """An independent session that prefilled only the survivors' tokens (no prefix cache)."""
    fresh = Session(k.model, k.tokenizer, tenant=ks.tenant, chunk_size=k.settings.chunk_size)
    for seg in ks._loaded().ledger.live():
        fresh.append(seg.kind, tokens=seg.tokens, chunks=seg.chunks)
    return fresh.fingerprint()


def test_tool_call_denied_while_untrusted_in_attention(gov) -> None:
    k = gov
    s = k.session("acme")
    s.append("system", "You are a billing assistant.")
    s.append("user", "Summarise my invoices.")
    admitted = s.admit("web_fetch", INJECTION)
    assert admitted.verdict.kind == "ALLOW"  # the gate saw nothing: the floor must hold anyway
    (adm_event,) = events(k, "admission_verdict")
    assert (adm_event.trust, adm_event.audited, adm_event.exempted) == ("untrusted", ["watch-invoices"], [])
    list(s.generate(max_tokens=6, min_tokens=6))  # the model's turn, produced with the injection in attention

    d = s.authorize_tool_call("send_email", {"to": "billing-archive@example.net", "body": "invoices"})
    assert d.verdict == "DENY" and d.rule_id == "no-untrusted-before-send"
    assert d.offending == (admitted.ref,) and d.attention_refs == 1
    assert s.authorize_tool_call("transfer_money", '{"amount": 10}').verdict == "DENY"  # most restrictive wins
    assert s.authorize_tool_call("get_weather", {}).verdict == "ALLOW"  # unlisted
    shell = s.authorize_tool_call("shell_run", {"cmd": "ls"})
    assert shell.verdict == "ALLOW" and shell.audited == ("watch-shell",)  # an audit rule reports, decides nothing

    logged = events(k, "tool_call_decision")
    assert [e.verdict for e in logged] == ["DENY", "DENY", "ALLOW", "ALLOW"]
    assert logged[0].offending == [admitted.ref] and logged[0].rule_id == "no-untrusted-before-send"
    assert logged[0].args_digest.startswith("blake3k:") and logged[3].audited == ["watch-shell"]
    assert all("billing-archive" not in e.model_dump_json() for e in logged)  # arguments never in the log
    assert d.audit_index == k.audit.size() - 4

    # the remedy: evict the offending span and the turn it caused, exactly; then ask again
    removed = s.evict_refs(d.offending)
    assert len(removed.segment_ids) == 2 and removed.exactness == "bit-exact"
    kinds = [(x["kind"], x["state"]) for x in s.ledger()]
    assert kinds == [("system", "live"), ("user", "live"), ("tool", "evicted"), ("assistant", "evicted")]
    again = s.authorize_tool_call("send_email", {"to": "me@example.com"})
    assert again.verdict == "ALLOW" and again.offending == () and again.attention_refs == 0
    assert s.authorize_tool_call("transfer_money", {}).verdict == "CONFIRM"  # the rule without a condition

    never = k.session("acme")
    never.append("system", "You are a billing assistant.")
    never.append("user", "Summarise my invoices.")
    assert s.fingerprint() == never.fingerprint() == _never_saw(k, s)
    assert [e.reason for e in events(k, "eviction")] == ["tool_call", "tool_call"]


def test_trust_comes_from_the_producing_tool(gov) -> None:
    """A trusted tool's ref in attention does not block; an untrusted one's does, wherever it sits."""
    k = gov
    s = k.session("acme")
    s.append("user", "weather, then mail it")
    s.admit("weather", WEATHER)
    assert s.authorize_tool_call("send_email", {}).verdict == "ALLOW"
    bad = s.admit("web_fetch", INJECTION).ref
    s.append("user", "go on")
    d = s.authorize_tool_call("send_email", {})
    assert d.verdict == "DENY" and d.offending == (bad,)
    s.evict_refs([bad], drop_generated=False)  # the later user turn is recomputed without it
    assert s.authorize_tool_call("send_email", {}).verdict == "ALLOW"
    assert s.fingerprint() == _never_saw(k, s)


def test_trust_follows_the_source_host_as_the_gate_judged_it(gov) -> None:
    """One tool, two sources: a page from a host the operator trusts does not block a send;
    the same tool's page from anywhere else does (and a restart keeps the source)."""
    k = gov
    s = k.session("acme")
    ours = s.admit("web_fetch", b"Release notes: version 4.2 ships on Monday.", source="https://docs.example.com/rn")
    assert ours.verdict.trust == "trusted"
    assert s.authorize_tool_call("send_email", {}).verdict == "ALLOW"
    theirs = s.admit("web_fetch", INJECTION, source="https://pastebin.example.net/raw/x1")
    d = s.authorize_tool_call("send_email", {})
    assert d.verdict == "DENY" and d.offending == (theirs.ref,)
    k.services.producers.clear()  # from the state database now, as after a restart
    s._attention_cache = None
    assert s.authorize_tool_call("send_email", {}).offending == (theirs.ref,)
    assert k.state.ref("acme", ours.ref).source == "https://docs.example.com/rn"


def test_audit_mode_policy_reports_what_it_would_do(tmp_path, tiny_dir, tiny_lm) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.replace("spec:\n", "spec:\n  mode: audit\n", 1))
    k = Kernel.open(Settings(data_dir=tmp_path / "d", model_path=tiny_dir, chunk_size=16, policy_path=policy),
                    model=tiny_lm, progress=None)
    try:
        s = k.session("acme")
        s.admit("web_fetch", INJECTION)
        d = s.authorize_tool_call("send_email", {})
        assert (d.verdict, d.enforced, d.would_be) == ("ALLOW", False, "DENY")
        assert events(k, "tool_call_decision")[-1].would_be == "DENY"
    finally:
        k.close()


def test_bad_tool_call_input_is_refused(gov) -> None:
    from fak.errors import InvalidInput

    s = gov.session("acme")
    with pytest.raises(InvalidInput):
        s.authorize_tool_call("", {})
    with pytest.raises(InvalidInput):
        s.authorize_tool_call("send_email", {"x": float("nan")})
    assert events(gov, "tool_call_decision") == []


def test_expired_ref_is_evicted_everywhere(gov) -> None:
    """A lifetime in seconds: at expiry the ref leaves every session of the tenant exactly,
    materialisation REFUSEs it, and one event records it; admitting the bytes again starts anew."""
    k = gov
    a, b = k.session("acme"), k.session("acme")
    a.append("system", "You are an ops assistant.")
    ref = a.admit("vault", VAULT).ref
    a.append("user", "Connect to the replica.")
    b.admit("weather", WEATHER)
    b.admit("vault", VAULT)
    other = k.session("globex")
    other.admit("weather", VAULT)  # the same bytes in another tenant, from a tool without a short lifetime
    assert k.expire_due() == []  # nothing is due yet

    reports = k.expire_due(now_us() + 3601 * 1_000_000)
    assert [r.ref for r in reports] == [ref]
    assert {u.session_id for u in reports[0].units if u.kind == "segment"} == {a.id, b.id}
    (event,) = events(k, "ref_expired")
    assert event.ref == ref and event.cause == "seconds" and len(event.units) == 2
    for ks in (a, b):
        assert [x["state"] for x in ks.ledger() if x["kind"] == "tool" and x["ref"] == ref] == ["expired"]
        assert ks.fingerprint() == _never_saw(k, ks)
    assert [x["state"] for x in other.ledger()] == ["live"]

    result = a.materialise({"refs": [ref]})
    assert [(p.verdict, p.reason) for p in result.pieces] == [("REFUSE", "expired")]
    assert k.expire_due(now_us() + 3602 * 1_000_000) == []  # executed once

    again = a.admit("vault", VAULT)  # new evidence, new lifetime
    assert again.admitted and again.ref == ref
    assert a.materialise({"refs": [ref]}).pieces[0].verdict == "HIT"


def test_expiry_sweeper_runs_on_its_own(tmp_path, tiny_dir, tiny_lm) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.replace("expires: {seconds: 3600}", "expires: {seconds: 1}"))
    settings = Settings(data_dir=tmp_path / "d", model_path=tiny_dir, chunk_size=16, policy_path=policy,
                        expiry_sweep_s=0.05)
    k = Kernel.open(settings, model=tiny_lm, progress=None)
    try:
        s = k.session("acme")
        s.admit("vault", VAULT)
        s.append("user", "thanks")
        deadline = time.monotonic() + 10
        while s.ledger()[0]["state"] == "live" and time.monotonic() < deadline:
            time.sleep(0.05)  # reading the ledger takes the session's lock, as any use does
        assert [e.cause for e in events(k, "ref_expired")] == ["seconds"]
        assert [x["state"] for x in s.ledger()] == ["expired", "live"]
        assert s.fingerprint() == _never_saw(k, s)
    finally:
        k.close()


def test_ref_expires_after_its_turns_even_across_a_restart(tmp_path, tiny_dir, tiny_lm) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    settings = Settings(data_dir=tmp_path / "d", model_path=tiny_dir, chunk_size=16, policy_path=policy)
    with Kernel.open(settings, model=tiny_lm, progress=None) as k:
        s = k.session("acme", None)
        sid = s.id
        s.append("user", "What is my sign-in code?")
        otp = s.admit("otp_inbox", OTP)
        ref = otp.ref
        assert otp.admitted and events(k, "admission_verdict")[-1].exempted == ["otp-tool"]
        assert s.authorize_tool_call("send_email", {}).attention_refs == 1  # visible before its turn
    with Kernel.open(settings, model=tiny_lm, progress=None) as k:
        s = k.session("acme", sid)
        list(s.generate(max_tokens=4, min_tokens=4))  # its one turn: the model may use it
        assert [x["state"] for x in s.ledger() if x["kind"] == "tool"] == ["expired"]  # the next use evicts
        (event,) = events(k, "ref_expired")
        assert event.ref == ref and event.cause == "turns"
        assert s.fingerprint() == _never_saw(k, s)
        kinds = [x["kind"] for x in s.ledger() if x["state"] == "live"]
        assert kinds == ["user", "assistant"]


def test_quarantine_of_a_busy_session_applies_before_its_next_use(gov) -> None:
    """A late decision does not wait for a generation being consumed; the session applies it
    the moment it is next used, before anything else, and ends bit-exact to never-saw."""
    k = gov
    s = k.session("acme")
    s.append("user", "Summarise my invoices.")
    ref = s.admit("web_fetch", INJECTION).ref
    s.append("user", "and be brief")
    stream = s.generate(max_tokens=4, min_tokens=4)
    next(stream)  # the session is busy now
    report = k.quarantine("acme", ref, reason="late_test", principal="detector:test")
    assert report.pending == [s.id] and [u for u in report.units if u.kind == "segment"] == []
    list(stream)  # the generation finishes with what was in attention when it started
    assert s.authorize_tool_call("send_email", {}).verdict == "ALLOW"  # settled first
    states = [(x["kind"], x["state"]) for x in s.ledger()]
    assert states[1] == ("tool", "quarantined") and all(st == "live" for kd, st in states if kd != "tool")
    assert s.fingerprint() == _never_saw(k, s)
    assert sum(1 for x in s._loaded().ledger.live() if x.kind is SegmentKind.TOOL) == 0


def test_a_session_executes_its_own_tenant_s_expiries_only(tmp_path, tiny_dir, tiny_lm) -> None:
    """Before it uses attention a session executes its tenant's due expiries; another tenant's
    wait for their own use or the sweeper, so they never cost this tenant's requests."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.replace("expires: {seconds: 3600}", "expires: {seconds: 1}"))
    settings = Settings(data_dir=tmp_path / "d", model_path=tiny_dir, chunk_size=16, policy_path=policy,
                        expiry_sweep_s=3600)  # no sweep during the test
    with Kernel.open(settings, model=tiny_lm, progress=None) as k:
        acme, globex = k.session("acme"), k.session("globex")
        acme.admit("vault", VAULT)
        globex.admit("vault", VAULT)
        time.sleep(1.2)
        acme.append("user", "connect")
        assert [x["state"] for x in acme.ledger()] == ["expired", "live"]
        assert [x["state"] for x in globex.ledger()] == ["live"]  # not yet: its tenant has not used it
        globex.append("user", "connect")
        assert [x["state"] for x in globex.ledger()] == ["expired", "live"]
        assert sorted(e.tenant for e in events(k, "ref_expired")) == ["acme", "globex"]
