"""The REST API against a real uvicorn server on 127.0.0.1 (``live_server``): every
route, every role, a cross-tenant probe for every id a route takes, problem+json
shapes, body limits, bad inputs, and a client that walks away from an SSE stream."""

from __future__ import annotations

import json
import re
import secrets
import socket
import time
from pathlib import Path

import httpx
import pytest
from fastapi.routing import iter_route_contexts
from support.api_world import ROLES, World, ok, random_digest, same
from support.kernel_facade_helpers import CLEAN, WEATHER

from fak.api.server import serve
from fak.audit import merkle, note
from fak.audit.checkpoint import open_checkpoint
from fak.audit.proofs import InclusionProof, verify_tlog_proof
from fak.audit.receipt import verify_receipt
from fak.kernel.facade import default_policy_path

PROBLEM = "application/problem+json"
TYPES = "https://fak.dev/problems/"
AGENT, READER, AUDITOR, ADMIN = {"agent", "admin"}, set(ROLES), {"auditor", "admin"}, {"admin"}  # R: an approver too
PUBLIC = {"/healthz"}
# FastAPI's generated description (behind a key) and its viewers (off): see docs/api.md
FASTAPI_DOCS = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}


def assert_problem(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, (r.status_code, r.text[:500])
    assert r.headers["content-type"].split(";")[0] == PROBLEM, r.headers["content-type"]
    body = r.json()
    assert body["type"].startswith(TYPES) and re.fullmatch(r"[a-z][a-z0-9_]*", body["type"][len(TYPES):])
    assert body["status"] == status
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["detail"], str) and body["detail"]
    if code is not None:
        assert body["type"] == TYPES + code, body
    return body



# --- authentication: /healthz is the only route that answers without a key ------------------
def _routes(app) -> list[tuple[str, str, object]]:  # noqa: ANN001
    """The API's routes. The console's pages (/console, a cookie session rather than a key)
    have their own role matrix and table: tests/api/console/test_console.py, docs/api.md "Console routes".
    The MCP gateway (/mcp) speaks MCP, not REST: its keys and roles (401, an auditor's 403, another
    tenant's session 404) are witnessed in tests/api/test_mcp_gateway.py."""
    out = []
    for rc in iter_route_contexts(app.routes):
        if (rc.path_format or rc.path).startswith("/console") or (rc.path_format or rc.path) == "/mcp":
            continue
        for method in sorted(rc.methods or ()):
            out.append((method, rc.path_format or rc.path, rc.endpoint))
    return out


def _fill(template: str) -> str:
    values = {"sid": "sess_0123456789abcdef0123", "digest": random_digest(), "index": "1",
              "request_id": "fgt_0123456789abcdef01234567"}
    return re.sub(r"\{(\w+)(?::\w+)?\}", lambda m: values.get(m.group(1), "x"), template)


def test_only_healthz_answers_without_a_key(live_server) -> None:
    live = live_server
    admin_key = live.key("acme", "admin")
    revoked = live.key("acme", "admin")
    live.app.state.keys.revoke(revoked.split("_")[1])
    well_formed_unknown = "fak_" + secrets.token_hex(8) + "_" + secrets.token_urlsafe(32)
    routes = _routes(live.app)
    paths = {p for _m, p, _e in routes}
    assert paths >= PUBLIC and {"/metrics", "/v1/audit/export", "/v1/policy", "/v1/refs/{digest}"} <= paths
    public = set()
    with live.client() as anon:
        for method, template, _endpoint in routes:
            url = _fill(template)
            for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"Bearer {well_formed_unknown}"},
                            {"X-API-Key": revoked}, {"Authorization": f"Bearer {revoked}"},
                            {"Authorization": f"Basic {admin_key}"}):
                r = anon.request(method, url, headers=headers)
                if r.status_code != 401:
                    public.add(template)
                    assert r.status_code < 400, (method, url, headers, r.status_code)
                    continue
                assert r.headers.get("www-authenticate") == "Bearer"
                if method != "HEAD":
                    assert_problem(r, 401, "unauthorized")
            assert template in public or template not in PUBLIC
    assert public == PUBLIC, public  # /openapi.json too needs a key; /docs and /redoc are off
    with live.client(admin_key) as c:  # the same requests with a valid key get past authentication
        assert c.get("/v1/sessions").status_code == 200


