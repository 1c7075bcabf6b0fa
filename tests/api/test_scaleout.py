"""``fak serve --replicas 3`` on Ray Serve, end to end (docs/scale-out.md): three replica
kernels in their own processes on one PostgreSQL governance plane, behind the router, with a
real HTTP client. A forget reaches every replica with one receipt; a replica SIGKILLed in the
middle of a forget loses nothing acknowledged; sessions stay where they live and new ones go
where their prefix is cached. Skipped, saying why, only when Ray or PostgreSQL cannot start.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from support.pg import pg_scratch, pg_server_url

from fak.audit.signing import load_signer
from fak.audit.tenant_export import verify_tenant_export

pytestmark = pytest.mark.postgres

FAK = str(Path(sys.executable).with_name("fak"))
TENANT = "acme"
REPLICAS = ["replica-0", "replica-1", "replica-2"]
SYSTEM = ("You are the travel desk of a large airline. Answer in one short sentence, quote booking "
          "references exactly as given, never invent a flight number, and say when you do not know.")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _url_of_schema(schema: str) -> str:
    return f"{pg_server_url()}?options=-csearch_path%3D{schema}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Iterator[dict[str, Any]]:
    """Three replicas of the tiny model on private schemas, the router on a free port."""
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"Ray Serve is not installed ({exc}); scale-out tests skipped (pip install fak[scale])")
    main, keys = f"fak_so_{secrets.token_hex(5)}", f"fak_sk_{secrets.token_hex(5)}"
    with pg_scratch(f'CREATE SCHEMA "{main}"', f'DROP SCHEMA "{main}" CASCADE'), \
            pg_scratch(f'CREATE SCHEMA "{keys}"', f'DROP SCHEMA "{keys}" CASCADE'):
        data = tmp_path_factory.mktemp("scaleout-data")
        # Ray puts unix sockets under RAY_TMPDIR, whose paths may not exceed 107 bytes: pytest's
        # own temporary folders are too deep under pytest-xdist (.../popen-gw0/ray0/...)
        ray_tmp = tempfile.mkdtemp(prefix="fak-ray-", dir="/tmp")
        port = _free_port()
        env = {**os.environ, "FAK_DATA_DIR": str(data), "FAK_DATABASE_URL": _url_of_schema(main),
               "FAK_CAS_KEY_URL": _url_of_schema(keys), "FAK_MODEL_PATH": str(tiny_dir), "FAK_CHUNK_SIZE": "16",
               "FAK_WEIGHTS": "float32", "RAY_USAGE_STATS_ENABLED": "0",
               "RAY_TMPDIR": ray_tmp}  # fmt: skip
        log = (data.parent / "serve.log").open("wb")
        server = subprocess.Popen([FAK, "serve", "--replicas", "3", "--port", str(port)], env=env, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(server, base, data.parent / "serve.log")

            def key(role: str, tenant: str = TENANT) -> str:
                out = subprocess.run([FAK, "keys", "create", "--tenant", tenant, "--role", role, "--json"], env=env,
                                     check=True, capture_output=True, text=True).stdout
                return str(json.loads(out)["key"])

            engine = sa.create_engine(_url_of_schema(main))
            yield {"base": base, "agent": key("agent"), "admin": key("admin"), "auditor": key("auditor"),
                   "other": key("agent", "globex"), "engine": engine, "env": env}
            engine.dispose()
        finally:
            os.killpg(server.pid, signal.SIGINT)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
            log.close()
            shutil.rmtree(ray_tmp, ignore_errors=True)


def _wait_ready(server: subprocess.Popen[bytes], base: str, log: Path, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(trust_env=False, timeout=2.0) as c:
        while time.monotonic() < deadline:
            if server.poll() is not None:
                tail = log.read_text(errors="replace")[-3000:]
                if "ray" in tail.lower() and ("failed" in tail.lower() or "error" in tail.lower()):
                    pytest.skip(f"Ray could not start here; scale-out tests skipped. Its output:\n{tail}")
                raise AssertionError(f"fak serve --replicas 3 exited ({server.returncode}):\n{tail}")
            try:
                if c.get(base + "/healthz").status_code == 200 and _all_joined(c, base):
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
    raise AssertionError(f"the cluster did not come up in {timeout_s:.0f} s:\n{log.read_text(errors='replace')[-3000:]}")


def _all_joined(c: httpx.Client, base: str) -> bool:
    """Every replica's kernel answers (the router's own health answers before they do)."""
    return all(c.get(base + "/healthz", headers={"x-fak-replica": name}).headers.get("x-fak-replica") == name
               for name in REPLICAS)


def _client(cluster: dict[str, Any], role: str = "agent") -> httpx.Client:
    return httpx.Client(base_url=cluster["base"], headers={"Authorization": f"Bearer {cluster[role]}"},
                        trust_env=False, timeout=120.0)


def _session_on_each(c: httpx.Client) -> dict[str, str]:
    """replica -> a new session placed on it (new sessions go to the least loaded replica)."""
    found: dict[str, str] = {}
    for _ in range(12):
        r = c.post("/v1/sessions", json={})
        assert r.status_code == 201, r.text
        where = r.headers["x-fak-replica"]
        sid = r.json()["id"]
        found.setdefault(where, sid)
        assert c.post(f"/v1/sessions/{sid}/messages", json={"role": "system", "content": SYSTEM}).status_code == 201
        if len(found) == len(REPLICAS):
            return found
    raise AssertionError(f"new sessions did not spread over the replicas: {found}")


def _admit(c: httpx.Client, sid: str, data: str) -> str:
    r = c.post(f"/v1/sessions/{sid}/tool-results", json={"tool": "booking", "content": data})
    assert r.status_code == 201, r.text
    assert r.json()["verdict"] == "ALLOW", r.text
    return str(r.json()["ref"])


def _completed(admin: httpx.Client, request_id: str, timeout_s: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = admin.get(f"/v1/forget/{request_id}")
        assert r.status_code == 200, r.text
        body = r.json()
        if body.get("state") == "completed" and body.get("replay_event"):
            return {k: v for k, v in body.items() if k not in ("state", "replay")}  # the receipt's own fields
        time.sleep(0.3)
    raise AssertionError(f"forget {request_id} did not complete its replay in {timeout_s:.0f} s")


def _holding_everywhere(agent: httpx.Client, secret: str) -> tuple[dict[str, str], str]:
    """A session on each replica holding ``secret``; on replica-2 a generated answer attended to it."""
    sessions = _session_on_each(agent)
    refs = {_admit(agent, sessions[name], secret) for name in REPLICAS}
    assert len(refs) == 1
    r = agent.post(f"/v1/sessions/{sessions['replica-2']}/generate", json={"max_tokens": 4, "min_tokens": 4})
    assert r.status_code == 200, r.text
    return sessions, refs.pop()


def test_a_forget_reaches_every_replica_with_one_receipt(cluster: dict[str, Any]) -> None:
    secret = "Booking reference QX7Y2Z for passenger Ada Lovelace, card ending 4242, seat 14C."
    with _client(cluster) as agent, _client(cluster, "admin") as admin, _client(cluster, "auditor") as auditor:
        sessions, ref = _holding_everywhere(agent, secret)
        r = admin.post("/v1/forget", json={"ref": ref})
        assert r.status_code == 200, r.text
        receipt = _completed(admin, r.json()["request_id"])
        parts = {p["replica"]: p for p in receipt["replicas"]}
        assert sorted(parts) == REPLICAS and all(p["sessions"] == 1 for p in parts.values())
        assert {x["session_id"]: x["replica"] for x in receipt["sessions"]} == {v: k for k, v in sessions.items()}
        assert any(u["kind"] == "generated_segment" and u["replica"] == "replica-2" for u in receipt["units_dropped"])
        replay = json.loads(receipt["replay_event"])
        assert replay["verified"] is True  # each replica's sessions equal an independent replay of their survivors
        check = auditor.post("/v1/audit/receipts/verify", json=receipt)
        assert check.status_code == 200 and check.json()["ok"], check.text
        for name in REPLICAS:  # gone on every replica: the bytes, and from every session
            gone = agent.get(f"/v1/refs/{ref}", headers={"x-fak-replica": name})
            assert gone.status_code == 410 and gone.headers["x-fak-replica"] == name, gone.text
            seg = agent.get(f"/v1/sessions/{sessions[name]}").json()["segments"]
            assert not any(ref in (s["ref"], *s["provenance"]) for s in seg if s["state"] == "live")


def test_a_replica_killed_mid_forget_loses_nothing(cluster: dict[str, Any]) -> None:
    secret = "Loyalty number FF-88812345 belongs to Grace Hopper; her PIN is 7731."
    engine: sa.Engine = cluster["engine"]
    with _client(cluster) as agent, _client(cluster, "admin") as admin, _client(cluster, "auditor") as auditor:
        sessions, ref = _holding_everywhere(agent, secret)
        acknowledged = {name: agent.get(f"/v1/sessions/{sid}").json() for name, sid in sessions.items()}
        with engine.connect() as conn:
            pid = conn.execute(sa.text("SELECT pid FROM fak_replicas WHERE name = 'replica-2'")).scalar_one()
        os.kill(pid, signal.SIGSTOP)  # frozen: its lock is held, so the forget waits for its part
        answer: dict[str, httpx.Response] = {}
        forgetting = threading.Thread(target=lambda: answer.setdefault("r", admin.post(
            "/v1/forget", json={"ref": ref}, headers={"x-fak-replica": "replica-0"})))  # not to the frozen one
        forgetting.start()
        deadline = time.monotonic() + 60
        while True:  # the forget has begun: replica-2's task is written and pending
            with engine.connect() as conn:
                state = conn.execute(sa.text("SELECT t.state FROM fak_withdrawal_tasks t JOIN fak_forgets f "
                                             "ON f.request_id = t.request_id WHERE f.ref = :ref AND "
                                             "t.replica = 'replica-2'"), {"ref": ref}).scalar()
            if state == "pending":
                break
            assert time.monotonic() < deadline, "the forget did not start"
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        forgetting.join(timeout=300)
        r = answer["r"]
        assert r.status_code == 200, r.text
        receipt = _completed(admin, r.json()["request_id"], timeout_s=300)
        parts = {p["replica"]: p for p in receipt["replicas"]}
        assert sorted(parts) == REPLICAS and parts["replica-2"]["sessions"] == 1
        # applied by a peer standing in (its lock freed by the kill), or by replica-2 restarted by Serve
        print(f"replica-2's part applied by {parts['replica-2']['applied_by']}")
        assert parts["replica-2"]["applied_by"] in REPLICAS
        assert json.loads(receipt["replay_event"])["verified"] is True
        # nothing acknowledged is lost: each session answers (replica-2's rebuilt from its ledger,
        # where it lives now), with every segment it had, the forgotten one evicted
        for name, sid in sessions.items():
            now = agent.get(f"/v1/sessions/{sid}")
            assert now.status_code == 200, now.text
            before = {s["id"]: s for s in acknowledged[name]["segments"]}
            after = {s["id"]: s for s in now.json()["segments"]}
            assert set(before) <= set(after)
            assert all(after[i]["state"] != "live" for i, s in before.items() if ref in (s["ref"], *s["provenance"]))
        # the log verifies (against the pinned key, not the served one), with one event per decision
        exported = auditor.get("/v1/audit/export")
        assert exported.status_code == 200
        path = Path(cluster["env"]["FAK_DATA_DIR"]).parent / "export.jsonl"
        path.write_text(exported.text)
        pinned = load_signer(Path(cluster["env"]["FAK_DATA_DIR"]), "fak.local/log").verifier().vkey()
        assert verify_tenant_export(path, pinned).ok
        events = [json.loads(x["event"]) for x in map(json.loads, exported.text.splitlines()[1:]) if x]
        mine = [e for e in events if e.get("request_id") == r.json()["request_id"]]
        assert sorted(e["type"] for e in mine) == ["forget_completed", "forget_requested", "replay_verified"]
        admissions = [e for e in events if e["type"] == "admission_verdict" and e.get("ref") == ref]
        assert len(admissions) == len(REPLICAS)
        check = auditor.post("/v1/audit/receipts/verify", json=receipt)
        assert check.status_code == 200 and check.json()["ok"], check.text


def test_sessions_stay_put_and_new_ones_go_where_their_prefix_is(cluster: dict[str, Any]) -> None:
    with _client(cluster) as agent, _client(cluster, "other") as other, _client(cluster, "auditor") as auditor:
        def chat(session: str, question: str, client: httpx.Client = agent) -> httpx.Response:
            r = client.post("/v1/chat/completions", json={
                "model": "fak", "max_tokens": 3, "fak_session": session,
                "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]})
            assert r.status_code == 200, r.text
            return r

        first = chat("trip-1", "Where is my lounge?")
        home = first.headers["x-fak-replica"]
        for _ in range(3):  # affinity: the session's requests all reach its replica
            assert agent.get("/v1/sessions/trip-1").headers["x-fak-replica"] == home
        second = chat("trip-2", "Is my flight on time?")  # a new session with the same system prompt
        assert second.headers["x-fak-replica"] == home
        assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # and it hits the prefix
        # another tenant with the same prompt: no replica serves it the first tenant's KV
        third = chat("trip-1", "Where is my lounge?", other)
        assert third.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        metrics = auditor.get("/metrics")
        assert metrics.status_code == 200
        assert all(f'replica="{name}"' in metrics.text for name in REPLICAS)  # every replica's series, labelled
