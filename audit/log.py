"""AuditLog: the append-only, signed Merkle log of every decision.

Why one writer thread: it makes group commit and gap-free indexes simple.
Callers canonicalise their event and hand it over; the writer drains whatever
is queued into ONE transaction (under the database writer lock), assigns the
next indexes, stores the leaf and every subtree hash that became complete, and
acknowledges each append only after the commit returned. The queue is bounded
(``max_queue``): past it a decision waits for room and a countable event is dropped and
counted, so a flood cannot grow memory without bound. A checkpoint is
signed every N entries, every T ms while entries are pending, and on demand,
always after checking it is consistent with the last one signed.

Why the signer does not trust the database: before each signature it recomputes the
tree from the entries themselves and checks that the tree it remembers signing (in a
file beside its key, ``signer_state``) is a prefix of it; a database rewritten behind
its back makes it refuse, with an ``AuditAlarm`` in the log. Witnesses (C2SP
tlog-witness) cosign each new checkpoint from a separate thread, so a slow or absent
witness never delays appends (``fak.audit.cosigner``: only the newest checkpoint is sent to a
slow witness; ``witness_stats`` measures coverage); the writer stores their cosignature lines,
served with the checkpoint. On close the unsigned tail is signed and cosigned.

This module is the writer and the remembering signer; ``AuditLog`` reads its entries, serves its
checkpoints and proves inclusion and consistency through ``fak.audit.log_reads.LogReads``.
"""

from __future__ import annotations

import base64
import contextlib
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import rfc8785
from sqlalchemy.engine import Connection

from fak.audit import merkle, note, store
from fak.audit.checkpoint import SignedCheckpoint, open_checkpoint, sign_checkpoint
from fak.audit.cosigner import Cosignature, Cosigner
from fak.audit.errors import AuditError, AuditUnverified
from fak.audit.events import MAX_INT, AuditAlarm, Event, to_event
from fak.audit.log_reads import LogReads, tenant_tail
from fak.audit.note import Signer
from fak.audit.signer_state import CheckpointSuperseded, SignerMemory, SignerRefused, read_state, state_path
from fak.audit.signing import load_signer
from fak.audit.statement import statement_text
from fak.audit.witness import WitnessEndpoint
from fak.settings import StorageSettings

if TYPE_CHECKING:
    from fak.audit.verify import VerifyReport  # verify imports this module


# An event's canonical bytes are made by the caller with this placeholder as its ``tseq``
# member; the writer puts the tenant's next sequence number in its place under the writer lock
# (numbers are digits in canonical JSON, so the bytes stay canonical).
_TSEQ_MARK = b'"tseq":%d' % MAX_INT


@dataclass
class _Append:
    body: bytes  # canonical bytes holding _TSEQ_MARK once
    tenant: str
    type: str
    ts: int
    future: Future[int]  # the entry's index, once committed


def _request(event: Event, future: Future[int]) -> _Append:
    """An append request: the event's canonical bytes with the ``tseq`` placeholder."""
    if event.tseq is not None:
        raise AuditError("tseq is assigned by the log at append; leave it unset")
    fields = event.model_dump(mode="json", exclude_none=True)  # canonical(), with the placeholder in
    fields["tseq"] = MAX_INT
    body = rfc8785.dumps(fields)
    if body.count(_TSEQ_MARK) != 1:  # only an event type with a nested "tseq" member could do this
        raise AuditError(f"cannot number a {event.type} event: its bytes hold the tseq placeholder twice")
    return _Append(body, event.tenant, event.type, event.ts, future)


_R = TypeVar("_R")
_CheckpointRow = tuple[int, bytes, str]  # size, root, signed note
# a checkpoint() waiter gets the row and, when witnesses are asked, the future of their cosignatures
_Checkpointed = tuple[_CheckpointRow, "Future[None] | None"]


