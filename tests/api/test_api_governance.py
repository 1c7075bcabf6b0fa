"""Tool-call authorization and its remedy through the front door: the REST routes over a
real uvicorn server (``live_server``), the HTTP SDK, and ``local()``; the same answers in
both modes, and the roles and tenants the rest of the API enforces."""

from __future__ import annotations

import pytest
from support.governance import INJECTION, POLICY

from fak.sdk import Client, FakAPIError, local


@pytest.fixture(autouse=True)
def _one_master_secret(monkeypatch, tmp_path):
    monkeypatch.setenv("FAK_MASTER_SECRET", "cd" * 32)  # both kernels derive the same refs:
    monkeypatch.setenv("FAK_CAS_KEY_URL", f"sqlite:///{tmp_path / 'shared-cas-keys.db'}")  # one tenant digest key


@pytest.fixture
def settings(tmp_path, tiny_dir):
    from fak import Settings

    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    return Settings(data_dir=tmp_path / "data", model_path=tiny_dir, chunk_size=16, policy_path=policy)


def _flow(c) -> dict:  # noqa: ANN001 - Client or LocalClient
    s = c.create_session("gov")
    s.append("system", "You are a billing assistant.")
    s.append("user", "Summarise my invoices.")
    out: dict = {"admitted": s.admit("web_fetch", INJECTION, source="https://pastebin.example.net/raw/x1")}
    out["trusted_page"] = s.admit("web_fetch", b"Release notes: 4.2 ships Monday.", source="https://docs.example.com/")
    s.generate(max_tokens=4, min_tokens=4)
    out["deny"] = s.authorize_tool_call("send_email", {"to": "billing-archive@example.net"})
    out["confirm_json_string"] = s.authorize_tool_call("transfer_money", '{"amount": 12.5}')
    out["evicted"] = s.evict_refs(out["deny"].offending)
    out["allow"] = s.authorize_tool_call("send_email", {"to": "me@example.com"})
    out["confirm"] = s.authorize_tool_call("transfer_money", {"amount": 1})
    out["info"] = s.info()
    return out


def _same(a, b) -> bool:  # noqa: ANN001
    drop = ("audit_index", "audit_indexes", "seconds")
    return ({k: v for k, v in a.model_dump().items() if k not in drop}
            == {k: v for k, v in b.model_dump().items() if k not in drop})


def test_authorize_and_remedy_over_http_and_locally(live_server, tmp_path, tiny_dir, tiny_lm):
    from fak import Kernel, Settings

    with Client(live_server.url, live_server.key("acme", "agent"), trust_env=False, timeout=60) as c:
        http = _flow(c)
    d = http["deny"]
    assert (d.verdict, d.rule_id, d.offending) == ("DENY", "no-untrusted-before-send", [http["admitted"].ref])
    assert d.attention_refs == 2  # the page from the trusted host is in attention and offends nothing
    assert http["confirm_json_string"].verdict == "DENY"
    assert len(http["evicted"].segment_ids) == 2 and http["evicted"].exactness == "bit-exact"
    assert (http["allow"].verdict, http["allow"].attention_refs) == ("ALLOW", 1)
    assert http["confirm"].verdict == "CONFIRM" and http["confirm"].rule_id == "payments-need-a-person"
    assert http["info"].fingerprint == http["evicted"].fingerprint
    text = live_server.client(live_server.key("acme", "auditor")).get("/metrics").text
    counted = {v: f'fak_tool_call_decisions_total{{verdict="{v}"}} {n}.0' for v, n in
               (("DENY", 2), ("ALLOW", 1), ("CONFIRM", 1))}
    assert all(line in text for line in counted.values()), text

    policy = tmp_path / "local-policy.yaml"
    policy.write_text(POLICY)
    k = Kernel.open(Settings(data_dir=tmp_path / "local", model_path=tiny_dir, chunk_size=16, policy_path=policy),
                    model=tiny_lm, progress=None)
    try:
        with local(kernel=k, tenant="acme") as fak:
            here = _flow(fak)
    finally:
        k.close()
    for name in http:
        assert type(http[name]) is type(here[name]), name
        assert _same(http[name], here[name]), name


def test_roles_tenants_and_bad_bodies(live_server):
    agent = live_server.client(live_server.key("acme", "agent"))
    sid = agent.post("/v1/sessions", json={}).json()["id"]
    url = f"/v1/sessions/{sid}/tool-calls/authorize"
    ok = agent.post(url, json={"name": "send_email", "arguments": {"to": "x@example.com"}})
    assert ok.status_code == 200 and ok.json()["verdict"] == "ALLOW"

    auditor = live_server.client(live_server.key("acme", "auditor"))
    assert auditor.post(url, json={"name": "send_email"}).status_code == 403
    other = live_server.client(live_server.key("globex", "agent"))
    assert other.post(url, json={"name": "send_email"}).status_code == 404  # as an unknown session
    assert other.post(f"/v1/sessions/{sid}/evict-refs", json={"refs": ["blake3k:" + "0" * 64]}).status_code == 404

    for body in ({"name": ""}, {"arguments": {}}, {"name": "x", "extra": 1}, {"name": "x" * 129}):
        r = agent.post(url, json=body)
        assert r.status_code in (400, 422) and r.headers["content-type"].startswith("application/problem+json")
    r = agent.post(f"/v1/sessions/{sid}/evict-refs", json={"refs": ["not-a-digest"]})
    assert r.status_code in (400, 422)
    nothing = agent.post(f"/v1/sessions/{sid}/evict-refs", json={"refs": ["blake3k:" + "0" * 64]})
    assert nothing.status_code == 200 and nothing.json()["segment_ids"] == []


def test_sdk_raises_problems(live_server):
    with Client(live_server.url, live_server.key("acme", "auditor"), trust_env=False) as c:
        with pytest.raises(FakAPIError) as e:
            c.session("nope").authorize_tool_call("send_email")
        assert e.value.status in (403, 404)
