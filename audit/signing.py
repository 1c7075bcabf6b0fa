"""The log's Ed25519 signing key: created on first start in the data directory
(mode 0600, atomic), or supplied by argument or path.

``FAK_AUDIT_SIGNING_KEY`` (read by ``fak.settings``, passed down by ``AuditLog.open``) holds
a signer key string (``PRIVATE+KEY+...``) or a path to a file holding one. The key name is the log's origin, as the
tlog-checkpoint spec recommends.
"""

from __future__ import annotations

import os
from pathlib import Path

from fak.audit.errors import AuditError
from fak.audit.note import Signer
from fak.faults import fault_point
from fak.keys import sweep_stale_temp

KEY_FILE = "audit_signing.key"
DEFAULT_ORIGIN = "fak.local/audit"


def _from_text_or_path(value: str | os.PathLike[str]) -> Signer:
    text = str(value).strip()
    if not text.startswith("PRIVATE+KEY+"):
        path = Path(text)
        try:
            text = path.read_text().strip()
        except OSError as exc:
            raise AuditError(f"cannot read audit signing key {path}: {exc.strerror}") from None
    try:
        return Signer.parse(text)
    except AuditError as exc:
        raise AuditError(f"bad audit signing key: {exc}") from None


def _create(path: Path, origin: str) -> None:
    """Write a fresh key with mode 0600; if another process wins the race, keep theirs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_temp(path.parent, f"{path.name}.tmp")
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (Signer.generate(origin).skey() + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    fault_point("audit.signing_key.before_link")
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()


def load_signer(data_dir: Path, origin: str | None, supplied: object = None) -> Signer:
    """Resolve the signer: ``supplied`` (the argument, or ``Settings.audit_signing_key``, i.e.
    ``$FAK_AUDIT_SIGNING_KEY``, passed down by ``AuditLog.open``), else the data-dir key file."""
    if isinstance(supplied, Signer):
        signer = supplied
    elif supplied is not None:
        signer = _from_text_or_path(supplied)  # type: ignore[arg-type]
    else:
        path = Path(data_dir) / KEY_FILE
        if not path.exists():
            _create(path, origin or DEFAULT_ORIGIN)
        signer = _from_text_or_path(path)
    if origin is not None and signer.name != origin:
        raise AuditError(f"audit signing key is named {signer.name!r} but the log origin is {origin!r}")
    return signer
