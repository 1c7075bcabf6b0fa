"""Pydantic models the other layers see: ``Ref`` (what a tool result becomes),
``Use`` (a KV unit that references a ref) and ``ShredRecord`` (what forget
destroyed, the input of the signed forget receipt). They carry digests and ids,
never content."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from fak import errors, types
from fak.cas.digest import Digest
from fak.cas.errors import InvalidInput
from fak.errors import shown
from fak.types import Tenant

Taint = Literal["untrusted", "trusted", "quarantined"]
State = Literal["live", "forgotten"]
TAINTS: tuple[str, ...] = ("trusted", "untrusted", "quarantined")  # least to most restrictive

# RFC 6838 type/subtype (restricted-name), optional ";param=value" list.
_NAME = r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}"
_MEDIA = re.compile(rf"{_NAME}/{_NAME}(?:\s*;\s*[A-Za-z0-9!#$&^_.+-]+=(?:[A-Za-z0-9!#$&^_.+-]+|\"[^\"\\]*\"))*")
_UNIT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@#-]{0,255}")


def check_media_type(value: str) -> str:
    if not isinstance(value, str) or not _MEDIA.fullmatch(value):
        raise InvalidInput(f"invalid media type {shown(value)}: expected 'type/subtype', e.g. 'text/plain'")
    return value


def check_tenant(value: str) -> str:
    """The one tenant grammar (``fak.types``), raising the CAS's ``InvalidInput``."""
    try:
        return types.check_tenant(value)
    except errors.InvalidInput as exc:
        raise InvalidInput(str(exc)) from None


def check_taint(value: str) -> str:
    if value not in TAINTS:
        raise InvalidInput(f"invalid taint {shown(value)}: one of {', '.join(TAINTS)}")
    return value


def check_unit(kind: str, unit_id: str) -> None:
    for what, value in (("unit kind", kind), ("unit id", unit_id)):
        if not isinstance(value, str) or not _UNIT.fullmatch(value):
            raise InvalidInput(f"invalid {what} {shown(value)}: 1-256 characters from letters, digits and . _ : / @ # -")


def stricter(a: str, b: str) -> str:
    """The more restrictive of two taints (re-putting bytes never loosens their taint)."""
    return a if TAINTS.index(a) >= TAINTS.index(b) else b


def _v(fn):  # wrap an InvalidInput checker as a pydantic validator
    def inner(value):
        try:
            return fn(value)
        except InvalidInput as exc:
            raise ValueError(str(exc)) from None

    return AfterValidator(inner)


class Ref(BaseModel):
    """A content-addressed tool result, as seen by its tenant."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    digest: Digest
    size: int = Field(ge=0)
    media_type: Annotated[str, _v(check_media_type)]
    tenant: Tenant
    taint: Taint = "untrusted"
    created_at: datetime
    state: State = "live"
    pinned: bool = False


class Use(BaseModel):
    """One KV unit (session segment, prefix-cache node, PIC chunk) that references a ref."""

    model_config = ConfigDict(frozen=True)

    unit_kind: str
    unit_id: str
    recorded_at: datetime


class ShredRecord(BaseModel):
    """What ``forget`` destroyed. Safe to log: ids and digests, no content, no key bytes."""

    model_config = ConfigDict(frozen=True)

    digest: Digest
    tenant: Tenant
    size: int
    forgotten_at: datetime
    key_id: str | None = Field(description="id of the destroyed wrapped data key (None: blob was stored unencrypted)")
    kek_version: int | None = Field(description="KEK version that had wrapped the destroyed key")
    blob_id: str | None = Field(description="id of the deleted ciphertext file")
    ciphertext_deleted: bool
    crypto_shredded: bool = Field(description="True when the only copy of the data key was destroyed")
    uses_released: list[Use] = Field(default_factory=list, description="KV units that referenced the ref")
    was_pinned: bool = False
    already_forgotten: bool = False
