"""The backup and restore runbook of docs/deploy.md, executed on a real data directory (SQLite,
the tiny model) with the real ``fak`` commands the page shows.

The files backed up, where, and what a restore does with each are read from the page's backup
table, so the page and this test cannot drift apart. A ref is admitted, the data set is backed
up, the ref is forgotten, the main database and blobs are lost and restored from the backup;
then the page's steps run as written: the backup's export verifies with the pinned key, the
signer refuses (``signer_state_ahead``) until ``fak audit signer-reset``, the restored log
extends the backup's export byte for byte, ``fak cas fsck`` lists the forgotten ref as keyless
and ``fak forget`` makes it a tombstone again, dropping it from the restored session that held
it (never reading it). Nothing of the forgotten ref reads again, at any step; the ref that was
live at the backup reads back."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.at_rest import raw_bytes_under

from fak.cli import main

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "deploy.md"
HEADER = "| file | compose | holds | backup set | restore | never store with |"
SECRET = b"Passport X4471902, Ada Lovelace, booked on LH 404 to Lisbon."
KEPT = b"The weather in Lisbon is sunny, 24 degrees."


@dataclass(frozen=True)
class Row:
    path: str
    backup_set: str
    restore: str
    never_with: frozenset[str]


def backup_table() -> dict[str, Row]:
    """docs/deploy.md's backup table: file -> its backup set, its restore, what it is never stored with."""
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    start = lines.index(HEADER) + 2
    rows: dict[str, Row] = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        path = cells[0].strip("`")
        rows[path] = Row(path, cells[3], cells[4], frozenset(re.findall(r"`([^`]+)`", cells[5])))
    return rows


def shell_commands(section: str) -> list[list[str]]:
    """The ``fak`` lines of the shell fences of a section of docs/deploy.md, as words."""
    text = PAGE.read_text(encoding="utf-8").split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    out = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        out += [line.split() for line in block.strip().splitlines() if line.strip().startswith("fak ")]
    return out


