"""Policy: read the active one, validate a candidate, replace it (admin).

The policy is deployment-wide: one policy governs every tenant of this server, so a
replacement by an admin key of any tenant applies to all of them (docs/api.md)."""

from __future__ import annotations

import os
import secrets
import threading
from pathlib import Path

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from fak.api.deps import ADMIN, READER, kernel
from fak.api.keys import Principal
from fak.errors import Conflict
from fak.kernel.facade import Kernel, default_policy_path

router = APIRouter(prefix="/v1/policy", tags=["policy"])

MAX_POLICY_TEXT = 1 << 20  # characters of one policy document
_replace_lock = threading.Lock()  # one replacement at a time (write + reload)


class PolicyOut(BaseModel):
    name: str
    digest: str
    mode: str  # enforce | audit


class PolicyText(BaseModel):
    model_config = {"extra": "forbid"}

    text: str = Field(max_length=MAX_POLICY_TEXT, description="one policy document (YAML)")
    source: str = Field("policy.yaml", pattern=r"^[A-Za-z0-9._/+~-]{1,256}$",
                        description="the file name the errors name (as `fak policy check FILE` prints them)")


class PolicyReplace(BaseModel):
    model_config = {"extra": "forbid"}

    text: str = Field(max_length=MAX_POLICY_TEXT, description="the new policy document (YAML)")


class ValidateOut(BaseModel):
    ok: bool
    name: str
    digest: str


class ReplaceOut(BaseModel):
    name: str
    digest: str
    previous_digest: str
    mode: str


def _out(k: Kernel) -> PolicyOut:
    p = k.policy
    return PolicyOut(name=p.name, digest=p.digest, mode=p.spec.mode)


@router.get("", response_model=PolicyOut)
def get_policy(who: Principal = Depends(READER), k: Kernel = Depends(kernel)) -> PolicyOut:  # noqa: B008
    """The active policy's name, digest and mode (deployment-wide)."""
    return _out(k)


@router.post("/validate", response_model=ValidateOut)
def validate(body: PolicyText, who: Principal = Depends(READER), k: Kernel = Depends(kernel)) -> ValidateOut:  # noqa: B008
    """Check a policy without loading it, as this server would load it (judges against its
    allow-lists). A bad one is a 400 ``policy_invalid`` problem whose ``errors`` are the
    ``file:line:col: message`` lines ``fak policy check`` prints."""
    from fak.policy import load_policy_text

    p = load_policy_text(body.text, body.source, k.judge_egress)  # PolicyError -> 400 with located errors
    return ValidateOut(ok=True, name=p.name, digest=p.digest)


@router.put("", response_model=ReplaceOut)
def replace(body: PolicyReplace, who: Principal = Depends(ADMIN), k: Kernel = Depends(kernel)) -> ReplaceOut:  # noqa: B008
    """Validate, write the policy file atomically (temp file, fsync, rename), reload.
    A bad policy changes nothing (400 with located errors); the policy is deployment-wide."""
    from fak.errors import Forbidden
    from fak.policy import load_policy_text

    if who.tenant != k.settings.operator_tenant:  # the policy governs every tenant
        raise Forbidden("the policy is deployment-wide: only admin keys of the operator tenant "
                        "(setting operator_tenant, FAK_OPERATOR_TENANT) may replace it")
    path = k.policy_path
    _check_replaceable(path)
    # validated before anything is written, judges against the deployment's allow-lists (its
    # settings, which no policy can change): a judge elsewhere is refused at its line
    load_policy_text(body.text, str(path), k.judge_egress)
    with _replace_lock:
        before = k.policy
        old = path.read_bytes()
        _write_atomic(path, body.text.encode("utf-8"))
        try:
            p = k.reload_policy(principal=f"key:{who.key_id}")
        except BaseException:  # the file on disk must stay the policy in force
            _write_atomic(path, old)
            raise
    return ReplaceOut(name=p.name, digest=p.digest, previous_digest=before.digest, mode=p.spec.mode)


def _check_replaceable(path: Path) -> None:
    if path.is_dir():
        raise Conflict("the policy is a directory of overlays: replace its files on the server, then reload")
    if not path.is_file():
        raise Conflict("the policy file is missing on the server")
    if path.resolve() == default_policy_path().resolve():
        raise Conflict("the server runs the packaged default policy; configure policy_path "
                       "(FAK_POLICY_PATH) to a writable file to replace it over the API")


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so a reader sees the old or the new file, never a mix,
    and the new one survives a crash once this returns."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dirfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dirfd)
    finally:
        os.close(dirfd)
