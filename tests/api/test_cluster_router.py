"""The replicated deployment's routing rules (fak.api.cluster.rules), without Ray: which
requests name a session, which are placed by prefix score, the affinity cache, the choice
among scores, and /metrics merged across replicas."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fak.api.cluster.rules import (
    AffinityCache,
    Kind,
    Placement,
    Route,
    Score,
    choose,
    classify,
    credential,
    credential_digest,
    elsewhere,
    merge_metrics,
    parse_json,
    place,
    prompt_key,
    prompt_messages,
    response_handle,
)


def test_session_paths_are_session_scoped() -> None:
    assert classify("GET", "/v1/sessions/s1", None) == Route(Kind.SESSION, session_id="s1")
    assert classify("DELETE", "/v1/sessions/a.b-c_d", None).session_id == "a.b-c_d"
    r = classify("POST", "/v1/sessions/s1/messages", {"role": "user", "content": "hi"})
    assert r == Route(Kind.SESSION, session_id="s1", messages=({"role": "user", "content": "hi"},))
    assert classify("POST", "/v1/sessions/s1/generate", {"max_tokens": 3}).kind is Kind.SESSION
    # not a session id: any replica answers the client's error
    assert classify("GET", "/v1/sessions/-bad", None).kind is Kind.ANY


def test_placements() -> None:
    assert classify("POST", "/v1/sessions", None) == Route(Kind.PLACE)
    assert classify("POST", "/v1/sessions", {"id": "mine"}) == Route(Kind.PLACE, session_id="mine")
    assert classify("GET", "/v1/sessions", None).kind is Kind.ANY  # the list: any replica
    chat = {"model": "m", "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]}
    r = classify("POST", "/v1/chat/completions", chat)
    assert r.kind is Kind.PLACE and r.session_id is None and len(r.messages) == 2
    assert classify("POST", "/v1/chat/completions", {**chat, "fak_session": "s9"}).session_id == "s9"
    assert classify("POST", "/v1/chat/completions", {**chat, "fak_session": "../x"}).session_id is None
    r = classify("POST", "/v1/responses", {"model": "m", "input": "hi", "previous_response_id": "resp_abc123"})
    assert r.kind is Kind.PLACE and r.response_id == "resp_abc123"
    assert classify("POST", "/v1/responses", {"input": "hi", "previous_response_id": "nope"}).response_id is None
    # a body that is not JSON still routes (the replica answers 422)
    assert classify("POST", "/v1/chat/completions", parse_json(b"{not json")) == Route(Kind.PLACE)


def test_other_routes() -> None:
    assert classify("GET", "/healthz", None).kind is Kind.HEALTH
    assert classify("GET", "/metrics", None).kind is Kind.METRICS
    for method, path in [("GET", "/v1/models"), ("POST", "/v1/forget"), ("GET", "/v1/audit/checkpoint"),
                         ("GET", "/v1/responses/resp_x"), ("GET", "/v1/chat/completions")]:
        assert classify(method, path, None).kind is Kind.ANY, path
    for verb in ("approve", "reject"):  # the first replica that answers decides (held calls are in the state database)
        assert classify("POST", f"/v1/tool-calls/call_held_1/{verb}", None).kind is Kind.EACH


def test_prompt_messages() -> None:
    chat = {"messages": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}},
                                     {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": []},
    ]}
    assert prompt_messages("POST", "/v1/chat/completions", chat) == (
        {"role": "system", "content": "sys"}, {"role": "user", "content": "ab"},
        {"role": "assistant", "content": ""})
    assert prompt_messages("POST", "/v1/chat/completions", {"messages": "x"}) == ()
    assert prompt_messages("POST", "/v1/chat/completions", {"messages": [{"role": 1, "content": "x"}]}) == ()
    # Responses: instructions first (a new chain only), then the message items up to the first other item
    body = {"instructions": "be brief", "input": [
        {"role": "user", "content": "q"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
        {"type": "function_call_output", "call_id": "c", "output": "x"},
        {"role": "user", "content": "later"}]}
    assert prompt_messages("POST", "/v1/responses", body) == (
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"})
    assert prompt_messages("POST", "/v1/responses", {"input": "hello"}) == ({"role": "user", "content": "hello"},)
    follow = {"instructions": "be brief", "input": "more", "previous_response_id": "resp_1"}
    assert prompt_messages("POST", "/v1/responses", follow) == ({"role": "user", "content": "more"},)
    assert prompt_messages("POST", "/v1/sessions/s/messages", {"role": "system", "content": "S"}) == (
        {"role": "system", "content": "S"},)
    assert prompt_messages("GET", "/v1/chat/completions", chat) == ()
    assert prompt_messages("POST", "/v1/chat/completions", None) == ()


def test_credential() -> None:
    assert credential([("Authorization", "Bearer fak_k")]) == "fak_k"
    assert credential([("authorization", "bearer  fak_k ")]) == "fak_k"
    assert credential([("x-api-key", "fak_x")]) == "fak_x"
    assert credential([("authorization", "Basic zzz"), ("x-api-key", "fak_x")]) == "fak_x"
    assert credential([]) is None
    assert credential_digest("fak_k") != credential_digest("fak_j")
    assert "fak_k" not in credential_digest("fak_k")


def test_affinity_cache_is_a_bounded_lru() -> None:
    c = AffinityCache(capacity=2)
    c.put("k", "s1", "replica-0")
    c.put("k", "s2", "replica-1")
    assert c.get("k", "s1") == "replica-0"  # s1 now most recent
    c.put("k", "s3", "replica-2")  # s2 out
    assert c.get("k", "s2") is None and c.get("k", "s3") == "replica-2" and len(c) == 2
    assert c.get("other", "s1") is None  # another credential's session of the same name
    c.put("k", "s1", "replica-1")  # a 421 moved it
    assert c.get("k", "s1") == "replica-1"
    assert c.drop_replica("replica-1") == 1 and c.get("k", "s1") is None
    c.discard("k", "s3")
    assert len(c) == 0
    assert response_handle("resp_1") != "resp_1"
    with pytest.raises(ValueError):
        AffinityCache(0)


def test_elsewhere() -> None:
    body = json.dumps({"type": "about:blank", "status": 421, "code": "session_elsewhere", "replica": "replica-2"})
    assert elsewhere(body.encode()) == "replica-2"
    assert elsewhere(b'{"replica": "Not A Name"}') is None
    assert elsewhere(b"oops") is None


def test_choose_most_hits_then_least_load_then_name() -> None:
    assert choose({"r0": Score(True, None, 10, 5), "r1": Score(True, None, 30, 9)}) == "r1"
    assert choose({"r0": Score(True, None, 30, 5), "r1": Score(True, None, 30, 2)}) == "r1"
    assert choose({"r1": Score(True, None, 0, 1), "r0": Score(True, None, 0, 1)}) == "r0"
    assert choose({"r0": Score(True, None, 0, 4), "r1": Score(True, None, 0, 1)}) == "r1"
    with pytest.raises(ValueError):
        choose({})


def test_slack_keeps_hits_from_piling_on_a_busy_replica() -> None:
    scores = {"r0": Score(True, None, 400, 9), "r1": Score(True, None, 0, 1), "r2": Score(True, None, 20, 3)}
    assert choose(scores) == "r0"  # hits alone
    assert choose(scores, slack=2) == "r2"  # r0 is past the slack: the most hits among the rest
    assert choose(scores, slack=1) == "r1"
    assert choose(scores, slack=8) == "r0"
    assert place(scores, Placement.PREFIX, slack=2) == "r2"
    assert place({**scores, "r0": Score(True, "r0", 400, 9)}, Placement.PREFIX, slack=0) == "r0"  # an owner is an owner


def test_place_by_mode() -> None:
    scores = {"r0": Score(True, None, 50, 3), "r1": Score(True, None, 0, 1), "r2": Score(True, None, 0, 2)}
    assert place(scores, Placement.PREFIX) == "r0"
    assert place(scores, Placement.LOAD) == "r1"
    rng = random.Random(7)
    assert {place(scores, Placement.RANDOM, rng) for _ in range(60)} == {"r0", "r1", "r2"}
    # an owner wins over every mode
    owned = {**scores, "r2": Score(True, "r2", 0, 9)}
    assert all(place(owned, m) == "r2" for m in Placement)
    # an owner that is not among the answering replicas is ignored
    assert place({"r0": Score(True, "gone", 0, 1), "r1": Score(True, "gone", 0, 0)}, Placement.PREFIX) == "r1"


REPLICA_0 = """# HELP fak_http_requests_total HTTP requests
# TYPE fak_http_requests_total counter
fak_http_requests_total{method="GET",route="/v1/models",status="200"} 3.0
# HELP fak_http_request_duration_seconds latency
# TYPE fak_http_request_duration_seconds histogram
fak_http_request_duration_seconds_bucket{le="0.1",method="GET",route="/x"} 1.0
fak_http_request_duration_seconds_bucket{le="+Inf",method="GET",route="/x"} 2.0
fak_http_request_duration_seconds_count{method="GET",route="/x"} 2.0
fak_http_request_duration_seconds_sum{method="GET",route="/x"} 0.3
# HELP fak_audit_log_size entries
# TYPE fak_audit_log_size gauge
fak_audit_log_size 12.0
"""
REPLICA_1 = """# HELP fak_http_requests_total HTTP requests
# TYPE fak_http_requests_total counter
fak_http_requests_total{method="GET",route="/v1/models",status="200"} 5.0
# HELP fak_sessions_loaded sessions
# TYPE fak_sessions_loaded gauge
fak_sessions_loaded 2.0
# HELP fak_audit_log_size entries
# TYPE fak_audit_log_size gauge
fak_audit_log_size 12.0
"""


def test_merge_metrics_labels_every_sample_once_per_family() -> None:
    merged = merge_metrics({"replica-0": REPLICA_0, "replica-1": REPLICA_1})
    assert merged.count("# TYPE fak_http_requests_total counter") == 1
    assert merged.count("# HELP fak_audit_log_size") == 1
    families = {f.name: f for f in text_string_to_metric_families(merged)}  # the real parser accepts it
    reqs = families["fak_http_requests"]
    assert {(s.labels["replica"], s.value) for s in reqs.samples} == {("replica-0", 3.0), ("replica-1", 5.0)}
    hist = families["fak_http_request_duration_seconds"]
    assert hist.type == "histogram" and all(s.labels["replica"] == "replica-0" for s in hist.samples)
    assert len(hist.samples) == 4
    assert {s.labels["replica"] for s in families["fak_audit_log_size"].samples} == {"replica-0", "replica-1"}
    assert [s.labels for s in families["fak_sessions_loaded"].samples] == [{"replica": "replica-1"}]
    # a family's lines stay in one block: its samples follow its TYPE line before the next family's
    lines = merged.splitlines()
    at = lines.index("# TYPE fak_http_requests_total counter")
    assert all(line.startswith("fak_http_requests_total{replica=") for line in lines[at + 1:at + 3])


def test_merge_metrics_keeps_a_replica_label_and_empty_input() -> None:
    text = '# TYPE x gauge\nx{replica="mine",a="1"} 1\n'
    assert 'x{replica="mine",a="1"} 1' in merge_metrics({"replica-0": text})
    assert merge_metrics({}) == ""
    assert merge_metrics([("replica-0", "")]) == ""


# --- the replica's side, without Ray: a request through the app in process, and its score ----
def _items(app: Any, method: str, path: str, key: str | None = None, body: object | None = None,
           stop_after: int | None = None) -> list[Any]:
    """What ``stream_asgi`` yields (all of it, or the first ``stop_after`` items, then the
    caller leaves as a disconnecting client would)."""
    from fak.api.cluster.asgi import stream_asgi

    headers = [("content-type", "application/json")] + ([("authorization", f"Bearer {key}")] if key else [])
    raw = json.dumps(body).encode() if body is not None else b""

    async def run() -> list[Any]:
        out: list[Any] = []
        gen = stream_asgi(app, method, path, b"", headers, raw, ("127.0.0.1", 5))
        try:
            async for item in gen:
                out.append(item)
                if stop_after is not None and len(out) >= stop_after:
                    break
        finally:
            await gen.aclose()
        await asyncio.sleep(0.2)  # the app's cleanup after a disconnect runs on this loop
        return out

    return asyncio.run(run())


def test_a_json_answer_is_one_item_and_a_stream_stays_a_stream(kernel: Any) -> None:
    from fak.api.app import create_app

    app = create_app(kernel)
    key = app.state.keys.create("acme", "agent")[0]
    [(status, headers, body, more)] = _items(app, "GET", "/healthz")
    assert (status, json.loads(body), more) == (200, {"status": "ok"}, False)
    assert ("content-type", "application/json") in headers
    [(status, _, body, more)] = _items(app, "GET", "/v1/models")  # no key: the app's own 401
    assert status == 401 and not more and json.loads(body)["status"] == 401
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "min_tokens": 4,
            "stream": True}
    items = _items(app, "POST", "/v1/chat/completions", key, chat)
    status, headers, first, more = items[0]
    assert status == 200 and more and dict(headers)["content-type"].startswith("text/event-stream")
    text = (first + b"".join(items[1:])).decode()
    assert len(items) > 2 and text.count("data: ") >= 5 and text.rstrip().endswith("data: [DONE]")
    # a client that leaves mid-stream: the app sees the disconnect and cleans up (no session left behind)
    partial = _items(app, "POST", "/v1/chat/completions", key, {**chat, "max_tokens": 64, "min_tokens": 64},
                     stop_after=2)
    assert len(partial) == 2 and partial[0][0] == 200
    assert kernel.sessions("acme") == []
    [(status, _, _, _)] = _items(app, "POST", "/v1/chat/completions", key, {**chat, "stream": False})
    assert status == 200


def test_score_request(kernel: Any) -> None:
    from fak.api.app import create_app
    from fak.api.cluster.replica import score_request

    app = create_app(kernel)
    keys = app.state.keys
    key = keys.create("acme", "agent")[0]
    system = {"role": "system", "content": "You are the travel desk of a large airline. " * 6}
    assert score_request(kernel, keys, "fak_nope", None, []) == {"authorized": False}
    assert score_request(kernel, keys, None, None, []) == {"authorized": False}
    cold = score_request(kernel, keys, key, None, [system, {"role": "user", "content": "a"}])
    assert cold["authorized"] and cold["owner"] is None and cold["hit_tokens"] == 0 and cold["load"] >= 0
    chat = {"model": "m", "messages": [system, {"role": "user", "content": "a"}], "max_tokens": 2,
            "fak_session": "trip-1"}
    assert _items(app, "POST", "/v1/chat/completions", key, chat)[0][0] == 200
    warm = score_request(kernel, keys, key, None, [system, {"role": "user", "content": "b"}])
    assert warm["hit_tokens"] > 0  # the system prompt is in this kernel's prefix cache now
    # the named session exists: its owner (a single process names none, so "" here) and no scoring
    owned = score_request(kernel, keys, key, "trip-1", [system])
    assert owned["owner"] is not None and owned["hit_tokens"] == 0
    assert score_request(kernel, keys, key, "nobody", [])["owner"] is None
    assert score_request(kernel, keys, key, None, [], "resp_unknown1")["owner"] is None


def test_new_prefixes_spread_by_rendezvous_hashing_and_stay_put() -> None:
    idle = {n: Score(True, None, 0, 0) for n in ("replica-0", "replica-1", "replica-2")}
    prompts = [[{"role": "system", "content": f"You are the assistant of tenant {i}."}] for i in range(30)]
    homes = [place(idle, Placement.PREFIX, key=prompt_key(p)) for p in prompts]
    assert len(set(homes)) == 3  # thirty new prefixes do not all go to the first name
    assert homes == [place(idle, Placement.PREFIX, key=prompt_key(p)) for p in prompts]  # any router: the same
    warm = dict(idle) | {"replica-1": Score(True, None, 40, 0)}
    assert all(place(warm, Placement.PREFIX, key=prompt_key(p)) == "replica-1" for p in prompts)  # hits first
    assert choose(idle) == "replica-0"  # no prompt: by name, as before
