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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import InstrumentedAttribute, defer, sessionmaker
from sqlalchemy.orm import Session as OrmSession

from fak import db
from fak.db import WRITE
from fak.errors import Conflict, ContentStoreError, FakError
from fak.scrub import scrub
from fak.state.apikeys import row_mac
from fak.state.schema import (
    ApiKeyRow,
    ConsoleLogoutRow,
    ForgetRow,
    HeldCallRow,
    McpPinRow,
    RefLinkRow,
    RefRow,
    ResponseRow,
    SegmentRow,
    SessionRow,
    ToolApprovalRow,
    WithdrawalTaskRow,
)
from fak.state.seal import ContentKeys, Plain, needs_seal, seal

MIGRATIONS = Path(__file__).with_name("migrations")


class StateError(FakError):
    """The kernel state database cannot be opened or holds something inconsistent."""


def now_us() -> int:
    return time.time_ns() // 1000


def upgrade(engine: Engine, api_key_mac: bytes | None = None) -> None:
    """Migrate the kernel state. ``api_key_mac`` (``derive_key(master, MAC_LABEL)``): the key
    that seals the API key rows present when state_0005 runs (needed only if there are any)."""
    try:
        db.upgrade(engine, MIGRATIONS, {"api_key_mac": api_key_mac} if api_key_mac is not None else None)
    except sa.exc.OperationalError as exc:
        raise StateError(f"cannot open the kernel state database {engine.url!r}: {exc.orig}") from exc


class _Anywhere:
    """``sessions_holding``'s default: sessions on every replica."""


ANYWHERE = _Anywhere()
Placed: TypeAlias = frozenset[str | None] | _Anywhere  # noqa: UP040 - mypy reads it


def _placed(tenant: str, on: Placed) -> sa.Select[str]:
    """The ids of the tenant's sessions placed on ``on`` (None in it: unplaced), as a subquery."""
    q = sa.select(SessionRow.id).where(SessionRow.tenant == tenant)
    if isinstance(on, _Anywhere):
        return q
    named = sorted(x for x in on if x is not None)
    cond = [SessionRow.replica.in_(named)] if named else []
    if None in on:
        cond.append(SessionRow.replica.is_(None))
    return q.where(sa.or_(*cond) if cond else sa.false())


def pack_tokens(ids: Iterable[int]) -> bytes:
    return array("i", ids).tobytes()


def unpack_tokens(raw: bytes) -> list[int]:
    out = array("i")
    out.frombytes(raw)
    return out.tolist()


