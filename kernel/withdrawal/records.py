"""The withdrawals' records, typed, and the JSON a forget's row and a replica's task row keep of them.

Every withdrawal (a forget, a quarantine, an expiry) reports its units as ``DroppedUnit``s.
A forget's progress is durable as JSON text (``fak_forgets.units``, ``.sessions``, ``.linked``;
``fak_withdrawal_tasks.units``, ``.sessions``; a quarantine's or an expiry's task row has its
units only): each column is written and read by one pair,
``STORED_UNITS`` / ``STORED_SESSIONS`` / ``STORED_LINKED`` (``dump`` and ``load``), so no other
code handles its dicts. The JSON is the shape rows have always had (``json.dumps`` of the
dicts, keys in the same order, an absent key for None): rows written before these types, a
forget a crash interrupted included, read back unchanged (``resume``), and a row written now
reads in an older kernel.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, TypeAdapter

from fak.audit.events import DroppedUnit, LinkedRef, SessionFingerprints
from fak.kernel.services import SessionJob

__all__ = ["STORED_LINKED", "STORED_SESSIONS", "STORED_UNITS", "DroppedUnit", "LinkedForm", "SessionDrop", "Stored",
           "UnitKind", "unit"]

T = TypeVar("T", bound=BaseModel)
UnitKind = Literal["segment", "generated_segment", "prefix_node", "pic_chunk", "gateway_segment"]  # ``DroppedUnit.kind``


def unit(kind: UnitKind, unit_id: str, session_id: str | None = None, replica: str | None = None) -> DroppedUnit:
    """One unit a withdrawal dropped: a session's segment (``session_id``: its session), a
    generated segment, a prefix-cache node or a PIC chunk; ``replica``: the replica a forget
    acted for (a quarantine's or an expiry's units never name one: its task row does)."""
    return DroppedUnit(kind=kind, id=unit_id, session_id=session_id, replica=replica)


class SessionDrop(BaseModel):
    """What one session's drop reports: its id, its KV fingerprint after the drop (keyed per
    tenant, as ``ForgetCompleted`` logs it), its survivors' segment ids (kept until the replay
    is logged: a crash re-runs the replay from them; None once logged, or in a row older than
    them), the replica that held it (a replicated deployment) and, in a replica's task row
    once its replay ran, the replay's fingerprint (None: a survivor was gone)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    session_id: str
    fingerprint_after: str
    survivors: list[str] | None = None
    replica: str | None = None
    fingerprint_replay: str | None = None

    def logged(self) -> SessionFingerprints:
        """The entry ``ForgetCompleted`` logs (no survivors, no replay: ``ReplayVerified`` has it)."""
        return SessionFingerprints(session_id=self.session_id, fingerprint_after=self.fingerprint_after,
                                   replica=self.replica)

    def settled(self) -> SessionDrop:
        """The entry a completed forget's row keeps (``logged``: the survivors' ids go with the replay)."""
        return SessionDrop(session_id=self.session_id, fingerprint_after=self.fingerprint_after, replica=self.replica)

    def job(self) -> SessionJob:
        """This session's replay from the durable ledger, by its survivors' ids (no copy in memory)."""
        return SessionJob(self.session_id, self.fingerprint_after, list(self.survivors or []))


class LinkedForm(BaseModel):
    """A ref a forget erases with its own (the other form of a REDACTed result) and its data
    key as read before the shred: a resumed forget erases the same and logs the same."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ref: str
    key_id: str | None
    kek_version: int | None

    def logged(self) -> LinkedRef:
        return LinkedRef(ref=self.ref, shredded_key_id=self.key_id, kek_version=self.kek_version)


class Stored(Generic[T]):
    """One JSON column of records: ``dump`` writes what ``load`` reads (a list; None and ""
    read as empty). ``keep_none``: the field names whose None is written as ``null`` (the
    others are left out, as the rows have always had them)."""

    def __init__(self, cls: type[T], keep_none: frozenset[str] = frozenset()) -> None:
        self._adapter: TypeAdapter[list[T]] = TypeAdapter(list[cls])  # type: ignore[valid-type]
        self._keep_none = keep_none

    def dump(self, items: Sequence[T]) -> str:
        rows = self._adapter.dump_python(list(items), mode="json")
        return json.dumps([{k: v for k, v in r.items() if v is not None or k in self._keep_none} for r in rows])

    def load(self, text: str | None) -> list[T]:
        return self._adapter.validate_json(text) if text else []


STORED_UNITS: Stored[DroppedUnit] = Stored(DroppedUnit)
STORED_SESSIONS: Stored[SessionDrop] = Stored(SessionDrop)
STORED_LINKED: Stored[LinkedForm] = Stored(LinkedForm, keep_none=frozenset({"key_id", "kek_version"}))
