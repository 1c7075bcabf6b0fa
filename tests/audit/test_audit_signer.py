"""The signer remembers what it signed outside the database: a database rewritten behind
its back (triggers dropped, entry changed, tree nodes recomputed, checkpoints deleted) is
refused loudly with an AuditAlarm in the log, on SQLite and real PostgreSQL; the state
file survives crashes; only an explicit, logged operator reset resumes signing."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time

import pytest
from support.audit import rewrite_history

from fak.audit import AuditError, AuditLog, PolicyLoaded, merkle
from fak.audit.checkpoint import open_checkpoint, parse_body
from fak.audit.events import canonical
from fak.audit.note import Verifier
from fak.audit.signer_state import STATE_FILE, SignerState, read_state, write_state
from fak.cli import main

P = "sha256:" + "cd" * 32


def ev(i: int) -> PolicyLoaded:
    return PolicyLoaded(policy_id=f"p{i}", policy_digest=P)


def alarms(log: AuditLog) -> list:
    return [e.event for e in log.entries() if e.event.type == "audit_alarm"]


def test_db_rewrite_refused_by_signer(db_url, tmp_path, capsys):
    with AuditLog.open(url=db_url, data_dir=tmp_path) as log:
        for i in range(10):
            log.append(ev(i))
        honest = log.checkpoint()
        vkey = log.public_key()
    assert read_state(tmp_path / STATE_FILE).size == 10

    rewrite_history(db_url, 2, canonical(PolicyLoaded(policy_id="p-forged", policy_digest=P)))
    with AuditLog.open(url=db_url, data_dir=tmp_path) as log:
        assert log.entry(2).event.policy_id == "p-forged"  # the rewrite took
        assert log.alarms == 1
        assert "ALARM (history_rewritten)" in capsys.readouterr().err
        (alarm,) = alarms(log)
        assert alarm.kind == "history_rewritten" and alarm.remembered_size == 10
        assert alarm.remembered_root == "sha256:" + honest.root.hex()
        assert alarm.found_root is not None and alarm.found_root != alarm.remembered_root
        assert log.entry(10).event == alarm  # audit-visible: the alarm is entry 10
        with pytest.raises(AuditError, match=r"size 10.*root .*signer signed root") as err:
            log.checkpoint()
        assert honest.root.hex() not in str(err.value)  # roots are printed base64, both of them
        from fak.audit.note import b64

        assert b64(honest.root) in str(err.value)
        assert log.append(ev(11)) == 11  # appends go on ...
        with pytest.raises(AuditError, match="rewritten"):
            log.checkpoint()  # ... but nothing covers them
        assert log.checkpoints() == [] and log.latest_checkpoint() is None
        with pytest.raises(AuditError):
            log.inclusion_proof(3)
    with AuditLog.open(url=db_url, data_dir=tmp_path) as log:  # every open says it again
        assert [a.kind for a in alarms(log)] == ["history_rewritten", "history_rewritten"]
        with pytest.raises(AuditError, match="rewritten"):
            log.checkpoint()
        size = log.size()
    # the operator's explicit, logged resolution (the CLI's is in test_signer_reset_cli)
    with AuditLog.open(url=db_url, data_dir=tmp_path) as log:
        n = log.size()
        assert n == size + 1  # this open's own alarm
        accepted, root = log.reset_signer(n, principal="ops:alice")
        assert accepted == n
        cp = log.checkpoint()
        assert cp.size == n + 1  # covers the reset event too
        reset = alarms(log)[-1]
        assert reset.kind == "signer_reset" and reset.principal == "ops:alice" and reset.found_size == n
        assert open_checkpoint(cp.note, Verifier.parse(vkey)).size == n + 1
        log.append(ev(99))
        assert log.checkpoint().size == n + 2  # signing resumed for good
    assert read_state(tmp_path / STATE_FILE).size == n + 2


def test_signer_reset_cli(tmp_path, capsys, monkeypatch):
    """``fak audit signer-reset`` against the default data dir (the CLI's own)."""
    monkeypatch.setenv("FAK_DATA_DIR", str(tmp_path))
    url = f"sqlite:///{tmp_path / 'fak.db'}"
    with AuditLog.open(url=url) as log:
        for i in range(4):
            log.append(ev(i))
        log.checkpoint()
    (tmp_path / STATE_FILE).unlink()  # e.g. an old key directory restored without its state
    with AuditLog.open(url=url) as log:
        assert [a.kind for a in alarms(log)] == ["signer_state_missing"]
        with pytest.raises(AuditError, match="remembers nothing"):
            log.checkpoint()
        n = log.size()
    capsys.readouterr()
    assert main(["audit", "signer-reset", "--accept-size", str(n + 7), "--url", url]) == 1
    assert "cannot accept size" in capsys.readouterr().err
    assert main(["audit", "signer-reset", "--accept-size", str(n), "--url", url, "--principal", "ops:bob"]) == 0
    out = capsys.readouterr()
    assert parse_body(out.out.split("\n\n")[0] + "\n").size >= n + 1
    with AuditLog.open(url=url) as log:
        assert log.alarms == 0
        assert alarms(log)[-1].kind == "signer_reset" and alarms(log)[-1].principal == "ops:bob"
        log.append(ev(50))
        assert log.checkpoint().size == log.size()


def test_state_ahead_of_the_database_alarms(tmp_path):
    """A database restored from a backup older than the signer's memory."""
    db = tmp_path / "fak.db"
    url = f"sqlite:///{db}"
    with AuditLog.open(url=url, data_dir=tmp_path) as log:
        for i in range(5):
            log.append(ev(i))
        log.checkpoint()
    shutil.copy(db, tmp_path / "backup.db")
    with AuditLog.open(url=url, data_dir=tmp_path) as log:
        for i in range(5, 9):
            log.append(ev(i))
        log.checkpoint()
    shutil.copy(tmp_path / "backup.db", db)
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"fak.db{suffix}").unlink(missing_ok=True)
    with AuditLog.open(url=url, data_dir=tmp_path) as log:
        (alarm,) = alarms(log)
        assert alarm.kind == "signer_state_ahead" and alarm.remembered_size == 9 and alarm.found_size == 5
        with pytest.raises(AuditError, match="signed size 9"):
            log.checkpoint()