def _like_escaped(text: str) -> str:
    """``text`` as a literal inside a LIKE pattern whose escape character is a backslash."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _linked_of(linked: str | None) -> set[str]:
    """The refs of a ``fak_forgets.linked`` column: JSON [{ref, key_id, kek_version}, ...]."""
    return {x["ref"] for x in json.loads(linked or "[]")}


@dataclass(frozen=True)
class ForgetProgress:
    """A forget's progress, written with the session ledger it changed, in one transaction: the
    request, the replica whose task row records it (None: the forget's own row) and the JSON of
    its units and sessions so far (``fak.kernel.withdrawal.records`` writes and reads them)."""

    request_id: str
    replica: str | None
    units: str
    sessions: str


class StateStore:
    def __init__(self, engine: Engine, *, api_key_mac: bytes) -> None:
        """``api_key_mac``: the API key rows' MAC key (``fak.state.apikeys``), derived from the
        master secret: a tenant erase revokes its keys and seals the rows again."""
        self.engine = engine
        self._api_key_mac = api_key_mac
        upgrade(engine, api_key_mac)
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
        self, row: SessionRow, segments: list[SegmentRow],
        forget: ForgetProgress | None = None,
    ) -> None:
        """Replace a session's metadata and ledger in one transaction; ``forget`` updates that
        forget's progress in the same transaction (its own row, or a replica's task row,
        ``fak_withdrawal_tasks``), so a crash never leaves a dropped segment unrecorded in its receipt."""
        with self.tx() as s:
            s.execute(sa.delete(SegmentRow).where(SegmentRow.tenant == row.tenant, SegmentRow.session_id == row.id))
            s.merge(row)
            s.add_all(segments)
            if forget is not None:
                values = {"units": forget.units, "sessions": forget.sessions}
                if forget.replica is None:
                    s.execute(sa.update(ForgetRow).where(ForgetRow.request_id == forget.request_id).values(**values))
                else:
                    s.execute(sa.update(WithdrawalTaskRow).where(WithdrawalTaskRow.request_id == forget.request_id,
                                                                 WithdrawalTaskRow.replica == forget.replica)
                              .values(**values))

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

    def committed_ledger(self, tenant: str, session_id: str) -> tuple[SessionRow, list[SegmentRow]] | None:
        """A session's rows as last committed, for a read: one statement (one snapshot, also under
        PostgreSQL's read committed, while a writer may replace the ledger), without the columns
        that hold text or tokens (a read shows ids, digests and counts, never content)."""
        q = (
            sa.select(SessionRow, SegmentRow)
            .outerjoin(SegmentRow, sa.and_(SegmentRow.tenant == SessionRow.tenant,
                                           SegmentRow.session_id == SessionRow.id))
            .where(SessionRow.tenant == tenant, SessionRow.id == session_id)
            .order_by(SegmentRow.seq)
            .options(defer(SegmentRow.tokens), defer(SegmentRow.message_text), defer(SegmentRow.sealed))
        )
        with self._session() as s:
            found = s.execute(q).all()
        if not found:
            return None
        return found[0][0], [seg for _, seg in found if seg is not None]

    def segments_naming(self, tenant: str, ref: str, limit: int) -> tuple[list[SegmentRow], bool]:
        """The first ``limit`` segment rows of the tenant's sessions (any state, by session and
        order) whose own ref, content or attention provenance names ``ref``, and whether there
        are more: one bounded query, whatever the number of sessions (the console's ref page)."""
        pattern = "%" + _like_escaped(json.dumps(ref)) + "%"
        q = (
            sa.select(SegmentRow)
            .where(SegmentRow.tenant == tenant,
                   sa.or_(SegmentRow.ref == ref, SegmentRow.content.like(pattern, escape="\\"),
                          SegmentRow.attention.like(pattern, escape="\\")))
            .order_by(SegmentRow.session_id, SegmentRow.seq)
            .limit(limit + 1)
            .options(defer(SegmentRow.tokens), defer(SegmentRow.message_text), defer(SegmentRow.sealed))
        )
        with self._session() as s:
            rows = list(s.scalars(q))
        return rows[:limit], len(rows) > limit

    def delete_session(self, tenant: str, session_id: str) -> None:
        with self.tx() as s:
            s.execute(sa.delete(SegmentRow).where(SegmentRow.tenant == tenant, SegmentRow.session_id == session_id))
            s.execute(sa.delete(SessionRow).where(SessionRow.tenant == tenant, SessionRow.id == session_id))
            # a session created later under the same id starts without them
            s.execute(sa.delete(ToolApprovalRow).where(ToolApprovalRow.tenant == tenant,
                                                       ToolApprovalRow.session_id == session_id))

    def session_count(self, tenant: str) -> int:
        with self._session() as s:
            return s.scalar(sa.select(sa.func.count()).select_from(SessionRow).where(SessionRow.tenant == tenant)) or 0

    def session_ids(self, tenant: str) -> list[str]:
        with self._session() as s:
            q = sa.select(SessionRow.id).where(SessionRow.tenant == tenant).order_by(SessionRow.created_us, SessionRow.id)
            return list(s.scalars(q))

    def session_ids_by_tenant(self) -> dict[str, list[str]]:
        """Every tenant that has sessions, in name order, with its session ids (as ``session_ids``)."""
        with self._session() as s:
            q = sa.select(SessionRow.tenant, SessionRow.id).order_by(SessionRow.tenant, SessionRow.created_us,
                                                                     SessionRow.id)
            out: dict[str, list[str]] = {}
            for tenant, session_id in s.execute(q):
                out.setdefault(tenant, []).append(session_id)
            return out

    def sessions_holding(self, tenant: str, ref: str, on: Placed = ANYWHERE) -> list[str]:
        """Sessions with a live segment whose own ref, content or attention provenance holds
        ``ref``; ``on``: only those placed on these replicas (None in it: unplaced ones)."""
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
            if on is not ANYWHERE:
                q = q.where(SegmentRow.session_id.in_(_placed(tenant, on)))
            return sorted(s.scalars(q))

    def session_ids_on(self, tenant: str, on: Placed) -> list[str]:
        """Ids of the tenant's sessions placed on the replicas ``on`` (None in it: unplaced)."""
        with self._session() as s:
            return sorted(s.scalars(_placed(tenant, on)))

    def session_created(self, tenant: str, session_id: str) -> int | None:
        """When the session was created (what tells it from a later session of the same id), None if it does not exist."""
        with self._session() as s:
            return s.scalar(sa.select(SessionRow.created_us).where(SessionRow.tenant == tenant,
                                                                   SessionRow.id == session_id))

    def placement(self, tenant: str, session_id: str) -> tuple[bool, str | None]:
        """(the session exists, the replica it is placed on; None: unplaced)."""
        with self._session() as s:
            row = s.execute(sa.select(SessionRow.replica).where(SessionRow.tenant == tenant,
                                                                SessionRow.id == session_id)).first()
            return (False, None) if row is None else (True, row[0])

    def move_session(self, tenant: str, session_id: str, owner: str | None, to: str) -> bool:
        """Place the session on ``to`` if it is still placed on ``owner`` (a replica that is down):
        whether it moved."""
        with self.tx() as s:
            where = [SessionRow.tenant == tenant, SessionRow.id == session_id,
                     SessionRow.replica.is_(None) if owner is None else SessionRow.replica == owner]
            return bool(s.execute(sa.update(SessionRow).where(*where).values(replica=to)).rowcount)  # type: ignore[attr-defined]

    def seal_clear_segments(self, keys: ContentKeys) -> tuple[int, int]:
        """Seal the live segment rows derived from tool content that a store written before
        sealing (``state_0003``) keeps in the clear, then scrub the old rows out of the
        database files (``fak.scrub``). Run on open; idempotent. (sealed, skipped): a row
        whose refs have no data key any more (erased outside the kernel) is left as it is; the
        store says so with a ``ContentStoreError`` (``fak.cas.CasError``)."""
        with self._session() as s:
            q = sa.select(SegmentRow).where(SegmentRow.state == "live", SegmentRow.sealed.is_(None),
                                            SegmentRow.tokens.is_not(None), SegmentRow.content != "[]")
            rows = list(s.scalars(q))
        done = skipped = 0
        by_tenant: dict[str, dict[str, bytes] | None] = {}  # one key-database read per tenant, not per row
        for t in {r.tenant for r in rows}:
            try:
                by_tenant[t] = keys.content_keys(t, {x for r in rows if r.tenant == t for x in json.loads(r.content)})
            except ContentStoreError:  # some ref is gone: rows are read one at a time below
                by_tenant[t] = None
        for row in rows:
            refs = json.loads(row.content)
            known = by_tenant[row.tenant]
            try:
                mine = {x: known[x] for x in refs} if known is not None else keys.content_keys(row.tenant, refs)
            except ContentStoreError:
                skipped += 1
                continue
            if not needs_seal(mine):
                continue
            plain = Plain(unpack_tokens(row.tokens or b""), row.message_role, row.message_text)
            ciphertext = seal(mine, row.tenant, row.session_id, row.id, plain)
            with self.tx() as s:
                s.execute(sa.update(SegmentRow)
                          .where(SegmentRow.tenant == row.tenant, SegmentRow.session_id == row.session_id,
                                 SegmentRow.id == row.id, SegmentRow.sealed.is_(None))
                          .values(sealed=ciphertext, tokens=None, message_role=None, message_text=None))  # fmt: skip
            done += 1
        if done:
            scrub(self.engine, SegmentRow.__tablename__)
        return done, skipped

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
        with self.tx() as s:
            s.execute(sa.delete(RefRow).where(RefRow.tenant == tenant))
            s.execute(sa.delete(RefLinkRow).where(RefLinkRow.tenant == tenant))
            s.execute(sa.delete(ResponseRow).where(ResponseRow.tenant == tenant))
            s.execute(sa.delete(HeldCallRow).where(HeldCallRow.tenant == tenant))
            s.execute(sa.delete(ToolApprovalRow).where(ToolApprovalRow.tenant == tenant))
            when = now_us()
            rows = list(s.scalars(sa.select(ApiKeyRow).where(ApiKeyRow.tenant == tenant, ApiKeyRow.revoked_us.is_(None))))
            for row in rows:  # revoked and sealed again: the MAC covers the revocation
                row.revoked_us = when
                row.mac = row_mac(self._api_key_mac, row)
            return len(rows)

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
            return [(t, d, int(e)) for t, d, e in s.execute(q) if e is not None]  # the query admits no None

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
        """A forget of ``ref``, or one that erases it as a linked ref, has not completed."""
        row = self.forget_row(tenant, ref)
        if row is not None and row.state == "requested":
            return True
        with self._session() as s:  # the tenant's pending forgets: few, and only while they run
            q = sa.select(ForgetRow.linked).where(ForgetRow.tenant == tenant, ForgetRow.state == "requested",
                                                  ForgetRow.linked.is_not(None))
            return any(ref in _linked_of(linked) for linked in s.scalars(q))

    def forget_standing(self, tenant: str, ref: str) -> tuple[bool, ForgetRow | None]:
        """``forget_pending`` and ``forget_covering`` in one read (an admission asks both)."""
        with self._session() as s:
            own = s.scalars(sa.select(ForgetRow).where(ForgetRow.tenant == tenant, ForgetRow.ref == ref)
                            .order_by(ForgetRow.started_us.desc()).limit(1)).first()
            q = (sa.select(ForgetRow).where(ForgetRow.tenant == tenant,
                                            ForgetRow.linked.like(f"%{json.dumps(ref)}%"))
                 .order_by(ForgetRow.started_us.desc()))
            linked = [r for r in s.scalars(q) if ref in _linked_of(r.linked)]
        pending = (own is not None and own.state == "requested") or any(r.state == "requested" for r in linked)
        latest = linked[0] if linked else None
        if own is None or (latest is not None and latest.started_us > own.started_us):
            return pending, latest
        return pending, own

    def forget_covering(self, tenant: str, ref: str) -> ForgetRow | None:
        """The latest forget of ``ref`` or of a ref linked to it (that erased it too)."""
        own = self.forget_row(tenant, ref)
        with self._session() as s:
            q = (sa.select(ForgetRow).where(ForgetRow.tenant == tenant,
                                            ForgetRow.linked.like(f"%{json.dumps(ref)}%"))
                 .order_by(ForgetRow.started_us.desc()))
            linked = next((r for r in s.scalars(q) if ref in _linked_of(r.linked)), None)
        if own is None or (linked is not None and linked.started_us > own.started_us):
            return linked
        return own

    # --- redaction links ------------------------------------------------------
    def link_refs(self, tenant: str, original: str, derived: str) -> None:
        """Record that the kernel's gate derived ``derived`` (a REDACT's bytes) from ``original``."""
        with self.tx() as s:
            if s.get(RefLinkRow, (tenant, original, derived)) is None:
                s.add(RefLinkRow(tenant=tenant, original=original, derived=derived, created_us=now_us()))

    def linked_refs(self, tenant: str, ref: str, limit: int = 10_000) -> list[str]:
        """The other refs a forget of ``ref`` erases: every ref it was derived from (its
        originals, transitively) and every ref derived from those or from it. Another
        original that merely shares a redacted form is not erased. Of ``tenant`` only."""
        t = RefLinkRow
        with self._session() as s:
            def step(frontier: set[str], src: InstrumentedAttribute[str], dst: InstrumentedAttribute[str]) -> set[str]:
                q = sa.select(dst).where(t.tenant == tenant, src.in_(sorted(frontier)))
                return set(s.scalars(q))

            up: set[str] = set()
            frontier = {ref}
            while frontier and len(up) < limit:
                frontier = step(frontier, t.derived, t.original) - up - {ref}
                up |= frontier
            seen = up | {ref}
            frontier = set(seen)
            while frontier and len(seen) < limit:
                frontier = step(frontier, t.original, t.derived) - seen
                seen |= frontier
        return sorted(seen - {ref})

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

    def forgets_replaying(self) -> list[ForgetRow]:
        """Forgets whose erasure is done and whose independent replay is not logged yet (``fak.kernel.withdrawal.replay_check``)."""
        with self._session() as s:
            q = sa.select(ForgetRow).where(ForgetRow.state == "replaying").order_by(ForgetRow.started_us)
            return list(s.scalars(q))

    # --- responses (the OpenAI Responses door, fak.kernel.openai.responses) -----------------
    def claim_response(self, row: ResponseRow) -> None:
        """Insert a new response row; ``Conflict`` when ``row.previous_id`` already has a
        follower (the unique index: two follow-ups of one response race, one wins)."""
        try:
            with self.tx() as s:
                s.add(row)
        except sa.exc.IntegrityError:
            raise Conflict(f"response {row.previous_id} already has a follow-up") from None

    def response(self, tenant: str, response_id: str) -> ResponseRow | None:
        with self._session() as s:
            return s.get(ResponseRow, (tenant, response_id))

    def response_follower(self, tenant: str, response_id: str) -> str | None:
        """The id of the response that follows ``response_id`` in its chain, if any."""
        with self._session() as s:
            q = sa.select(ResponseRow.id).where(ResponseRow.tenant == tenant, ResponseRow.previous_id == response_id)
            return s.scalars(q).first()

    def update_response(self, tenant: str, response_id: str, state: str, body: str | None = None,
                        sealed: bytes | None = None, content: str | None = None) -> None:
        """Set a response's state and body (in the clear, or sealed with its refs); None clears them."""
        with self.tx() as s:
            s.execute(sa.update(ResponseRow).where(ResponseRow.tenant == tenant, ResponseRow.id == response_id)
                      .values(state=state, body=body, sealed=sealed, content=content))

    def drop_response(self, tenant: str, response_id: str) -> None:
        """Remove a claim that left no trace in its session (its response never happened)."""
        with self.tx() as s:
            s.execute(sa.delete(ResponseRow).where(ResponseRow.tenant == tenant, ResponseRow.id == response_id))

    def live_responses(self, tenant: str, session_id: str) -> int:
        """How many responses of the session's chain are not deleted."""
        with self._session() as s:
            q = sa.select(sa.func.count()).select_from(ResponseRow).where(
                ResponseRow.tenant == tenant, ResponseRow.session_id == session_id, ResponseRow.state != "deleted")
            return s.scalar(q) or 0

    # --- pinned MCP tool descriptions (fak.kernel.mcp.pins) -------------------------------------
    def mcp_pins(self, label: str | None = None) -> list[McpPinRow]:
        """The pinned tools of server ``label`` (every server's when None)."""
        with self._session() as s:
            q = sa.select(McpPinRow)
            if label is not None:
                q = q.where(McpPinRow.label == label)
            return list(s.scalars(q.order_by(McpPinRow.label, McpPinRow.tool)))

    def replace_mcp_pins(self, label: str, rows: list[McpPinRow]) -> None:
        """Server ``label``'s pins become ``rows``, in one transaction."""
        with self.tx() as s:
            s.execute(sa.delete(McpPinRow).where(McpPinRow.label == label))
            s.add_all(rows)

    # --- held tool calls and remembered approvals (fak.kernel.calls.held) ----------------------
    def add_held_call(self, row: HeldCallRow, *, limit: int, since_us: int) -> None:
        """Insert a held call. The tenant's rows created before ``since_us`` (expired) go in the
        same transaction, and beyond ``limit`` rows its oldest: a tenant evicts only its own."""
        with self.tx() as s:
            s.execute(sa.delete(HeldCallRow).where(HeldCallRow.tenant == row.tenant, HeldCallRow.created_us < since_us))
            s.add(row)
            s.flush()
            count = s.scalar(sa.select(sa.func.count()).select_from(HeldCallRow)
                             .where(HeldCallRow.tenant == row.tenant)) or 0
            if count > limit:
                oldest = sa.select(HeldCallRow.call_id).where(HeldCallRow.tenant == row.tenant).order_by(
                    HeldCallRow.created_us, HeldCallRow.call_id).limit(count - limit)
                s.execute(sa.delete(HeldCallRow).where(HeldCallRow.tenant == row.tenant,
                                                       HeldCallRow.call_id.in_(list(s.scalars(oldest)))))

    def held_call(self, tenant: str, call_id: str) -> HeldCallRow | None:
        with self._session() as s:
            return s.get(HeldCallRow, (tenant, call_id))

    def held_calls_of_form(self, tenant: str, form: str, since_us: int, limit: int = 64) -> list[HeldCallRow]:
        """The tenant's held calls created since ``since_us`` whose canonical form is ``form``."""
        with self._session() as s:
            q = (sa.select(HeldCallRow).where(HeldCallRow.tenant == tenant, HeldCallRow.form == form,
                                              HeldCallRow.created_us >= since_us)
                 .order_by(HeldCallRow.created_us).limit(limit))
            return list(s.scalars(q))

    def held_forms(self, tenant: str, forms: Iterable[str], since_us: int) -> set[str]:
        """Which of ``forms`` a held call of the tenant created since ``since_us`` has."""
        wanted, found = sorted(set(forms)), set()
        with self._session() as s:
            for at in range(0, len(wanted), 500):  # bounded IN lists
                found |= set(s.scalars(sa.select(HeldCallRow.form).distinct().where(
                    HeldCallRow.tenant == tenant, HeldCallRow.form.in_(wanted[at:at + 500]),
                    HeldCallRow.created_us >= since_us)))
        return found

    def held_calls(self, tenant: str, state: str, since_us: int, limit: int) -> list[HeldCallRow]:
        """The tenant's held calls in ``state`` created since ``since_us``, oldest first."""
        with self._session() as s:
            q = (sa.select(HeldCallRow).where(HeldCallRow.tenant == tenant, HeldCallRow.state == state,
                                              HeldCallRow.created_us >= since_us)
                 .order_by(HeldCallRow.created_us, HeldCallRow.call_id).limit(limit))
            return list(s.scalars(q))

    def update_held_call(self, tenant: str, call_id: str, mac: str, values: dict[str, Any]) -> bool:
        """Change a held call only if its row is still the one read (its ``mac``): of two replicas
        deciding the same call at once, one changes it. Whether it changed."""
        with self.tx() as s:
            q = (sa.update(HeldCallRow)
                 .where(HeldCallRow.tenant == tenant, HeldCallRow.call_id == call_id, HeldCallRow.mac == mac)
                 .values(**values))
            return bool(s.execute(q).rowcount)  # type: ignore[attr-defined]

    def remember_approval(self, row: ToolApprovalRow) -> bool:
        """Keep an approval for its session, if the session exists (its row locked, so a delete
        waits and takes the approval with it); whether it was kept."""
        with self.tx() as s:
            if s.get(SessionRow, (row.tenant, row.session_id), with_for_update=True) is None:
                return False
            s.execute(sa.delete(ToolApprovalRow).where(  # the session's expired ones go: rows stay bounded
                ToolApprovalRow.tenant == row.tenant, ToolApprovalRow.session_id == row.session_id,
                ToolApprovalRow.expires_us < row.created_us))
            s.merge(row)
            return True

    def approval(self, tenant: str, session_id: str, key: str) -> ToolApprovalRow | None:
        with self._session() as s:
            return s.get(ToolApprovalRow, (tenant, session_id, key))

    # --- console sign-outs (fak.api.console.auth) ------------------------------------------------
    def record_console_logout(self, session_id: str, expires_us: int, now_us: int) -> None:
        """Sign a console session out until ``expires_us`` (idempotent, also when two replicas
        record it at once), pruning the sign-outs whose cookies expired before ``now_us``."""
        try:
            with self.tx() as s:
                s.execute(sa.delete(ConsoleLogoutRow).where(ConsoleLogoutRow.expires_us < now_us))
                s.merge(ConsoleLogoutRow(session_id=session_id, expires_us=expires_us))
        except sa.exc.IntegrityError:  # another replica recorded it at the same moment: signed out
            if not self.console_signed_out(session_id):
                raise

    def console_signed_out(self, session_id: str) -> bool:
        """Whether the console session was signed out (one primary-key read)."""
        with self._session() as s:
            return s.get(ConsoleLogoutRow, session_id) is not None
