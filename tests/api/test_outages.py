"""Dependencies failing under a real server:

- PostgreSQL stopped mid-run (a throwaway cluster, ``tests/support/pg_cluster.py``, never the
  shared server): every request is a ``503 unavailable`` problem with ``Retry-After``,
  none a 500; when the server returns, the same requests succeed, nothing of the failed
  ones is in a ledger, the CAS or the log, and the log verifies.
- The blob directory's disk full (a 24 KiB tmpfs; root only): admissions fail with a
  clear ``507 storage_full``, nothing half-written (fsck clean, no temp file, no orphan),
  every acknowledged ref reads back, and admissions work again once space is freed.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest
from support.pg_cluster import available, throwaway_cluster

from fak import Kernel
from fak.api.server import serve

PROBLEM = "application/problem+json"


def _verify_log(k: Kernel, where: Path) -> None:
    from fak.audit import verify_export

    k.audit.export(where)
    report = verify_export(where, pubkey=k.audit.public_key())
    assert report.ok, report.summary()


@pytest.mark.skipif(not available(), reason="no PostgreSQL server binaries (initdb, pg_ctl) for a throwaway cluster")
def test_postgres_stopped_mid_run_is_503_then_recovers(settings, tiny_lm, tmp_path) -> None:
    with throwaway_cluster() as pg:
        s = settings.model_copy(update={"database_url": pg.url})
        with Kernel.open(s, model=tiny_lm, progress=None) as k, serve(k) as live:
            agent = live.client(live.key("acme", "agent"))
            auditor = live.client(live.key("acme", "auditor"))
            sid = agent.post("/v1/sessions", json={}).json()["id"]
            assert agent.post(f"/v1/sessions/{sid}/messages", json={"role": "system", "content": "Be brief."}
                              ).status_code == 201
            first = agent.post(f"/v1/sessions/{sid}/tool-results", json={"tool": "t", "content": "gate B22"}).json()
            before = auditor.get(f"/v1/sessions/{sid}").json()
            size = k.audit.size()
            pg.stop()
            calls = [
                (agent, "POST", f"/v1/sessions/{sid}/messages", {"role": "user", "content": "lost?"}),
                (agent, "POST", f"/v1/sessions/{sid}/tool-results", {"tool": "t", "content": "during the outage"}),
                (agent, "POST", "/v1/sessions", {}),
                (agent, "GET", "/v1/sessions", None),
                (auditor, "GET", "/v1/audit/entries", None),
                (auditor, "GET", f"/v1/audit/proof/inclusion/{first['audit_index']}", None),
                (agent, "GET", f"/v1/refs/{first['ref']}", None),
            ]
            for c, method, path, body in calls:
                r = c.request(method, path, json=body)
                assert r.status_code == 503, (method, path, r.status_code, r.text[:300])
                assert r.headers["content-type"].startswith(PROBLEM) and r.headers.get("retry-after") == "1"
                assert r.json()["type"].endswith("/unavailable")
            pg.start()
            ok = [agent.request(m, p, json=b) for c, m, p, b in calls if c is agent]  # the same calls now work
            assert all(r.status_code < 300 for r in ok), [(r.status_code, r.text[:200]) for r in ok]
            after = auditor.get(f"/v1/sessions/{sid}").json()
            assert after["segments"][: len(before["segments"])] == before["segments"]
            kinds = [x["kind"] for x in after["segments"][len(before["segments"]):]]
            assert kinds == ["user", "tool"], kinds  # the retried calls only: nothing of the failed ones
            assert k.store.digest_of(b"during the outage", "acme") in {x["ref"] for x in after["segments"]}
            assert k.audit.size() > size
            _verify_log(k, tmp_path / "export.log")
            ks = k.session("acme", sid)
            assert ks.fingerprint() == ks.replay_fingerprint()
            agent.close()
            auditor.close()


def _mount_tmpfs(path: Path, size: str) -> bool:
    if os.geteuid() != 0:
        return False
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def test_blob_disk_full_is_a_clear_error_and_nothing_half_written(settings, tiny_lm, tmp_path) -> None:
    blobs = settings.data_dir / "blobs"
    if not _mount_tmpfs(blobs, "24k"):
        pytest.skip("a small tmpfs for the blob directory needs root (mount -t tmpfs)")
    try:
        with Kernel.open(settings, model=tiny_lm, progress=None) as k, serve(k) as live:
            agent = live.client(live.key("acme", "agent"))
            admin = live.client(live.key("acme", "admin"))
            acked: dict[str, bytes] = {}
            full = None
            for i in range(200):  # one session each: a tool result of ~3000 tokens fills the tiny context
                sid = agent.post("/v1/sessions", json={}).json()["id"]
                content = (f"result {i} " + os.urandom(2_000).hex())[:3_000]
                r = agent.post(f"/v1/sessions/{sid}/tool-results", json={"tool": "t", "content": content})
                if r.status_code == 201:
                    acked[r.json()["ref"]] = content.encode()
                    continue
                full = r
                break
            assert full is not None, "the 24 KiB blob directory never filled"
            assert full.status_code == 507 and full.headers["content-type"].startswith(PROBLEM), full.text
            assert full.json()["type"].endswith("/storage_full") and "full" in full.json()["detail"]
            assert len(acked) >= 3
            # nothing half-written: no temp file, no orphan, every acknowledged ref reads back
            report = k.store.fsck()
            assert report.missing == [] and report.wrong_size == [] and report.orphans == []
            assert list(k.store.backend.tmp_dir.iterdir()) == []
            for ref, data in acked.items():
                assert agent.get(f"/v1/refs/{ref}").content == data
            assert agent.get(f"/v1/sessions/{sid}").json()["segments"] == []  # the failed admission left nothing
            # free space (forget two results), and admissions work again
            for ref in list(acked)[:2]:
                assert admin.post("/v1/forget", json={"ref": ref, "reason": "space"}).status_code == 200
            r = agent.post(f"/v1/sessions/{sid}/tool-results", json={"tool": "t", "content": "after the purge"})
            assert r.status_code == 201, r.text
            _verify_log(k, tmp_path / "export.log")
            agent.close()
            admin.close()
    finally:
        with contextlib.suppress(Exception):
            subprocess.run(["umount", str(blobs)], check=False)
