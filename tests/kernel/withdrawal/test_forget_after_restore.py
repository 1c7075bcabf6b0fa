"""Forget after the main database was restored from a backup taken before the forget (the key
database kept live: the forgotten ref's data key stays destroyed, docs/deploy.md, "Restore").

The restored ledger says the ref is live in the sessions that held it, and its bytes no key
opens. A forget of that ref, a delete of such a session and the resume of a pending forget at
``Kernel.open`` never read them: the segments derived from the ref are dropped unread, the
survivors replayed, bit-exact to the forget the backup did not see. Any other use of such a
session is refused with the command that fixes it."""

from __future__ import annotations

import logging
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.kernel_facade_helpers import WEATHER

from fak import Kernel, Settings
from fak.audit.receipt import verify_receipt
from fak.errors import FakError
from fak.kernel.session.durable_ledger import RefsErased
from fak.kernel.withdrawal import forget as forgets
from fak.state.store import StateError

SECRET = b"Passport X4471902, Ada Lovelace, booked on LH 404 to Lisbon."


@dataclass(frozen=True)
class Restored:
    """A data directory whose main database is the backup taken before ``gone`` was forgotten."""

    gone: str  # forgotten after the backup: live in the restored database, its key destroyed
    kept: str  # live at the backup and after
    fingerprint: str  # the session ``trip`` after the forget the backup did not see
    survivors: list[str]  # its live segment ids after that forget


def _hold(k: Kernel) -> tuple[str, str]:
    """``trip``: the ref, a turn generated while it was live (sealed under its key), then a
    kept ref; ``plain``: the ref alone."""
    trip = k.create_session("acme", "trip")
    trip.append("system", "You are a travel assistant.")
    trip.append("user", "Book my flight.")
    gone = trip.admit("booking", SECRET).ref
    list(trip.generate(max_tokens=6, min_tokens=6))
    trip.append("user", "And the weather?")
    kept = trip.admit("weather", WEATHER).ref
    plain = k.create_session("acme", "plain")
    plain.append("user", "Book my flight.")
    plain.admit("booking", SECRET)
    return gone, kept


def _back_up(data: Path, dest: Path) -> None:
    dest.mkdir()
    with sqlite3.connect(data / "fak.db") as src, sqlite3.connect(dest / "fak.db") as dst:
        src.backup(dst)  # a consistent copy, its WAL included
    shutil.copytree(data / "blobs", dest / "blobs")


def _restore(data: Path, backup: Path) -> None:
    """The main database and blobs back from ``backup``; the key database stays as it is."""
    for p in data.glob("fak.db*"):
        p.unlink()
    shutil.rmtree(data / "blobs")
    shutil.copy2(backup / "fak.db", data / "fak.db")
    shutil.copytree(backup / "blobs", data / "blobs")


@pytest.fixture
def restored(settings: Settings, tiny_lm: Any, tmp_path: Path) -> Restored:
    data = Path(settings.data_dir)
    with Kernel.open(settings, model=tiny_lm, progress=None) as k:
        gone, kept = _hold(k)
        _back_up(data, tmp_path / "backup")
        k.forget("acme", gone, wait_replay=True)
        trip = k.session("acme", "trip")
        fingerprint = trip.fingerprint()
        survivors = [x["id"] for x in trip.ledger() if x["state"] == "live"]
    _restore(data, tmp_path / "backup")
    with Kernel.open(settings, model=tiny_lm, progress=None) as k:  # the runbook's signer-reset
        k.audit.reset_signer(k.audit.size(), principal="ops:alice")
    return Restored(gone, kept, fingerprint, survivors)


def _open(settings: Settings, tiny_lm: Any) -> Kernel:
    return Kernel.open(settings, model=tiny_lm, progress=None)


def test_forget_of_a_ref_erased_since_the_backup_completes_bit_exact(settings, tiny_lm, restored) -> None:
    with _open(settings, tiny_lm) as k:
        assert k.state.session("acme", "trip") is not None  # the restored ledger holds the ref as live
        receipt = k.forget("acme", restored.gone, wait_replay=True)
        assert receipt.replay == "verified" and verify_receipt(receipt, k.audit.public_key(), require_replay=True)
        assert {x.session_id for x in receipt.sessions} == {"trip", "plain"}
        dropped = {(u.kind, u.session_id) for u in receipt.units_dropped}
        assert {("segment", "trip"), ("generated_segment", "trip"), ("segment", "plain")} <= dropped
        trip = k.session("acme", "trip")
        # the same KV, bit for bit, as the forget the backup did not see (itself a never-saw run)
        assert trip.fingerprint() == restored.fingerprint == trip.replay_fingerprint()
        assert [x["id"] for x in trip.ledger() if x["state"] == "live"] == restored.survivors
        assert trip.refs() == {restored.kept}
        assert k.store.head(restored.gone, "acme").state == "forgotten"
        assert k.store.fsck().keyless == []
    with _open(settings, tiny_lm) as k:  # the ledger the forget wrote rebuilds and checks
        assert k.session("acme", "trip").fingerprint() == restored.fingerprint


