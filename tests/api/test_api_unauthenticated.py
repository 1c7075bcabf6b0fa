"""What a request without a valid key may still cost the server (issue 25.5): the audit log
grows by a bounded number of entries under a flood of bogus keys (authentication failures
are aggregated per window), and a key sent where it does not belong (the query string, the
path) never reaches the access log."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from fak.api.server import serve
from fak.audit import AuthFailure

FAK = str(Path(sys.executable).with_name("fak"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bogus() -> str:
    return "fak_" + secrets.token_hex(8) + "_" + secrets.token_urlsafe(32)


# --- the access log ----------------------------------------------------------------------------
def test_the_access_log_of_fak_serve_holds_no_key(tmp_path, tiny_dir) -> None:
    """A real ``fak serve`` at its default log level: every request is in its access log, and
    no key is, wherever the client put it (query parameters named like credentials, any
    value that looks like a fak key, percent-encoded or not, a path segment)."""
    env = os.environ | {"FAK_DATA_DIR": str(tmp_path / "data"), "FAK_MODEL_PATH": str(tiny_dir),
                        "FAK_CHUNK_SIZE": "16"}
    made = subprocess.run([FAK, "keys", "create", "--tenant", "acme", "--role", "admin"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    bogus, token = _bogus(), secrets.token_urlsafe(24)
    port = _free_port()
    out = tmp_path / "serve.log"
    with open(out, "wb") as log:
        proc = subprocess.Popen([FAK, "serve", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, out.read_text()
            try:
                if httpx.get(base + "/healthz", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)
        urls = [f"/v1/sessions?api_key={key}", f"/v1/sessions?limit=5&key={key}&x=1", f"/v1/sessions?token={token}",
                f"/v1/sessions?access_token={token}", f"/v1/sessions?API_KEY={key}", f"/v1/sessions?q={bogus}",
                f"/v1/sessions?api%5Fkey={token}", f"/v1/sessions?x={key.replace('_', '%5F')}",
                f"/v1/sessions/{key}", f"/v1/refs/{bogus}?auth={token}"]
        with httpx.Client(base_url=base, timeout=30, trust_env=False) as c:
            for url in urls:
                assert c.get(url).status_code in (401, 404), url  # a key in the query string is refused
            assert c.get("/v1/sessions", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    text = out.read_text()
    access = [line for line in text.splitlines() if '"GET /v1/' in line]
    assert len(access) >= len(urls) + 1, text[-3000:]  # every request is logged...
    for secret in (key, key.split("_", 2)[2], bogus.split("_", 2)[2], token):
        assert secret not in text, f"a credential is in the server's output:\n{text[-3000:]}"  # ...no key is
    assert any("api_key=[redacted]" in line for line in access), access
    assert any("limit=5&key=[redacted]&x=1" in line for line in access), access  # the rest stays readable


# --- authentication failures in the audit log --------------------------------------------------
@pytest.fixture
def settings(tmp_path, tiny_dir):
    from fak.settings import Settings

    return Settings(data_dir=tmp_path / "data", model_path=tiny_dir, chunk_size=16, auth_failure_window_s=3600)


def test_a_flood_of_bogus_keys_adds_a_bounded_number_of_audit_entries(kernel) -> None:
    """2,000 requests with bogus keys (and without one) added 2,000 audit entries (4.4 MB)
    before; now the first failure of each reason in a window is logged at once and the rest
    are counted into one ``auth_failures`` entry at the window's end or at shutdown, with
    keyed fingerprints of the keys and clients they came from (never a key)."""
    audit = kernel.audit
    keys = [_bogus() for _ in range(50)]
    with serve(kernel) as live:
        before = audit.size()
        with live.client(timeout=30) as c:
            for i in range(2000):
                headers = {"Authorization": f"Bearer {keys[i % len(keys)]}"} if i % 100 else {}
                assert c.get("/v1/sessions", headers=headers).status_code == 401
        live.app.state.auth_failures.flush()  # what the window's end (or shutdown) does
        deadline = time.monotonic() + 10
        while audit.size() < before + 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        added = [e.event for e in audit.entries(start=before)]
        assert len(added) <= 4, [e.type for e in added]
        firsts = [e for e in added if isinstance(e, AuthFailure)]
        assert sorted(e.reason for e in firsts) == ["missing_key", "unknown_key"]
        (summary,) = [e for e in added if e.type == "auth_failures"]
        assert summary.count == 2000 - len(firsts)
        assert summary.reasons == {"unknown_key": 1980 - 1, "missing_key": 20 - 1}
        assert len(summary.key_fingerprints) == 16 and summary.more_keys == len(keys) - 16
        assert len(summary.client_fingerprints) == 1 and summary.client_fingerprints[0].startswith("hmac-sha256:")
        text = b"".join(e.event.model_dump_json().encode() for e in audit.entries(start=before))
        assert not any(k.split("_", 2)[2].encode() in text or k[:24].encode() in text for k in keys)
        with live.client(live.key("acme", "agent")) as c:  # a valid key still works
            assert c.get("/v1/sessions").status_code == 200


def test_failures_counted_in_a_window_are_logged_at_shutdown(kernel, tmp_path) -> None:
    audit = kernel.audit
    with serve(kernel) as live:
        before = audit.size()
        with live.client(timeout=30) as c:
            for _ in range(30):
                assert c.get("/v1/sessions", headers={"Authorization": f"Bearer {_bogus()}"}).status_code == 401
        live.app.state.auth_failures.close()  # what the app's shutdown does
        deadline = time.monotonic() + 10
        while audit.size() < before + 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        added = [e.event for e in audit.entries(start=before)]
        assert [e.type for e in added] == ["auth_failure", "auth_failures"] and added[1].count == 29


def test_the_audit_queue_is_bounded_decisions_wait_counted_events_drop(tmp_path) -> None:
    """With the writer stalled (another connection holds SQLite's write lock), at most
    ``max_queue`` appends wait in memory: a countable event past it is dropped and counted
    (``try_submit``), a decision waits for room (``submit``) and is committed once there is."""
    import sqlite3

    from fak.audit import AuditLog, PolicyLoaded

    db = tmp_path / "audit.db"
    log = AuditLog.open(url=f"sqlite:///{db}", data_dir=tmp_path, max_queue=32)
    decision = PolicyLoaded(policy_id="p", policy_digest="blake3:" + "0" * 64)
    try:
        log.append(decision)
        blocker = sqlite3.connect(db, timeout=60, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        stalled = log.submit(decision)  # the writer takes it and waits for the lock
        time.sleep(1.0)
        taken = [log.try_submit(AuthFailure(reason="unknown_key")) for _ in range(1000)]
        assert sum(f is not None for f in taken) == 32 and log.dropped == 1000 - 32
        waited: list[int] = []
        waiter = threading.Thread(target=lambda: waited.append(log.append(decision)))
        waiter.start()
        waiter.join(timeout=1.0)
        assert waiter.is_alive() and not waited  # backpressure: no room, the decision waits
        blocker.execute("ROLLBACK")
        blocker.close()
        waiter.join(timeout=60)
        assert waited and stalled.result(timeout=60) == 1
        assert all(f.result(timeout=60) for f in taken if f is not None)
        assert log.size() == 1 + 1 + 32 + 1  # nothing acknowledged was lost, nothing dropped was kept
    finally:
        log.close()
