"""A whole earlier row of a key, restored by a database writer, does not bring the key back
(issue 25.4, the gaps its MAC left).

The row's MAC binds its fields, not its history: a copy of the row taken before a
revocation (a backup) carries a valid MAC. The signed audit log does hold the history
(``key_revoked``, ``tenant_erased``; removing an entry is a history rewrite the signer
detects), so authentication refuses a key the log says is revoked, whatever its row says:
401 as for an unknown key, and a ``key_alarm`` (kind ``revoked_in_log``). A revocation by
another process (``fak keys revoke`` beside a running server) is honoured by the row at
once and by the log within the key store's refresh interval. And a writer who rolls the
state schema back (drops the MAC column) does not get the rows sealed again at the next
upgrade once the log shows this deployment sealed keys before.

Real SQLite and PostgreSQL, a real uvicorn server, a real ``fak`` process, real HMAC.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from fak.db import writing

FAK = str(Path(sys.executable).with_name("fak"))
COLUMNS = ("key_id", "tenant", "role", "hash", "name", "created_us", "revoked_us", "expires_us", "mac")


@pytest.fixture
def settings(settings, db_url):
    """conftest's settings on both backends."""
    return settings.model_copy(update={"database_url": db_url})


def _key_id(key: str) -> str:
    return key.split("_")[1]


def _copy_row(engine, key: str) -> dict:  # noqa: ANN001
    """What a backup holds: the key's whole row, MAC included."""
    with engine.connect() as conn:
        row = conn.execute(sa.text(f"SELECT {', '.join(COLUMNS)} FROM fak_api_keys WHERE key_id = :k"),
                           {"k": _key_id(key)}).mappings().one()
    return dict(row)


def _backed_up_key(live) -> tuple[str, dict]:  # noqa: ANN001
    """A new key of acme's, seen working (the server has built its view of the log), and its
    row as a backup holds it now."""
    key = live.key("acme", "agent")
    assert _status(live, key) == 200
    return key, _copy_row(live.kernel.state.engine, key)


def _restore_row(engine, row: dict) -> None:  # noqa: ANN001
    """What a database writer does with that backup: the row put back as it was."""
    with writing(engine) as conn:
        conn.execute(sa.text("DELETE FROM fak_api_keys WHERE key_id = :key_id"), row)
        conn.execute(sa.text(f"INSERT INTO fak_api_keys ({', '.join(COLUMNS)}) "
                             f"VALUES ({', '.join(':' + c for c in COLUMNS)})"), row)


def _state_schema_to(engine, revision: str, *, down: bool = False) -> None:  # noqa: ANN001
    """Alembic on the state schema, up or down to ``revision`` (what a writer holding the
    migrations can do)."""
    from alembic import command
    from alembic.config import Config

    from fak.state.store import MIGRATIONS

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with writing(engine) as conn:
        cfg.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(cfg, revision)


def _status(live, key: str) -> int:  # noqa: ANN001
    with live.client(key) as c:
        return c.get("/v1/sessions").status_code


def _refused_like_unknown(live, key: str) -> None:  # noqa: ANN001
    with live.client(key) as c:
        r = c.get("/v1/sessions")
    with live.client("fak_" + "0" * 16 + "_" + "x" * 43) as c:
        unknown = c.get("/v1/sessions")
    assert r.status_code == 401, (r.status_code, r.text)
    assert r.json() == unknown.json()  # nothing says the row exists, or why it is refused


def _alarms(kernel, wait: float = 5.0) -> list:  # noqa: ANN001
    deadline = time.monotonic() + wait
    while True:
        found = [e.event for e in kernel.audit.entries() if e.event.type == "key_alarm"]
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


def _refused_within(live, key: str, bound_s: float) -> float:  # noqa: ANN001
    """Seconds until the key is refused (polled); fails past ``bound_s``."""
    start = time.monotonic()
    while _status(live, key) != 401:
        assert time.monotonic() - start < bound_s, f"the restored row still worked after {bound_s} s"
        time.sleep(0.02)
    return time.monotonic() - start


