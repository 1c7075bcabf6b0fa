"""The rows a replicated deployment shares (docs/scale-out.md): who the replicas are, and each
replica's part of each withdrawal (``fak_withdrawal_tasks``). One short transaction each."""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable

import blake3
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session as OrmSession
from sqlalchemy.orm import sessionmaker

from fak.db import WRITE
from fak.state.schema import ReplicaRow, WithdrawalTaskRow
from fak.state.store import now_us

PENDING, DROPPED, DONE = "pending", "dropped", "done"  # dropped: a forget's, before its replay


def report_mac(key: bytes, row: WithdrawalTaskRow) -> str:
    """A keyed MAC over a task's report (who, what, the units and sessions, the state): the
    replica that waits for it signs a receipt from it, so whoever can write the database but
    holds no key cannot make a replica's part look done."""
    msg = json.dumps([row.request_id, row.replica, row.kind, row.tenant, row.refs, row.state, row.units,
                      row.sessions, row.applied_by]).encode()
    return "blake3k:" + blake3.blake3(msg, key=key).hexdigest()


class ReplicaStore:
    """``fak_replicas`` and ``fak_withdrawal_tasks`` on the state database. ``mac_key``
    (derived from the master secret) signs each report a replica finishes (``report_mac``)."""

    def __init__(self, engine: Engine, mac_key: bytes, channel: str | None = None) -> None:
        """``channel``: the PostgreSQL notification channel a task's change is announced on
        (every replica listens, so none waits for its next poll); None: announce nothing."""
        self._read = sessionmaker(engine, expire_on_commit=False)
        self._write = sessionmaker(engine.execution_options(**{WRITE: True}), expire_on_commit=False)
        self._mac_key = mac_key
        self.channel = channel

    def nudge(self, request_id: str) -> None:
        """Wake every replica's tailer (a withdrawal moved on outside the task rows)."""
        if self.channel is not None:
            with self._write() as s, s.begin():
                self._announce(s, request_id)

    def _announce(self, s: OrmSession, request_id: str) -> None:
        """Notify the listeners when this transaction commits (PostgreSQL delivers on commit)."""
        if self.channel is not None:
            s.execute(sa.text("SELECT pg_notify(:channel, :payload)"), {"channel": self.channel, "payload": request_id})

    def verified(self, row: WithdrawalTaskRow) -> bool:
        """Whether a task's report carries this deployment's MAC (a pending one has none to check)."""
        if row.state == PENDING:
            return True
        return row.mac is not None and hmac.compare_digest(row.mac, report_mac(self._mac_key, row))

    def join(self, name: str, pid: int, host: str) -> None:
        """Record that ``name`` runs (first start or a restart)."""
        now = now_us()
        with self._write() as s, s.begin():
            row = s.get(ReplicaRow, name)
            if row is None:
                s.add(ReplicaRow(name=name, joined_us=now, started_us=now, pid=pid, host=host))
            else:
                row.started_us, row.pid, row.host = now, pid, host

    def names(self) -> list[str]:
        """Every replica that ever joined, by name."""
        with self._read() as s:
            return sorted(s.scalars(sa.select(ReplicaRow.name)))

    # --- withdrawal tasks -----------------------------------------------------
    def add_tasks(self, request_id: str, kind: str, tenant: str, refs: list[str], replicas: Iterable[str]) -> None:
        """One pending task per replica for this withdrawal (those present already are kept:
        a resumed withdrawal adds none twice)."""
        now = now_us()
        with self._write() as s, s.begin():
            for name in sorted(set(replicas)):
                if s.get(WithdrawalTaskRow, (request_id, name)) is None:
                    s.add(WithdrawalTaskRow(request_id=request_id, replica=name, kind=kind, tenant=tenant,
                                            refs=json.dumps(refs), state=PENDING, units="[]", sessions="[]",
                                            applied_by=None, created_us=now, done_us=None))
            self._announce(s, request_id)

    def pending(self, replica: str) -> list[WithdrawalTaskRow]:
        """The replica's tasks not done yet, oldest first."""
        return self._oldest_first(WithdrawalTaskRow.replica == replica, WithdrawalTaskRow.state == PENDING)

    def owed_replays(self, applied_by: str) -> list[WithdrawalTaskRow]:
        """Forget tasks ``applied_by`` dropped and whose independent replay it still owes."""
        return self._oldest_first(WithdrawalTaskRow.applied_by == applied_by, WithdrawalTaskRow.state == DROPPED)

    def _oldest_first(self, *where: sa.ColumnElement[bool]) -> list[WithdrawalTaskRow]:
        with self._read() as s:
            q = (sa.select(WithdrawalTaskRow).where(*where)
                 .order_by(WithdrawalTaskRow.created_us, WithdrawalTaskRow.request_id))
            return list(s.scalars(q))

    def tasks(self, request_id: str) -> list[WithdrawalTaskRow]:
        """Every replica's task of one withdrawal, by replica."""
        with self._read() as s:
            q = sa.select(WithdrawalTaskRow).where(WithdrawalTaskRow.request_id == request_id)
            return sorted(s.scalars(q), key=lambda r: r.replica)

    def task(self, request_id: str, replica: str) -> WithdrawalTaskRow | None:
        with self._read() as s:
            return s.get(WithdrawalTaskRow, (request_id, replica))

    def update(self, request_id: str, replica: str, **values: object) -> None:
        """Change a task's row and sign its report again."""
        with self._write() as s, s.begin():
            row = s.get(WithdrawalTaskRow, (request_id, replica))
            if row is None:
                return
            for name, value in values.items():
                setattr(row, name, value)
            row.mac = report_mac(self._mac_key, row)
            self._announce(s, request_id)

    def finish(self, request_id: str, replica: str, applied_by: str, **values: object) -> None:
        """The replica's part is done (``applied_by``: itself, or the replica that stood in)."""
        self.update(request_id, replica, state=DONE, applied_by=applied_by, done_us=now_us(), **values)
