"""Crash at a chosen point (``fak.faults``): a child process runs one operation with
``$FAK_FAULT_POINT`` naming a point inside it and is SIGKILLed there; the test then
opens what it left, on SQLite and on PostgreSQL, and checks the invariants:

- the stores open, ``fsck`` finds no missing or wrong-sized blob, every live ref reads
  back its exact bytes, what the killed writer left is an orphan ``fsck`` removes;
- the audit log opens without a signer alarm and its export verifies;
- a rotation killed half way leaves every ref readable and the next one completes;
- first-start key creation killed half way: the next start works, one master secret,
  one signing key, no temp key files left behind.

Kernel-level points of forget (``forget.after_requested`` … ``forget.before_completed``,
the interrupted forget completes on the next open) are in ``test_kernel_forget.py``
(SQLite) and below for PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fak.audit import AuditLog, KeyRotated, verify_export
from fak.cas import CasStore

CHILD = textwrap.dedent("""
    import json, sys
    op, data_dir, url = sys.argv[1:4]
    if op == "first_start":
        from fak.keys import load_master_secret
        from fak.audit import AuditLog
        from fak.cas import CasStore
        load_master_secret(data_dir)
        AuditLog.open(url, data_dir).close()
        store = CasStore.open(data_dir, url)
        store.put(b"first", "text/plain", "acme")  # the tenant's first KEK and digest key
    else:
        from fak.cas import CasStore
        store = CasStore.open(data_dir, url)
        if op == "put":
            store.put(b"never acknowledged", "text/plain", "acme")
        elif op == "forget":
            store.forget(json.load(open(data_dir + "/refs.json"))["acme"][0], "acme")
        elif op == "rotate":
            from fak.audit import AuditLog
            from fak.kernel.withdrawal.keys import rotate
            rotate(store, AuditLog.open(url, data_dir), None, principal="ops")
    print("finished without reaching the fault point", flush=True)
