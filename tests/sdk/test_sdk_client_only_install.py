"""A client-only install works: ``pip install fak`` (the base dependencies: pydantic, httpx,
cryptography, rfc8785; no torch, no SQLAlchemy, no FastAPI) in a bare virtual environment
talks to a real server and verifies a forget receipt offline, and the ``fak`` command there
names ``pip install 'fak[server]'`` for the server's commands instead of a traceback.

The wheel is built from this working tree (no dependencies, the test venv's setuptools); the
bare venv (``python -m venv``, no system site packages) installs it with its declared
dependencies from the package registry (or pip's cache). It runs in CI; when pip cannot
reach a registry the test is skipped and says so."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.client_install

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("fak", "kernel", "cas", "policy", "audit", "api", "sdk")
SERVER_ONLY = ("torch", "sqlalchemy", "fastapi", "uvicorn", "numpy", "alembic", "pydantic_settings", "blake3")
# pip's words for a registry it cannot reach (a missing or misspelt dependency is a failure, not this)
OFFLINE = re.compile(r"(Max retries exceeded|NewConnectionError|Temporary failure in name resolution|"
                     r"Network is unreachable|Name or service not known|Connection refused|ConnectionError|"
                     r"ProxyError|Read timed out|connect timeout)", re.IGNORECASE)

CLIENT = r"""
import json, sys
from fak.audit.receipt import verify_receipt
from fak.sdk import Client, FakAPIError

url, key = sys.argv[1], sys.argv[2]
with Client(url, key, trust_env=False, timeout=120) as c:
    s = c.create_session("client-only")
    s.append("user", "What is the lounge policy?")
    a = s.admit("lounge_info", "The lounge opens at 6am.")
    turn = s.generate(max_tokens=4)
    pinned = c.audit_checkpoint().public_key
    receipt = c.forget(a.ref, reason="gdpr")
    try:
        c.session("nope").info()
        missing = None
    except FakAPIError as e:
        missing = e.code
    print(json.dumps({"verdict": a.verdict, "tokens": len(turn.tokens), "sessions": c.sessions(),
                      "offline_ok": verify_receipt(receipt, pinned).ok, "missing": missing,
                      "fingerprint": s.fingerprint()}))
"""


def _run(cmd: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Outside this checkout (its ``fak/`` must not shadow the installed package) and without
    the test process's Python variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=Path(cmd[0]).parent)


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bare venv with this checkout's wheel and its base dependencies; its python."""
    tmp = tmp_path_factory.mktemp("client-only")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                  str(tmp / "dist"), str(src)])
    assert built.returncode == 0, built.stderr[-4000:]
    wheel = next((tmp / "dist").glob("fak-*.whl"))

    venv = tmp / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)])  # no --system-site-packages
    assert made.returncode == 0, made.stderr[-4000:]
    python = venv / "bin" / "python"
    pip = _run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--retries", "2", "--timeout", "30",
                str(wheel)])
    if pip.returncode != 0 and OFFLINE.search(pip.stderr + pip.stdout):
        lines = (pip.stderr + pip.stdout).strip().splitlines()
        why = " / ".join([x.strip()[:160] for x in lines if OFFLINE.search(x)][:1] + lines[-1:])
        print(f"\nCLIENT-ONLY INSTALL NOT TESTED: pip cannot reach a package registry: {why}")
        pytest.skip(f"pip cannot reach a package registry to install the client's dependencies: {why}")
    assert pip.returncode == 0, pip.stderr[-4000:]
    return python


def test_the_bare_venv_has_the_client_and_none_of_the_server(client_venv: Path) -> None:
    probe = ("import importlib.util as u, json, sys\n"
             f"print(json.dumps({{'present': [m for m in {SERVER_ONLY!r} if u.find_spec(m)],"
             " 'sdk': bool(u.find_spec('fak.sdk')), 'system_site': sys.base_prefix != sys.prefix}))")
    out = _run([str(client_venv), "-I", "-c", probe], timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["present"] == [], f"a client-only install pulled server dependencies: {seen['present']}"
    assert seen["sdk"] and seen["system_site"]  # a venv of its own, with the SDK in it
    cfg = (client_venv.parent.parent / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in cfg


def test_a_client_only_install_talks_to_a_real_server(client_venv: Path, live_server) -> None:
    """A real server from this venv (uvicorn on a socket), a client from the bare one: a session,
    an admitted tool result, a generated turn, a forget whose receipt verifies offline."""
    key = live_server.key("acme", "admin")
    out = _run([str(client_venv), "-I", "-c", CLIENT, live_server.url, key], timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["verdict"] == "ALLOW" and got["tokens"] >= 1 and got["sessions"] == ["client-only"]
    assert got["offline_ok"] is True and got["missing"] == "not_found"
    assert got["fingerprint"] == live_server.kernel.session("acme", "client-only").fingerprint()


def test_the_fak_command_names_the_server_extra(client_venv: Path) -> None:
    """``fak serve`` (and any kernel command) in a client-only install: a one-line error naming
    ``pip install 'fak[server]'``, exit 1, no traceback; ``fak --help`` still works."""
    fak = client_venv.parent / "fak"
    for argv in (["serve"], ["keys", "list"], ["policy", "check", "x.yaml"], ["demo"]):
        out = _run([str(fak), *argv], timeout=120)
        assert out.returncode == 1, (argv, out.stdout, out.stderr)
        assert "pip install 'fak[server]'" in out.stderr and "Traceback" not in out.stderr, (argv, out.stderr)
    helped = _run([str(fak), "--help"], timeout=120)
    assert helped.returncode == 0 and "fak[server]" in helped.stdout, helped.stderr
