"""A tiles client that is not fak's code verifies the served log (issue 31): a small Go program
(`tests/data/tlog_client/main.go`) built against Go's `golang.org/x/mod/sumdb/tlog` and
`sumdb/note` (Debian's golang-go and golang-golang-x-mod-dev) checks the checkpoint's signature
with the pinned key, the tree hash from fak's hash tiles and an entry's inclusion. The set-up
installs the packages with apt-get when they are missing and it runs as root; otherwise the
test is skipped, naming them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fak.audit import PolicyLoaded, note

GOPATH = Path("/usr/share/gocode")  # where Debian's golang-*-dev packages put their sources
TLOG = GOPATH / "src/golang.org/x/mod/sumdb/tlog"
PACKAGES = ("golang-go", "golang-golang-x-mod-dev")
P = "blake3:" + "ab" * 32


def _go() -> str | None:
    return shutil.which("go") if TLOG.is_dir() else None


@pytest.fixture(scope="module")
def tlog_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if _go() is None and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-q", *PACKAGES], env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
                       capture_output=True, timeout=600, check=False)
    go = _go()
    if go is None:
        pytest.skip(f"no Go toolchain with golang.org/x/mod here (Debian packages {', '.join(PACKAGES)}); "
                    "the Go tiles client test is skipped")
    out = tmp_path_factory.mktemp("tlog-client")
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": str(GOPATH), "GOCACHE": str(out / "cache")}
    src = Path(__file__).parents[1] / "data" / "tlog_client"
    built = subprocess.run([go, "build", "-o", str(out / "tlog_client"), "."], cwd=src, env=env, capture_output=True,
                           text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    return out / "tlog_client"


@pytest.fixture
def settings(settings):  # noqa: ANN001
    return settings.model_copy(update={"operator_tenant": "acme"})  # entry bundles: the operator's auditors


def test_go_tlog_verifies_the_served_tiles(live_server, tlog_client: Path, tmp_path: Path) -> None:
    live = live_server
    futures = [live.kernel.audit.submit(PolicyLoaded(policy_id=f"p{i}", policy_digest=P, tenant="evil"))
               for i in range(700)]  # past two full tiles: full, partial and level-1 tiles all read
    for f in futures:
        f.result(timeout=60)
    cp = live.kernel.audit.checkpoint()
    prefix, pub = live.url + "/v1/audit/log", live.kernel.audit.public_key()
    env = {**os.environ, "FAK_KEY": live.key("acme", "auditor")}

    def run(vkey: str, index: int, leaf: bytes) -> subprocess.CompletedProcess[str]:
        path = tmp_path / f"leaf-{index}"
        path.write_bytes(leaf)
        return subprocess.run([str(tlog_client), prefix, vkey, str(index), str(path)], env=env, capture_output=True,
                              text=True, timeout=120)

    for index in (0, 300, cp.size - 1):
        leaf = live.kernel.audit.entry(index).body
        r = run(pub, index, leaf)
        assert r.returncode == 0 and r.stdout.strip() == f"ok {cp.size}", r.stderr
    bad = run(pub, 300, live.kernel.audit.entry(301).body)  # another entry's bytes at 300: not included
    assert bad.returncode == 1 and "inclusion of 300" in bad.stderr
    other = note.Signer.generate(cp.origin).verifier().vkey()  # the log's name, another key: not its signer
    wrong = run(other, 0, live.kernel.audit.entry(0).body)
    assert wrong.returncode == 1 and "checkpoint signature" in wrong.stderr, wrong.stderr