# --- roles -------------------------------------------------------------------------------------
def _matrix(w: World) -> list[tuple[str, str, set[str], object]]:
    """(method, path, roles allowed, body or role -> body)."""
    sid = w.sid
    policy_text = w.live.kernel.policy_path.read_text()
    victims = {role: ok(w("acme", "agent").post(f"/v1/sessions/{sid}/tool-results",
                                                json={"tool": "weather", "content": f"{role}: dry"}), 201)
               for role in AGENT}  # one live segment for each role that may evict
    short = {"model": "m", "input": "hi", "max_output_tokens": 1}
    kept = {role: ok(w("acme", "agent").post("/v1/responses", json=short))["id"] for role in (*AGENT, "read")}
    return [
        ("POST", "/v1/responses", AGENT, short | {"store": False}),
        ("GET", f"/v1/responses/{kept['read']}", READER, None),
        ("DELETE", ("/v1/responses/{response_id}", lambda role: f"/v1/responses/{kept.get(role, kept['read'])}"),
         AGENT, None),  # a response of its own for each role that may delete (a second delete is a 404)
        ("POST", "/v1/sessions", AGENT, {}),
        ("GET", "/v1/sessions", READER, None),
        ("GET", f"/v1/sessions/{sid}", READER, None),
        ("POST", f"/v1/sessions/{sid}/messages", AGENT, {"role": "user", "content": "and the gate?"}),
        ("POST", f"/v1/sessions/{sid}/tool-results", AGENT, {"tool": "weather", "content": WEATHER.decode()}),
        ("POST", f"/v1/sessions/{sid}/evict", AGENT, lambda role: {"segment_id": victims[role]["segment"]["id"]}
         if role in victims else {"segment_id": w.ref_segment}),
        ("POST", f"/v1/sessions/{sid}/materialise", AGENT, {"refs": [w.ref]}),
        ("POST", f"/v1/sessions/{sid}/generate", AGENT, {"max_tokens": 2}),
        ("POST", f"/v1/sessions/{sid}/tool-calls/authorize", AGENT, {"name": "send_email", "arguments": {}}),
        ("POST", f"/v1/sessions/{sid}/evict-refs", AGENT, {"refs": ["blake3k:" + "0" * 64]}),
        ("POST", "/v1/forget", ADMIN, {"ref": w.gone_ref}),
        ("GET", f"/v1/forget/{w.request_id}", AUDITOR, None),
        ("POST", "/v1/quarantine", AGENT, {"ref": w.poison_ref, "reason": "late"}),
        ("GET", "/v1/audit/entries", AUDITOR, None),
        ("GET", "/v1/audit/checkpoint", AUDITOR, None),
        ("GET", f"/v1/audit/proof/inclusion/{w.ref_index}", AUDITOR, None),
        ("GET", "/v1/audit/proof/consistency?first=1", AUDITOR, None),
        ("GET", "/v1/audit/export", AUDITOR, None),
        ("POST", "/v1/audit/receipts/verify", READER, w.receipt),
        ("GET", "/v1/audit/log/checkpoint", AUDITOR, None),  # tlog-tiles (tests/audit/test_audit_tiles.py)
        ("GET", ("/v1/audit/log/tile/{path}", lambda role: "/v1/audit/log/tile/0/000.p/1"), AUDITOR, None),
        ("GET", "/v1/policy", READER, None),
        ("POST", "/v1/policy/validate", READER, {"text": policy_text}),
        ("PUT", "/v1/policy", ADMIN, {"text": policy_text}),
        ("HEAD", f"/v1/refs/{w.ref}", READER, None),
        ("GET", f"/v1/refs/{w.ref}", AGENT, None),  # tool-result bytes: not for auditors
        ("GET", "/metrics", AUDITOR, None),
        ("GET", "/v1/mcp/servers", ADMIN, None),  # the operator tenant's (tests/api/test_api_mcp_servers.py)
        ("POST", ("/v1/mcp/servers/{label}/approve", lambda role: "/v1/mcp/servers/mail/approve"), ADMIN, {}),
    ]


def _template(path: str | tuple[str, object], w: World) -> str:
    if isinstance(path, tuple):  # (template, role -> path)
        return path[0]
    path = path.split("?")[0]
    path = re.sub(r"/v1/responses/resp_[0-9a-f]+", "/v1/responses/{response_id}", path)
    for value, name in ((w.sid, "{sid}"), (w.ref, "{digest}"), (w.request_id, "{request_id}"),
                        (f"/{w.ref_index}", "/{index}")):
        path = path.replace(value, name)
    return path


def test_role_matrix(world) -> None:
    w = world
    matrix = _matrix(w)
    covered = {(m, _template(p, w)) for m, p, _r, _b in matrix}
    ours = {(m, p) for m, p, e in _routes(w.live.app)
            if p not in PUBLIC | FASTAPI_DOCS and getattr(e, "__module__", "") != "fak.api.routes.openai"}
    assert covered == ours, ("routes without a role-matrix row", ours - covered, covered - ours)
    for method, path, allowed, body in matrix:
        for role in ROLES:
            url = path[1](role) if isinstance(path, tuple) else path
            r = w("acme", role).request(method, url, json=body(role) if callable(body) else body)
            if role in allowed:
                assert r.status_code not in (401, 403) and r.status_code < 500, (method, path, role, r.text[:300])
                assert r.status_code < 300, (method, path, role, r.status_code, r.text[:300])
            elif method == "HEAD":
                assert r.status_code == 403
            else:
                body403 = assert_problem(r, 403, "forbidden")
                assert role in body403["detail"]


def test_evicting_an_unknown_or_evicted_segment_is_a_client_error(world) -> None:
    w = world
    agent = w("acme", "agent")
    ok(agent.post(f"/v1/sessions/{w.sid}/evict", json={"segment_id": w.ref_segment}))
    for segment in (w.ref_segment, "seg_9999", "../x"):
        r = agent.post(f"/v1/sessions/{w.sid}/evict", json={"segment_id": segment})
        assert 400 <= r.status_code < 500, (segment, r.text)