def test_a_restored_pre_revocation_row_is_refused_and_alarmed(live_server) -> None:
    live = live_server
    key, before = _backed_up_key(live)
    other = live.key("acme", "agent")
    live.app.state.keys.revoke(_key_id(key))
    assert _status(live, key) == 401
    _restore_row(live.kernel.state.engine, before)  # the row as it was, MAC and all: the MAC alone takes it
    _refused_like_unknown(live, key)
    (alarm,) = _alarms(live.kernel)
    assert (alarm.key_id, alarm.kind, alarm.tenant) == (_key_id(key), "revoked_in_log", "")
    assert _status(live, other) == 200  # the key beside it is untouched
    assert live.app.state.keys.state(live.app.state.keys.list("acme")[0]) == "tampered"


def test_a_restored_row_of_an_erased_tenant_is_refused(live_server) -> None:
    live = live_server
    key, before = _backed_up_key(live)
    theirs = live.key("globex", "agent")
    event = live.kernel.erase_tenant("acme", confirm="acme")
    assert event.api_keys_revoked == 1 and _status(live, key) == 401
    _restore_row(live.kernel.state.engine, before)
    _refused_within(live, key, 3.0)  # the erase was logged by the kernel, not the key store: one refresh
    assert [(a.key_id, a.kind) for a in _alarms(live.kernel)] == [(_key_id(key), "revoked_in_log")]
    fresh = live.key("acme", "agent")  # the tenant's name is used again: its new keys work
    assert _status(live, fresh) == 200 and _status(live, theirs) == 200