@dataclass
class Fak:
    """``fak`` in this process (the real parser and handlers), recording every command it ran."""

    ran: list[list[str]] = field(default_factory=list)

    def __call__(self, *argv: str, rc: int = 0) -> tuple[str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
        self.ran.append(["fak", *argv])
        assert code == rc, f"fak {' '.join(argv)} -> {code}, expected {rc}\n{out.getvalue()}\n{err.getvalue()}"
        return out.getvalue(), err.getvalue()


def _placeholder(word: str) -> bool:
    return "$" in word or word.startswith("/backup/") or bool(re.fullmatch(r"[A-Z][A-Z_]*|ops:\w+", word))


def _ran_as_written(doc: list[str], ran: list[list[str]]) -> bool:
    return any(len(r) == len(doc) and all(d == w or _placeholder(d) for d, w in zip(doc, r, strict=True))
               for r in ran)


@pytest.fixture
def env(tmp_path: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    data = tmp_path / "data"
    for name, value in {"FAK_DATA_DIR": str(data), "FAK_MODEL_PATH": str(tiny_dir), "FAK_CHUNK_SIZE": "16"}.items():
        monkeypatch.setenv(name, value)
    for name in ("FAK_DATABASE_URL", "FAK_CAS_KEY_URL", "FAK_MASTER_SECRET", "FAK_AUDIT_SIGNING_KEY", "FAK_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    return data


def _admit(data: Path, tiny_lm: object) -> tuple[str, str]:
    from fak import Kernel, Settings

    with Kernel.open(Settings(data_dir=data, model_path=None, chunk_size=16), model=tiny_lm, progress=None) as k:
        s = k.create_session("acme", "trip")
        s.append("user", "Book my flight.")
        gone = s.admit("booking", SECRET).ref
        kept = s.admit("weather", KEPT).ref
    return gone, kept


def _back_up(data: Path, dest: Path, table: dict[str, Row], fak: Fak) -> None:
    """Each file of the table into ``dest/<its backup set>/``, as the page says to take it."""
    for row in table.values():
        if row.backup_set not in ("data", "keys", "secrets"):
            continue
        target = dest / row.backup_set / row.path.rstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if row.path == "audit.export":
            fak("audit", "export", str(target))
        elif row.path.endswith(".db"):  # SQLite's online backup API: a consistent copy, its WAL included
            with sqlite3.connect(data / row.path) as src, sqlite3.connect(target) as dst:
                src.backup(dst)
        elif row.path.endswith("/"):
            shutil.copytree(data / row.path, target)
        else:
            shutil.copy2(data / row.path, target)


def _restore(data: Path, backup: Path, table: dict[str, Row]) -> None:
    for row in table.values():
        if row.restore == "from backup":
            source = backup / row.backup_set / row.path.rstrip("/")
            if row.path.endswith("/"):
                shutil.copytree(source, data / row.path)
            else:
                shutil.copy2(source, data / row.path)
        elif row.restore == "keep live" and row.path != "fak.lock":
            assert (data / row.path).exists(), f"{row.path}: the page keeps it live, but it is gone"


def _lose_the_main_database(data: Path) -> None:
    for p in data.glob("fak.db*"):
        p.unlink()
    shutil.rmtree(data / "blobs")


def test_the_backup_table_keeps_keys_and_secrets_apart() -> None:
    table = backup_table()
    assert set(table) == {"fak.db", "blobs/", "audit.export", "keys/cas-keys.db", "master.key",
                          "audit_signing.key", "audit_signer.state", "fak.lock"}
    sets = {path: row.backup_set for path, row in table.items()}
    assert sets["fak.db"] == sets["blobs/"] == "data" and sets["keys/cas-keys.db"] == "keys"
    assert sets["master.key"] == sets["audit_signing.key"] == "secrets" and sets["audit_signer.state"] == "none"
    # what the page says is never stored together is in different sets, both ways where both are backed up
    for row in table.values():
        for other in row.never_with & set(table):
            assert sets[other] != row.backup_set, f"{row.path} and {other} share a backup set"
    assert "keys/cas-keys.db" in table["master.key"].never_with and "master.key" in table["keys/cas-keys.db"].never_with
    assert table["keys/cas-keys.db"].restore == "keep live" and table["audit_signer.state"].restore == "keep live"


def test_backup_forget_restore_as_the_page_says(env: Path, tmp_path: Path, tiny_lm: object) -> None:
    data, backup, fak, table = env, tmp_path / "backup", Fak(), backup_table()
    gone, kept = _admit(data, tiny_lm)
    pinned = fak("audit", "pubkey")[0].strip()
    _back_up(data, backup, table, fak)
    assert sorted(p.name for p in backup.iterdir()) == ["data", "keys", "secrets"]
    assert not list((backup / "data").rglob("*.key")) and not list((backup / "data").rglob("cas-keys.db"))

    out, _ = fak("forget", gone, "--tenant", "acme")
    assert json.loads(out)["ref"] == gone
    fak("cas", "get", gone, "--tenant", "acme", "-o", str(tmp_path / "got"), rc=1)

    _lose_the_main_database(data)
    _restore(data, backup, table)
    assert (data / "fak.db").exists() and (data / "blobs").is_dir()

    # the forgotten ref is in the restored database as live, and reads nothing: its key is gone
    _, err = fak("cas", "get", gone, "--tenant", "acme", "-o", str(tmp_path / "got"), rc=1)
    assert "not in the key database" in err
    assert not (tmp_path / "got").exists() or (tmp_path / "got").read_bytes() == b""  # -o opened, nothing written
    assert SECRET not in raw_bytes_under(data)

    # step 3: the backup's export verifies with the pinned key; its size is N
    out, _ = fak("audit", "verify", str(backup / "data" / "audit.export"), "--pubkey", pinned)
    n = int(re.search(r"OK: (\d+) entries", out).group(1))
    # step 4: the signer refuses until the operator's reset
    _, err = fak("audit", "checkpoint", rc=1)
    assert "signer_state_ahead" in err and "fak audit signer-reset --accept-size" in err
    fak("audit", "signer-reset", "--accept-size", str(n), "--principal", "ops:alice")
    # step 5: the restored log is the backup's, entry for entry, and signed again
    restored = backup / "restored.export"
    fak("audit", "export", str(restored))
    fak("audit", "verify", str(restored), "--pubkey", pinned, "--since", str(backup / "data" / "audit.export"))
    events = [json.loads(line.split(" ", 3)[3]) for line in restored.read_text().splitlines() if line.startswith("e ")]
    assert [e["kind"] for e in events if e["type"] == "audit_alarm"][-1] == "signer_reset"
    assert not any(e["type"] == "forget_completed" for e in events)  # lost with the entries after the backup

    # step 6: fsck names the ref forgotten since the backup; the kernel's forget makes it a tombstone again
    out, _ = fak("cas", "fsck", rc=1)
    assert json.loads(out)["keyless"] == [f"acme {gone}"]
    fak("forget", gone, "--tenant", "acme")
    out, _ = fak("cas", "fsck")
    assert json.loads(out)["keyless"] == []
    assert json.loads(fak("cas", "head", gone, "--tenant", "acme")[0])["state"] == "forgotten"
    fak("cas", "get", gone, "--tenant", "acme", "-o", str(tmp_path / "got"), rc=1)
    fak("cas", "get", kept, "--tenant", "acme", "-o", str(tmp_path / "kept"))
    assert (tmp_path / "kept").read_bytes() == KEPT  # what was live at the backup is back
    assert SECRET not in raw_bytes_under(data) + raw_bytes_under(backup)

    final = backup / "final.export"
    fak("audit", "export", str(final))
    fak("audit", "verify", str(final), "--pubkey", pinned, "--since", str(backup / "data" / "audit.export"))

    documented = shell_commands("Restore")
    assert len(documented) == 6
    missing = [" ".join(d) for d in documented if not _ran_as_written(d, fak.ran)]
    assert missing == [], f"the page's restore commands this test did not run as written: {missing}"


def test_the_kernel_forgets_a_ref_forgotten_since_the_backup(env: Path, tmp_path: Path, tiny_lm: object) -> None:
    """The restored session that held the ref is refused (naming the fix) until the kernel's
    forget, which drops the ref unread; then it serves the survivors, and every start opens."""
    from fak import Kernel, Settings
    from fak.kernel.session.durable_ledger import RefsErased

    data, backup, fak, table = env, tmp_path / "backup", Fak(), backup_table()
    gone, kept = _admit(data, tiny_lm)
    _back_up(data, backup, table, fak)
    fak("forget", gone, "--tenant", "acme")
    _lose_the_main_database(data)
    _restore(data, backup, table)
    n = int(re.search(r"OK: (\d+) entries", fak("audit", "verify", str(backup / "data" / "audit.export"),
                                                   "--trust-embedded-key")[0]).group(1))
    fak("audit", "signer-reset", "--accept-size", str(n))
    settings = Settings(data_dir=data, model_path=None, chunk_size=16)
    with Kernel.open(settings, model=tiny_lm, progress=None) as k, pytest.raises(RefsErased, match=re.escape(
            f"fak forget {gone} --tenant acme")):
        k.session("acme", "trip").refs()
    receipt = json.loads(fak("forget", gone, "--tenant", "acme")[0])
    assert [x["session_id"] for x in receipt["sessions"]] == ["trip"] and receipt["replay_event"] is not None
    with Kernel.open(settings, model=tiny_lm, progress=None) as k:
        trip = k.session("acme", "trip")
        assert trip.refs() == {kept} and trip.fingerprint() == trip.replay_fingerprint()
    assert json.loads(fak("cas", "fsck")[0])["keyless"] == []