# --- cross-tenant probes -----------------------------------------------------------------------
def test_cross_tenant_ids_answer_as_unknown_ids(world) -> None:
    w = world
    k = w.live.kernel
    evil = w("evil", "admin")  # every role's routes
    evil_sid = ok(evil.post("/v1/sessions", json={}), 201)["id"]
    acme_before = ok(w("acme", "admin").get(f"/v1/sessions/{w.sid}"))
    size = k.audit.size()
    unknown_sid = "sess_" + secrets.token_hex(10)
    unknown_ref = random_digest()
    unknown_index = str(size + 10**6)
    unknown_request = "fgt_" + secrets.token_hex(12)
    path_probes = [
        ("GET", "/v1/sessions/{}", w.sid, unknown_sid, None),
        ("POST", "/v1/sessions/{}/messages", w.sid, unknown_sid, {"role": "user", "content": "hi"}),
        ("POST", "/v1/sessions/{}/tool-results", w.sid, unknown_sid, {"tool": "t", "content": "x"}),
        ("POST", "/v1/sessions/{}/evict", w.sid, unknown_sid, {"segment_id": w.ref_segment}),
        ("POST", "/v1/sessions/{}/materialise", w.sid, unknown_sid, {"refs": []}),
        ("POST", "/v1/sessions/{}/generate", w.sid, unknown_sid, {"max_tokens": 2}),
        ("POST", "/v1/sessions/{}/generate", w.sid, unknown_sid, {"max_tokens": 2, "stream": True}),
        ("GET", "/v1/refs/{}", w.ref, unknown_ref, None),
        ("HEAD", "/v1/refs/{}", w.ref, unknown_ref, None),
        ("GET", "/v1/refs/{}", w.gone_ref, unknown_ref, None),  # forgotten by acme: still a 404 for evil
        ("GET", "/v1/audit/proof/inclusion/{}", str(w.ref_index), unknown_index, None),
        ("GET", "/v1/audit/proof/inclusion/{}?format=tlog", str(w.ref_index), unknown_index, None),
        ("GET", "/v1/audit/proof/inclusion/{}", "0", unknown_index, None),  # a system row: nobody's
        ("GET", "/v1/forget/{}", w.request_id, unknown_request, None),
    ]
    for method, template, theirs, unknown, body in path_probes:
        r1 = evil.request(method, template.format(theirs), json=body)
        r2 = evil.request(method, template.format(unknown), json=body)
        assert r1.status_code == 404, (method, template, r1.status_code, r1.text)
        same(r1, theirs, r2, unknown)
    body_probes = [
        ("POST", "/v1/forget", lambda ref: {"ref": ref, "reason": "probe"}),
        ("POST", "/v1/quarantine", lambda ref: {"ref": ref, "reason": "probe"}),
    ]
    for theirs in (w.ref, w.poison_ref, w.gone_ref):
        for method, path, make in body_probes:
            r1, r2 = evil.request(method, path, json=make(theirs)), evil.request(method, path, json=make(unknown_ref))
            assert r1.status_code == 404
            same(r1, theirs, r2, unknown_ref)
        # a working set naming another tenant's ref: the same piece verdict as an unknown ref
        p1 = ok(evil.post(f"/v1/sessions/{evil_sid}/materialise", json={"refs": [theirs]}))["pieces"]
        p2 = ok(evil.post(f"/v1/sessions/{evil_sid}/materialise", json={"refs": [unknown_ref]}))["pieces"]
        assert json.dumps(p1).replace(theirs, "{ID}") == json.dumps(p2).replace(unknown_ref, "{ID}")
    # lists and logs hold nothing of acme's
    assert ok(evil.get("/v1/sessions"))["sessions"] == [evil_sid]
    for tenant in ("acme", "evil"):
        rows = ok(w(tenant, "auditor").get("/v1/audit/entries", params={"limit": 1000}))["entries"]
        assert rows and {json.loads(e["event"])["tenant"] for e in rows} == {tenant}
    # and nothing of acme's changed
    assert ok(w("acme", "admin").get(f"/v1/sessions/{w.sid}")) == acme_before
    assert w("acme", "agent").get(f"/v1/refs/{w.ref}").content == CLEAN
    assert k.store.head(w.ref, "acme").state == "live"


# --- audit -------------------------------------------------------------------------------------
def test_audit_entries_checkpoint_and_proofs(world) -> None:
    w = world
    aud = w("acme", "auditor")
    cp = ok(aud.get("/v1/audit/checkpoint"))
    signed = open_checkpoint(cp["checkpoint"], note.Verifier.parse(cp["public_key"]), cp["origin"])
    assert signed.size == cp["size"] >= w.ref_index + 1 and signed.root.hex() == cp["root_hash"]
    # paging through the tenant's rows one at a time gives the same rows as one page
    page, rows, start = None, [], 0
    while True:
        page = ok(aud.get("/v1/audit/entries", params={"start": start, "limit": 1}))
        rows += page["entries"]
        if page["next_start"] is None:
            break
        start = page["next_start"]
    assert rows == ok(aud.get("/v1/audit/entries", params={"limit": 1000}))["entries"]
    for e in rows:
        assert merkle.hash_leaf(e["event"].encode()).hex() == e["leaf_hash"]
    entry = next(e for e in rows if e["index"] == w.ref_index)
    assert json.loads(entry["event"])["ref"] == w.ref
    # inclusion: JSON verifies against the signed note it carries; tlog text verifies too
    inc = ok(aud.get(f"/v1/audit/proof/inclusion/{w.ref_index}"))
    proof = InclusionProof.from_json(inc["proof"])
    proof.verify(bytes.fromhex(entry["leaf_hash"]))
    assert open_checkpoint(proof.checkpoint, note.Verifier.parse(cp["public_key"])).root == proof.root_hash
    text = aud.get(f"/v1/audit/proof/inclusion/{w.ref_index}", params={"format": "tlog"})
    assert text.status_code == 200 and text.headers["content-type"].startswith("text/plain")
    index, _cp = verify_tlog_proof(text.text, cp["public_key"], entry["event"].encode(), cp["origin"])
    assert index == w.ref_index
    # consistency between two signed sizes
    ok(w("acme", "agent").post(f"/v1/sessions/{w.sid}/tool-results", json={"tool": "t", "content": "more"}), 201)
    cp2 = ok(aud.get("/v1/audit/checkpoint"))
    assert cp2["size"] > cp["size"]
    cons = ok(aud.get("/v1/audit/proof/consistency", params={"first": cp["size"], "second": cp2["size"]}))
    assert (cons["oldRootHash"], cons["rootHash"]) == (cp["root_hash"], cp2["root_hash"])
    merkle.verify_consistency(cp["size"], cp2["size"], bytes.fromhex(cp["root_hash"]), bytes.fromhex(cp2["root_hash"]),
                              [bytes.fromhex(h) for h in cons["hashes"]])
    assert ok(aud.get("/v1/audit/proof/consistency", params={"first": 1}))["treeSize"] == w.live.kernel.audit.size()
    for params in ({"first": cp2["size"], "second": cp["size"]}, {"first": 1, "second": 10**9}, {"first": -1},
                   {"first": "x"}, {"first": 10**30}, {}):
        assert_problem(aud.get("/v1/audit/proof/consistency", params=params), 400, "invalid_input")
    for bad in ("-1", "99999999999999999999999", "x", "1.5"):
        assert_problem(aud.get(f"/v1/audit/proof/inclusion/{bad}"), 400, "invalid_input")
    assert_problem(aud.get(f"/v1/audit/proof/inclusion/{w.ref_index}", params={"format": "xml"}), 400)
    for params in ({"limit": 0}, {"limit": 1001}, {"start": -1}, {"start": 2**63}, {"limit": "many"}):
        assert_problem(aud.get("/v1/audit/entries", params=params), 400, "invalid_input")


