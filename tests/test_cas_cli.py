"""``fak cas`` through the real CLI entry point: round trip, clear errors, forget."""

from __future__ import annotations

import json

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
