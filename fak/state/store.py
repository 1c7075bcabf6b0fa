"""Reads and writes of the kernel state (``fak.state.schema``), one short
transaction each. A session's ledger is rewritten whole on every change: a
ledger is small (segments, not tokens), and a whole rewrite cannot leave half
a change behind."""

from __future__ import annotations

import json
import time
from array import array
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session as OrmSession
from sqlalchemy.orm import sessionmaker

from fak import db
from fak.db import WRITE
from fak.errors import FakError
from fak.state.schema import ForgetRow, RefRow, SegmentRow, SessionRow

MIGRATIONS = Path(__file__).with_name("migrations")


class StateError(FakError):
    """The kernel state database cannot be opened or holds something inconsistent."""


def now_us() -> int:
    return time.time_ns() // 1000


def upgrade(engine: Engine) -> None:
    try:
        db.upgrade(engine, MIGRATIONS)
    except sa.exc.OperationalError as exc:
        raise StateError(f"cannot open the kernel state database {engine.url!r}: {exc.orig}") from exc


def pack_tokens(ids: Iterable[int]) -> bytes:
    return array("i", ids).tobytes()


def unpack_tokens(raw: bytes) -> list[int]:
    out = array("i")
    out.frombytes(raw)
    return out.tolist()


class StateStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        upgrade(engine)
        self._session = sessionmaker(engine, expire_on_commit=False)
        # writers take SQLite's write lock up front (fak.db): a read-then-write never fails
        # half way because the audit writer committed in between
        self._writer = sessionmaker(engine.execution_options(**{WRITE: True}), expire_on_commit=False)

    @contextmanager
    def tx(self) -> Iterator[OrmSession]:
        with self._writer() as s, s.begin():
            yield s

    # --- sessions -------------------------------------------------------------
    def save_session(
        self, row: SessionRow, segments: list[SegmentRow], forget: tuple[str, dict[str, object]] | None = None
    ) -> None:
        """Replace a session's metadata and ledger in one transaction; ``forget`` =
        (request id, values) updates that forget's progress in the same transaction, so a
        crash never leaves a dropped segment unrecorded in its receipt."""
        with self.tx() as s:
            s.execute(sa.delete(SegmentRow).where(SegmentRow.tenant == row.tenant, SegmentRow.session_id == row.id))
            s.merge(row)
            s.add_all(segments)
            if forget is not None:
                request_id, values = forget
                s.execute(sa.update(ForgetRow).where(ForgetRow.request_id == request_id).values(**values))

    def session(self, tenant: str, session_id: str) -> tuple[SessionRow, list[SegmentRow]] | None:
        with self._session() as s:
            row = s.get(SessionRow, (tenant, session_id))
            if row is None:
                return None
            segs = s.scalars(
                sa.select(SegmentRow)
                .where(SegmentRow.tenant == tenant, SegmentRow.session_id == session_id)
                .order_by(SegmentRow.seq)
            ).all()
            return row, list(segs)

    def delete_session(self, tenant: str, session_id: str) -> None:
        with self.tx() as s:
            s.execute(sa.delete(SegmentRow).where(SegmentRow.tenant == tenant, SegmentRow.session_id == session_id))
            s.execute(sa.delete(SessionRow).where(SessionRow.tenant == tenant, SessionRow.id == session_id))

    def session_count(self, tenant: str) -> int:
        with self._session() as s:
            return s.scalar(sa.select(sa.func.count()).select_from(SessionRow).where(SessionRow.tenant == tenant)) or 0

    def session_ids(self, tenant: str) -> list[str]:
        with self._session() as s:
            q = sa.select(SessionRow.id).where(SessionRow.tenant == tenant).order_by(SessionRow.created_us, SessionRow.id)
            return list(s.scalars(q))

    def sessions_holding(self, tenant: str, ref: str) -> list[str]:
        """Sessions with a live segment whose own ref, content or attention provenance holds ``ref``."""
        pattern = f'%{json.dumps(ref)}%'
        with self._session() as s:
            q = (
                sa.select(SegmentRow.session_id)
                .where(
                    SegmentRow.tenant == tenant,
                    SegmentRow.state == "live",
                    sa.or_(SegmentRow.ref == ref, SegmentRow.content.like(pattern),
                          SegmentRow.attention.like(pattern)),
                )
                .distinct()
            )
            return sorted(s.scalars(q))

    # --- refs -----------------------------------------------------------------
    def record_ref(
        self, tenant: str, digest: str, tool: str, tags: Iterable[str], verdict: str, policy_digest: str,
        expires_us: int | None = None, source: str | None = None,
    ) -> None:
        """Record an admission of ``digest``. Each admission is new evidence: it sets the ref's
        lifetime anew (``expires_us``; None: no lifetime) and clears an executed expiry."""
        with self.tx() as s:
            row = s.get(RefRow, (tenant, digest), with_for_update=True)
            if row is None:
                seq = (s.scalar(sa.select(sa.func.max(RefRow.seq)).where(RefRow.tenant == tenant)) or 0) + 1
                s.add(RefRow(tenant=tenant, digest=digest, tool=tool, tags=json.dumps(sorted(set(tags))),
                             admitted_us=now_us(), seq=seq, verdict=verdict, policy_digest=policy_digest,
                             quarantined=False, expires_us=expires_us, source=source))
            else:
                row.tags = json.dumps(sorted(set(json.loads(row.tags)) | set(tags)))
                row.verdict, row.policy_digest = verdict, policy_digest
                row.expires_us, row.expired_us = expires_us, None
                row.source = source if source is not None else row.source

    def ref(self, tenant: str, digest: str) -> RefRow | None:
        with self._session() as s:
            return s.get(RefRow, (tenant, digest))

    def refs_tagged(self, tenant: str, tag: str) -> list[str]:
        """Digests of refs carrying ``tag`` (``tool:NAME`` selects by tool), in admission order."""
        with self._session() as s:
            q = sa.select(RefRow).where(RefRow.tenant == tenant).order_by(RefRow.seq)
            if tag.startswith("tool:"):
                q = q.where(RefRow.tool == tag[5:])
                return [r.digest for r in s.scalars(q)]
            return [r.digest for r in s.scalars(q.where(RefRow.tags.like(f'%{json.dumps(tag)}%')))
                    if tag in json.loads(r.tags)]

    def set_quarantined(self, tenant: str, digest: str, reason: str) -> None:
        with self.tx() as s:
            row = s.get(RefRow, (tenant, digest), with_for_update=True)
            if row is not None:
                row.quarantined, row.quarantine_reason = True, reason

    def erase_tenant_records(self, tenant: str) -> int:
        """Delete what the kernel knew of the tenant's refs (tools, tags, sources) and revoke its
        API keys; the number of keys revoked. Forget progress rows stay: receipts need them."""
        from fak.state.schema import ApiKeyRow

        with self.tx() as s:
            s.execute(sa.delete(RefRow).where(RefRow.tenant == tenant))
            revoked = s.execute(sa.update(ApiKeyRow).where(ApiKeyRow.tenant == tenant, ApiKeyRow.revoked_us.is_(None))
                                .values(revoked_us=now_us()))
            return revoked.rowcount or 0

    def set_expired(self, tenant: str, digest: str, when_us: int) -> None:
        with self.tx() as s:
            row = s.get(RefRow, (tenant, digest), with_for_update=True)
            if row is not None:
                row.expired_us = when_us

    def due_expiries(self, now: int, limit: int = 256, tenant: str | None = None) -> list[tuple[str, str, int]]:
        """(tenant, ref, expires_us) of refs whose lifetime ended by ``now`` and whose expiry
        has not been executed (of one tenant, when given), earliest first."""
        with self._session() as s:
            q = (sa.select(RefRow.tenant, RefRow.digest, RefRow.expires_us)
                 .where(RefRow.expires_us.is_not(None), RefRow.expires_us <= now, RefRow.expired_us.is_(None))
                 .order_by(RefRow.expires_us).limit(limit))  # fmt: skip
            if tenant is not None:
                q = q.where(RefRow.tenant == tenant)
            return [(t, d, int(e)) for t, d, e in s.execute(q)]

    def next_expiry(self) -> int | None:
        """The earliest lifetime end not yet executed (None: none pending)."""
        with self._session() as s:
            return s.scalar(sa.select(sa.func.min(RefRow.expires_us))
                            .where(RefRow.expires_us.is_not(None), RefRow.expired_us.is_(None)))

    # --- forgets --------------------------------------------------------------
    def forget_row(self, tenant: str, ref: str) -> ForgetRow | None:
        """The latest forget of ``ref`` (a ref re-admitted after a forget may have several)."""
        with self._session() as s:
            q = (sa.select(ForgetRow).where(ForgetRow.tenant == tenant, ForgetRow.ref == ref)
                 .order_by(ForgetRow.started_us.desc()).limit(1))
            return s.scalars(q).first()

    def forget_by_request(self, tenant: str, request_id: str) -> ForgetRow | None:
        with self._session() as s:
            row = s.get(ForgetRow, request_id)
            return row if row is not None and row.tenant == tenant else None

    def forget_pending(self, tenant: str, ref: str) -> bool:
        row = self.forget_row(tenant, ref)
        return row is not None and row.state == "requested"

    def start_forget(self, row: ForgetRow) -> None:
        with self.tx() as s:
            s.add(row)

    def update_forget(self, request_id: str, **values: object) -> None:
        with self.tx() as s:
            s.execute(sa.update(ForgetRow).where(ForgetRow.request_id == request_id).values(**values))

    def pending_forgets(self) -> list[ForgetRow]:
        with self._session() as s:
            q = sa.select(ForgetRow).where(ForgetRow.state == "requested").order_by(ForgetRow.started_us)
            return list(s.scalars(q))