def test_a_session_holding_an_erased_ref_is_refused_with_the_command(settings, tiny_lm, restored) -> None:
    with _open(settings, tiny_lm) as k, pytest.raises(RefsErased) as refused:
        k.session("acme", "trip").fingerprint()
    assert refused.value.refs == [restored.gone] and refused.value.status == 409
    assert f"fak forget {restored.gone} --tenant acme" in str(refused.value)


def test_delete_session_needs_no_rebuild(settings, tiny_lm, restored) -> None:
    with _open(settings, tiny_lm) as k:
        k.delete_session("acme", "plain")
        assert k.sessions("acme") == ["trip"]
        k.delete_session("acme", "trip")
        assert k.sessions("acme") == []


def test_open_resumes_a_pending_forget_of_an_erased_ref(settings, tiny_lm, restored, monkeypatch) -> None:
    def fails(*_: object, **__: object) -> None:
        raise StateError("the process died here")

    with _open(settings, tiny_lm) as k:
        with monkeypatch.context() as m:
            m.setattr(forgets, "drop_held_units", fails)
            with pytest.raises(StateError):
                k.forget("acme", restored.gone)
        assert k.state.forget_row("acme", restored.gone).state == "requested"
    with _open(settings, tiny_lm) as k:  # the open resumes it
        assert k.replays.wait(timeout=120)
        assert k.state.forget_row("acme", restored.gone).state == "completed"
        assert k.session("acme", "trip").fingerprint() == restored.fingerprint


def test_open_starts_when_a_pending_forget_cannot_finish(settings, tiny_lm, restored, monkeypatch, caplog) -> None:
    def fails(*_: object, **__: object) -> None:
        raise StateError("still broken")

    monkeypatch.setattr(forgets, "drop_held_units", fails)
    with _open(settings, tiny_lm) as k, pytest.raises(StateError):
        k.forget("acme", restored.gone)
    with caplog.at_level(logging.ERROR, logger="fak.kernel"), _open(settings, tiny_lm) as k:
        row = k.state.forget_row("acme", restored.gone)
        assert row.state == "requested"  # pending, said loudly, and the kernel serves
        said = " ".join(r.getMessage() for r in caplog.records)
        assert row.request_id in said and "still broken" in said
        assert f"fak forget {restored.gone} --tenant acme" in said
        monkeypatch.undo()
        receipt = k.forget("acme", restored.gone)  # the command it names finishes it
        assert receipt.request_id == row.request_id
        assert k.state.forget_row("acme", restored.gone).state in ("replaying", "completed")


def test_forget_of_another_ref_drops_an_erased_one_with_it(settings, tiny_lm, restored, caplog) -> None:
    with caplog.at_level(logging.WARNING), _open(settings, tiny_lm) as k:
        receipt = k.forget("acme", restored.kept, wait_replay=True)
        assert receipt.replay == "verified"
        said = " ".join(r.getMessage() for r in caplog.records)
        assert restored.gone in said and "erased already" in said
        trip = k.session("acme", "trip")
        assert trip.refs() == set() and trip.fingerprint() == trip.replay_fingerprint()
        live = [x for x in trip.ledger() if x["state"] == "live"]
        assert [x["kind"] for x in live] == ["system", "user", "user"]
        # the erased ref's own forget still completes (no session holds it now) and leaves no keyless ref
        k.forget("acme", restored.gone, wait_replay=True)
        assert k.store.fsck().keyless == []


def test_the_erased_ref_reads_nothing_at_any_step(settings, tiny_lm, restored) -> None:
    """The forget never needed its bytes: they are unreadable before and after it."""
    with _open(settings, tiny_lm) as k:
        with pytest.raises(FakError, match="not in the key database"):
            k.store.get(restored.gone, "acme")
        k.forget("acme", restored.gone)
        with pytest.raises(FakError):
            k.store.get(restored.gone, "acme")
