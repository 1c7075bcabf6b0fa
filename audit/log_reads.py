"""Reading the audit log: its entries (by index, by tenant, newest first, the admission or the
replay a receipt names), its checkpoints as served (the log's note with the witnesses'
cosignature lines), and inclusion and consistency proofs over the stored tree.

``LogReads`` is the reading half of ``fak.audit.log.AuditLog``: it reads the database the
writer commits to and never writes. Two things a read needs come from the writer: a proof for
an entry no checkpoint covers yet signs one (``checkpoint``), and a row found under another
tenant's ``tenant`` column (which no hash covers) is alarmed in the log (``_column_changed``).
"""

from __future__ import annotations

import contextlib
import json
from abc import ABC, abstractmethod
from collections.abc import Generator, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from fak.audit import merkle, store
from fak.audit.checkpoint import SignedCheckpoint, from_note
from fak.audit.cosignature import add_lines
from fak.audit.errors import AuditError
from fak.audit.events import AdmissionVerdict, Event, ReplayVerified, parse_event
from fak.audit.proofs import ConsistencyProof, InclusionProof


@dataclass(frozen=True)
class LogEntry:
    index: int
    event: Event
    body: bytes  # the canonical JSON that was hashed: leaf hash = SHA-256(0x00 || body)

    @property
    def leaf_hash(self) -> bytes:
        return merkle.hash_leaf(self.body)


def _cp(row: tuple[int, bytes, str], lines: Sequence[str] = ()) -> SignedCheckpoint:
    """A stored checkpoint as served: the log's note with the witnesses' cosignature lines."""
    return from_note(add_lines(row[2], list(lines)) if lines else row[2])


def tenant_tail(conn: Connection, tenant: str, stop: int) -> tuple[int, int | None]:
    """Among entries [0, stop), as the ``tenant`` column finds them (which no hash covers: the
    signer's remembered tails are what a statement states): the tenant's last sequence number
    (its latest entry's ``tseq``, or, when that entry was logged before tseq existed, how many
    entries it has) and the index of its latest entry (None: it has none). A latest row whose
    body is another tenant's counts as none."""
    row = store.tenant_last(conn, tenant, stop)
    if row is None:
        return 0, None
    obj = json.loads(row[1])
    if obj.get("tenant") != tenant:
        return 0, None
    seq = obj.get("tseq")
    return (seq if type(seq) is int else store.tenant_count(conn, tenant, stop)), row[0]