def test_audit_export_streams_own_rows_with_proofs(world) -> None:
    w = world
    lines = []
    with w("acme", "auditor").stream("GET", "/v1/audit/export") as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        assert "content-length" not in r.headers  # streamed
        lines = [json.loads(line) for line in r.iter_lines() if line]
    head, rows = lines[0], lines[1:]
    assert head["format"] == "fak-tenant-audit-export/v2" and head["tenant"] == "acme"
    cp = open_checkpoint(head["checkpoint"], note.Verifier.parse(head["public_key"]), head["origin"])
    assert (cp.size, cp.root.hex()) == (head["tree_size"], head["root_hash"])
    listed = ok(w("acme", "auditor").get("/v1/audit/entries", params={"limit": 1000}))["entries"]
    assert [e["index"] for e in rows] == [e["index"] for e in listed if e["index"] < cp.size]
    for e in rows:
        assert json.loads(e["event"])["tenant"] == "acme"
        leaf = merkle.hash_leaf(e["event"].encode())
        assert leaf.hex() == e["leaf_hash"]
        merkle.verify_inclusion(e["index"], cp.size, leaf, [bytes.fromhex(h) for h in e["hashes"]], cp.root)
    evil = [json.loads(x) for x in w("evil", "auditor").get("/v1/audit/export").text.splitlines()]
    assert evil[0]["tenant"] == "evil" and all(json.loads(e["event"])["tenant"] == "evil" for e in evil[1:])


def test_receipts_verify_and_forget_routes(world) -> None:
    w = world
    receipt = w.receipt
    key = ok(w("acme", "auditor").get("/v1/audit/checkpoint"))["public_key"]
    assert verify_receipt(receipt, key).ok  # offline, with the pinned key
    for role in ROLES:
        assert ok(w("acme", role).post("/v1/audit/receipts/verify", json=receipt)) == {"ok": True, "reason": ""}
    tampered = dict(receipt, units_dropped=[])
    res = ok(w("acme", "agent").post("/v1/audit/receipts/verify", json=tampered))
    assert res["ok"] is False and "differs" in res["reason"]
    res = ok(w("acme", "agent").post("/v1/audit/receipts/verify", json={}))
    assert res["ok"] is False and res["reason"].startswith("malformed receipt")
    for body in ([], "x", 5):
        assert_problem(w("acme", "agent").post("/v1/audit/receipts/verify", json=body), 400, "invalid_input")
    # the forget routes: the receipt by request id, the same receipt on repeat, the ref gone
    got = ok(w("acme", "auditor").get(f"/v1/forget/{w.request_id}"))
    assert got.pop("state") == "completed" and got.pop("replay") == "verified" and got == receipt
    assert ok(w("acme", "admin").post("/v1/forget", json={"ref": w.gone_ref})) == receipt
    assert_problem(w("acme", "agent").get(f"/v1/refs/{w.gone_ref}"), 410, "forgotten")
    q = ok(w("acme", "agent").post("/v1/quarantine", json={"ref": w.ref, "reason": "late_detection"}))
    assert q["ref"] == w.ref and q["units"]
    seg = next(s for s in ok(w("acme", "agent").get(f"/v1/sessions/{w.sid}"))["segments"] if s["ref"] == w.ref)
    assert seg["state"] != "live"


# --- policy ------------------------------------------------------------------------------------
BAD_POLICY = """apiVersion: fak.dev/v1
kind: Policy
metadata:
  name: broken
spec:
  mode: enforce
  defaults:
    verdict: MAYBE
  surprise: 1
"""


