"""A throwaway PostgreSQL cluster (initdb + pg_ctl in a temp dir, its own port on
127.0.0.1) that a test or bench may stop and start without touching the shared server at
5432. Needs the server binaries (``/usr/lib/postgresql/*/bin``); when running as root,
the cluster runs as the ``postgres`` user (initdb refuses root).

    with throwaway_cluster() as pg:
        url = pg.url            # postgresql+psycopg://postgres@127.0.0.1:<port>/postgres
        pg.stop(); pg.start()
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    bindir: Path
    datadir: Path
    port: int
    user: str | None  # run as this OS user (root cannot run postgres)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=check)

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.datadir), "-l", str(self.datadir / "log"), "-w", "-t", "60", "-o",
                  f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.datadir} -c fsync=off", "start")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return
            time.sleep(0.1)
        raise RuntimeError("the throwaway PostgreSQL did not come up")

    def stop(self, mode: str = "immediate") -> None:
        self._run("pg_ctl", "-D", str(self.datadir), "-m", mode, "-w", "stop", check=False)


def available() -> bool:
    return pg_bin() is not None and (os.geteuid() != 0 or _has_user("postgres"))


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


@contextlib.contextmanager
def throwaway_cluster() -> Iterator[Cluster]:
    bindir = pg_bin()
    if bindir is None:
        raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin")
    user = "postgres" if os.geteuid() == 0 else None
    tmp = Path(tempfile.mkdtemp(prefix="fak-pg-"))
    datadir = tmp / "data"
    try:
        if user:
            info = pwd.getpwnam(user)
            os.chown(tmp, info.pw_uid, info.pw_gid)
        cluster = Cluster(bindir, datadir, _free_port(), user)
        cluster._run("initdb", "-D", str(datadir), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8")
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
