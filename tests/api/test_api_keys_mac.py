"""API key rows bound by a MAC under a server key that is not in the database (issue 25.4).

A database writer who edits a key's row (its tenant, its role, its revocation, its expiry)
gets a key that is refused with the same 401 as an unknown key, and the edit raises a
``key_alarm`` audit event (one per key and window, with a count: a flood of requests on
an edited row does not grow the log by a request each). Keys may carry an expiry; key
creation and revocation are audited events. Rows from before the upgrade are sealed by
the migration, once. Real SQLite and PostgreSQL, a real uvicorn server, real HMAC.
"""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from fak.db import writing


@pytest.fixture
def settings(settings, db_url):
    """conftest's settings on both backends."""
    return settings.model_copy(update={"database_url": db_url})


def _key_id(key: str) -> str:
    return key.split("_")[1]


def _edit(live, key: str, **values: object) -> None:  # noqa: ANN001
    """What a database writer does: an UPDATE on the key's row, nothing else."""
    cols = ", ".join(f"{c} = :{c}" for c in values)
    with writing(live.kernel.state.engine) as conn:
        n = conn.execute(sa.text(f"UPDATE fak_api_keys SET {cols} WHERE key_id = :kid"),
                         {**values, "kid": _key_id(key)}).rowcount
    assert n == 1


def _events(kernel, kind: str, wait: float = 0.0) -> list:  # noqa: ANN001
    """Events of ``kind`` in the log; waits up to ``wait`` s for at least one (alarms are submitted, not awaited)."""
    deadline = time.monotonic() + wait
    while True:
        found = [e.event for e in kernel.audit.entries() if e.event.type == kind]
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


def _refused_like_unknown(live, key: str, path: str = "/v1/sessions") -> None:  # noqa: ANN001
    with live.client(key) as c:
        r = c.get(path)
    with live.client("fak_" + "0" * 16 + "_" + "x" * 43) as c:
        unknown = c.get(path)
    assert r.status_code == 401, (path, r.status_code, r.text)
    assert r.json() == unknown.json()  # the same problem document: nothing says the row exists


def test_tenant_moved_in_the_database_is_refused_and_alarmed(live_server) -> None:
    live = live_server
    mine, theirs = live.key("acme", "agent"), live.key("globex", "agent")
    with live.client(theirs) as c:
        assert c.post("/v1/sessions", json={"id": "globex-secret"}).status_code == 201
    with live.client(mine) as c:
        assert c.get("/v1/sessions").json() == {"sessions": []}

    _edit(live, mine, tenant="globex")
    _refused_like_unknown(live, mine)
    (alarm,) = _events(live.kernel, "key_alarm", wait=5)
    assert alarm.key_id == _key_id(mine) and alarm.kind == "row_mac_mismatch" and alarm.tenant == ""
    with live.client(theirs) as c:  # the row nobody touched still works
        assert c.get("/v1/sessions").json() == {"sessions": ["globex-secret"]}


def test_role_escalated_in_the_database_is_refused(live_server) -> None:
    live = live_server
    key = live.key("acme", "agent")
    with live.client(key) as c:
        assert c.get("/v1/audit/entries").status_code == 403
    _edit(live, key, role="admin")
    _refused_like_unknown(live, key, "/v1/audit/entries")
    _refused_like_unknown(live, key)
    assert _events(live.kernel, "key_alarm", wait=5)


def test_unrevoked_in_the_database_is_refused(live_server) -> None:
    live = live_server
    key = live.key("acme", "agent")
    live.app.state.keys.revoke(_key_id(key))
    _refused_like_unknown(live, key)
    assert _events(live.kernel, "key_alarm") == []  # a revoked key is refused, not an alarm
    _edit(live, key, revoked_us=None)
    _refused_like_unknown(live, key)
    assert _events(live.kernel, "key_alarm", wait=5)


def test_expiry_moved_later_in_the_database_is_refused(live_server) -> None:
    live = live_server
    key, who = live.app.state.keys.create("acme", "agent", expires_in=3600)
    with live.client(key) as c:
        assert c.get("/v1/sessions").status_code == 200
    _edit(live, key, expires_us=who.expires_us + 365 * 86400 * 10**6)
    _refused_like_unknown(live, key)
    _edit(live, key, expires_us=None)  # or removed
    _refused_like_unknown(live, key)
    assert _events(live.kernel, "key_alarm", wait=5)


def test_an_expired_key_is_refused(live_server) -> None:
    live = live_server
    key, who = live.app.state.keys.create("acme", "agent", expires_in=1.0)
    lasting = live.key("acme", "agent")
    with live.client(key) as c:
        assert c.get("/v1/sessions").status_code == 200
    time.sleep(max(0.0, (who.expires_us / 1e6) - time.time()) + 0.05)
    _refused_like_unknown(live, key)
    with live.client(lasting) as c:
        assert c.get("/v1/sessions").status_code == 200
    assert _events(live.kernel, "key_alarm") == []
    failures = _events(live.kernel, "auth_failure", wait=5)
    assert any(f.reason == "expired" for f in failures)
    for bad in (0, -5, float("nan"), float("inf")):
        with pytest.raises(Exception, match="expir"):
            live.app.state.keys.create("acme", "agent", expires_in=bad)