def test_policy_routes(live_server, tmp_path, capsys) -> None:
    from fak.cli import main

    live = live_server
    path = live.kernel.policy_path
    original = path.read_bytes()
    reader, admin = live.client(live.key("acme", "agent")), live.client(live.key("acme", "admin"))
    before = ok(reader.get("/v1/policy"))
    assert before == {"name": "default", "digest": live.kernel.policy.digest, "mode": "enforce"}
    # validate: ok, or the located errors exactly as `fak policy check FILE` prints them
    v = ok(reader.post("/v1/policy/validate", json={"text": original.decode()}))
    assert v == {"ok": True, "name": "default", "digest": before["digest"]}
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text(BAD_POLICY)
    assert main(["policy", "check", str(candidate)]) == 1
    printed = capsys.readouterr().err.strip().splitlines()
    body = assert_problem(reader.post("/v1/policy/validate", json={"text": BAD_POLICY, "source": str(candidate)}),
                          400, "policy_invalid")
    assert body["errors"] == printed and len(printed) >= 2 and all(re.match(r".+:\d+:\d+: ", e) for e in printed)
    body = assert_problem(reader.post("/v1/policy/validate", json={"text": "a: [\n"}), 400, "policy_invalid")
    assert body["errors"][0].startswith("policy.yaml:")
    for bad in ({"text": 5}, {"text": "x" * ((1 << 20) + 1)}, {"text": "ok", "source": "a\nb.yaml"},
                {"text": "ok", "extra": 1}, {}):
        assert_problem(reader.post("/v1/policy/validate", json=bad), 400)
    # replace: admin only; a bad policy changes nothing
    assert_problem(reader.put("/v1/policy", json={"text": original.decode()}), 403, "forbidden")
    other_admin = live.client(live.key("evil", "admin"))  # an admin of a tenant that is not the operator's
    assert "deployment-wide" in assert_problem(other_admin.put("/v1/policy", json={"text": original.decode()}),
                                               403, "forbidden")["detail"]
    body = assert_problem(admin.put("/v1/policy", json={"text": BAD_POLICY}), 400, "policy_invalid")
    assert all(e.startswith(f"{path}:") for e in body["errors"])
    assert path.read_bytes() == original and ok(reader.get("/v1/policy")) == before
    new_text = original.decode().replace("name: default", "name: stricter", 1).replace(
        "verdict: ALLOW", "verdict: QUARANTINE", 1)
    out = ok(admin.put("/v1/policy", json={"text": new_text}))
    assert out["name"] == "stricter" and out["previous_digest"] == before["digest"] != out["digest"]
    assert path.read_text() == new_text and not list(path.parent.glob(f".{path.name}.*"))
    assert ok(reader.get("/v1/policy")) == {"name": "stricter", "digest": out["digest"], "mode": "enforce"}
    assert live.kernel.policy.digest == out["digest"]
    loaded = [json.loads(e.body) for e in live.kernel.audit.entries("")]
    assert any(e["type"] == "policy_loaded" and e["policy_digest"] == out["digest"] and
               e["previous_digest"] == before["digest"] and e["principal"].startswith("key:") for e in loaded)
    # the packaged default is never written over the API
    from fak.api.routes.policy import _check_replaceable
    from fak.errors import Conflict

    with pytest.raises(Conflict):
        _check_replaceable(default_policy_path())
    reader.close()
    admin.close()


# --- refs --------------------------------------------------------------------------------------
def test_refs_head_get(world) -> None:
    w = world
    assert_problem(w("acme", "auditor").get(f"/v1/refs/{w.ref}"), 403, "forbidden")  # audit rows, not content
    c = w("acme", "agent")
    r = c.get(f"/v1/refs/{w.ref}")
    assert r.status_code == 200 and r.content == CLEAN
    assert r.headers["content-type"] == "text/plain" and r.headers["etag"] == f'"{w.ref}"'
    assert r.headers["x-content-type-options"] == "nosniff" and r.headers["content-disposition"] == "attachment"
    h = c.head(f"/v1/refs/{w.ref}")
    assert h.status_code == 200 and h.content == b"" and int(h.headers["content-length"]) == len(CLEAN)
    assert h.headers["etag"] == r.headers["etag"]
    assert c.get(f"/v1/refs/{w.ref}", headers={"If-None-Match": r.headers["etag"]}).status_code == 304
    assert c.get(f"/v1/refs/{w.poison_ref}").headers["x-fak-taint"] == "quarantined"
    assert_problem(c.get(f"/v1/refs/{w.gone_ref}"), 410, "forgotten")
    assert c.head(f"/v1/refs/{w.gone_ref}").status_code == 410
    assert_problem(c.get(f"/v1/refs/{random_digest()}"), 404, "not_found")
    assert_problem(w("evil", "admin").get(f"/v1/refs/{w.ref}"), 404, "not_found")
    for bad in ("nope", "blake3k:XYZ", "sha256:" + "0" * 64, "blake3k:" + "0" * 63, "blake3:" + "a" * 300):
        assert_problem(c.get(f"/v1/refs/{bad}"), 400, "invalid_digest")
    assert c.head("/v1/refs/nope").status_code == 400


