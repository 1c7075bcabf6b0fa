"""One configuration (issue 26.6): ``fak/settings.py`` is the only module that reads the
environment; every other module receives its settings (or values passed down from them).

The scan is of the syntax tree of every non-test module of the packages: any use of
``os.environ``, ``os.getenv`` (or ``environ`` / ``getenv`` imported from ``os``) outside
``fak/settings.py`` must be one of the documented exceptions below, named by the module
and the variable it reads (each has a comment at its line saying why)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fak", "kernel", "cas", "audit", "api", "policy", "sdk")
READER = "fak/settings.py"
ENV_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}

# (module, the variable read, as written) -> why it is not a setting
ALLOWED = {
    ("fak/faults.py", "ENV"): "FAK_FAULT_POINT: test fault injection, armed in a child process at import",
    ("api/malloc.py", "'MALLOC_ARENA_MAX'"): "glibc's own variable: the operator's choice wins over the server's cap",
    ("policy/judge.py", "rule.api_key_env"): "the judge's key: the variable the operator allow-listed (judge_key_envs)",
    ("policy/judge.py", "self.rule.api_key_env"): "the same, read at each judgement",
    ("kernel/model/blockdot.py", "'CC'"): "the C toolchain's own variable (as make and setuptools read it)",
    ("policy/accel.py", "'FAK_NO_HYPERSCAN'"): "picks the matcher at import, before any Settings exists",
}


def _modules(root: Path = ROOT) -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (root / pkg).rglob("*.py"))


def _key(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> str:
    """The variable an ``os.environ`` / ``os.getenv`` node reads, as written ('<environ>' when
    the whole mapping is used)."""
    parent = parents.get(node)
    if isinstance(parent, ast.Attribute) and isinstance(parents.get(parent), ast.Call):  # os.environ.get(x)
        call = parents[parent]
        if call.func is parent and call.args:
            return ast.unparse(call.args[0])
    if isinstance(parent, ast.Call) and parent.func is node and parent.args:  # os.getenv(x)
        return ast.unparse(parent.args[0])
    if isinstance(parent, ast.Subscript) and parent.value is node:  # os.environ[x]
        return ast.unparse(parent.slice)
    if isinstance(parent, ast.Compare) and node in parent.comparators:  # x in os.environ
        return ast.unparse(parent.left)
    return "<environ>"


def env_reads(path: Path, root: Path = ROOT) -> list[tuple[str, str, int]]:
    """(module relative to ``root``, variable, line) of every environment read in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    rel = path.relative_to(root).as_posix()
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    os_names = {"os"} | {a.asname for n in ast.walk(tree) if isinstance(n, ast.Import)
                         for a in n.names if a.name == "os" and a.asname}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [(rel, f"from os import {a.name}", node.lineno) for a in node.names if a.name in ENV_NAMES]
        elif (isinstance(node, ast.Attribute) and node.attr in ENV_NAMES
              and isinstance(node.value, ast.Name) and node.value.id in os_names):
            found.append((rel, _key(node, parents), node.lineno))
    return found


def test_only_settings_reads_the_environment() -> None:
    reads = [r for p in _modules() for r in env_reads(p) if r[0] != READER]
    stray = [f"{mod}:{line} reads {var}" for mod, var, line in reads if (mod, var) not in ALLOWED]
    assert not stray, "read the environment only in fak/settings.py (pass settings down):\n" + "\n".join(stray)


def test_the_exceptions_are_still_there() -> None:
    """An exception no longer needed leaves the list (so the list stays the truth)."""
    reads = {(mod, var) for p in _modules() for mod, var, _ in env_reads(p)}
    assert set(ALLOWED) <= reads, f"no longer read: {sorted(set(ALLOWED) - reads)}"
    assert any(mod == READER for mod, _ in reads)


@pytest.mark.parametrize("source, expected", [
    ("import os\nx = os.environ.get('A')", [("m.py", "'A'", 2)]),
    ("import os\nx = os.environ['B']", [("m.py", "'B'", 2)]),
    ("import os\nx = os.getenv('C', 'd')", [("m.py", "'C'", 2)]),
    ("import os\nx = 'D' in os.environ", [("m.py", "'D'", 2)]),
    ("import os as o\nx = dict(o.environ)", [("m.py", "<environ>", 2)]),
    ("from os import environ\n", [("m.py", "from os import environ", 1)]),
    ("import os\nx = os.path.join('a')", []),
])
def test_the_scan_sees_each_way_of_reading(tmp_path, source, expected) -> None:
    (tmp_path / "m.py").write_text(source)
    assert env_reads(tmp_path / "m.py", tmp_path) == expected


def test_cache_dir_is_a_setting(tmp_path, monkeypatch) -> None:
    """The weight and kernel cache keeps today's default (``$XDG_CACHE_HOME/fak``, else
    ``~/.cache/fak``) and ``FAK_CACHE_DIR`` overrides it."""
    from fak.settings import StorageSettings

    monkeypatch.delenv("FAK_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert StorageSettings().cache_dir == tmp_path / "xdg" / "fak"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert StorageSettings().cache_dir == tmp_path / "home" / ".cache" / "fak"
    monkeypatch.setenv("FAK_CACHE_DIR", str(tmp_path / "explicit"))
    assert StorageSettings().cache_dir == tmp_path / "explicit"


def test_the_store_and_the_log_take_their_secrets_from_the_settings_they_are_given(tmp_path) -> None:
    """Passed settings, not the environment (which the fixtures leave without these variables),
    decide the master secret, the key database and the audit signer."""
    from fak.audit import AuditLog
    from fak.audit.note import Signer
    from fak.cas import CasStore, KeyMismatch
    from fak.settings import StorageSettings

    key_url = f"sqlite:///{tmp_path / 'elsewhere-keys.db'}"
    first = StorageSettings(data_dir=tmp_path / "d", master_secret="11" * 32, cas_key_url=key_url)
    with CasStore.open(settings=first) as store:
        store.put(b"x", "text/plain", "acme")
    assert (tmp_path / "elsewhere-keys.db").is_file() and not (tmp_path / "d" / "master.key").exists()
    with pytest.raises(KeyMismatch):
        CasStore.open(settings=StorageSettings(data_dir=tmp_path / "d", master_secret="22" * 32, cas_key_url=key_url))
    signer = Signer.generate("settings.test/log")
    given = StorageSettings(data_dir=tmp_path / "d", audit_signing_key=signer.skey())
    with AuditLog.open(settings=given) as log:
        assert log.public_key() == signer.verifier().vkey()


@pytest.mark.parametrize("name", ["master_secret", "audit_signing_key"])
def test_secrets_are_refused_in_a_config_file(tmp_path, monkeypatch, name) -> None:
    """A config file is shared, copied and committed, and nothing checks its mode: the master
    secret and the audit signing key come from the environment or their 0600 key files only."""
    from fak.settings import Settings, SettingsError

    config = tmp_path / "fak.yaml"
    config.write_text(f"{name}: {'ab' * 32}\n")
    with pytest.raises(SettingsError, match=f"{name} may not be set in a config file"):
        Settings.load(config)
    monkeypatch.delenv("FAK_DATA_DIR")  # the environment wins over the file
    config.write_text(f"data_dir: {tmp_path / 'd'}\n")
    assert Settings.load(config).data_dir == tmp_path / "d"