def test_create_and_revoke_are_audited_without_the_secret(live_server) -> None:
    live = live_server
    key, who = live.app.state.keys.create("acme", "auditor", name="ci", expires_in=86400)
    live.app.state.keys.revoke(who.key_id, principal="operator")
    (created,) = _events(live.kernel, "key_created", wait=5)
    (revoked,) = _events(live.kernel, "key_revoked", wait=5)
    assert (created.key_id, created.tenant, created.role) == (who.key_id, "acme", "auditor")
    assert created.expires_ms == who.expires_us // 1000
    assert (revoked.key_id, revoked.tenant, revoked.role, revoked.principal) == (who.key_id, "acme", "auditor",
                                                                                  "operator")
    secret = key.split("_", 2)[2]
    for entry in live.kernel.audit.entries():
        assert secret.encode() not in entry.event.model_dump_json().encode()
    # the tenant's own auditors see their keys' lifecycle
    auditor = live.key("acme", "auditor")
    with live.client(auditor) as c:
        types = [e["type"] for e in c.get("/v1/audit/entries").json()["entries"]]
    assert "key_created" in types and "key_revoked" in types


def test_a_flood_on_an_edited_row_is_one_alarm_with_a_count(live_server) -> None:
    live = live_server
    key = live.key("acme", "agent")
    _edit(live, key, role="admin")
    with live.client(key) as c:
        codes = {c.get("/v1/sessions").status_code for _ in range(200)}
    assert codes == {401}
    alarms = _events(live.kernel, "key_alarm", wait=5)
    assert 1 <= len(alarms) <= 2 and alarms[0].refusals >= 1
    assert len(_events(live.kernel, "key_alarm")) <= 2


def test_rows_from_before_the_upgrade_are_sealed_once(settings, tiny_lm) -> None:
    """A database at the previous state revision with a key row (keyed hash only, as the
    old code wrote it): the upgrade seals it, the key works; a row added afterwards
    without a MAC (what a writer can insert) is refused."""
    import hashlib
    import hmac

    from alembic import command
    from alembic.config import Config

    from fak import Kernel
    from fak.api.keys import HASH_LABEL
    from fak.api.server import serve
    from fak.db import make_engine
    from fak.keys import derive_key, load_master_secret
    from fak.state.store import MIGRATIONS

    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    hash_key = derive_key(load_master_secret(settings.data_dir), HASH_LABEL)
    engine = make_engine(settings.resolved_database_url)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with writing(engine) as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "state_0004")  # the revision before the MAC

    def legacy(key_id: str, tenant: str) -> str:
        key = f"fak_{key_id}_{'s' * 43}"
        digest = hmac.new(hash_key, key.encode(), hashlib.sha256).hexdigest()
        with writing(engine) as conn:
            conn.execute(sa.text("INSERT INTO fak_api_keys (key_id, tenant, role, hash, created_us) "
                                 "VALUES (:k, :t, 'agent', :h, 1)"), {"k": key_id, "t": tenant, "h": digest})
        return key

    old = legacy("0123456789abcdef", "acme")
    engine.dispose()
    k = Kernel.open(settings, model=tiny_lm, progress=None)
    try:
        with serve(k) as live:
            with live.client(old) as c:
                assert c.get("/v1/sessions").status_code == 200
            engine = make_engine(settings.resolved_database_url)
            try:
                late = legacy("fedcba9876543210", "acme")  # no MAC: written after the upgrade
            finally:
                engine.dispose()
            _refused_like_unknown(live, late)
            assert [a.key_id for a in _events(k, "key_alarm", wait=5)] == ["fedcba9876543210"]
            _edit(live, old, tenant="globex")
            _refused_like_unknown(live, old)
    finally:
        k.close()


def test_cli_creates_expiring_keys_lists_tampered_rows_and_logs_both(db_url, monkeypatch, capsys) -> None:
    """``fak keys create --expires``, ``list`` (state and expiry; an edited row shows as
    tampered) and ``revoke``, in process, on both backends; creation and revocation logged."""
    import json
    import os
    from pathlib import Path

    from fak.audit import AuditLog
    from fak.cli import main
    from fak.db import make_engine

    monkeypatch.setenv("FAK_DATABASE_URL", db_url)
    assert main(["keys", "create", "--tenant", "acme", "--role", "agent", "--expires", "30d", "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert 29.9 * 86400 < made["expires_us"] / 1e6 - time.time() <= 30 * 86400
    assert main(["keys", "create", "--tenant", "acme", "--role", "admin", "--json"]) == 0
    other = json.loads(capsys.readouterr().out)
    with pytest.raises(SystemExit):
        main(["keys", "create", "--tenant", "acme", "--role", "agent", "--expires", "soon"])
    assert main(["keys", "create", "--tenant", "acme", "--role", "agent", "--expires", "0"]) == 1
    assert "expiry must be a positive number" in capsys.readouterr().err

    engine = make_engine(db_url)
    try:
        with writing(engine) as conn:
            conn.execute(sa.text("UPDATE fak_api_keys SET role = 'admin' WHERE key_id = :k"), {"k": made["key_id"]})
    finally:
        engine.dispose()
    assert main(["keys", "list"]) == 0
    listing = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "tampered" in listing[made["key_id"]] and "active" in listing[other["key_id"]]
    assert "expires never" in listing[other["key_id"]]
    assert main(["keys", "revoke", other["key_id"]]) == 0
    assert main(["keys", "list"]) == 0
    assert "revoked" in capsys.readouterr().out

    with AuditLog.open(db_url, Path(os.environ["FAK_DATA_DIR"])) as log:
        events = [e.event for e in log.entries()]
    created = [e for e in events if e.type == "key_created"]
    assert [(e.key_id, e.role, e.principal) for e in created] == [(made["key_id"], "agent", "cli"),
                                                                 (other["key_id"], "admin", "cli")]
    assert created[0].expires_ms == made["expires_us"] // 1000 and created[1].expires_ms is None
    assert [(e.key_id, e.tenant, e.role) for e in events if e.type == "key_revoked"] == [
        (other["key_id"], "acme", "admin")]