# --- metrics -----------------------------------------------------------------------------------
def test_metrics_by_route_template_and_tenant_only(world) -> None:
    from fak.api import metrics

    w = world
    app = w.live.app
    ok(w("acme", "agent").get(f"/v1/sessions/{w.sid}"))
    series = ('fak_admission_verdicts_total{kind="QUARANTINE"}', 'fak_evictions_total{mode="recompute"}',
              "fak_forgets_total", "fak_decode_tokens_total", 'fak_admission_verdicts_total{kind="ALLOW"}')

    def values(text: str) -> dict[str, float]:  # the world's real decisions are counted too: compare deltas
        out = dict.fromkeys(series, 0.0)
        for line in text.splitlines():
            name, _, value = line.rpartition(" ")
            if name in out:
                out[name] = float(value)
        return out

    before = values(w("acme", "auditor").get("/metrics").text)
    metrics.record_verdict(app, "QUARANTINE", tenant="acme")
    metrics.record_eviction(app, "recompute", tenant="acme")
    metrics.record_forget(app, tenant="acme")
    metrics.record_decode(app, 40, 2.0, tenant="acme")
    metrics.record_verdict(app, "ALLOW", tenant="evil")
    r = w("acme", "auditor").get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert 'fak_http_requests_total{method="GET",route="/v1/sessions/{sid}",status="200"}' in text
    assert 'fak_http_request_duration_seconds_bucket{le="0.5",method="GET",route="/v1/sessions/{sid}"}' in text
    assert w.sid not in text and w.ref not in text and "tenant=" not in text  # templates, no ids, no tenants
    after = values(text)
    assert {k: after[k] - before[k] for k in series} == dict(zip(series, (1.0, 1.0, 1.0, 40.0, 0.0), strict=True))
    assert "fak_decode_tokens_per_second" in text and "fak_sessions_loaded" in text
    for name in ("fak_prefix_cache_hit_tokens_total", "fak_prefix_cache_miss_tokens_total", "fak_prefix_cache_bytes",
                 "fak_prefix_cache_evictions_total", "fak_kv_bytes", "fak_audit_log_size",
                 "fak_pic_hit_tokens_total", "fak_pic_lookups_total", "fak_pic_bytes"):
        assert re.search(rf"^{name} \d", text, re.M), name
    evil = w("evil", "auditor").get("/metrics").text
    assert "/v1/sessions/{sid}" not in evil and 'kind="ALLOW"}' in evil and "fak_sessions_loaded 0.0" in evil
    assert "fak_forgets_total" not in evil.replace("# HELP fak_forgets_total", "").replace("# TYPE fak_forgets_total", "")


def test_metrics_deployment_scope_is_the_operators_alone(world) -> None:
    """``/metrics?scope=deployment``: every tenant's series labelled with its tenant, for the
    operator tenant's auditor or admin keys; anyone else's key (another tenant's admin
    included) gets a 403, and a plain scrape stays the caller's own."""
    from fak.api import metrics

    w = world
    metrics.record_verdict(w.live.app, "DENY", tenant="evil")
    ok(w("acme", "agent").get(f"/v1/sessions/{w.sid}"))
    for role in ("auditor", "admin"):
        r = w("acme", role).get("/metrics", params={"scope": "deployment"})
        assert r.status_code == 200, r.text
        text = r.text
        assert re.search(r'^fak_admission_verdicts_total\{kind="DENY",tenant="evil"\} [1-9]', text, re.M)
        assert re.search(r'^fak_http_requests_total\{method="GET",route="/v1/sessions/\{sid\}",status="200",'
                         r'tenant="acme"\}', text, re.M)
        assert re.search(r'^fak_sessions_loaded\{tenant="acme"\} \d', text, re.M)
        assert re.search(r"^fak_audit_log_size [1-9]", text, re.M)  # one log: no tenant label
        assert w.sid not in text
    for tenant, role in (("evil", "admin"), ("evil", "auditor"), ("acme", "agent")):
        r = w(tenant, role).get("/metrics", params={"scope": "deployment"})
        assert r.status_code == 403, (tenant, role, r.status_code)
    assert "tenant=" not in w("acme", "auditor").get("/metrics").text
    assert w("acme", "auditor").get("/metrics", params={"scope": "everyone"}).status_code == 400


def test_metrics_time_to_first_token_and_per_output_token(world) -> None:
    """Served generations, JSON and streamed, are timed at the door: one time-to-first-token
    observation per request (from its start), one time-per-output-token per generation of
    more than one token; by route template, the caller's tenant only."""
    w = world
    route = "/v1/sessions/{sid}/generate"

    def series(text: str, name: str) -> tuple[float, float]:
        count = re.search(rf'^{name}_count{{route="{re.escape(route)}"}} (\S+)$', text, re.M)
        total = re.search(rf'^{name}_sum{{route="{re.escape(route)}"}} (\S+)$', text, re.M)
        return (float(count.group(1)), float(total.group(1))) if count and total else (0.0, 0.0)

    def scrape() -> dict[str, tuple[float, float]]:
        text = w("acme", "auditor").get("/metrics").text
        return {n: series(text, n) for n in ("fak_time_to_first_token_seconds", "fak_time_per_output_token_seconds")}

    before = scrape()
    t0 = time.perf_counter()
    gen = ok(w("acme", "agent").post(f"/v1/sessions/{w.sid}/generate", json={"max_tokens": 4, "min_tokens": 4}))
    assert len(gen["tokens"]) == 4
    with w("acme", "agent").stream("POST", f"/v1/sessions/{w.sid}/generate",
                                   json={"max_tokens": 5, "min_tokens": 5, "stream": True}) as r:
        tokens = [line for line in r.iter_lines() if line.startswith("data:") and '"token"' in line]
    elapsed = time.perf_counter() - t0
    assert len(tokens) == 5
    after = scrape()
    (ttft_n, ttft_s), (tpot_n, tpot_s) = ((after[n][0] - before[n][0], after[n][1] - before[n][1])
                                          for n in ("fak_time_to_first_token_seconds",
                                                    "fak_time_per_output_token_seconds"))
    assert ttft_n == 2 and tpot_n == 2  # one request each, one generation each
    assert 0 < ttft_s < elapsed and 0 < tpot_s < elapsed
    evil = w("evil", "auditor").get("/metrics").text
    assert "fak_time_to_first_token_seconds_count" not in evil  # acme's generations are acme's


