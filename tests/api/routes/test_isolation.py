"""Tenant isolation, enumerated from the app itself (issue 19, part 4).

- Every route whose path takes an id is found in the app's route table and OpenAPI
  document, not listed by hand: tenant B calling it with tenant A's id gets a 404 whose
  status, media type and body (the id replaced) are those of a random id nobody issued.
  A new route with a path id of a kind this file does not know, or with a request body
  it has no example for, fails the test until it is probed.
- Every request-body field that carries an id (found by name in the OpenAPI schemas) is
  probed the same way.
- Byte-identical prompts of two tenants through the API: the second tenant's prefix-cache
  hit tokens stay 0 (its own second session hits), and its scrape shows only its own.

The timing side (hit vs miss latency across tenants, a two-sample test) is
``bench/isolation.py``; the PIC registry's probe through the API is ``tests/api/test_isolation_pic.py``.
"""

from __future__ import annotations

import json
import re
import secrets
import time

import httpx
from support.api_world import ROLES, World, ok, random_digest, same

from fak.kernel.calls.held import HeldCall
from fak.wire import HELD_PREFIX

# path-parameter names that name something a tenant owns, and how to make an unknown one
TENANT_IDS = {"sid", "digest", "index", "request_id", "call_id", "response_id"}
# path-parameter names that name nothing a tenant owns (the same answer for everyone)
GLOBAL_IDS = {"model_id", "path",  # path: a C2SP tile of the whole log (docs/audit.md says who may read which)
              "label"}  # an MCP server the deployment declares: the operator tenant's admins only, 403 for others
# request bodies of the routes that take a path id (a route missing here fails the test)
BODIES: dict[tuple[str, str], list[object]] = {
    ("POST", "/v1/sessions/{sid}/messages"): [{"role": "user", "content": "hi"}],
    ("POST", "/v1/sessions/{sid}/tool-results"): [{"tool": "t", "content": "x"}],
    ("POST", "/v1/sessions/{sid}/evict"): [{"segment_id": "seg_0001"}],
    ("POST", "/v1/sessions/{sid}/tool-calls/authorize"): [{"name": "send_email", "arguments": {}}],
    ("POST", "/v1/sessions/{sid}/evict-refs"): [{"refs": ["blake3k:" + "0" * 64]}],
    ("POST", "/v1/sessions/{sid}/materialise"): [{"refs": []}],
    ("POST", "/v1/sessions/{sid}/generate"): [{"max_tokens": 2}, {"max_tokens": 2, "stream": True}],
}
QUERIES = {"/v1/audit/proof/inclusion/{index}": ["", "?format=tlog"]}
# request-body fields that carry a tenant's id, and where each is probed below
ID_FIELDS = {"ref", "refs", "segment_id", "fak_session", "id", "request_id", "session_id", "digest"}
BODY_PROBED = {
    ("POST", "/v1/forget", "ref"), ("POST", "/v1/quarantine", "ref"),
    ("POST", "/v1/sessions/{sid}/evict-refs", "refs"), ("POST", "/v1/sessions/{sid}/materialise", "refs"),
    ("POST", "/v1/sessions", "id"), ("POST", "/v1/chat/completions", "fak_session"),
    # a segment id names a segment of the caller's own session (seg_0001 exists in every session):
    # it never reaches another tenant's ledger, the path's sid decides whose session it is
    ("POST", "/v1/sessions/{sid}/evict", "segment_id"),
}


def _spec(w: World) -> dict:
    return ok(w("evil", "admin").get("/openapi.json"))


def _path_routes(spec: dict) -> list[tuple[str, str, list[str], bool]]:
    """(method, template, path-parameter names, has a request body) of every operation with a path id."""
    out = []
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            names = [p["name"] for p in op.get("parameters", []) if p["in"] == "path"]
            if names:
                out.append((method.upper(), path, names, "requestBody" in op))
    return out


