"""One CLI grammar: every ``fak`` command that reads settings takes ``--config FILE`` (and
means the same by it), every command that opens the database without a server takes
``--database-url``, and ``--policy`` names a fak policy wherever it appears (the audit
verifier's file is ``--witness-policy``). The flags are checked on the real parser; what
``--config`` does is checked by running commands against a config file's data directory."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from fak.cli import build_parser, main
from fak.cli_options import CONFIG_HELP
from fak.settings import SettingsError, StorageSettings

ROOT = Path(__file__).resolve().parents[2]

# commands that read no settings, and why (a new command lands in neither list: the test says so)
READS_NO_SETTINGS = {
    "audit verify": "offline: trusts only the keys and files it is given",
    "audit verify-receipt": "offline: trusts only the keys and files it is given",
    "mcp list": "a client of a running server (--url, --key)",
    "mcp approve": "a client of a running server (--url, --key)",
    "demo": "the embedded defaults, in a temporary directory of its own",
}
OPENS_THE_DATABASE = ("cas", "audit export", "audit checkpoint", "audit pubkey", "audit proof", "audit signer-reset")


def leaves(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every runnable command by its words (``cas put``), from the real parser."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001
    if not subs:
        return {prefix.strip(): parser}
    out: dict[str, argparse.ArgumentParser] = {}
    seen: set[int] = set()
    for name, child in subs[0].choices.items():
        if id(child) not in seen:  # an alias (policy validate) is the same parser
            seen.add(id(child))
            out |= leaves(child, f"{prefix} {name}")
    return out


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings}  # noqa: SLF001


COMMANDS = leaves(build_parser())


def test_every_command_that_reads_settings_takes_the_same_config_flag() -> None:
    assert len(COMMANDS) >= 38, sorted(COMMANDS)  # every layer registered its commands
    missing = [c for c, p in COMMANDS.items() if c not in READS_NO_SETTINGS and "--config" not in options(p)]
    assert not missing, f"commands without --config: {missing}"
    for command, parser in COMMANDS.items():
        config = options(parser).get("--config")
        if command in READS_NO_SETTINGS:
            assert config is None, f"{command} reads no settings but takes --config"
        else:
            assert config is not None and config.help == CONFIG_HELP and config.metavar == "FILE", command
    assert set(READS_NO_SETTINGS) <= set(COMMANDS), set(READS_NO_SETTINGS) - set(COMMANDS)


def test_database_url_and_policy_mean_one_thing() -> None:
    for command, parser in COMMANDS.items():
        opts = options(parser)
        if command.startswith(OPENS_THE_DATABASE):
            assert "--database-url" in opts and opts["--database-url"].dest == "url", command
        policy = opts.get("--policy")
        if policy is not None and policy.help != argparse.SUPPRESS:
            assert "policy file or directory" in str(policy.help), f"{command}: --policy is not a fak policy"
    verify = options(COMMANDS["audit verify"])
    assert verify["--witness-policy"].dest == verify["--policy"].dest  # the former spelling still parses
    assert verify["--policy"].help == argparse.SUPPRESS


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A deployment's config file: a data directory of its own, a policy, and a setting the
    storage commands do not read (which they must accept, not refuse)."""
    path = tmp_path / "fak.yaml"
    path.write_text(f"data_dir: {tmp_path / 'data'}\nchunk_size: 256\n"
                    f"policy_path: {ROOT / 'examples' / 'policies' / 'strict.yaml'}\n")
    return path


def test_config_reaches_every_settings_read_of_the_command(config: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("FAK_CONFIG", raising=False)
    monkeypatch.delenv("FAK_DATA_DIR", raising=False)
    monkeypatch.delenv("FAK_DATABASE_URL", raising=False)
    blob = tmp_path / "result.txt"
    blob.write_text("a tool result")
    data = tmp_path / "data"
    assert main(["cas", "put", str(blob), "--config", str(config)]) == 0  # the store opens StorageSettings()
    ref = json.loads(capsys.readouterr().out)
    assert (data / "fak.db").exists() and (data / "master.key").exists()
    assert "FAK_CONFIG" not in os.environ  # the command's file, for the command's run only
    assert main(["cas", "head", ref["digest"], "--config", str(config)]) == 0
    assert json.loads(capsys.readouterr().out)["size"] == len("a tool result")
    assert main(["audit", "pubkey", "--config", str(config)]) == 0
    assert (data / "audit_signing.key").exists() and capsys.readouterr().out.strip()
    context = ROOT / "examples" / "contexts" / "inbox-injection.jsonl"
    code = main(["policy", "authorize", "--config", str(config), "--context", str(context), "--tool", "send_email",
                 "--args", '{"to": "attacker@evil.example", "body": "hi"}'])
    assert "policy: strict " in capsys.readouterr().out  # the config's policy_path, not the packaged one
    assert code == 2


def test_a_storage_command_refuses_a_config_key_that_is_no_setting(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"data_dir: {tmp_path}\nchunk_sise: 256\n")
    monkeypatch.setenv("FAK_CONFIG", str(bad))
    with pytest.raises(SettingsError, match="chunk_sise: not a setting"):
        StorageSettings()
    monkeypatch.setenv("FAK_CONFIG", str(tmp_path / "absent.yaml"))
    with pytest.raises(SettingsError, match="cannot read config file"):
        StorageSettings()
