"""The one engine factory (fak.db) that the CAS and the audit log share."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

from fak import db, errors
from fak.audit import AuditLog, PolicyLoaded
from fak.audit import store as audit_store
from fak.audit.errors import AuditError
from fak.cas import CasError, CasStore
from fak.cas import db as cas_db
from fak.settings import StorageSettings

P = "sha256:" + "cd" * 32


def _pragmas(engine) -> dict:
    with engine.connect() as conn:
        return {p: conn.exec_driver_sql(f"PRAGMA {p}").scalar()
                for p in ("journal_mode", "synchronous", "foreign_keys", "secure_delete", "busy_timeout")}  # fmt: skip


@pytest.mark.parametrize(("durable", "sync"), [(True, 2), (False, 1)])
def test_sqlite_settings(tmp_path, durable, sync):
    engine = db.make_engine(f"sqlite:///{tmp_path / 'new' / 'dir' / 'fak.db'}", durable=durable)
    try:
        assert _pragmas(engine) == {"journal_mode": "wal", "synchronous": sync, "foreign_keys": 1,
                                    "secure_delete": 1, "busy_timeout": db.BUSY_TIMEOUT_S * 1000}  # fmt: skip
        assert (tmp_path / "new" / "dir").is_dir()
    finally:
        engine.dispose()


def test_the_layers_use_the_factory(tmp_path):
    url = f"sqlite:///{tmp_path / 'fak.db'}"
    for make in (cas_db.make_engine, audit_store.make_engine):
        engine = make(url)
        try:
            assert _pragmas(engine)["secure_delete"] == 1 and _pragmas(engine)["foreign_keys"] == 1
        finally:
            engine.dispose()
    assert audit_store.WRITE == db.WRITE


@pytest.mark.parametrize("url", ["nosuchdb://x", "::not a url", "postgresql+nodriver://u:hunter2@h/d"])
def test_bad_urls_are_clear_errors_in_every_layer(url):
    with pytest.raises(errors.InvalidInput) as exc:
        db.make_engine(url)
    assert "hunter2" not in str(exc.value)
    with pytest.raises(CasError):
        cas_db.make_engine(url)
    with pytest.raises(AuditError):
        audit_store.make_engine(url)


def test_writers_wait_for_each_other_readers_do_not(tmp_path):
    url = f"sqlite:///{tmp_path / 'fak.db'}"
    a, b = db.make_engine(url), db.make_engine(url)  # two engines: as two processes would
    try:
        with db.writing(a) as conn:
            conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
            conn.exec_driver_sql("INSERT INTO t VALUES (1)")
        holding, waited = threading.Event(), []

        def hold() -> None:
            with db.writing(a) as conn:
                conn.exec_driver_sql("INSERT INTO t VALUES (2)")
                holding.set()
                time.sleep(0.4)

        t = threading.Thread(target=hold)
        t.start()
        holding.wait(5)
        start = time.monotonic()
        with b.connect() as conn:  # a reader: not blocked, sees the last commit
            assert conn.exec_driver_sql("SELECT count(*) FROM t").scalar() == 1
        assert time.monotonic() - start < 0.3
        with db.writing(b) as conn:  # a writer: waits for the lock instead of failing
            waited.append(time.monotonic() - start)
            conn.exec_driver_sql("INSERT INTO t VALUES (3)")
        t.join()
        assert waited[0] >= 0.2
        with b.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM t").scalar() == 3
    finally:
        a.dispose()
        b.dispose()


def test_autocommit_option_runs_outside_a_transaction(tmp_path):
    engine = db.make_engine(f"sqlite:///{tmp_path / 'fak.db'}")
    try:
        with engine.execution_options(**{db.AUTOCOMMIT: True}).connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            assert not conn.connection.dbapi_connection.in_transaction
        with engine.connect() as conn:  # the pooled connection still has no implicit BEGIN
            assert conn.connection.dbapi_connection.isolation_level is None
    finally:
        engine.dispose()


def test_postgres_engine(pg_url):
    engine = db.make_engine(pg_url)
    try:
        assert engine.pool._pre_ping
        with db.writing(engine) as conn:
            assert conn.execute(sa.text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()


def test_cas_and_audit_share_one_database_under_concurrency(db_url, tmp_path):
    """Many threads putting, re-putting with a stricter taint, recording uses and forgetting
    in the CAS while the audit log appends into the same database: no 'database is locked',
    no lost update (a taint never loosens)."""
    store = CasStore.open(StorageSettings().data_dir, db_url, chunk_size=1024)
    log = AuditLog.open(url=db_url, data_dir=tmp_path)
    failures: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for i in range(15):
                data = f"shared {i % 5}".encode()
                ref = store.put(data, "text/plain", "acme", taint="trusted" if k % 2 else "untrusted")
                store.put(data, "text/plain", "acme", taint="quarantined" if i % 5 == 0 else "trusted")
                store.record_use(ref.digest, "acme", "segment", f"s{k}/{i}")
                mine = store.put(f"own {k} {i}".encode(), "text/plain", "acme")
                store.forget(mine.digest, "acme")
                log.append(PolicyLoaded(policy_id=f"p{k}-{i}", policy_digest=P, tenant="acme"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        refs = store.list_refs("acme")
        assert len(refs) == 5
        assert {r.taint for r in refs if r.digest == store.put(b"shared 0", "text/plain", "acme").digest} == {
            "quarantined"
        }
        assert all(r.taint != "trusted" for r in refs)  # an untrusted re-put is never loosened back
        assert log.size() == 6 * 15
    finally:
        log.close()
        store.close()


def test_a_new_sqlite_database_is_the_owner_s_alone(tmp_path, settings, tiny_lm):
    """The folder is created 0700 and the file 0600 before SQLite opens it (never the umask's
    wider mode); the Kernel's data directory likewise."""
    import os
    import stat

    from fak import Kernel

    path = tmp_path / "new" / "dir" / "fak.db"
    engine = db.make_engine(f"sqlite:///{path}")
    with engine.connect() as conn:
        conn.execute(sa.text("CREATE TABLE t (x INTEGER)"))
    engine.dispose()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    k = Kernel.open(settings, model=tiny_lm, progress=None)
    try:
        assert stat.S_IMODE(os.stat(settings.data_dir).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(settings.data_dir / "fak.db").st_mode) == 0o600
    finally:
        k.close()