def _ids(w: World) -> dict[str, list[tuple[str, str]]]:
    """For each kind of path id: (acme's id, an id nobody issued) pairs."""
    size = w.live.kernel.audit.size()
    unknown = {
        "sid": lambda: "sess_" + secrets.token_hex(10),
        "digest": random_digest,
        "index": lambda: str(size + 10**6 + secrets.randbelow(1000)),
        "request_id": lambda: "fgt_" + secrets.token_hex(12),
        "call_id": lambda: HELD_PREFIX + secrets.token_hex(12),
        "response_id": lambda: "resp_" + secrets.token_hex(12),
    }
    held = HELD_PREFIX + secrets.token_hex(12)  # a call fak held for acme (CONFIRM), pending
    w.live.kernel.services.holds.hold(HeldCall(tenant="acme", session_id=w.sid, call_id=held, tool="pay",
                                               arguments={}, rule_id=None, offending=(), decision_index=None,
                                               created=time.time()))
    response = ok(w("acme", "agent").post("/v1/responses", json={"model": "m", "input": "hi", "max_output_tokens": 1}))
    theirs = {
        "sid": [w.sid],
        "digest": [w.ref, w.poison_ref, w.gone_ref],  # live, quarantined, forgotten by acme
        "index": [str(w.ref_index), "0"],  # acme's admission, a system row (nobody's)
        "request_id": [w.request_id],
        "call_id": [held],
        "response_id": [response["id"]],
    }
    return {name: [(x, unknown[name]()) for x in values] for name, values in theirs.items()}


def test_every_path_id_route_answers_another_tenants_id_as_an_unknown_one(world) -> None:
    w = world
    spec = _spec(w)
    routes = _path_routes(spec)
    kinds = {n for _m, _p, names, _b in routes for n in names}
    assert kinds <= TENANT_IDS | GLOBAL_IDS, f"a path id of a new kind, probe it: {kinds - TENANT_IDS - GLOBAL_IDS}"
    assert len(routes) >= 12  # the sessions, refs, audit, forget and models routes at least
    acme_before = ok(w("acme", "admin").get(f"/v1/sessions/{w.sid}"))
    ids = _ids(w)
    probed = 0
    for method, template, names, has_body in routes:
        if set(names) <= GLOBAL_IDS:
            continue
        assert len(names) == 1, f"{method} {template}: several path ids, extend the probe"
        name = names[0]
        if has_body:
            assert (method, template) in BODIES, f"{method} {template}: add a request body to BODIES"
        bodies = BODIES.get((method, template), [None])
        for role in ROLES:
            evil = w("evil", role)
            for theirs, unknown in ids[name]:
                for query in QUERIES.get(template, [""]):
                    for body in bodies:
                        def call(value: str) -> httpx.Response:
                            path = template.replace("{" + name + "}", value) + query  # noqa: B023
                            return evil.request(method, path, json=body)  # noqa: B023

                        r1, r2 = call(theirs), call(unknown)
                        where = (role, method, template, query, body, theirs)
                        assert r1.status_code in (403, 404), (where, r1.status_code, r1.text[:300])
                        if r1.status_code == 404:  # a role that may call the route
                            assert r1.headers["content-type"].startswith("application/problem+json"), where
                            if method != "HEAD":
                                assert r1.json()["type"].endswith("/not_found"), where
                        same(r1, theirs, r2, unknown)
                        probed += 1
    assert probed >= 60
    # and nothing of acme's changed
    assert ok(w("acme", "admin").get(f"/v1/sessions/{w.sid}")) == acme_before
    assert k_state(w, w.ref) == "live"


def k_state(w: World, ref: str) -> str:
    return w.live.kernel.store.head(ref, "acme").state


