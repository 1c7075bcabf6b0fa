"""The server master secret and the keys derived from it.

One 32-byte secret per deployment, created on first use in the data directory
with mode 0600 (or given as hex in ``FAK_MASTER_SECRET``, read by ``fak.settings``). A secret file readable by
group or others, or owned by another user, is refused at start. Every layer derives
its own keys from it with HKDF-SHA256 under a distinct label, so no two uses
share key material and a client can never choose a derived value (tenant
salts, keyed-digest keys).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fak.errors import FakError
from fak.faults import fault_point

SECRET_FILE = "master.key"


def load_master_secret(directory: Path, given_hex: str | None = None) -> bytes:
    """The master secret: ``given_hex`` (``Settings.master_secret``, i.e. ``FAK_MASTER_SECRET``)
    when set, else the data directory's file, created atomically (mode 0600) if absent."""
    if given_hex:
        try:
            raw = bytes.fromhex(given_hex)
        except ValueError as exc:
            raise FakError("FAK_MASTER_SECRET must be hex") from exc
        if len(raw) < 32:
            raise FakError("FAK_MASTER_SECRET must hold at least 32 bytes (64 hex digits)")
        return raw
    path = Path(directory) / SECRET_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale_temp(path.parent, path.stem + ".tmp")
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_bytes(32).hex().encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        fault_point("keys.master.before_link")
        try:
            os.link(tmp, path)  # fails if another process won the race: keep theirs
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    check_secret_file(path)
    raw = bytes.fromhex(path.read_text().strip())
    if len(raw) < 32:
        raise FakError(f"{path}: master secret is shorter than 32 bytes")
    return raw


def sweep_stale_temp(directory: Path, prefix: str) -> int:
    """Remove ``<prefix><pid>`` files whose writer is dead: a process killed while creating a
    key file leaves its temp copy (a key nobody uses, or a second link to the one in use)."""
    removed = 0
    for tmp in Path(directory).glob(prefix + "*"):
        pid = tmp.name[len(prefix):]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        try:
            tmp.unlink()
            removed += 1
        except FileNotFoundError:
            pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_secret_file(path: Path) -> None:
    """Refuse a master secret file that anyone but this process's user could read or
    swap: group/world permission bits, or another owner. Whoever reads it reads every
    tenant's keys, so fak will not start on it (the error names the fix)."""
    st = path.stat()
    if st.st_mode & 0o077:
        raise FakError(
            f"{path}: the master secret is accessible to group or others (mode {st.st_mode & 0o777:04o}); "
            f"run: chmod 600 {path}"
        )
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        raise FakError(
            f"{path}: the master secret is owned by uid {st.st_uid}, not by the user running fak "
            f"(uid {os.geteuid()}); run: chown {os.geteuid()} {path} (as root), or run fak as its owner"
        )


def derive_key(master: bytes, label: str, context: bytes = b"", length: int = 32) -> bytes:
    """HKDF-SHA256(master, info = label || 0x00 || context)."""
    info = label.encode() + b"\x00" + context
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(master)


def tenant_salt(master: bytes, tenant: str) -> bytes:
    """Server-side namespace salt for a tenant (prefix-cache roots, PIC keys)."""
    return derive_key(master, "fak/kernel/tenant-salt", tenant.encode())