# --- problem shapes, limits, bad inputs --------------------------------------------------------
def test_problem_shapes_and_bad_inputs_are_400_not_500(world) -> None:
    w = world
    agent, admin = w("acme", "agent"), w("acme", "admin")
    sid = w.sid
    cases = [
        (agent, "POST", "/v1/sessions", {"id": "x" * 65}, 400),
        (agent, "POST", "/v1/sessions", {"id": "../etc"}, 400),
        (agent, "POST", "/v1/sessions", {"id": sid}, 409),
        (agent, "GET", "/v1/sessions/" + "y" * 65, None, 400),
        (agent, "GET", "/v1/sessions/%00", None, 400),
        (agent, "POST", f"/v1/sessions/{sid}/messages", {"role": "user", "content": 5}, 400),
        (agent, "POST", f"/v1/sessions/{sid}/messages", {"role": "assistant", "content": "x"}, 400),
        (agent, "POST", f"/v1/sessions/{sid}/messages", {"role": "user", "content": "x" * ((1 << 20) + 1)}, 400),
        (agent, "POST", f"/v1/sessions/{sid}/tool-results", {"tool": "t", "content_b64": "!!"}, 400),
        (agent, "POST", f"/v1/sessions/{sid}/tool-results", {"tool": "t", "content": "a", "content_b64": "YQ=="}, 400),
        (agent, "POST", f"/v1/sessions/{sid}/tool-results", {"tool": "", "content": "a"}, 400),
        (agent, "POST", f"/v1/sessions/{sid}/tool-results", {"tool": "t", "content": "a", "tags": ["a b"]}, 400),
        (agent, "POST", f"/v1/sessions/{sid}/evict", {"segment_id": "seg_0001", "mode": "shred"}, 400),
        (agent, "POST", f"/v1/sessions/{sid}/materialise", {"refs": ["nope"]}, 400),
        (agent, "POST", f"/v1/sessions/{sid}/materialise", {"refs": "x", "budget_tokens": -1}, 400),
        (agent, "POST", f"/v1/sessions/{sid}/generate", {"max_tokens": 10**30}, 400),
        (agent, "POST", f"/v1/sessions/{sid}/generate", {"max_tokens": -1}, 400),
        (agent, "POST", f"/v1/sessions/{sid}/generate", {"temperature": "hot"}, 400),
        (agent, "POST", f"/v1/sessions/{sid}/generate", {"seed": 2**64}, 400),
        (admin, "POST", "/v1/forget", {"ref": "zzz"}, 400),
        (admin, "POST", "/v1/forget", {"ref": w.ref, "reason": "has spaces!"}, 400),
        (agent, "POST", "/v1/quarantine", {"ref": w.ref}, 400),
        (admin, "GET", "/v1/forget/" + "z" * 300, None, 404),
        (agent, "GET", "/v1/nope", None, 404),
        (agent, "DELETE", "/v1/policy", None, 405),
    ]
    for client, method, path, body, status in cases:
        r = client.request(method, path, json=body)
        assert_problem(r, status)
    raw = [
        (b"{not json", "application/json"),
        (b'{"id": "a"' + b"[" * 5000, "application/json"),
        (b"\xff\xfe\x00", "application/json"),
        (b'{"id": "a"}', "text/plain"),
    ]
    for content, media in raw:
        r = agent.post("/v1/sessions", content=content, headers={"Content-Type": media})
        assert 400 <= r.status_code < 500 and r.headers["content-type"].startswith(PROBLEM), (content[:20], r.text)
    # a bad query string on every GET route that takes one
    for path in ("/v1/audit/entries?start=1e3", "/v1/audit/proof/consistency?first=&second=",
                 "/v1/audit/entries?limit=" + "9" * 5000):
        assert_problem(admin.get(path), 400)


def test_body_limit_413(live_server) -> None:
    from fak.api.app import MAX_BODY

    live = live_server
    key = live.key("acme", "agent")
    # the declared length alone is refused, before a byte of the body is read
    with socket.create_connection(("127.0.0.1", live.port), timeout=10) as s:
        s.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + key.encode() +
                  b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1))
        s.shutdown(socket.SHUT_WR)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(65536)
            if not chunk:
                break
            head += chunk
    assert head.startswith(b"HTTP/1.1 413 "), head[:200]
    assert b"application/problem+json" in head
    with serve(live.kernel, max_body=1024) as small, small.client(small.key("acme", "agent")) as c:
        r = c.post("/v1/sessions", content=b" " * 2048, headers={"Content-Type": "application/json"})
        assert_problem(r, 413, "request_too_large")
        assert c.post("/v1/sessions", json={}).status_code == 201


def test_streamed_body_over_the_limit_is_413(kernel) -> None:
    with serve(kernel, max_body=1024) as small, small.client(small.key("acme", "agent")) as c:
        def chunks():  # chunked transfer: no declared length
            for _ in range(8):
                yield b" " * 512

        r = c.post("/v1/sessions", content=chunks(), headers={"Content-Type": "application/json"})
        assert_problem(r, 413)