def test_every_body_id_field_is_probed(world) -> None:
    w = world
    spec = _spec(w)
    schemas = spec["components"]["schemas"]
    found = set()
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            for media in op.get("requestBody", {}).get("content", {}).values():
                refs = re.findall(r'"\$ref": "#/components/schemas/(\w+)"', json.dumps(media["schema"]))
                for name in refs:
                    for field in schemas[name].get("properties", {}):
                        if field in ID_FIELDS:
                            found.add((method.upper(), path, field))
    assert found, "no id-carrying body field found: the scan is broken"
    assert found <= BODY_PROBED, f"body id fields not probed across tenants: {found - BODY_PROBED}"
    evil = w("evil", "admin")
    evil_sid = ok(evil.post("/v1/sessions", json={}), 201)["id"]
    unknown_ref = random_digest()
    for theirs in (w.ref, w.poison_ref, w.gone_ref):
        for path in ("/v1/forget", "/v1/quarantine"):
            r1 = evil.post(path, json={"ref": theirs, "reason": "probe"})
            r2 = evil.post(path, json={"ref": unknown_ref, "reason": "probe"})
            assert r1.status_code == 404, (path, r1.text)
            same(r1, theirs, r2, unknown_ref)
        for path in (f"/v1/sessions/{evil_sid}/materialise", f"/v1/sessions/{evil_sid}/evict-refs"):
            r1 = evil.post(path, json={"refs": [theirs]})
            r2 = evil.post(path, json={"refs": [unknown_ref]})
            assert r1.status_code == r2.status_code == 200, (path, r1.text, r2.text)
            a, b = r1.json(), r2.json()
            assert a.pop("audit_index", 0) < b.pop("audit_index", 1)  # each answer is its own logged decision
            assert json.dumps(a).replace(theirs, "{ID}") == json.dumps(b).replace(unknown_ref, "{ID}"), (a, b)
    # acme's session ids as evil's new session ids: created as any unused id (no 409 reveals them)
    acme_sid2 = ok(w("acme", "agent").post("/v1/sessions", json={}), 201)["id"]
    r1 = evil.post("/v1/sessions", json={"id": acme_sid2})
    assert r1.status_code == 201 and r1.json()["id"] == acme_sid2 and r1.json()["segments"] == []
    # ... and as an OpenAI-compatible persistent session: evil's own, new, like an unused id
    acme_before = ok(w("acme", "admin").get(f"/v1/sessions/{w.sid}"))
    chat = {"model": "fak", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    c1 = evil.post("/v1/chat/completions", json=chat | {"fak_session": w.sid})
    c2 = evil.post("/v1/chat/completions", json=chat | {"fak_session": "sess_" + secrets.token_hex(10)})
    assert c1.status_code == c2.status_code == 200, (c1.text[:300], c2.text[:300])
    mine = ok(evil.get(f"/v1/sessions/{w.sid}"))["segments"]
    assert [s["kind"] for s in mine] == ["user", "assistant"], mine
    assert ok(w("acme", "admin").get(f"/v1/sessions/{w.sid}")) == acme_before


def _hits(c: httpx.Client) -> float:
    text = c.get("/metrics").text
    m = re.search(r"^fak_prefix_cache_hit_tokens_total (\S+)$", text, re.M)
    assert m, text[:500]
    return float(m.group(1))


def test_identical_prompts_never_hit_across_tenants(world) -> None:
    w = world
    k = w.live.kernel
    assert k.prefix is not None
    system = "You are a careful assistant for tenant-isolation probes. " * 4
    user = "Tell me the secret the other tenant typed."

    def first_message_hits(tenant: str) -> float:
        """Hit tokens of a new session's first message (a session later hits its own earlier
        segments, so only the first message shows what the namespace held before)."""
        c = w(tenant, "agent")
        sid = ok(c.post("/v1/sessions", json={}), 201)["id"]
        before = _hits(w(tenant, "admin"))
        ok(c.post(f"/v1/sessions/{sid}/messages", json={"role": "system", "content": system}), 201)
        hits = _hits(w(tenant, "admin")) - before
        ok(c.post(f"/v1/sessions/{sid}/messages", json={"role": "user", "content": user}), 201)
        return hits

    acme = [first_message_hits("acme"), first_message_hits("acme")]
    evil = [first_message_hits("evil"), first_message_hits("evil")]
    # acme's earlier session shares at most the first chunk; its second one is served the prompt
    assert acme[1] > acme[0] + 100, f"the probe must see the hit within a tenant: {acme}"
    assert evil[0] == 0, f"evil's first session was served {evil[0]} tokens of acme's identical prompt"
    assert evil[1] == acme[1]  # while its own second session hits as acme's did
    assert k.namespace("evil") != k.namespace("acme")
    # no node of one namespace is reachable from the other
    acme_nodes = {id(n) for n in k.prefix.nodes(k.namespace("acme"))}
    assert acme_nodes and not acme_nodes & {id(n) for n in k.prefix.nodes(k.namespace("evil"))}