def test_first_start_creates_state_and_each_checkpoint_updates_it(db_url, tmp_path):
    with AuditLog.open(url=db_url, data_dir=tmp_path, checkpoint_every=3) as log:
        st = read_state(tmp_path / STATE_FILE)
        assert (st.size, st.root) == (0, merkle.EMPTY_ROOT) and st.origin == log.origin
        assert os.stat(tmp_path / STATE_FILE).st_mode & 0o777 == 0o600
        for i in range(7):
            log.append(ev(i))
        cp = log.checkpoint()
        st = read_state(tmp_path / STATE_FILE)
        assert (st.size, st.root) == (7, cp.root) and cp.timestamp is not None
        assert abs(cp.timestamp - time.time()) < 60 and cp.text.split("\n")[3] == f"timestamp {cp.timestamp}"
        assert st.key_id == log.public_key().split("+")[1]
        json.loads((tmp_path / STATE_FILE).read_text())  # plain JSON an operator can read


def test_state_remembered_but_checkpoint_lost_is_not_an_alarm(tmp_path):
    """A crash after the state was written but before the checkpoint committed: the
    entries are there, so the remembered tree is still a prefix of the log."""
    url = f"sqlite:///{tmp_path / 'fak.db'}"
    with AuditLog.open(url=url, data_dir=tmp_path) as log:
        for i in range(6):
            log.append(ev(i))
        log.checkpoint()
        for i in range(6, 11):
            log.append(ev(i))
        root = log.root()
    old = read_state(tmp_path / STATE_FILE)
    write_state(tmp_path / STATE_FILE, SignerState(old.origin, old.key_id, 11, root, int(time.time())))
    with AuditLog.open(url=url, data_dir=tmp_path) as log:
        assert log.alarms == 0
        assert log.checkpoint().size == 11
    write_state(tmp_path / STATE_FILE, SignerState(old.origin, old.key_id, 11, merkle.hash_leaf(b"x"), 0))
    with AuditLog.open(url=url, data_dir=tmp_path) as log:  # ... but a wrong root is
        assert [a.kind for a in alarms(log)] == ["history_rewritten"]