@dataclass
class _Control(Generic[_R]):
    """A request to the writer thread; ``future`` resolves to what the ``kind`` yields
    (checkpoint: ``_Checkpointed``; reset: the accepted size and root; the others: None)."""

    kind: str  # "checkpoint" | "reset" | "cosignature" | "wake" | "stop"
    future: Future[_R]
    reset: tuple[int, str | None] | None = None  # "reset": the size to accept, the principal
    cosignatures: list[Cosignature] = field(default_factory=list)  # "cosignature": (size, vkey, line)


def _digest(root: bytes | None) -> str | None:
    return None if root is None else "sha256:" + root.hex()


def _b64(root: bytes | None) -> str:
    return "none" if root is None else base64.b64encode(root).decode()


class AuditLog(LogReads):
    """Open with ``AuditLog.open(...)``; safe to use from many threads."""

    def __init__(
        self,
        url: str,
        signer: Signer,
        checkpoint_every: int = 1000,
        checkpoint_ms: int = 1000,
        max_batch: int = 4096,
        max_queue: int = 16384,
        memory: SignerMemory | None = None,
        witnesses: Sequence[WitnessEndpoint | str] = (),
        witness_timeout: float = 5.0,
    ) -> None:
        self.origin = signer.name
        self._signer = signer
        self._memory = memory
        self._every = max(1, checkpoint_every)
        self._interval = max(1, checkpoint_ms) / 1000.0
        self._max_batch = max_batch
        engine = store.make_engine(url)
        try:
            store.migrate(engine)
        except Exception as exc:  # a DB that is unreachable or not ours
            store.release(engine)
            if isinstance(exc, AuditError):
                raise
            raise AuditError(f"cannot open the audit log at {url!r}: {exc}") from exc
        super().__init__(engine)
        self._frontier: merkle.Frontier | None = None
        self._tseq: dict[str, int] = {}  # tenant -> its last sequence number, exact at log size _tseq_size
        self._tseq_size = -1
        self._last_cp: tuple[int, bytes, str] | None = None
        self._last_cp_time = time.monotonic()
        self._queue: queue.SimpleQueue[_Append | _Control[Any]] = queue.SimpleQueue()
        # appends queued and not yet taken by the writer, at most max_queue: a flood cannot grow
        # memory without bound. submit() waits for room (a decision is never dropped);
        # try_submit() drops and counts (``dropped``) what may be counted instead of logged
        self._room = threading.Semaphore(max(1, max_queue))
        self.dropped = 0
        self._closers: list[Callable[[], None]] = []  # run by close() while appends still work
        self._closed = False
        self._gate = threading.Lock()
        self._alarm: SignerRefused | None = None  # set: the signer refuses until its state changes
        self._alarm_state: object = None  # the state file's content when the alarm was raised
        self.refusals = 0  # checkpoints refused by the signer
        self.alarms = 0  # AuditAlarms this process appended
        self._cosigner = Cosigner(engine, witnesses, witness_timeout, self._hand_over)
        self.witnesses = self._cosigner.witnesses
        self.witness_stats = self._cosigner.stats
        # cosignature lines for the writer to store: not behind the appends queued before them
        # (a flood of appends would otherwise hold a line back for the whole backlog)
        self._urgent: queue.SimpleQueue[_Control[None]] = queue.SimpleQueue()
        self._moved: set[int] = set()  # indexes of rows found under another tenant's column (alarmed once)
        if self._memory is not None:
            try:
                self._open_memory()
            except Exception:
                store.release(self._engine)
                raise
        self._writer = threading.Thread(target=self._run, name="fak-audit-writer", daemon=True)
        self._writer.start()
        self._cosigner.start()

    @classmethod
    def open(
        cls,
        url: str | None = None,
        data_dir: str | Path | None = None,
        origin: str | None = None,
        signing_key: object = None,
        witnesses: Sequence[WitnessEndpoint | str] = (),
        settings: StorageSettings | None = None,
        **options: int,
    ) -> AuditLog:
        """Open (creating if needed) the log at ``url`` (default: the shared fak database).
        Defaults come from ``settings`` (when not given, ``StorageSettings()``: the environment).
        ``signing_key``: a Signer, a ``PRIVATE+KEY+...`` string or a path to one; default
        ``audit_signing_key`` (``$FAK_AUDIT_SIGNING_KEY``) or ``<data dir>/audit_signing.key`` (created, mode 0600).
        The signer's memory is ``<data dir>/audit_signer.state`` for the data-dir key,
        ``audit_signer.<key id>.state`` for another. ``witnesses``: endpoints (or ``"<url>
        <vkey>"`` strings) asked to cosign each new checkpoint.
        ``options``: checkpoint_every (entries), checkpoint_ms, max_batch, max_queue (appends
        queued before ``submit`` waits and ``try_submit`` drops)."""
        conf = settings if settings is not None else StorageSettings()
        root = Path(data_dir) if data_dir is not None else conf.data_dir
        if data_dir is None:
            root.mkdir(parents=True, exist_ok=True)
        supplied = signing_key if signing_key is not None else (conf.audit_signing_key_text() or None)
        signer = load_signer(root, origin, supplied)
        memory = SignerMemory(state_path(root, None if supplied is None else f"{signer.id:08x}"), signer.name,
                              f"{signer.id:08x}")
        url = url or conf.database_url or f"sqlite:///{root / 'fak.db'}"
        return cls(url, signer, memory=memory, witnesses=witnesses, **options)

    # ------------------------------------------------------------------ the remembering signer

    def _bodies(self, conn: Connection, start: int, stop: int) -> Iterator[bytes]:
        """Stored event bytes of entries [start, stop); a missing index is a rewritten log."""
        expect = start
        for idx, body in store.entry_rows(conn, start, stop, None, batch=5000):
            if idx != expect:
                raise SignerRefused("history_rewritten", f"refusing to sign: audit entry {expect} is missing",
                                    None, stop, None)
            expect += 1
            yield body
        if expect != stop:
            raise SignerRefused("history_rewritten", f"refusing to sign: audit entry {expect} is missing",
                                None, stop, None)

    def _open_memory(self) -> None:
        """Check the database against the signer's memory (one full recomputation); on a
        mismatch, refuse to sign and put an AuditAlarm in the log (appends go on)."""
        assert self._memory is not None
        with self._engine.connect() as conn:
            n = store.size(conn)
            try:
                self._memory.verify_open(n, lambda a, b: self._bodies(conn, a, b))
                return
            except SignerRefused as exc:
                refused = exc
        self._refuse(refused)

    def _refuse(self, exc: SignerRefused) -> None:
        """Enter the refusing state: stderr, an AuditAlarm appended (writer thread or __init__)."""
        self.alarms += 1
        self._alarm = exc
        if self._memory is not None:
            with contextlib.suppress(OSError):  # stderr and the log's AuditAlarm still say it
                self._memory.record_alarm(exc)
        self._alarm_state = self._state_snapshot()
        print(f"fak audit: ALARM ({exc.kind}): {exc}", file=sys.stderr, flush=True)
        rem = exc.remembered
        alarm = AuditAlarm(kind=exc.kind, remembered_size=None if rem is None else rem.size,  # type: ignore[arg-type]
                           remembered_root=_digest(None if rem is None else rem.root),
                           found_size=exc.found_size, found_root=_digest(exc.found_root))
        fut: Future[int] = Future()
        self._commit([_request(alarm, fut)])
        with contextlib.suppress(Exception):
            fut.result(timeout=0)

    def _state_snapshot(self) -> object:
        assert self._memory is not None
        try:
            return read_state(self._memory.path)
        except AuditError as exc:
            return str(exc)

    def _check_alarm(self) -> None:
        """While refusing: raise again, unless the state file changed (an operator's reset),
        in which case signing is attempted afresh (the memory re-checks everything)."""
        if self._alarm is None or self._state_snapshot() != self._alarm_state:
            self._alarm = None
            standing = None if self._memory is None else self._memory.standing_alarm()
            if standing is None:
                return
            self._alarm, self._alarm_state = standing, self._state_snapshot()  # raised by another process
        raise self._alarm

    def reset_signer(self, accept_size: int, principal: str | None = None) -> tuple[int, bytes]:
        """Operator action after an alarm: accept the entries [0, accept_size) (recomputed from
        the entries) as what the signer remembers, log it, and sign again. Returns the size
        and root accepted."""
        fut: Future[tuple[int, bytes]] = Future()
        self._put(_Control("reset", fut, reset=(accept_size, principal)))
        return fut.result()

    def _do_reset(self, accept_size: int, principal: str | None) -> tuple[int, bytes]:
        assert self._memory is not None
        with self._engine.connect() as conn:
            n = store.size(conn)
            if not 0 <= accept_size <= n:
                raise AuditError(f"cannot accept size {accept_size}: the log has {n} entries")
            old, new = self._memory.reset(accept_size, lambda a, b: self._bodies(conn, a, b))
        self._alarm = None
        event = AuditAlarm(kind="signer_reset", remembered_size=None if old is None else old.size,
                           remembered_root=_digest(None if old is None else old.root), found_size=accept_size,
                           found_root=_digest(new.root), principal=principal)
        fut: Future[int] = Future()
        self._commit([_request(event, fut)])
        fut.result()
        print(f"fak audit: signer reset by the operator: accepted size {accept_size}, root {_b64(new.root)}",
              file=sys.stderr, flush=True)
        return accept_size, new.root

    # ------------------------------------------------------------------ writing

    def submit(self, event: object) -> Future[int]:
        """Queue an event; the future resolves to its index once the commit is durable. With
        ``max_queue`` appends already queued, wait for room (backpressure, never a drop)."""
        fut: Future[int] = Future()
        request = _request(to_event(event), fut)
        while not self._room.acquire(timeout=0.5):
            if self._closed:
                raise AuditError("the audit log is closed")
        self._queue_append(request)
        return fut

    def try_submit(self, event: object) -> Future[int] | None:
        """Queue an event that may be counted instead of logged (an authentication failure):
        None, counted in ``dropped``, when ``max_queue`` appends are already queued."""
        fut: Future[int] = Future()
        request = _request(to_event(event), fut)
        if not self._room.acquire(blocking=False):
            with self._gate:
                self.dropped += 1
            return None
        self._queue_append(request)
        return fut

    def _queue_append(self, request: _Append) -> None:
        try:
            self._put(request)
        except BaseException:
            self._room.release()
            raise

    def on_close(self, fn: Callable[[], None]) -> None:
        """Have ``close()`` call ``fn`` first, while appends still work (a flush of counted events)."""
        self._closers.append(fn)

    def _put(self, request: _Append | _Control[Any]) -> None:
        with self._gate:  # nothing is queued after the stop request
            if self._closed:
                raise AuditError("the audit log is closed")
            self._queue.put(request)

    def append(self, event: object) -> int:
        """Append an event and return its gap-free index once it is committed."""
        return self.submit(event).result()

    def checkpoint(self, wait_witnesses: bool = True) -> SignedCheckpoint:
        """Sign (or return, if the size has not moved) a checkpoint of the current tree; with
        witnesses configured, wait (bounded) for their cosignatures and return it with them."""
        fut: Future[_Checkpointed] = Future()
        self._put(_Control("checkpoint", fut))
        row, done = fut.result()
        if done is not None and wait_witnesses:
            with contextlib.suppress(Exception):
                done.result(timeout=2 * self._cosigner.timeout * len(self.witnesses) + 1)
        with self._read() as conn:
            return self._served(conn, row)

    def close(self) -> None:
        """Stop; with witnesses, first sign the entries not yet signed and wait (bounded) for
        their cosignatures, so no entry is left outside a cosigned checkpoint at shutdown."""
        while self._closers and not self._closed:
            with contextlib.suppress(Exception):  # a flush that fails must not keep the log open
                self._closers.pop(0)()
        if self.witnesses and not self._closed:
            with contextlib.suppress(Exception):  # a refusing signer or a closed log: nothing to add
                self.checkpoint()
        fut: Future[None] = Future()
        with self._gate:
            if self._closed:
                return
            self._closed = True  # no new appends; the cosigner finishes (its cosignatures are stored)
        self._cosigner.stop()
        self._queue.put(_Control("stop", fut))
        fut.result()
        self._writer.join()
        store.release(self._engine)

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
            for _ in appends:  # taken: room for as many more
                self._room.release()
            controls = [r for r in batch if isinstance(r, _Control)]
            if appends:
                self._commit(appends)
            due = self._pending() and (
                self._unsigned() >= self._every or time.monotonic() - self._last_cp_time >= self._interval
            )
            cosigs = []
            with contextlib.suppress(queue.Empty):  # ahead of any appends still queued
                while True:
                    cosigs.append(self._urgent.get_nowait())
            if cosigs:
                self._store_cosignatures(cosigs)
            for c in controls:
                if c.reset is not None:  # the "reset" kind
                    try:
                        c.future.set_result(self._do_reset(*c.reset))
                    except Exception as exc:
                        c.future.set_exception(exc)
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
                if isinstance(req, _Append):
                    self._room.release()

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
                if self._tseq_size != first:  # another writer appended (or first use): ask the database
                    self._tseq.clear()
                seqs: dict[str, int] = {}  # numbered here, under the writer lock, like the indexes
                entries, nodes = [], []
                for k, req in enumerate(appends):
                    t = req.tenant
                    if t not in seqs:  # the column's count, never below the signer's (a moved row)
                        seqs[t] = self._tseq[t] if t in self._tseq else max(
                            tenant_tail(conn, t, first)[0], 0 if self._memory is None else self._memory.remembered_tail(t))
                    seqs[t] += 1
                    body = req.body.replace(_TSEQ_MARK, b'"tseq":%d' % seqs[t], 1)
                    nodes.extend(frontier.append(merkle.hash_leaf(body)))
                    entries.append((first + k, t, req.type, req.ts, body))
                self._frontier = None  # stale until the commit has returned
                store.insert(conn, entries, nodes)
            self._frontier = frontier
            self._tseq.update(seqs)
            self._tseq_size = first + len(appends)
        except Exception as exc:
            err = exc if isinstance(exc, AuditError) else AuditError(f"audit append failed: {exc}")
            for req in appends:
                req.future.set_exception(err)
            return
        for k, req in enumerate(appends):
            req.future.set_result(first + k)

    def _safe_checkpoint(self, waiters: list[Future[_Checkpointed]] | None) -> None:
        try:
            row, cosign = self._sign_checkpoint(bool(waiters))
        except Exception as exc:
            if isinstance(exc, SignerRefused) and exc is not self._alarm:
                self._refuse(exc)
            self.refusals += isinstance(exc, SignerRefused)
            err = exc if isinstance(exc, AuditError) else AuditError(f"checkpoint failed: {exc}")
            for f in waiters or []:
                f.set_exception(err)
            self._last_cp_time = time.monotonic()  # do not spin on a persistent failure
            return
        done = self._cosigner.send(row[0], row[2]) if cosign else None
        for f in waiters or []:
            f.set_result((row, done))

    def _sign_checkpoint(self, explicit: bool) -> tuple[tuple[int, bytes, str], bool]:
        """Sign the current tree, or return the stored checkpoint when the size has not moved;
        also say whether witnesses should be asked to cosign it."""
        self._check_alarm()
        with store.writing(self._engine) as conn:
            frontier = self._sync(conn)
            if self._memory is not None:  # what the database stores, not this writer's copy of it:
                # a rewrite made while this process runs is then found at its next signature
                frontier = self._frontier = self._load_frontier(conn, frontier.size)
            size, root = frontier.size, frontier.root()
            last = store.latest_checkpoint(conn)
            if last is not None:
                if last[0] > size:
                    raise AuditError(f"refusing to sign: log has {size} entries, a checkpoint says {last[0]}")
                proof = merkle.consistency_proof(last[0], size, lambda ids: store.get_nodes(conn, ids))
                try:
                    merkle.verify_consistency(last[0], size, last[1], root, proof)
                except merkle.ProofError as exc:
                    if self._memory is not None and self._signed_here(last[2]):  # not a forged row: the tree
                        raise SignerRefused("history_rewritten",
                                            f"refusing to sign: the stored tree of size {size} (root {_b64(root)}) "
                                            f"is inconsistent with the checkpoint of size {last[0]} this log signed: "
                                            "the stored tree was rewritten", self._memory.remembered, size, root) \
                            from exc
                    raise AuditError(f"refusing to sign a checkpoint inconsistent with size {last[0]}") from exc
                if last[0] == size:
                    self._last_cp, self._last_cp_time = last, time.monotonic()
                    have = {w for w, _ in store.cosignature_lines(conn, size)} if explicit else set()
                    return last, explicit and any(w.vkey not in have for w in self.witnesses)
            signed_at = int(time.time())
            checked = tails = None
            if self._memory is not None:  # recomputed from entries, consistent with what it remembers
                checked, tails = self._memory.extend(size, lambda a, b: self._bodies(conn, a, b))
                if checked.root() != root:
                    rem = self._memory.remembered
                    raise SignerRefused("history_rewritten",
                                        f"refusing to sign size {size}: the entries hash to root {_b64(checked.root())} "
                                        f"but the stored tree nodes give {_b64(root)}: the stored tree was rewritten",
                                        rem, size, root)
            cp = sign_checkpoint(self._signer, self.origin, size, root, signed_at)
            store.insert_checkpoint(conn, size, root, cp.note)
            if checked is not None:
                self._memory.remember(size, checked, tails, signed_at)  # type: ignore[union-attr,arg-type]
        self._last_cp, self._last_cp_time = (size, root, cp.note), time.monotonic()
        return (size, root, cp.note), bool(self.witnesses)

    def _signed_here(self, signed: str) -> bool:
        """Whether a stored checkpoint note carries this log's own valid signature."""
        try:
            open_checkpoint(signed, self._signer.verifier(), self.origin)
        except AuditError:
            return False
        return True

    # ------------------------------------------------------------------ witnesses' lines

    def _hand_over(self, rows: list[Cosignature]) -> Future[None]:
        """The cosigner's verified lines, queued for the writer ahead of any appends; the future
        resolves once they are stored."""
        stored: Future[None] = Future()
        self._urgent.put(_Control("cosignature", stored, cosignatures=rows))
        self._queue.put(_Control("wake", Future()))  # an idle writer wakes for it
        return stored

    def _store_cosignatures(self, cosigs: list[_Control[None]]) -> None:
        rows = [r for c in cosigs for r in c.cosignatures]
        try:
            if rows:
                with store.writing(self._engine) as conn:
                    for size, vkey, line in rows:
                        store.insert_cosignature(conn, size, vkey, line)
        except Exception as exc:
            print(f"fak audit: storing cosignatures failed: {exc}", file=sys.stderr, flush=True)
            for c in cosigs:
                c.future.set_exception(exc)
            return
        self._any_cosig = self._any_cosig or bool(rows)
        self._cosigner.covered(rows)
        for c in cosigs:
            c.future.set_result(None)

    # ------------------------------------------------------------------ the signer's answers

    def public_key(self) -> str:
        """The verifier key string ``<origin>+<key id>+<base64 key>`` auditors pin."""
        return self._signer.verifier().vkey()

    @property
    def alarm(self) -> SignerRefused | None:
        """The signer's standing alarm, raised here or by another process sharing the key (None:
        none, or resolved). If the signer's state file changed since it was raised (an operator's
        reset from another process), signing is tried again first, which clears the alarm or
        raises it anew."""
        if self._memory is None:
            return self._alarm
        if self._alarm is not None and self._state_snapshot() != self._alarm_state:
            with contextlib.suppress(AuditError):
                self.checkpoint(wait_witnesses=False)
        return self._alarm or self._memory.standing_alarm()

    def require_verified(self) -> None:
        """Raise AuditUnverified while the signer is in alarm: the database's history then
        disagrees with what the log signed, and is not to be presented as the log."""
        alarm = self.alarm
        if alarm is None:
            return
        rem = alarm.remembered
        raise AuditUnverified(alarm.kind, f"the audit log's signer is in alarm ({alarm.kind}): the database's "
                              "history disagrees with what the log signed, so its entries and proofs are not "
                              "served until an operator checks the log and runs 'fak audit signer-reset'",
                              None if rem is None else rem.size, alarm.found_size)

    def tenant_statement(self, tenant: str, cp: SignedCheckpoint) -> str:
        """A note, signed with the log's key, stating how many entries ``tenant`` has in the tree
        of the log's checkpoint ``cp`` and the index of its latest one: what lets a tenant's
        export show that no line was removed (fak.audit.tenant_export). The count is the one the
        signer remembers at ``cp`` (from the entries' bodies, kept outside the database), so
        ``cp`` must be its latest signature: otherwise CheckpointSuperseded (sign, then retry).
        A log without a signer memory counts by the database's ``tenant`` column."""
        self.require_verified()
        with self._read() as conn:
            row = store.checkpoint_at_least(conn, cp.size)
            if row is None or (row[0], row[1]) != (cp.size, cp.root):
                raise AuditError(f"this log signed no checkpoint of size {cp.size} with root {_b64(cp.root)}")
            if self._memory is None:
                count, latest = tenant_tail(conn, tenant, cp.size)
        if self._memory is not None:
            tails = self._memory.tails_at(cp.size, cp.root)
            if tails is None:
                raise CheckpointSuperseded(f"the signer's latest signature is not the checkpoint of size {cp.size}")
            count, latest = tails.get(tenant, (0, None))
        return note.sign(statement_text(self.origin, cp.size, cp.root, tenant, count, latest), self._signer)

    def _column_changed(self, index: int, column: str) -> None:
        """A row stands under another tenant's column: say so once per row (stderr and an
        AuditAlarm ``tenant_column_changed`` whose found_size is the row's index)."""
        with self._gate:
            if index in self._moved or len(self._moved) >= 100_000 or self._closed:
                return
            self._moved.add(index)
        self.alarms += 1
        print(f"fak audit: ALARM (tenant_column_changed): audit entry {index} is filed under tenant {column!r} "
              "but its body is another tenant's: the database's tenant column was changed; the row is not "
              "served as that tenant's", file=sys.stderr, flush=True)
        with contextlib.suppress(AuditError):
            self.try_submit(AuditAlarm(kind="tenant_column_changed", found_size=index))

    # ------------------------------------------------------------------ export and verification

    def export(self, path: str | Path) -> int:
        """Sign a checkpoint of the current tree, then write every entry and checkpoint."""
        from fak.audit.export import write_export

        self.checkpoint()
        return write_export(self, Path(path))

    @staticmethod
    def verify_export(path: str | Path, pubkey: str | None = None, since: str | None = None) -> VerifyReport:
        from fak.audit.verify import verify_export

        return verify_export(path, pubkey=pubkey, since=since)