""")

PAYLOADS = {t: [f"{t} result {i} ".encode() * (i + 1) for i in range(6)] for t in ("acme", "globex")}


def _child(point: str, op: str, data_dir: Path, url: str) -> None:
    env = os.environ | {"FAK_FAULT_POINT": point, "FAK_DATA_DIR": str(data_dir)}
    run = subprocess.run([sys.executable, "-c", CHILD, op, str(data_dir), url], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == -9, f"{point}: exit {run.returncode}\n{run.stdout}\n{run.stderr[-3000:]}"


def _seed(data_dir: Path, url: str) -> dict[str, list[str]]:
    refs: dict[str, list[str]] = {}
    with CasStore.open(data_dir, url) as store, AuditLog.open(url, data_dir) as log:
        for tenant, payloads in PAYLOADS.items():
            refs[tenant] = [store.put(p, "text/plain", tenant).digest for p in payloads]
        from fak.kernel.withdrawal.keys import rotate

        rotate(store, log, None, principal="ops")  # a logged rotation before the crash
    (data_dir / "refs.json").write_text(json.dumps(refs))
    return refs


def _check_stores(data_dir: Path, url: str, refs: dict[str, list[str]], forgotten: set[str] = frozenset()) -> None:
    with CasStore.open(data_dir, url) as store:
        report = store.fsck()
        assert report.missing == [] and report.wrong_size == [], report
        for tenant, digests in refs.items():
            for digest, payload in zip(digests, PAYLOADS[tenant], strict=True):
                head = store.head(digest, tenant)
                if digest in forgotten:
                    assert head.state == "forgotten"
                else:
                    assert head.state == "live" and store.get(digest, tenant) == payload
        store.fsck(remove_orphans=True, older_than=0)  # what a killed writer left: ciphertext with no row
        after = store.fsck()
        assert after.orphans == [] and list(store.backend.tmp_dir.iterdir()) == []
    with AuditLog.open(url, data_dir) as log:
        log.checkpoint()
        assert log.alarms == 0
        log.export(data_dir / "export.log")
        result = verify_export(data_dir / "export.log", pubkey=log.public_key())
        assert result.ok, result.summary()


@pytest.mark.parametrize("point", ["cas.put.before_commit", "cas.keyring.before_commit.kek"])
def test_killed_put_leaves_nothing_half_written(db_url, tmp_path, point) -> None:
    data_dir = tmp_path / "d"
    refs = _seed(data_dir, db_url)
    if point == "cas.keyring.before_commit.kek":  # a new tenant's first KEK being created
        with CasStore.open(data_dir, db_url) as store:
            store.erase_tenant("acme")  # acme has no KEK now: the next put creates one
        refs.pop("acme")
    _child(point, "put", data_dir, db_url)
    with CasStore.open(data_dir, db_url) as store:
        gone = store.digest_of(b"never acknowledged", "acme")
        assert store.head(gone, "acme") is None  # never committed: not there, not half there
        orphans = store.fsck().orphans
        assert len(orphans) == 1  # the sealed blob, written before its key and row
    _check_stores(data_dir, db_url, refs)
    with CasStore.open(data_dir, db_url) as store:  # and the same put now succeeds
        ref = store.put(b"never acknowledged", "text/plain", "acme")
        assert store.get(ref, "acme") == b"never acknowledged"


def test_killed_cas_forget_between_key_and_ciphertext(db_url, tmp_path) -> None:
    data_dir = tmp_path / "d"
    refs = _seed(data_dir, db_url)
    victim = refs["acme"][0]
    _child("cas.forget.after_key_commit", "forget", data_dir, db_url)
    with CasStore.open(data_dir, db_url) as store:
        assert store.head(victim, "acme").state == "forgotten"  # the key is gone: it cannot be read
        assert len(store.fsck().orphans) == 1  # its ciphertext, without a key, until fsck removes it
        again = store.forget(victim, "acme")  # a repeated forget reports the earlier one
        assert again.already_forgotten
    _check_stores(data_dir, db_url, refs, forgotten={victim})


def test_killed_cas_forget_between_key_and_tombstone(db_url, tmp_path) -> None:
    """The data key leaves the key database first, the tombstone comes second (CAS database):
    a forget killed in between leaves a live row whose key is gone. It opens nothing, and the
    next forget of the ref finishes the job and says the key is destroyed."""
    from fak.cas import KeyDestroyed

    data_dir = tmp_path / "d"
    refs = _seed(data_dir, db_url)
    victim = refs["acme"][0]
    _child("cas.forget.after_key_delete", "forget", data_dir, db_url)
    with CasStore.open(data_dir, db_url) as store:
        assert store.head(victim, "acme").state == "live"
        with pytest.raises(KeyDestroyed, match="not in the key database"):
            store.get(victim, "acme")
        again = store.forget(victim, "acme")
        assert not again.already_forgotten and again.key_deleted and again.ciphertext_deleted
        assert store.head(victim, "acme").state == "forgotten"
    _check_stores(data_dir, db_url, refs, forgotten={victim})


@pytest.mark.parametrize("point", ["cas.rotate.after_new_kek", "cas.rotate.after_batch", "keyops.rotate.before_log"])
def test_killed_rotation_leaves_every_ref_readable(db_url, tmp_path, point) -> None:
    if point == "cas.rotate.after_new_kek" and not db_url.startswith("sqlite"):
        pytest.skip("the same rows as after_batch on PostgreSQL (kept short: run on SQLite)")
    data_dir = tmp_path / "d"
    refs = _seed(data_dir, db_url)
    _child(point, "rotate", data_dir, db_url)
    _check_stores(data_dir, db_url, refs)
    with CasStore.open(data_dir, db_url) as store, AuditLog.open(db_url, data_dir) as log:
        from fak.kernel.withdrawal.keys import rotate

        result = rotate(store, log, None, principal="ops")  # the next rotation completes
        assert set(result.versions) == set(PAYLOADS)
        events = [e.event for e in log.entries() if isinstance(e.event, KeyRotated)]
        active = {v.tenant: v.kek_id for v in store.kek_versions() if v.active}
        gaps = set()
        for tenant in PAYLOADS:
            mine = [e for e in events if e.tenant == tenant]
            assert len(mine) == 2 and mine[-1].new_key_id == active[tenant]
            assert sum(v.active for v in store.kek_versions(tenant)) == 1
            if mine[-1].old_key_id != mine[0].new_key_id:
                gaps.add(tenant)
        # a rotation killed before its event is not silent: for each tenant it reached, the chain
        # of key ids in the log has a gap (the next event's old key is not the last event's new key)
        assert gaps == (set(PAYLOADS) if point == "keyops.rotate.before_log" else gaps) and gaps, (point, events)
    _check_stores(data_dir, db_url, refs)


@pytest.mark.parametrize("point", ["keys.master.before_link", "audit.signing_key.before_link",
                                   "cas.keyring.before_commit.check", "cas.keyring.before_commit.kek",
                                   "cas.keyring.before_commit.digest"])
def test_killed_first_start_starts_cleanly_next_time(db_url, tmp_path, point) -> None:
    if point.startswith(("keys.", "audit.")) and not db_url.startswith("sqlite"):
        pytest.skip("a key file in the data directory: the database does not matter (run on SQLite)")
    if point == "cas.keyring.before_commit.digest" and not db_url.startswith("sqlite"):
        pytest.skip("the key database is SQLite in the data directory by default (run on SQLite)")
    data_dir = tmp_path / "d"
    data_dir.mkdir(mode=0o700)
    _child(point, "first_start", data_dir, db_url)
    env = os.environ | {"FAK_DATA_DIR": str(data_dir)}
    run = subprocess.run([sys.executable, "-c", CHILD, "first_start", str(data_dir), db_url], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(p.name for p in data_dir.iterdir() if ".tmp" in p.name) == []  # no stray key material
    assert (data_dir / "master.key").exists() and (data_dir / "audit_signing.key").exists()
    with CasStore.open(data_dir, db_url) as store:
        digest = store.digest_of(b"first", "acme")
        assert store.get(digest, "acme") == b"first"
        assert sum(v.active for v in store.kek_versions("acme")) == 1
    with AuditLog.open(db_url, data_dir) as log:
        log.checkpoint()
        assert log.alarms == 0


@pytest.mark.postgres
def test_interrupted_forget_completes_on_postgres(pg_url, tmp_path, tiny_dir, tiny_lm) -> None:
    from fak import Kernel, Settings
    from fak.audit.receipt import verify_receipt

    settings = Settings(data_dir=tmp_path / "data", model_path=tiny_dir, chunk_size=16, database_url=pg_url)
    with Kernel.open(settings, model=tiny_lm, progress=None) as k:
        s = k.session("acme")
        s.append("system", "You are terse.")
        ref = s.admit("flight_status", b"LH123 is on time, gate B22.").ref
        s.append("user", "Flight?")
        sid, before = s.id, s.fingerprint()
    script = textwrap.dedent("""
        import sys
        from fak import Kernel, Settings
        data, model, url, ref = sys.argv[1:5]
        k = Kernel.open(Settings(data_dir=data, model_path=model, chunk_size=16, database_url=url), progress=None)
        k.forget("acme", ref, requested_by="ops", reason="crash_test")
    """)
    env = os.environ | {"FAK_FAULT_POINT": "forget.before_shred"}
    run = subprocess.run([sys.executable, "-c", script, str(settings.data_dir), str(tiny_dir), pg_url, ref],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == -9, run.stderr[-3000:]
    with Kernel.open(settings, model=tiny_lm, progress=None) as k:  # resumes the forget, then its replay
        assert k.replays.wait(timeout=120)
        row = k.state.forget_row("acme", ref)
        assert row.state == "completed"
        receipt = k.forget("acme", ref)
        assert verify_receipt(receipt, k.audit.public_key(), require_replay=True)
        s = k.session("acme", sid)
        assert ref not in s.refs() and s.fingerprint() == s.replay_fingerprint() != before
        assert k.store.head(ref, "acme").state == "forgotten"
        types = [e.event.type for e in k.audit.entries()]
        assert types.count("forget_requested") == 1 and types.count("forget_completed") == 1
