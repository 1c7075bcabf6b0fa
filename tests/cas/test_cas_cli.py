"""``fak cas`` through the real CLI entry point: round trip, clear errors, forget."""

from __future__ import annotations

import json

import pytest

from fak.cli import main


def test_cli_put_get_forget(tmp_path, capsys):
    src = tmp_path / "result.txt"
    src.write_bytes(b"a tool result\n" * 100)
    assert main(["cas", "put", str(src), "--media-type", "text/plain", "--tenant", "acme"]) == 0
    ref = json.loads(capsys.readouterr().out)
    assert ref["digest"].startswith("blake3k:") and ref["size"] == 1400

    out = tmp_path / "out.bin"
    assert main(["cas", "get", ref["digest"], "--tenant", "acme", "-o", str(out)]) == 0
    assert out.read_bytes() == src.read_bytes()

    assert main(["cas", "get", ref["digest"], "--tenant", "globex"]) == 1
    assert "no ref" in capsys.readouterr().err

    assert main(["cas", "forget", ref["digest"], "--tenant", "acme"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["crypto_shredded"] and record["ciphertext_deleted"]
    assert main(["cas", "get", ref["digest"], "--tenant", "acme"]) == 1
    assert "forgotten" in capsys.readouterr().err


def test_cli_bad_input_is_one_line_error(tmp_path, capsys):
    assert main(["cas", "get", "blake3k:nothex", "--tenant", "acme"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("fak: error: malformed digest") and "Traceback" not in err
    assert main(["cas", "put", str(tmp_path / "absent")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_cli_get_output_is_private(tmp_path, capsys):
    src = tmp_path / "r.txt"
    src.write_bytes(b"private result")
    assert main(["cas", "put", str(src), "--tenant", "acme"]) == 0
    digest = json.loads(capsys.readouterr().out)["digest"]
    out = tmp_path / "out.bin"
    out.write_bytes(b"old")
    out.chmod(0o644)
    assert main(["cas", "get", digest, "--tenant", "acme", "-o", str(out)]) == 0
    assert out.read_bytes() == b"private result" and (out.stat().st_mode & 0o777) == 0o600


def test_cli_get_that_fails_leaves_no_file_and_keeps_an_old_one(tmp_path, capsys):
    """A read that fails (a forgotten ref) writes nothing to ``-o FILE``: no empty file appears,
    and a file already there keeps its bytes."""
    src = tmp_path / "r.txt"
    src.write_bytes(b"soon forgotten")
    assert main(["cas", "put", str(src), "--tenant", "acme"]) == 0
    digest = json.loads(capsys.readouterr().out)["digest"]
    assert main(["cas", "forget", digest, "--tenant", "acme"]) == 0
    fresh, old = tmp_path / "fresh.bin", tmp_path / "old.bin"
    old.write_bytes(b"kept")
    for out in (fresh, old):
        assert main(["cas", "get", digest, "--tenant", "acme", "-o", str(out)]) == 1
        assert "forgotten" in capsys.readouterr().err
    assert not fresh.exists() and old.read_bytes() == b"kept"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no partial file left


def test_cli_rotate_destroy_and_erase(tmp_path, capsys):
    src = tmp_path / "r.txt"
    src.write_bytes(b"rotate me")
    assert main(["cas", "put", str(src), "--tenant", "acme"]) == 0
    digest = json.loads(capsys.readouterr().out)["digest"]

    assert main(["cas", "rotate", "--destroy-after", "7d"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rotation"]["versions"] == {"acme": 2} and out["destroyed"]["destroyed"] == []
    assert main(["cas", "destroy-retired", "--older-than", "0"]) == 0
    assert [d["version"] for d in json.loads(capsys.readouterr().out)["destroyed"]] == [1]
    with pytest.raises(SystemExit):  # argparse: a usage error naming the accepted forms
        main(["cas", "destroy-retired", "--older-than", "soon"])
    assert "invalid duration 'soon'" in capsys.readouterr().err
    from fak import Settings
    from fak.audit import AuditLog

    s = Settings.load()
    with AuditLog.open(s.resolved_database_url, s.data_dir, origin=s.audit_origin) as log:
        logged = [e.event for e in log.entries() if e.event.type in ("key_rotated", "keys_destroyed")]
    assert [(e.type, e.tenant, e.key_kind, e.principal) for e in logged] == [
        ("key_rotated", "acme", "cas_kek", "cli"), ("keys_destroyed", "acme", "cas_kek", "cli")]
    assert logged[0].old_key_id in logged[1].key_ids and logged[0].new_key_id not in logged[1].key_ids
    assert main(["cas", "keks", "--tenant", "acme"]) == 0
    assert [json.loads(line)["version"] for line in capsys.readouterr().out.splitlines()] == [2]
    assert main(["cas", "get", digest, "--tenant", "acme"]) == 0
    capsys.readouterr()

    assert main(["cas", "erase-tenant", "acme", "--confirm", "globex"]) == 1
    assert "--confirm acme" in capsys.readouterr().err
    assert main(["cas", "erase-tenant", "acme", "--confirm", "acme"]) == 0
    erased = json.loads(capsys.readouterr().out)
    assert erased["refs_forgotten"] == 1 and erased["shred_status"] == "destroyed"
    assert main(["cas", "get", digest, "--tenant", "acme"]) == 1
    assert "forgotten" in capsys.readouterr().err
    assert main(["cas", "scrub"]) == 0
    assert json.loads(capsys.readouterr().out) == {"shred_status": "destroyed"}