# --- sessions routes and a client that leaves an SSE stream ------------------------------------
def test_session_routes(world) -> None:
    w = world
    agent = w("acme", "agent")
    sid = ok(agent.post("/v1/sessions", json={"id": "trip-42"}), 201)["id"]
    assert sid == "trip-42" and "trip-42" in ok(w("acme", "auditor").get("/v1/sessions"))["sessions"]
    ok(agent.post(f"/v1/sessions/{sid}/messages", json={"role": "system", "content": "Be brief."}), 201)
    a = ok(agent.post(f"/v1/sessions/{sid}/tool-results", json={"tool": "weather", "content": WEATHER.decode()}), 201)
    # (not LOUNGE: the world forgot its ref, and forgotten bytes sent again are refused)
    b = ok(agent.post(f"/v1/sessions/{sid}/tool-results",
                      json={"tool": "flight_status", "content_b64": __import__("base64").b64encode(CLEAN).decode()}), 201)
    assert a["verdict"] == b["verdict"] == "ALLOW"
    ev = ok(agent.post(f"/v1/sessions/{sid}/evict", json={"segment_id": a["segment"]["id"], "mode": "recompute"}))
    assert ev["exactness"] == "bit-exact" and ev["segment_id"] == a["segment"]["id"]
    mat = ok(agent.post(f"/v1/sessions/{sid}/materialise", json={"refs": [a["ref"], b["ref"]]}))
    assert {p["verdict"] for p in mat["pieces"]} <= {"HIT", "FAULT", "RECOMPUTE"}
    ok(agent.post(f"/v1/sessions/{sid}/messages", json={"role": "user", "content": "Weather?"}), 201)
    gen = ok(agent.post(f"/v1/sessions/{sid}/generate", json={"max_tokens": 4, "min_tokens": 4}))
    assert len(gen["tokens"]) == 4 and gen["segment"]["kind"] == "assistant"
    got = ok(w("acme", "auditor").get(f"/v1/sessions/{sid}"))
    assert got["fingerprint"] == gen["fingerprint"] and got["segments"][-1] == gen["segment"]
    with agent.stream("POST", f"/v1/sessions/{sid}/generate", json={"max_tokens": 3, "min_tokens": 3,
                                                                      "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line.startswith(("data:", "event:"))]
    assert sum(e.startswith("data:") for e in events) == 4 and events[-2] == "event: done"


def test_client_leaving_an_sse_stream_leaves_the_session_consistent(world) -> None:
    w = world
    sid = w.sid
    before = ok(w("acme", "auditor").get(f"/v1/sessions/{sid}"))
    with w.live.client(w.keys["acme", "agent"]) as c, c.stream(
        "POST", f"/v1/sessions/{sid}/generate", json={"max_tokens": 3000, "min_tokens": 3000, "stream": True}
    ) as r:
        assert r.status_code == 200
        first = next(line for line in r.iter_lines() if line.startswith("data:"))
        assert "token" in json.loads(first[5:])
    # the connection is closed mid-stream: the partial turn is rolled back, the session released
    deadline = time.monotonic() + 20
    while True:
        now = w("acme", "auditor").get(f"/v1/sessions/{sid}", timeout=30)
        if now.status_code == 200 and now.json() == before:
            break
        assert time.monotonic() < deadline, ("session did not return to its state", now.status_code, now.text[:300])
        time.sleep(0.05)
    gen = ok(w("acme", "agent").post(f"/v1/sessions/{sid}/generate", json={"max_tokens": 3, "min_tokens": 3}))
    after = ok(w("acme", "auditor").get(f"/v1/sessions/{sid}"))
    assert after["segments"][:-1] == before["segments"] and after["segments"][-1] == gen["segment"]
    assert len(gen["tokens"]) == 3


# --- docs/api.md says what the server does ------------------------------------------------------
DOCS_API = Path(__file__).resolve().parents[3] / "docs" / "api.md"
DOC_ROLES = {"none": set(), "R": READER, "A": AGENT, "U": AUDITOR, "admin": ADMIN,
             "admin of the operator tenant": ADMIN}


def _documented_routes() -> dict[tuple[str, str], set[str]]:
    """The rows of docs/api.md's "Routes and roles" table: (method, path) -> roles allowed."""
    rows = re.findall(r"^\| `([A-Z]+) (/[^`]*)` \| ([^|]+?) \|", DOCS_API.read_text(), re.M)
    return {(method, path): DOC_ROLES[role] for method, path, role in rows}


def test_api_docs_name_every_route_with_the_roles_the_server_enforces(world) -> None:
    w = world
    documented = _documented_routes()
    enforced = {(m, _template(p, w)): allowed for m, p, allowed, _b in _matrix(w)}
    enforced |= {("GET", path): set() for path in PUBLIC}
    assert documented == enforced, (
        "docs/api.md's route table disagrees with the server",
        {k: (documented.get(k), enforced.get(k)) for k in documented.keys() | enforced.keys()
         if documented.get(k) != enforced.get(k)})


def test_api_docs_say_only_healthz_answers_without_a_key() -> None:
    """Every paragraph of docs/api.md that says routes answer without a key names no route
    but /healthz (test_only_healthz_answers_without_a_key checks that the server agrees)."""
    for paragraph in re.split(r"\n\s*\n", DOCS_API.read_text()):
        if re.search(r"(answers?|served|open) without (a|an API) key", paragraph):
            named = set(re.findall(r"`(?:GET |HEAD )?(/[^`\s]*)`", paragraph))
            assert named <= PUBLIC, (paragraph, named - PUBLIC)
