"""Export and offline verification: any single flipped byte is caught at the right
line and entry index; forged-but-rehashed entries, reordering, foreign keys and
--since are caught; the CLI reports with exit codes."""

from __future__ import annotations

import random

import pytest

from fak.audit import AuditError, AuditLog, PolicyLoaded, merkle, note, verify_export
from fak.audit.checkpoint import sign_checkpoint
from fak.audit.signing import KEY_FILE
from fak.cli import main

P = "sha256:" + "cd" * 32


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("audit-export")
    with AuditLog.open(url=f"sqlite:///{d / 'fak.db'}", data_dir=d, checkpoint_every=7) as log:
        for i in range(40):
            log.append(PolicyLoaded(policy_id=f"p{i}", policy_digest=P, tenant=f"t{i % 3}"))
        path = d / "export.log"
        log.export(path)
        return path, log.public_key(), log.latest_checkpoint()


def _line_table(data: bytes) -> list[tuple[int, int, str, int | None]]:
    """(start, end incl. newline, kind, entry index) for each line."""
    out, pos = [], 0
    for line in data.split(b"\n")[:-1]:
        end = pos + len(line) + 1
        kind = "h" if pos == 0 else line[:1].decode()
        idx = int(line.split(b" ")[1]) if kind == "e" else None
        out.append((pos, end, kind, idx))
        pos = end
    return out


def test_clean_export_verifies(exported):
    path, vkey, last = exported
    report = verify_export(path, pubkey=vkey)
    assert report.ok, report.summary()
    assert (report.entries, report.signed_size, report.root) == (40, 40, last.root)
    assert report.checkpoints >= 5 and report.trusted_key
    unpinned = verify_export(path)  # fails closed: no pinned key is no evidence
    assert not unpinned.ok and "no pinned key" in unpinned.error
    embedded = verify_export(path, trust_embedded_key=True)
    assert embedded.ok and not embedded.trusted_key and "not evidence" in embedded.summary()


def test_tamper_any_byte_detected(exported, tmp_path):
    path, vkey, _ = exported
    data = path.read_bytes()
    table = _line_table(data)
    rng = random.Random(7)
    positions = rng.sample(range(len(data)), 600)
    kinds = set()
    for pos in positions:
        bad = bytearray(data)
        bad[pos] ^= rng.randrange(1, 256)
        target = tmp_path / "bad.log"
        target.write_bytes(bytes(bad))
        lineno, (_, _, kind, idx) = next((n, t) for n, t in enumerate(table, start=1) if t[0] <= pos < t[1])
        kinds.add(kind)
        report = verify_export(target, pubkey=vkey)
        assert not report.ok, f"flip at byte {pos} (line {lineno}) went unnoticed"
        assert report.bad_line == lineno, (pos, report.summary())
        if kind == "e":
            assert report.first_bad_index == idx, (pos, report.summary())
    assert kinds == {"h", "e", "c"}


def test_rehashed_forgery_reordering_and_deletion_caught(exported, tmp_path):
    path, vkey, _ = exported
    lines = path.read_bytes().split(b"\n")
    entry_lines = [i for i, line in enumerate(lines) if line.startswith(b"e ")]
    # forge entry 10 and recompute its leaf hash: only the signed root can catch it
    k = entry_lines[10]
    body = lines[k].split(b" ", 3)[3].replace(b'"p10"', b'"px"')
    forged = list(lines)
    forged[k] = b"e 10 " + merkle.hash_leaf(body).hex().encode() + b" " + body
    (tmp_path / "f.log").write_bytes(b"\n".join(forged))
    r = verify_export(tmp_path / "f.log", pubkey=vkey)
    assert not r.ok and "signed root" in r.error and r.first_bad_index is not None and r.first_bad_index <= 10
    assert r.bad_range is not None and r.bad_range[0] <= 10 < r.bad_range[1]
    swapped = list(lines)
    swapped[entry_lines[3]], swapped[entry_lines[4]] = swapped[entry_lines[4]], swapped[entry_lines[3]]
    (tmp_path / "s.log").write_bytes(b"\n".join(swapped))
    r = verify_export(tmp_path / "s.log", pubkey=vkey)
    assert not r.ok and r.first_bad_index == 3
    dropped = [line for i, line in enumerate(lines) if i != entry_lines[20]]
    (tmp_path / "d.log").write_bytes(b"\n".join(dropped))
    r = verify_export(tmp_path / "d.log", pubkey=vkey)
    assert not r.ok and r.first_bad_index == 20


def test_foreign_key_and_since(exported, tmp_path):
    path, vkey, last = exported
    other = note.Signer.generate(vkey.split("+")[0]).verifier().vkey()
    r = verify_export(path, pubkey=other)
    assert not r.ok and r.bad_line == 1
    since = tmp_path / "cp.txt"
    since.write_text(last.note)
    assert verify_export(path, pubkey=vkey, since=str(since)).ok
    # a checkpoint the log's own key signed over a different history: the export does not extend it
    signer = note.Signer.parse((path.parent / KEY_FILE).read_text())
    since.write_text(sign_checkpoint(signer, signer.name, 3, merkle.hash_leaf(b"fork")).note)
    r = verify_export(path, pubkey=vkey, since=str(since))
    assert not r.ok and "--since" in r.error
    since.write_text(sign_checkpoint(signer, signer.name, 41, last.root).note)
    r = verify_export(path, pubkey=vkey, since=str(since))
    assert not r.ok and "shorter" in r.error
    since.write_text(sign_checkpoint(note.Signer.generate(signer.name), signer.name, 3, bytes(32)).note)
    with pytest.raises(AuditError, match="since"):
        verify_export(path, pubkey=vkey, since=str(since))


def test_cli_export_and_verify(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    with AuditLog.open(url=url) as log:
        for i in range(5):
            log.append(PolicyLoaded(policy_id=f"p{i}", policy_digest=P))
        vkey = log.public_key()
    out = tmp_path / "e.log"
    assert main(["audit", "export", str(out), "--url", url]) == 0
    assert main(["audit", "pubkey", "--url", url]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == vkey
    assert main(["audit", "verify", str(out), "--pubkey", vkey]) == 0
    assert "OK: 5 entries" in capsys.readouterr().out
    data = bytearray(out.read_bytes())
    data[data.index(b'"p3"') + 2] ^= 1
    out.write_bytes(bytes(data))
    assert main(["audit", "verify", str(out), "--pubkey", vkey]) == 1
    assert "entry index 3" in capsys.readouterr().err
    assert main(["audit", "verify", str(tmp_path / "missing.log")]) == 1
    assert "cannot read export" in capsys.readouterr().err
    assert main(["audit", "proof", "2", "--format", "tlog", "--url", url]) == 0
    assert capsys.readouterr().out.startswith("c2sp.org/tlog-proof@v1\nindex 2\n")
