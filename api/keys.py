"""API keys: ``fak_<key id>_<secret>``, stored as a keyed hash (HMAC-SHA256 under a key
derived from the master secret), compared in constant time, mapped to one tenant and
one role. The key is shown once, when it is created."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from enum import StrEnum

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import sessionmaker

from fak.db import WRITE
from fak.errors import InvalidInput, NotFound
from fak.state.schema import ApiKeyRow
from fak.state.store import now_us
from fak.types import check_tenant

PREFIX = "fak_"
HASH_LABEL = "fak/api/key-hash"


class Role(StrEnum):
    AGENT = "agent"  # sessions, tool results, generation, chat completions
    AUDITOR = "auditor"  # the tenant's audit rows, proofs, receipts (read only)
    ADMIN = "admin"  # everything of the tenant, forget, and the policy


@dataclass(frozen=True)
class Principal:
    key_id: str
    tenant: str
    role: Role


@dataclass(frozen=True)
class Check:
    """The outcome of presenting a key: a principal, or why not (for the AuthFailure event)."""

    principal: Principal | None
    reason: str | None  # missing_key | unknown_key | revoked_key
    fingerprint: str | None  # keyed digest of the presented key, never the key


class KeyStore:
    def __init__(self, engine: Engine, hash_key: bytes) -> None:
        """``hash_key``: derived from the master secret under ``HASH_LABEL`` (never the secret itself)."""
        self._hash_key = hash_key
        self._session = sessionmaker(engine, expire_on_commit=False)
        self._writer = sessionmaker(engine.execution_options(**{WRITE: True}), expire_on_commit=False)

    def _hash(self, key: str) -> str:
        return hmac.new(self._hash_key, key.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()

    def create(self, tenant: str, role: str, name: str | None = None) -> tuple[str, Principal]:
        """A new key; the returned string is the only time it exists outside the caller."""
        tenant = check_tenant(tenant)
        try:
            role = Role(role)
        except ValueError:
            raise InvalidInput(f"role must be one of {', '.join(r.value for r in Role)}, not {role!r}") from None
        key_id = secrets.token_hex(8)
        key = f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
        with self._writer() as s, s.begin():
            s.add(ApiKeyRow(key_id=key_id, tenant=tenant, role=role.value, hash=self._hash(key),
                            name=(name or "")[:128] or None, created_us=now_us()))
        return key, Principal(key_id, tenant, role)

    def revoke(self, key_id: str) -> None:
        with self._writer() as s, s.begin():
            row = s.get(ApiKeyRow, key_id)
            if row is None:
                raise NotFound(f"no key {key_id!r}")
            row.revoked_us = row.revoked_us or now_us()

    def list(self, tenant: str | None = None) -> list[ApiKeyRow]:
        with self._session() as s:
            q = sa.select(ApiKeyRow).order_by(ApiKeyRow.created_us)
            if tenant is not None:
                q = q.where(ApiKeyRow.tenant == tenant)
            return list(s.scalars(q))

    def check(self, key: str | None) -> Check:
        if not key:
            return Check(None, "missing_key", None)
        digest = self._hash(key)
        fingerprint = "hmac-sha256:" + digest
        key_id = key[len(PREFIX):].split("_", 1)[0] if key.startswith(PREFIX) else ""
        with self._session() as s:
            row = s.get(ApiKeyRow, key_id) if len(key_id) == 16 else None
        stored = row.hash if row is not None else "0" * 64
        if not hmac.compare_digest(stored, digest) or row is None:
            return Check(None, "unknown_key", fingerprint)
        if row.revoked_us is not None:
            return Check(None, "revoked_key", fingerprint)
        return Check(Principal(row.key_id, row.tenant, Role(row.role)), None, fingerprint)