class LogReads(ABC):
    """Reads and proofs over the log's database (``engine``); safe to use from many threads."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._any_cosig = False  # once a cosignature is stored, served checkpoints look them up

    @abstractmethod
    def checkpoint(self, wait_witnesses: bool = True) -> SignedCheckpoint:
        """Sign (or return) a checkpoint of the current tree: the writer's."""

    @abstractmethod
    def _column_changed(self, index: int, column: str) -> None:
        """A row stands under another tenant's column: the writer logs the alarm."""

    def read_snapshot(self) -> contextlib.AbstractContextManager[Connection]:
        """A read connection (one snapshot) on the log's database: the export reads entries,
        checkpoints and cosignatures consistently through it."""
        return self._engine.connect()

    def _read(self) -> contextlib.AbstractContextManager[Connection]:
        return self._engine.connect()

    def size(self) -> int:
        with self._read() as conn:
            return store.size(conn)

    def latest_checkpoint(self) -> SignedCheckpoint | None:
        """The newest checkpoint, with the witnesses' cosignature lines after the log's."""
        with self._read() as conn:
            row = store.latest_checkpoint(conn)
            return None if row is None else self._served(conn, row)

    def checkpoints(self) -> list[SignedCheckpoint]:
        with self._read() as conn:
            cos = store.all_cosignatures(conn)
            return [_cp(row, cos.get(row[0], ())) for row in store.all_checkpoints(conn)]

    def _served(self, conn: Connection, row: tuple[int, bytes, str]) -> SignedCheckpoint:
        return _cp(row, [ln for _, ln in store.cosignature_lines(conn, row[0])] if self._cosigned(conn) else ())

    def _cosigned(self, conn: Connection) -> bool:
        """Whether any cosignature is stored (cached once true: proofs skip the query otherwise)."""
        if not self._any_cosig:
            self._any_cosig = conn.exec_driver_sql("SELECT 1 FROM audit_cosignatures LIMIT 1").first() is not None
        return self._any_cosig

    def root(self, size: int | None = None) -> bytes:
        with self._read() as conn:
            n = store.size(conn) if size is None else size
            return merkle.root_from(n, lambda ids: store.get_nodes(conn, ids))

    def entry(self, index: int) -> LogEntry:
        rows = list(self._entry_rows(index, index + 1, None))
        if not rows:
            raise AuditError(f"no audit entry at index {index}")
        return rows[0]

    def entries(
        self, tenant: str | None = None, start: int = 0, stop: int | None = None
    ) -> Generator[LogEntry, None, None]:
        """Entries in index order; ``tenant=None`` means all, ``""`` the system's only. A
        generator: ``close()`` it when stopping early, which releases its read connection."""
        return self._entry_rows(start, stop, tenant)

    def newest(self, tenant: str, before: int, limit: int, types: Sequence[str] = (),
               needles: Sequence[str] = ()) -> list[LogEntry]:
        """The tenant's entries before index ``before``, newest first, at most ``limit``: those
        of one of ``types`` (any when empty) whose canonical body holds every one of ``needles``.
        Filtered in the database (``store.tenant_rows_newest``) and checked again here on the
        hashed body: the ``type`` and ``tenant`` columns, which nothing hashes, decide nothing
        (a row filed under another tenant's column is skipped and alarmed, as ``entries`` does)."""
        out: list[LogEntry] = []
        moved: list[int] = []
        pos = before
        with self._read() as conn:
            while len(out) < limit:
                rows = store.tenant_rows_newest(conn, tenant, pos, limit, types, needles)
                for idx, body in rows:
                    event = parse_event(body)
                    if event.tenant != tenant:
                        moved.append(idx)
                    elif (not types or event.type in types) and all(n.encode() in body for n in needles):
                        out.append(LogEntry(idx, event, body))
                if len(rows) < limit:
                    break
                pos = rows[-1][0]
        for idx in moved:
            self._column_changed(idx, tenant)
        return out[:limit]

    def find_admission(self, tenant: str, ref: str, before: int) -> tuple[int, bytes] | None:
        """The newest AdmissionVerdict of ``tenant`` naming ``ref`` (as its ref or its admitted ref)
        logged before index ``before``: (index, canonical bytes), or None. Reads backwards from
        ``before`` through the tenant's entries (index on tenant, idx) whose hashed body is an
        admission (the ``type`` column, which nothing hashes, is not trusted). Here, not in
        ``fak.audit.receipt``, so that a receipt's model loads no database code (the SDK's)."""
        t = store.entries_t
        pos = before
        with self._read() as conn:
            while True:
                rows = conn.execute(
                    sa.select(t.c.idx, t.c.body)
                    .where(t.c.tenant == tenant, store.body_type_match(conn, ["admission_verdict"]), t.c.idx < pos)
                    .order_by(t.c.idx.desc())
                    .limit(500)
                ).all()
                for idx, body in rows:
                    raw = bytes(body)
                    if _names_ref(raw, ref) and _is_admission_of(raw, tenant, ref):
                        return int(idx), raw
                if len(rows) < 500:
                    return None
                pos = int(rows[-1][0])

    def find_replay(self, tenant: str, request_id: str, after: int) -> int | None:
        """The index of the ReplayVerified of forget ``request_id`` (logged after its completion at
        ``after``), or None while it is pending. Reads the tenant's replay events only."""
        t = store.entries_t
        needle = f'"request_id":"{request_id}"'.encode()
        with self._read() as conn:
            rows = conn.execute(sa.select(t.c.idx, t.c.body)  # by the hashed body, never the unhashed type column
                                .where(t.c.tenant == tenant, store.body_type_match(conn, ["replay_verified"]),
                                       t.c.idx > after)
                                .order_by(t.c.idx))
            for idx, body in rows:
                raw = bytes(body)
                if needle in raw:
                    ev = parse_event(raw)
                    if isinstance(ev, ReplayVerified) and ev.request_id == request_id and ev.completed_index == after:
                        return int(idx)
        return None

    def _entry_rows(self, start: int, stop: int | None, tenant: str | None) -> Generator[LogEntry, None, None]:
        """With ``tenant``: rows found by the ``tenant`` column (which no hash covers) whose
        body is another tenant's are skipped (never served as the column's) and alarmed."""
        moved = []
        try:
            with self._read() as conn:
                for idx, body in store.entry_rows(conn, start, stop, tenant):
                    event = parse_event(body)
                    if tenant is not None and event.tenant != tenant:
                        moved.append(idx)
                        continue
                    yield LogEntry(idx, event, body)
        finally:  # also when a page (islice, then close()) stops the iteration early
            for idx in moved:
                self._column_changed(idx, tenant)  # type: ignore[arg-type]

    def inclusion_proof(self, index: int, size: int | None = None) -> InclusionProof:
        """Proof for ``index``; by default in the first signed checkpoint that covers it
        (signing one now if none does yet), with that checkpoint attached. With ``size``:
        in the tree of that size, with its checkpoint if one was signed at exactly that size."""
        if index < 0:
            raise AuditError("index must be >= 0")
        for attempt in (0, 1):
            with self._read() as conn:

                def get(ids: Sequence[int]) -> dict[int, bytes]:
                    return store.get_nodes(conn, ids)

                if size is not None:
                    if not index < size <= store.size(conn):
                        raise AuditError(f"cannot prove index {index} in a tree of size {size}")
                    row = store.checkpoint_at_least(conn, size)
                    signed = self._served(conn, row).note if row is not None and row[0] == size else None
                    root = merkle.root_from(size, get)
                    hashes = merkle.inclusion_proof(index, size, get)
                    return InclusionProof(log_index=index, tree_size=size, root_hash=root, hashes=hashes,
                                          checkpoint=signed)
                row = store.checkpoint_at_least(conn, index + 1)
                if row is not None:
                    hashes = merkle.inclusion_proof(index, row[0], get)
                    return InclusionProof(log_index=index, tree_size=row[0], root_hash=row[1], hashes=hashes,
                                          checkpoint=self._served(conn, row).note)
                current = store.size(conn)
            if index >= current:
                raise AuditError(f"no audit entry at index {index} (log size {current})")
            if attempt == 0:
                self.checkpoint()
        raise AuditError(f"no checkpoint covers index {index}")

    def consistency_proof(self, size1: int, size2: int | None = None) -> ConsistencyProof:
        with self._read() as conn:
            n = store.size(conn) if size2 is None else size2
            if not 0 <= size1 <= n <= store.size(conn):
                raise AuditError(f"no consistency proof from size {size1} to size {n}")

            def get(ids: Sequence[int]) -> dict[int, bytes]:
                return store.get_nodes(conn, ids)

            return ConsistencyProof(
                size1=size1,
                size2=n,
                root1=merkle.root_from(size1, get),
                root2=merkle.root_from(n, get),
                hashes=merkle.consistency_proof(size1, n, get),
            )



def _names_ref(body: bytes, ref: str) -> bool:
    return f'"ref":"{ref}"'.encode() in body or f'"admitted_ref":"{ref}"'.encode() in body


def _is_admission_of(raw: bytes, tenant: str, ref: str) -> bool:
    try:
        ev = parse_event(raw)
    except AuditError:
        return False
    return isinstance(ev, AdmissionVerdict) and ev.tenant == tenant and ref in (ev.ref, ev.admitted_ref)
