"""The README's command and settings tables are the parsers' and ``Settings``' own: this test
fails when either drifts from the code (``make docs`` writes them again)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fak.cli_reference import rewrite, tables

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_tables_are_generated_from_the_parsers_and_settings() -> None:
    text = README.read_text(encoding="utf-8")
    generated = tables()
    assert rewrite(text, generated) == text, "README.md's command or settings table drifted: run `make docs`"
    for name, table in generated.items():
        assert f"<!-- fak:{name} -->\n{table}\n<!-- /fak:{name} -->" in text


def test_the_tables_name_every_command_and_setting() -> None:
    from fak.settings import Settings

    generated = tables()
    for field in Settings.model_fields:
        assert f"| `FAK_{field.upper()}` |" in generated["settings"]
    for words in ("serve", "keys create", "policy authorize", "cas rotate", "audit verify", "witness serve",
                  "mcp approve", "sessions"):
        assert f"| `fak {words}" in generated["commands"], words
    serve = next(line for line in generated["commands"].splitlines() if line.startswith("| `fak serve"))
    for flag in ("--host", "--port", "--model PATH", "--policy FILE", "--replicas N", "--placement", "--log-level"):
        assert flag in serve


def test_a_missing_marker_is_an_error_not_a_silent_skip() -> None:
    with pytest.raises(ValueError, match="fak:commands"):
        rewrite("no markers here", {"commands": "| x |"})
