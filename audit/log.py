"""AuditLog: the append-only, signed Merkle log of every decision.

Why one writer thread: it makes group commit and gap-free indexes simple.
Callers canonicalise their event and hand it over; the writer drains whatever
is queued into ONE transaction (under the database writer lock), assigns the
next indexes, stores the leaf and every subtree hash that became complete, and
acknowledges each append only after the commit returned. A checkpoint is
signed every N entries, every T ms while entries are pending, and on demand,
always after checking it is consistent with the last one signed.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import Connection

from fak.audit import merkle, store
from fak.audit.checkpoint import SignedCheckpoint, sign_checkpoint
from fak.audit.errors import AuditError
from fak.audit.events import Event, canonical, parse_event, to_event
from fak.audit.note import Signer
from fak.audit.proofs import ConsistencyProof, InclusionProof
from fak.audit.signing import load_signer


@dataclass(frozen=True)
class LogEntry:
    index: int
    event: Event
    body: bytes  # the canonical JSON that was hashed: leaf hash = SHA-256(0x00 || body)

    @property
    def leaf_hash(self) -> bytes:
        return merkle.hash_leaf(self.body)


@dataclass
class _Append:
    body: bytes
    tenant: str
    type: str
    ts: int
    future: Future


@dataclass
class _Control:
    kind: str  # "checkpoint" | "stop"
    future: Future


def _cp(row: tuple[int, bytes, str], origin: str) -> SignedCheckpoint:
    return SignedCheckpoint(origin=origin, size=row[0], root=row[1], note=row[2])


class AuditLog:
    """Open with ``AuditLog.open(...)``; safe to use from many threads."""

    def __init__(
        self,
        url: str,
        signer: Signer,
        checkpoint_every: int = 1000,
        checkpoint_ms: int = 1000,
        max_batch: int = 4096,
    ) -> None:
        self.origin = signer.name
        self._signer = signer
        self._every = max(1, checkpoint_every)
        self._interval = max(1, checkpoint_ms) / 1000.0
        self._max_batch = max_batch
        self._engine = store.make_engine(url)
        try:
            store.migrate(self._engine)
        except Exception as exc:  # a DB that is unreachable or not ours
            self._engine.dispose()
            if isinstance(exc, AuditError):
                raise
            raise AuditError(f"cannot open the audit log at {url!r}: {exc}") from exc
        self._frontier: merkle.Frontier | None = None
        self._last_cp: tuple[int, bytes, str] | None = None
        self._last_cp_time = time.monotonic()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._gate = threading.Lock()
        self._writer = threading.Thread(target=self._run, name="fak-audit-writer", daemon=True)
        self._writer.start()

    @classmethod
    def open(
        cls,
        url: str | None = None,
        data_dir: str | Path | None = None,
        origin: str | None = None,
        signing_key: object = None,
        **options: int,
    ) -> AuditLog:
        """Open (creating if needed) the log at ``url`` (default: the shared fak database).
        ``signing_key``: a Signer, a ``PRIVATE+KEY+...`` string or a path to one; default
        ``$FAK_AUDIT_SIGNING_KEY`` or ``<data dir>/audit_signing.key`` (created, mode 0600).
        ``options``: checkpoint_every (entries), checkpoint_ms, max_batch."""
        from fak.config import data_dir as default_dir
        from fak.config import database_url

        root = Path(data_dir) if data_dir is not None else default_dir()
        signer = load_signer(root, origin, signing_key)
        return cls(url or database_url(root), signer, **options)

    # ------------------------------------------------------------------ writing

    def submit(self, event: object) -> Future:
        """Queue an event; the future resolves to its index once the commit is durable."""
        ev = to_event(event)
        body = canonical(ev)
        fut: Future = Future()
        self._put(_Append(body, ev.tenant, ev.type, ev.ts, fut))
        return fut

    def _put(self, request: _Append | _Control) -> None:
        with self._gate:  # nothing is queued after the stop request
            if self._closed:
                raise AuditError("the audit log is closed")
            self._queue.put(request)

    def append(self, event: object) -> int:
        """Append an event and return its gap-free index once it is committed."""
        return self.submit(event).result()

    def checkpoint(self) -> SignedCheckpoint:
        """Sign (or return, if the size has not moved) a checkpoint of the current tree."""
        fut: Future = Future()
        self._put(_Control("checkpoint", fut))
        return fut.result()

    def close(self) -> None:
        fut: Future = Future()
        with self._gate:
            if self._closed:
                return
            self._queue.put(_Control("stop", fut))
            self._closed = True
        fut.result()
        self._writer.join()
        self._engine.dispose()

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        while True:
            timeout = None
            if self._pending():
                timeout = max(0.0, self._last_cp_time + self._interval - time.monotonic())
            try:
                batch = [self._queue.get(timeout=timeout)]
            except queue.Empty:
                self._safe_checkpoint(None)
                continue
            with contextlib.suppress(queue.Empty):
                while len(batch) < self._max_batch:
                    batch.append(self._queue.get_nowait())
            appends = [r for r in batch if isinstance(r, _Append)]
            controls = [r for r in batch if isinstance(r, _Control)]
            if appends:
                self._commit(appends)
            due = self._pending() and (
                self._unsigned() >= self._every or time.monotonic() - self._last_cp_time >= self._interval
            )
            wants = [c.future for c in controls if c.kind == "checkpoint"]
            if due or wants:
                self._safe_checkpoint(wants)
            stops = [c for c in controls if c.kind == "stop"]
            if stops:
                self._drain_closed()
                for c in stops:
                    c.future.set_result(None)
                return

    def _drain_closed(self) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                req = self._queue.get_nowait()
                req.future.set_exception(AuditError("the audit log is closed"))

    def _unsigned(self) -> int:
        """Entries appended since the last checkpoint this writer knows of."""
        size = self._frontier.size if self._frontier is not None else 0
        return size - (self._last_cp[0] if self._last_cp else 0)

    def _pending(self) -> bool:
        last = self._last_cp[0] if self._last_cp else -1
        return self._frontier is not None and self._frontier.size != last

    def _load_frontier(self, conn: Connection, size: int) -> merkle.Frontier:
        pieces = merkle.range_pieces(0, size)
        ids = [merkle.node_id(lv, ix) for lv, ix in pieces]
        found = store.get_nodes(conn, ids)
        if len(found) != len(ids):
            raise AuditError("audit log is damaged: stored subtree hashes are missing")
        return merkle.Frontier(size, [found[i] for i in ids])

    def _sync(self, conn: Connection) -> merkle.Frontier:
        """Make the in-memory right edge match the database (other writers, failed commits)."""
        size = store.size(conn)
        if self._frontier is None or self._frontier.size != size:
            self._frontier = self._load_frontier(conn, size)
        return self._frontier

    def _commit(self, appends: list[_Append]) -> None:
        try:
            with store.writing(self._engine) as conn:
                frontier = self._sync(conn)
                first = frontier.size
                entries, nodes = [], []
                for k, req in enumerate(appends):
                    nodes.extend(frontier.append(merkle.hash_leaf(req.body)))
                    entries.append((first + k, req.tenant, req.type, req.ts, req.body))
                self._frontier = None  # stale until the commit has returned
                store.insert(conn, entries, nodes)
            self._frontier = frontier
        except Exception as exc:
            err = exc if isinstance(exc, AuditError) else AuditError(f"audit append failed: {exc}")
            for req in appends:
                req.future.set_exception(err)
            return
        for k, req in enumerate(appends):
            req.future.set_result(first + k)

    def _safe_checkpoint(self, waiters: list[Future] | None) -> None:
        try:
            cp = self._sign_checkpoint()
        except Exception as exc:
            err = exc if isinstance(exc, AuditError) else AuditError(f"checkpoint failed: {exc}")
            for f in waiters or []:
                f.set_exception(err)
            self._last_cp_time = time.monotonic()  # do not spin on a persistent failure
            return
        for f in waiters or []:
            f.set_result(cp)

    def _sign_checkpoint(self) -> SignedCheckpoint:
        with store.writing(self._engine) as conn:
            frontier = self._sync(conn)
            size, root = frontier.size, frontier.root()
            last = store.latest_checkpoint(conn)
            if last is not None:
                if last[0] > size:
                    raise AuditError(f"refusing to sign: log has {size} entries, a checkpoint says {last[0]}")
                proof = merkle.consistency_proof(last[0], size, lambda ids: store.get_nodes(conn, ids))
                try:
                    merkle.verify_consistency(last[0], size, last[1], root, proof)
                except merkle.ProofError as exc:
                    raise AuditError(f"refusing to sign a checkpoint inconsistent with size {last[0]}") from exc
                if last[0] == size:
                    self._last_cp, self._last_cp_time = last, time.monotonic()
                    return _cp(last, self.origin)
            cp = sign_checkpoint(self._signer, self.origin, size, root)
            store.insert_checkpoint(conn, size, root, cp.note)
        self._last_cp, self._last_cp_time = (size, root, cp.note), time.monotonic()
        return cp

    # ------------------------------------------------------------------ reading

    def _read(self) -> contextlib.AbstractContextManager[Connection]:
        return self._engine.connect()

    def size(self) -> int:
        with self._read() as conn:
            return store.size(conn)

    def public_key(self) -> str:
        """The verifier key string ``<origin>+<key id>+<base64 key>`` auditors pin."""
        return self._signer.verifier().vkey()

    def latest_checkpoint(self) -> SignedCheckpoint | None:
        with self._read() as conn:
            row = store.latest_checkpoint(conn)
        return None if row is None else _cp(row, self.origin)

    def checkpoints(self) -> list[SignedCheckpoint]:
        with self._read() as conn:
            return [_cp(row, self.origin) for row in store.all_checkpoints(conn)]

    def root(self, size: int | None = None) -> bytes:
        with self._read() as conn:
            n = store.size(conn) if size is None else size
            return merkle.root_from(n, lambda ids: store.get_nodes(conn, ids))

    def entry(self, index: int) -> LogEntry:
        rows = list(self._entry_rows(index, index + 1, None))
        if not rows:
            raise AuditError(f"no audit entry at index {index}")
        return rows[0]

    def entries(self, tenant: str | None = None, start: int = 0, stop: int | None = None) -> Iterator[LogEntry]:
        """Entries in index order; ``tenant=None`` means all, ``""`` the system's only."""
        return self._entry_rows(start, stop, tenant)

    def _entry_rows(self, start: int, stop: int | None, tenant: str | None) -> Iterator[LogEntry]:
        with self._read() as conn:
            for idx, body in store.entry_rows(conn, start, stop, tenant):
                yield LogEntry(idx, parse_event(body), body)

    def inclusion_proof(self, index: int, size: int | None = None) -> InclusionProof:
        """Proof for ``index``; by default in the first signed checkpoint that covers it
        (signing one now if none does yet), with that checkpoint attached. With ``size``:
        in the tree of that size, with its checkpoint if one was signed at exactly that size."""
        if index < 0:
            raise AuditError("index must be >= 0")
        for attempt in (0, 1):
            with self._read() as conn:

                def get(ids):  # noqa: ANN001, ANN202
                    return store.get_nodes(conn, ids)

                if size is not None:
                    if not index < size <= store.size(conn):
                        raise AuditError(f"cannot prove index {index} in a tree of size {size}")
                    row = store.checkpoint_at_least(conn, size)
                    signed = row[2] if row is not None and row[0] == size else None
                    root = merkle.root_from(size, get)
                    hashes = merkle.inclusion_proof(index, size, get)
                    return InclusionProof(log_index=index, tree_size=size, root_hash=root, hashes=hashes,
                                          checkpoint=signed)
                row = store.checkpoint_at_least(conn, index + 1)
                if row is not None:
                    hashes = merkle.inclusion_proof(index, row[0], get)
                    return InclusionProof(log_index=index, tree_size=row[0], root_hash=row[1], hashes=hashes,
                                          checkpoint=row[2])
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

            def get(ids):  # noqa: ANN001, ANN202
                return store.get_nodes(conn, ids)

            return ConsistencyProof(
                size1=size1,
                size2=n,
                root1=merkle.root_from(size1, get),
                root2=merkle.root_from(n, get),
                hashes=merkle.consistency_proof(size1, n, get),
            )

    # ------------------------------------------------------------------ export and verification

    def export(self, path: str | Path) -> int:
        """Sign a checkpoint of the current tree, then write every entry and checkpoint."""
        from fak.audit.export import write_export

        self.checkpoint()
        return write_export(self, Path(path))

    @staticmethod
    def verify_export(path: str | Path, pubkey: str | None = None, since: str | None = None):  # noqa: ANN205
        from fak.audit.verify import verify_export

        return verify_export(path, pubkey=pubkey, since=since)
