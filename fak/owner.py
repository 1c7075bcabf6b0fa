"""Who owns a data directory: at most one process runs a Kernel on it.

Why: a Kernel is more than its database rows. It finishes forgets it finds unfinished
(another process's forget in flight looks the same), sweeps expired refs, keeps sessions'
KV in memory and runs late detectors. Two processes doing that on one data directory undo
each other's work, so the second refuses, naming the first's pid.

How: an exclusive ``flock`` on ``<data dir>/fak.lock``, held for the Kernel's life. The
file also holds the owner's pid and command, for the refusal message; the lock, not the
file, is the truth: the OS drops it when the owner exits, SIGKILL included, so a stale
file never blocks a restart. Within one process the claim is counted (a test opening two
Kernels on one directory keeps working as before); across processes it is exclusive.
Commands that only read, or write in single database transactions (``fak keys``,
``fak sessions``, ``fak audit export``, ``fak cas rotate``, ...), need no claim: they are
safe beside a running server (see docs/reliability.md, issue 25.1).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fak.errors import Conflict

LOCK_FILE = "fak.lock"
RETRY_S = 0.5  # a claim waits this long before refusing (the previous owner may be just exiting)


class DataDirBusy(Conflict):
    """Another process owns the data directory (``fak serve``, or a CLI command's Kernel)."""

    code = "data_dir_busy"


@dataclass(frozen=True)
class Holder:
    pid: int | None
    command: str


class Claim:
    """This process's hold on a data directory; ``release()`` once per ``claim()``."""

    def __init__(self, key: str, fd: int) -> None:
        self._key, self._fd, self._count = key, fd, 1

    def hold(self) -> Claim:
        """Count one more ``claim()`` of this directory by this process (each one ``release()``s)."""
        self._count += 1
        return self

    def release(self) -> None:
        with _lock:
            self._count -= 1
            if self._count > 0:
                return
            _held.pop(self._key, None)
            os.close(self._fd)  # closing the only descriptor drops the flock

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


_held: dict[str, Claim] = {}
_lock = threading.Lock()


def claim(data_dir: Path, *, why: str = "", shared: bool = False) -> Claim:
    """Own ``data_dir`` (created 0700 if missing) until ``release()``, or raise
    ``DataDirBusy`` naming the process that owns it. ``why`` ends the refusal message
    (what to do instead). ``shared``: the replicas of one deployment (docs/scale-out.md)
    share the directory with each other, and still keep out every exclusive claimant."""
    path = Path(data_dir)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = os.path.realpath(path)
    with _lock:
        held = _held.get(key)
        if held is not None:
            return held.hold()
        fd = os.open(os.path.join(key, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            _flock(fd, key, why, shared)
            if not shared:  # several replicas hold it at once: none of them is "the" owner
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps({"pid": os.getpid(), "command": _command()}).encode() + b"\n", 0)
        except BaseException:
            os.close(fd)
            raise
        held = _held[key] = Claim(key, fd)
        return held


def _flock(fd: int, key: str, why: str, shared: bool) -> None:
    deadline = time.monotonic() + RETRY_S
    while True:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
        if time.monotonic() >= deadline:
            h = _holder(fd)
            who = f"'{h.command}' (pid {h.pid})" if h.pid else "another process"
            raise DataDirBusy(f"the data directory {key} is in use by {who}: one process at a time runs a Kernel "
                              f"on it{'; ' + why if why else ''}")
        time.sleep(0.05)


def _holder(fd: int) -> Holder:
    """The owner as its lock file says (read a few times: it may be just writing it)."""
    for _ in range(20):
        try:
            obj = json.loads(os.pread(fd, 4096, 0) or b"null")
            return Holder(int(obj["pid"]), str(obj.get("command", "?")))
        except (ValueError, TypeError, KeyError):
            time.sleep(0.01)
    return Holder(None, "?")


def _command() -> str:
    """``fak serve``, ``fak forget``, ... (or the program's name) for the refusal message."""
    argv = sys.argv or ["?"]
    name = Path(argv[0]).name
    if name in ("fak", "cli.py", "__main__.py") and len(argv) > 1:
        return f"fak {argv[1]}"
    return " ".join([name, *argv[1:2]])


__all__ = ["LOCK_FILE", "Claim", "DataDirBusy", "Holder", "claim"]
