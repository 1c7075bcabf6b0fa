"""Where ciphertext lives. ``BlobBackend`` is the small interface an object store
could implement later; ``FileBackend`` keeps blobs as files under the data
directory in sharded folders, written to a temp file, fsynced, then renamed, so
a reader (or a process killed mid-write) never sees a partial blob."""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Protocol

from fak.cas.errors import IntegrityError


class BlobWriter(Protocol):
    def write(self, data: bytes) -> None: ...
    def commit(self) -> None:
        """Make the blob durable and visible under its id."""
    def abort(self) -> None:
        """Discard everything written (safe to call after commit: no-op)."""


class BlobBackend(Protocol):
    def new_writer(self, blob_id: str) -> BlobWriter: ...
    def open(self, blob_id: str) -> BinaryIO: ...
    def size(self, blob_id: str) -> int | None: ...
    def delete(self, blob_id: str) -> bool: ...
    def ids(self) -> Iterator[str]: ...
    def sweep_temp(self, older_than: float) -> int: ...


def new_blob_id() -> str:
    return secrets.token_hex(16)


def _check_id(blob_id: str) -> str:
    if len(blob_id) != 32 or any(c not in "0123456789abcdef" for c in blob_id):
        raise IntegrityError(f"invalid blob id {blob_id!r}")
    return blob_id


class _FileWriter:
    def __init__(self, backend: FileBackend, blob_id: str) -> None:
        self._backend = backend
        self._final = backend.path(blob_id)
        self._tmp = backend.tmp_dir / f"{blob_id}.{os.getpid()}.tmp"
        fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # ciphertext is nobody else's
        self._fh: BinaryIO | None = os.fdopen(fd, "wb")

    def write(self, data: bytes) -> None:
        assert self._fh is not None, "writer already closed"
        self._fh.write(data)

    def commit(self) -> None:
        assert self._fh is not None, "writer already closed"
        fh, self._fh = self._fh, None
        try:
            fh.flush()
            if self._backend.fsync:
                os.fsync(fh.fileno())
        finally:
            fh.close()
        self._backend.ensure_dir(self._final.parent)
        os.replace(self._tmp, self._final)
        if self._backend.fsync:
            _fsync_dir(self._final.parent)

    def abort(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        with contextlib.suppress(FileNotFoundError):
            self._tmp.unlink()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileBackend:
    """Blobs at ``<root>/<id[:2]>/<id[2:4]>/<id>``; temp files in ``<root>/tmp``.
    Directories are created 0700 and files 0600 whatever the umask."""

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self.root = Path(root)
        self.tmp_dir = self.root / "tmp"
        for d in (self.root, self.tmp_dir):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            if d.stat().st_mode & 0o077:
                d.chmod(0o700)
        self.fsync = fsync
        self._dirs: set[Path] = set()

    def ensure_dir(self, path: Path) -> None:
        if path not in self._dirs:
            for d in (path.parent, path):  # parents=True would create the shard with the umask's mode
                d.mkdir(mode=0o700, exist_ok=True)
            self._dirs.add(path)

    def path(self, blob_id: str) -> Path:
        _check_id(blob_id)
        return self.root / blob_id[:2] / blob_id[2:4] / blob_id

    def new_writer(self, blob_id: str) -> _FileWriter:
        return _FileWriter(self, blob_id)

    def open(self, blob_id: str) -> BinaryIO:
        try:
            return open(self.path(blob_id), "rb")  # noqa: SIM115 - caller closes
        except FileNotFoundError as exc:
            raise IntegrityError(f"stored blob {blob_id} is missing from {self.root}") from exc

    def size(self, blob_id: str) -> int | None:
        try:
            return self.path(blob_id).stat().st_size
        except FileNotFoundError:
            return None

    def delete(self, blob_id: str) -> bool:
        path = self.path(blob_id)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        if self.fsync:
            _fsync_dir(path.parent)
        return True

    def ids(self) -> Iterator[str]:
        for shard in sorted(self.root.glob("[0-9a-f][0-9a-f]/[0-9a-f][0-9a-f]")):
            for entry in sorted(shard.iterdir()):
                yield entry.name

    def sweep_temp(self, older_than: float = 3600.0) -> int:
        """Delete temp files left by killed writers, older than ``older_than`` seconds."""
        cutoff = time.time() - older_than
        removed = 0
        for entry in self.tmp_dir.glob("*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                if entry.stat().st_mtime < cutoff:
                    entry.unlink()
                    removed += 1
        return removed