def test_state_file_writes_are_atomic_under_sigkill(tmp_path):
    """SIGKILL a child rewriting the state file as fast as it can, 40 times, each after it has
    written at least once: the file is always one complete state, never torn, and the sizes
    only grow."""
    path = tmp_path / STATE_FILE
    rng = random.Random(7)
    seen = -1
    for trial in range(40):
        pid = os.fork()
        if pid == 0:
            try:
                n = max(seen, 0)
                while True:
                    n += 1
                    write_state(path, SignerState("o.test/log", "0a0b0c0d", n, merkle.hash_leaf(str(n).encode()), n))
            finally:
                os._exit(0)
        # the kill lands once the child has written (under load a child may not run at all in a
        # fixed window, and a trial without a write proves nothing), then at a random point
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and ((st := read_state(path)) is None or st.size <= max(seen, 0)):
            time.sleep(0.001)
        time.sleep(rng.uniform(0.005, 0.05))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        st = read_state(path)
        if st is None:
            assert trial == 0 or seen == -1
            continue
        assert st.root == merkle.hash_leaf(str(st.size).encode()), f"trial {trial}: torn state"
        assert st.size >= seen
        seen = st.size
    assert seen > 40


def test_another_key_in_the_same_data_dir_has_its_own_memory(tmp_path, monkeypatch):
    from fak.audit.note import Signer

    with AuditLog.open(url=f"sqlite:///{tmp_path / 'a.db'}", data_dir=tmp_path) as a:
        a.append(ev(0))
        a.checkpoint()
    signer = Signer.generate("other.test/log")
    with AuditLog.open(url=f"sqlite:///{tmp_path / 'b.db'}", data_dir=tmp_path, signing_key=signer) as b:
        b.append(ev(0))
        b.append(ev(1))
        assert b.checkpoint().size == 2 and b.alarms == 0
    assert (tmp_path / f"audit_signer.{signer.id:08x}.state").exists()
    assert read_state(tmp_path / STATE_FILE).size == 1


def test_running_service_resumes_after_a_reset_elsewhere(tmp_path):
    """The service keeps refusing while the state file is unchanged; an operator's reset
    from another process (the CLI) changes it, and the service's next checkpoint signs."""
    url = f"sqlite:///{tmp_path / 'fak.db'}"
    with AuditLog.open(url=url, data_dir=tmp_path) as log:
        for i in range(6):
            log.append(ev(i))
        log.checkpoint()
    rewrite_history(url, 1, canonical(PolicyLoaded(policy_id="p-forged", policy_digest=P)))
    with AuditLog.open(url=url, data_dir=tmp_path) as service:
        with pytest.raises(AuditError, match="rewritten"):
            service.checkpoint()
        service.append(ev(7))
        with pytest.raises(AuditError, match="rewritten"):
            service.checkpoint()
        with AuditLog.open(url=url, data_dir=tmp_path) as operator:  # what the CLI does
            operator.reset_signer(operator.size(), principal="ops:carol")
        service.append(ev(8))
        cp = service.checkpoint()
        assert cp.size == service.size() and service.alarms == 1
        assert [a.kind for a in alarms(service)] == ["history_rewritten", "history_rewritten", "signer_reset"]


def test_a_replaced_key_remembers_nothing(tmp_path, capsys):
    """The data dir's key replaced (the old state stays): the new key has no memory of this
    non-empty log, so it raises the alarm instead of signing."""
    from fak.audit.signing import KEY_FILE

    url = f"sqlite:///{tmp_path / 'fak.db'}"
    with AuditLog.open(url=url, data_dir=tmp_path) as log:
        log.append(ev(0))
        log.checkpoint()
    (tmp_path / KEY_FILE).unlink()
    with AuditLog.open(url=url, data_dir=tmp_path) as log:
        assert [a.kind for a in alarms(log)] == ["signer_state_missing"]
        with pytest.raises(AuditError, match="remembers nothing"):
            log.checkpoint()
    assert "belongs to" in capsys.readouterr().err