_OTHER_PROCESS = """
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
print(c.execute("SELECT count(*) FROM t").fetchone()[0])
c.close()  # the last user of the file as far as SQLite can tell: it checkpoints and deletes the WAL
"""


def _other_process(path) -> int:
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _OTHER_PROCESS, str(path)], capture_output=True, text=True,
                         timeout=60, check=True)
    return int(run.stdout)


def test_making_an_engine_keeps_this_process_s_locks(tmp_path):
    """Issue 25.1: a layer opening its engine while another layer of the same process holds
    the database open must not drop that process's POSIX locks on the file (as closing a
    descriptor opened outside SQLite does): another process closing its connection would
    then delete the WAL the first still writes into, and its later commits vanish."""
    path = tmp_path / "fak.db"
    url = f"sqlite:///{path}"
    engine = db.make_engine(url)
    with db.writing(engine) as conn:
        conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
        conn.exec_driver_sql("INSERT INTO t VALUES (1)")
    held = engine.connect()  # e.g. the audit writer's connection
    try:
        held.exec_driver_sql("SELECT count(*) FROM t").scalar()
        second = db.make_engine(url)  # e.g. the state store, opened after the audit log
        assert second is engine  # one engine per database per process
        assert _other_process(path) == 1  # e.g. 'fak keys list' while the server runs
        assert path.with_name("fak.db-wal").exists()
        with db.writing(engine) as conn:
            conn.exec_driver_sql("INSERT INTO t VALUES (2)")
        assert _other_process(path) == 2  # the commit is in the file everyone reads, not a deleted WAL
        db.release(second)
    finally:
        held.close()
        db.release(engine)


def test_one_engine_per_database_until_its_last_user_releases_it(tmp_path):
    url = f"sqlite:///{tmp_path / 'fak.db'}"
    a = db.make_engine(url)
    assert db.make_engine(f"sqlite:///{tmp_path / '.' / 'fak.db'}") is a  # the same file, spelled otherwise
    fast = db.make_engine(url, durable=False)
    assert fast is not a  # another synchronous setting: its own engine
    db.release(a)
    with a.connect() as conn:  # still in use by the other holder
        assert conn.exec_driver_sql("SELECT 1").scalar() == 1
    db.release(a)
    b = db.make_engine(url)
    assert b is not a  # the last release disposed it; the next user gets a new one
    db.release(b)
    db.release(fast)
