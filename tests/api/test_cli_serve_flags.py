"""``fak serve --model PATH --policy PATH``: a flag overrides the settings (``FAK_MODEL_PATH`` /
``FAK_POLICY_PATH``, the ``--config`` file), which override the defaults; a flag naming no file or
folder is refused by name before anything loads (no model, no server)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fak.api.cli import _serve_settings
from fak.cli import build_parser
from fak.errors import FakError

FAK = str(Path(sys.executable).with_name("fak"))


def _settings(argv: list[str]):  # noqa: ANN202
    return _serve_settings(build_parser().parse_args(["serve", *argv]))


def test_flags_override_settings_which_override_defaults(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("FAK_MODEL_PATH", raising=False)
    monkeypatch.delenv("FAK_POLICY_PATH", raising=False)
    monkeypatch.delenv("FAK_CONFIG", raising=False)
    flag_model, env_model, file_model = tmp_path / "flag.gguf", tmp_path / "env.gguf", tmp_path / "file.gguf"
    flag_policy = tmp_path / "policies"
    flag_model.touch()
    flag_policy.mkdir()
    config = tmp_path / "fak.toml"
    config.write_text(f'model_path = "{file_model}"\n')

    s = _settings([])
    assert s.model_path is None and s.policy_path is None  # the defaults: the packaged model and policy
    assert _settings(["--config", str(config)]).model_path == file_model
    monkeypatch.setenv("FAK_MODEL_PATH", str(env_model))
    assert _settings(["--config", str(config)]).model_path == env_model  # the variable over the file
    s = _settings(["--config", str(config), "--model", str(flag_model), "--policy", str(flag_policy)])
    assert (s.model_path, s.policy_path) == (flag_model, flag_policy)  # the flags over both


@pytest.mark.parametrize("flag", ["--model", "--policy"])
def test_a_missing_path_names_the_flag(tmp_path, flag) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(FakError, match=f"^{flag} {missing}: no such file or folder$"):
        _settings([flag, str(missing)])


def test_the_command_refuses_before_loading_anything(tmp_path) -> None:
    done = subprocess.run([FAK, "serve", "--policy", str(tmp_path / "typo.yaml")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1
    assert done.stderr == f"fak: error: --policy {tmp_path / 'typo.yaml'}: no such file or folder\n"