def test_a_revocation_by_another_process_is_honoured_within_the_refresh_bound(live_server, settings) -> None:
    """``fak keys revoke`` in its own process beside the running server: the row refuses the
    key at once; the row restored right after is refused within the refresh interval
    (1 s), by the log."""
    from fak.api.keys import REFRESH_S

    live = live_server
    key, before = _backed_up_key(live)
    env = {**os.environ, "FAK_DATA_DIR": str(settings.data_dir), "FAK_DATABASE_URL": settings.resolved_database_url}
    done = subprocess.run([FAK, "keys", "revoke", _key_id(key)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    revoked_at = time.monotonic()
    assert _status(live, key) == 401  # the row: at once
    _restore_row(live.kernel.state.engine, before)
    _refused_within(live, key, REFRESH_S + 1.0)  # the log: within the refresh interval (+ slack for a loaded CI)
    took = time.monotonic() - revoked_at
    assert took < REFRESH_S + 1.0, took
    assert [(a.key_id, a.kind) for a in _alarms(live.kernel)] == [(_key_id(key), "revoked_in_log")]


def test_a_schema_rollback_does_not_reseal_the_rows(settings, tiny_lm, capfd) -> None:
    """A writer rolls the state schema back to before the MAC (drops the column) and
    un-revokes a key: the next open's upgrade does not seal the rows again (the log shows
    this deployment sealed keys before), says so, and every such row is refused."""
    from fak import Kernel
    from fak.api.keys import KeyStore
    from fak.api.server import serve
    from fak.db import make_engine

    k = Kernel.open(settings, model=tiny_lm, progress=None)
    try:
        keys = KeyStore.of(k)
        active, _ = keys.create("acme", "agent")
        revoked, who = keys.create("acme", "admin")
        keys.revoke(who.key_id)
    finally:
        k.close()

    engine = make_engine(settings.resolved_database_url)
    try:
        _state_schema_to(engine, "state_0004", down=True)  # the mac and expires_us columns dropped
        with writing(engine) as conn:
            conn.execute(sa.text("UPDATE fak_api_keys SET revoked_us = NULL"))
    finally:
        engine.dispose()

    capfd.readouterr()
    k = Kernel.open(settings, model=tiny_lm, progress=None)
    try:
        assert "not sealed again" in capfd.readouterr().err
        with serve(k) as live:
            for key in (active, revoked):
                _refused_like_unknown(live, key)
            assert {a.kind for a in _alarms(k)} <= {"row_mac_mismatch", "revoked_in_log"}
            fresh = live.key("acme", "agent")  # keys created after it work
            assert _status(live, fresh) == 200
        assert {KeyStore.of(k).state(r) for r in KeyStore.of(k).list("acme") if r.key_id != _key_id(fresh)} == {
            "tampered"}
    finally:
        k.close()


def test_a_fresh_deployment_and_a_first_upgrade_still_seal(settings, tiny_lm) -> None:
    """The refusal to seal is for a rolled-back table only: a database whose log holds no
    key event (never upgraded before) is sealed at its upgrade as before."""
    from fak import Kernel
    from fak.api.keys import HASH_LABEL
    from fak.api.server import serve
    from fak.audit import AuditLog
    from fak.db import make_engine
    from fak.keys import derive_key, load_master_secret

    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    with AuditLog.open(settings.resolved_database_url, settings.data_dir,
                       origin=settings.audit_origin) as log:  # a log, no key events
        log.append({"type": "tenant_erase_requested", "tenant": "other"})
    hash_key = derive_key(load_master_secret(settings.data_dir), HASH_LABEL)
    old = f"fak_0123456789abcdef_{'s' * 43}"
    engine = make_engine(settings.resolved_database_url)
    try:
        _state_schema_to(engine, "state_0004")
        with writing(engine) as conn:  # a row as the code before the MAC wrote it
            conn.execute(sa.text("INSERT INTO fak_api_keys (key_id, tenant, role, hash, created_us) "
                                 "VALUES ('0123456789abcdef', 'acme', 'agent', :h, 1)"),
                         {"h": hmac.new(hash_key, old.encode(), hashlib.sha256).hexdigest()})
    finally:
        engine.dispose()
    k = Kernel.open(settings, model=tiny_lm, progress=None)
    try:
        with serve(k) as live:
            assert _status(live, old) == 200
            assert _status(live, live.key("acme", "agent")) == 200
    finally:
        k.close()


def test_renaming_the_revocation_in_the_type_column_hides_nothing(live_server) -> None:
    """The log's ``type`` column is not hashed: a writer who renames the ``key_revoked``
    entry there (the append-only triggers dropped) and restores the row gains nothing, in
    a server that reads the log afresh (restarted) as in one that read it before."""
    from fak.api.keys import KeyStore

    live = live_server
    engine = live.kernel.state.engine
    key = live.key("acme", "agent")
    before = _copy_row(engine, key)
    live.app.state.keys.revoke(_key_id(key))
    with writing(engine) as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("ALTER TABLE audit_entries DISABLE TRIGGER USER"))
        else:
            for name in conn.execute(sa.text("SELECT name FROM sqlite_master WHERE type = 'trigger' "
                                             "AND tbl_name = 'audit_entries'")).scalars().all():
                conn.execute(sa.text(f'DROP TRIGGER "{name}"'))
        n = conn.execute(sa.text("UPDATE audit_entries SET type = 'eviction' WHERE type = 'key_revoked'")).rowcount
        assert n == 1
    _restore_row(engine, before)
    _refused_like_unknown(live, key)
    fresh = KeyStore.of(live.kernel)  # what a restarted server builds: the log read from its bodies
    assert fresh.check(key).principal is None and fresh.state(fresh.list("acme")[0]) == "tampered"


def test_a_slow_log_refresh_does_not_hold_up_other_authentications(tmp_path, monkeypatch) -> None:
    """The backstop's refresh queries the database; while one caller makes it, the others
    answer from what was read instead of queueing behind it (fails when the refresh ran
    under the lock every lookup takes)."""
    import threading

    from fak.api.keys import _LogRevocations
    from fak.audit import store as log_store

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'log.db'}")
    log_store.Base.metadata.create_all(engine, tables=[log_store.entries_t])
    log = _LogRevocations(engine, refresh_s=0.0)
    log.revoked("c" * 16, "t0")  # the first read
    entered, release = threading.Event(), threading.Event()
    real = log_store.entries_of_types

    def slow(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        entered.set()
        release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(log_store, "entries_of_types", slow)
    with engine.begin() as conn:  # one entry, so the refresh has a range to read
        conn.execute(log_store.entries_t.insert().values(idx=0, tenant="", type="x", ts=0, body=b"{}"))
    first = threading.Thread(target=log.revoked, args=("a" * 16, "t1"))
    first.start()
    try:
        assert entered.wait(5)
        answered = []
        other = threading.Thread(target=lambda: answered.append(log.revoked("b" * 16, "t2")))
        other.start()
        other.join(2)
        assert answered == [False]
    finally:
        release.set()
        first.join(10)
    engine.dispose()
