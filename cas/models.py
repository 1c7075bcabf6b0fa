"""Pydantic models the other layers see: ``Ref`` (what a tool result becomes),
``Use`` (a KV unit that references a ref) and ``ShredRecord`` (what forget
destroyed, the input of the signed forget receipt). They carry digests and ids,
never content."""

from __future__ import annotations

import re
from collections.abc import Callable
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


def _v(fn: Callable[[str], str]) -> AfterValidator:
    """Wrap an InvalidInput checker as a pydantic validator."""

    def inner(value: str) -> str:
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


ShredStatus = Literal["destroyed", "pending_wal_checkpoint", "pending_vacuum"]


def size_bucket(size: int) -> int:
    """``size`` rounded up to a power of two: what a tombstone keeps (not the exact size)."""
    return 0 if size <= 0 else 1 << (size - 1).bit_length()


TOMBSTONE_MEDIA_TYPE = "application/octet-stream"  # a tombstone keeps no media type


class ShredRecord(BaseModel):
    """What ``forget`` destroyed. Safe to log: ids and digests, no content, no key bytes."""

    model_config = ConfigDict(frozen=True)

    digest: Digest
    tenant: Tenant
    size: int = Field(description="size rounded up to a power of two (the tombstone keeps no exact size)")
    forgotten_at: datetime
    key_id: str | None = Field(description="id of the destroyed wrapped data key (None: blob was stored unencrypted)")
    kek_version: int | None = Field(description="the tenant's KEK version that had wrapped the destroyed key")
    kek_id: str | None = Field(default=None, description="id of that KEK (destroy it to void every copy of the wrap)")
    blob_id: str | None = Field(description="id of the deleted ciphertext file")
    ciphertext_deleted: bool
    key_deleted: bool = Field(default=False, description="the wrapped data key's row was deleted")
    shred_status: ShredStatus = Field(
        default="destroyed",
        description="destroyed: no wrapped key left readable in the database files; pending_wal_checkpoint "
        "(SQLite: a reader kept the WAL from being checkpointed) or pending_vacuum (PostgreSQL: a dead tuple "
        "may remain) until scrub() completes it",
    )
    wal_checkpointed: bool | None = Field(default=None, description="SQLite: the WAL checkpoint completed")
    crypto_shredded: bool = Field(
        description="True when the only copy of the data key was destroyed and scrubbed from the database files"
    )
    uses_released: list[Use] = Field(default_factory=list, description="KV units that referenced the ref")
    was_pinned: bool = False
    already_forgotten: bool = False


class KekInfo(BaseModel):
    """One KEK version of a tenant (``CasStore.kek_versions``)."""

    tenant: str
    version: int
    kek_id: str
    active: bool
    created_at: datetime
    retired_at: datetime | None
    keys: int = Field(description="data keys wrapped under it")


class RotationResult(BaseModel):
    """What ``rotate`` did: per tenant the new active version, and keys re-wrapped."""

    versions: dict[str, int]
    rewrapped: int
    retired: list[str] = Field(description="ids of the KEKs retired (destroyable after the grace period)")


class DestroyResult(BaseModel):
    """What ``destroy_retired`` destroyed."""

    destroyed: list[KekInfo]
    rewrapped: int = Field(description="stragglers wrapped under a retired KEK, re-wrapped before it was destroyed")
    shred_status: ShredStatus


class TenantErasure(BaseModel):
    """What ``erase_tenant`` destroyed: every key of the tenant, its refs tombstoned."""

    tenant: Tenant
    keys_destroyed: list[str] = Field(description="'kind:version:id' of each destroyed tenant key")
    refs_forgotten: int
    blobs_deleted: int
    shred_status: ShredStatus
