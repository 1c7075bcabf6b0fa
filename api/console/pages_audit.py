"""The console's audit pages: the tenant's entries, newest first, with filters, the latest
checkpoint and its cosignatures, the signer's alarm; one entry with its inclusion proof, checked
by the server and again in the browser."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from fak import wire as w
from fak.api.console import auth
from fak.api.console.common import page, render
from fak.audit.checkpoint import SignedCheckpoint, open_checkpoint
from fak.audit.errors import AuditError, AuditUnverified
from fak.audit.events import EVENT_TYPES
from fak.audit.merkle import hash_leaf
from fak.audit.note import Verifier
from fak.audit.proofs import InclusionProof
from fak.audit.verify import checkpoint_time
from fak.errors import FakError, NotFound
from fak.kernel import operations as ops
from fak.kernel.facade import Kernel
from fak.kernel.operations import MAX_LIMIT
from fak.kernel.session.caller import Caller

router = APIRouter(prefix="/console", include_in_schema=False)
SCAN = 20_000  # audit entries a page with a time filter reads at most
SHOWN = 200  # audit entries one page shows at most
TYPES = sorted(t.model_fields["type"].default for t in EVENT_TYPES)  # the audit page's type filter


def _ms(text: str) -> int | None:
    """A ``datetime-local`` field (UTC) as epoch milliseconds; None when empty or malformed."""
    try:
        return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000) if text else None
    except ValueError:
        return None


def _checkpoint(k: Kernel, c: Caller) -> dict[str, Any]:
    """The latest checkpoint: the log's signature and each witness's cosignature, and its age."""
    cp = ops.audit_checkpoint(k, c)
    sigs = [line[2:].split(" ", 1)[0] for line in cp.checkpoint.split("\n\n", 1)[-1].splitlines()
            if line.startswith("\u2014 ")]
    signed = checkpoint_time(SignedCheckpoint(origin=cp.origin, size=cp.size, root=bytes.fromhex(cp.root_hash),
                                              note=cp.checkpoint))
    return {"cp": cp, "log_signer": [n for n in sigs if n == cp.origin],
            "witnesses": [n for n in sigs if n != cp.origin],
            "age_s": None if signed is None else max(0, int(time.time()) - signed)}


def newest_entries(k: Kernel, c: Caller, keep: Callable[[dict[str, Any]], bool] | None = None, types: Sequence[str] = (),
            needles: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The tenant's newest entries of ``types`` holding every one of ``needles`` (filtered in the
    database, ``ops.audit_newest``) that ``keep`` accepts, newest first, at most ``SHOWN``. Read
    in pages from the end of the log back; with ``keep``, at most ``SCAN`` entries, so a page
    costs what it shows, not the size of the log."""
    shown: list[dict[str, Any]] = []
    before, scanned = k.audit.size(), 0
    while len(shown) < SHOWN and scanned < SCAN:
        got = ops.audit_newest(k, c, before, SHOWN if keep is None else MAX_LIMIT, types, needles).entries
        page: list[dict[str, Any]] = [{"index": e.index, "type": e.type, "text": e.event} for e in got]
        shown += [e for e in page if keep is None or keep(e)]
        scanned += len(got)
        if keep is None or len(got) < MAX_LIMIT:
            break
        before = got[-1].index
    for e in shown[:SHOWN]:
        e.setdefault("event", json.loads(e["text"]))  # parsed only for what is shown
    return shown[:SHOWN]


@router.get("/audit")
def audit(request: Request, type: str = "", session: str = "", ref: str = "",  # noqa: A002 - the filter's name
          since: str = "", until: str = "") -> Response:
    """The tenant's entries (newest first) with filters, the latest checkpoint, the signer alarm."""
    def run(s: auth.ConsoleSession, c: Caller, k: Kernel) -> Response:
        alarm = k.audit.alarm
        cp = None
        if alarm is None:
            try:  # signs a checkpoint if the tree grew: a rewritten history raises the alarm here
                cp = _checkpoint(k, c)
            except AuditUnverified:
                alarm = k.audit.alarm
            except (AuditError, FakError):
                cp = None  # no checkpoint to show (the page says so); the entries still are
        if alarm is not None:
            return render(request, "audit.html", 409, s=s, alarm=alarm.kind, entries=[], checkpoint=None,
                          filters={}, types=[])
        lo, hi = _ms(since), _ms(until)

        def in_time(e: dict[str, Any]) -> bool:
            ts = e.setdefault("event", json.loads(e["text"])).get("ts")
            return not ((lo is not None and (ts is None or ts < lo)) or (hi is not None and (ts is None or ts > hi)))

        shown = newest_entries(k, c, in_time if (lo, hi) != (None, None) else None, types=[type] if type else [],
                        needles=[x for x in (session, ref) if x])
        for e in shown:
            ts = e["event"].get("ts")
            e["time"] = datetime.fromtimestamp(ts / 1000, UTC).isoformat(timespec="seconds") if ts else ""
        return render(request, "audit.html", s=s, alarm=None, entries=shown, checkpoint=cp, types=TYPES,
                      filters={"type": type, "session": session, "ref": ref, "since": since, "until": until})

    return page(request, (), run)


def _server_check(proof: dict[str, Any], body: bytes, vkey: str) -> str | None:
    """What is wrong with an entry's proof as the server sees it (None: nothing), the same checks
    the page's script makes again in the browser."""
    try:
        p = InclusionProof.from_json(proof)
        p.verify(hash_leaf(body))
        cp = open_checkpoint(p.checkpoint or "", Verifier.parse(vkey))
        if (cp.size, cp.root) != (p.tree_size, p.root_hash):
            return "the checkpoint names another tree than the proof"
    except (AuditError, ValueError) as e:
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    return None


@router.get("/audit/entries/{index}")
def audit_entry(index: int, request: Request) -> Response:
    """One of the tenant's entries with its inclusion proof against the latest checkpoint: checked
    here by the server and again in the browser (``inclusion.js``) against the key the auditor
    pinned there. Another tenant's index is a 404, as the API's proof route answers it."""
    def run(s: auth.ConsoleSession, c: Caller, k: Kernel) -> Response:
        if index < 0:
            raise NotFound(f"no audit entry at index {index}")
        proof = ops.audit_inclusion(k, c, index)
        assert isinstance(proof, w.InclusionOut)
        found = ops.audit_entries(k, c, index, 1).entries
        if not found or found[0].index != index or proof.proof.get("logIndex") != index:
            raise NotFound(f"no audit entry at index {index}")
        entry = found[0]
        checked = _server_check(proof.proof, entry.event.encode(), k.audit.public_key())
        data = {"entry": entry.event, "leaf_hash": proof.leaf_hash, "proof": proof.proof,
                "server_key": k.audit.public_key()}
        return render(request, "audit_entry.html", s=s, entry=entry, event=json.loads(entry.event),
                      proof=proof.proof, checked=checked, data=data)

    return page(request, (), run)
