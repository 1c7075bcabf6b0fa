"""The forget path's typed records (``fak.kernel.withdrawal.records``) read the JSON rows have
always stored, and write it back the same; a forget a crash left with rows written in that
shape resumes; the forget routes' wire models carry the receipt's JSON unchanged."""

from __future__ import annotations

import json

from support.kernel_facade_helpers import WEATHER

from fak import wire as w
from fak.audit.receipt import ForgetReceipt, verify_receipt
from fak.kernel.withdrawal.forget import resume
from fak.kernel.withdrawal.records import STORED_LINKED, STORED_SESSIONS, STORED_UNITS, SessionDrop
from fak.state.schema import ForgetRow
from fak.state.store import now_us

FP = "blake3:" + "1" * 64
# rows as the kernel wrote them before the typed records: json.dumps of dicts, a None left out
# (``_unit``, ``| {"replica": ...}``), the linked refs' key ids kept as null
OLD_UNITS = [
    {"kind": "pic_chunk", "id": "pic_1"},
    {"kind": "segment", "id": "seg_3", "session_id": "s_a"},
    {"kind": "generated_segment", "id": "seg_4", "session_id": "s_a", "replica": "r1"},
    {"kind": "prefix_node", "id": "pn_9", "replica": "r1"},
]
OLD_SESSIONS = [
    {"session_id": "s_a", "fingerprint_after": FP, "survivors": ["seg_1", "seg_2"]},
    {"session_id": "s_b", "fingerprint_after": FP, "survivors": [], "replica": "r1"},
    {"session_id": "s_c", "fingerprint_after": FP},  # completed (survivors dropped with the replay), or older
]
OLD_TASK_SESSIONS = [  # a replica's task row once its replay ran
    {"session_id": "s_b", "fingerprint_after": FP, "survivors": ["seg_1"], "replica": "r1", "fingerprint_replay": FP},
]
OLD_LINKED = [{"ref": "blake3k:" + "2" * 64, "key_id": "dk_1", "kek_version": 3},
              {"ref": "blake3k:" + "3" * 64, "key_id": None, "kek_version": None}]


def test_old_rows_read_into_the_records_and_write_back_byte_for_byte() -> None:
    for stored, old in ((STORED_UNITS, OLD_UNITS), (STORED_SESSIONS, OLD_SESSIONS),
                        (STORED_SESSIONS, OLD_TASK_SESSIONS), (STORED_LINKED, OLD_LINKED)):
        text = json.dumps(old)
        records = stored.load(text)
        assert len(records) == len(old)
        assert stored.dump(records) == text  # type: ignore[arg-type]
    units = STORED_UNITS.load(json.dumps(OLD_UNITS))
    assert units[1].session_id == "s_a" and units[0].session_id is None and units[3].replica == "r1"
    a, b, c = STORED_SESSIONS.load(json.dumps(OLD_SESSIONS))
    assert a.job().survivors == ["seg_1", "seg_2"] and b.replica == "r1" and c.job().survivors == []
    # what ForgetCompleted logs of an entry, and what a completed row keeps: no survivors
    assert b.logged().model_dump(mode="json") == {"session_id": "s_b", "fingerprint_after": FP,
                                                  "fingerprint_replay": None, "replica": "r1"}
    assert STORED_SESSIONS.dump([a.settled()]) == json.dumps([{"session_id": "s_a", "fingerprint_after": FP}])
    (t,) = STORED_SESSIONS.load(json.dumps(OLD_TASK_SESSIONS))
    assert t.fingerprint_replay == FP
    linked = STORED_LINKED.load(json.dumps(OLD_LINKED))
    assert linked[1].logged().shredded_key_id is None and linked[0].logged().kek_version == 3
    assert STORED_UNITS.load("[]") == [] and STORED_LINKED.load(None) == []
    assert SessionDrop(session_id="s", fingerprint_after=FP, survivors=[]).job().survivors == []


def test_a_forget_left_with_old_shaped_rows_resumes(kernel) -> None:
    """A forget a crash interrupted before the typed records (its row holds units in the old
    JSON) resumes: the old units are in its receipt, and its row stays in that shape."""
    k = kernel
    s = k.session("acme")
    s.append("system", "You are a travel assistant.")
    adm = s.admit("weather", WEATHER)
    old_units = [{"kind": "prefix_node", "id": "pn_old"}, {"kind": "pic_chunk", "id": "pic_old"}]
    k.state.start_forget(ForgetRow(
        tenant="acme", ref=adm.ref, request_id="fgt_old_shape", started_us=now_us(), state="requested",
        principal=None, reason=None, requested_index=None, completed_index=None, key_id=None, kek_version=None,
        units=json.dumps(old_units), sessions="[]", linked=None))  # fmt: skip
    receipt = resume(k.services, k.state.forget_row("acme", adm.ref))
    assert receipt is not None and receipt.request_id == "fgt_old_shape"
    dumped = [u.model_dump(mode="json", exclude_none=True) for u in receipt.units_dropped]
    assert dumped[:2] == old_units and {"kind": "segment", "id": adm.segment.id, "session_id": s.id} in dumped
    assert k.replays.wait("fgt_old_shape", timeout=120)
    row = k.state.forget_by_request("acme", "fgt_old_shape")
    assert row.state == "completed" and row.units.startswith(json.dumps(old_units)[:-1])
    assert json.loads(row.sessions) == [{"session_id": s.id, "fingerprint_after": receipt.sessions[0].fingerprint_after}]
    done = k.forget_status("acme", "fgt_old_shape").receipt
    assert done.replay == "verified" and verify_receipt(done, k.audit.public_key(), require_replay=True)

    # the wire models carry the receipt's JSON as it is, key for key and in order
    assert set(w.ForgetReceiptOut.model_fields) == set(ForgetReceipt.model_fields)
    body = done.model_dump(mode="json")
    assert json.dumps(w.ForgetReceiptOut.model_validate(body).model_dump(mode="json")) == json.dumps(body)
    status = body | {"state": "completed", "replay": "verified"}
    assert json.dumps(w.ForgetStatusOut.model_validate(status).model_dump(mode="json")) == json.dumps(status)


def test_a_quarantines_units_are_dropped_units_in_the_shape_it_always_had(kernel) -> None:
    """Quarantine and expiry report ``DroppedUnit``s (the forget path's type): the route's JSON
    and a replica task row's units are the dicts they always were (no key for a None, no
    replica), and a task row written before reads back the same."""
    k = kernel
    s = k.session("acme")
    s.append("system", "You are a travel assistant.")
    adm = s.admit("weather", WEATHER)
    report = k.quarantine("acme", adm.ref, reason="late_detection", principal="classifier")
    old = []  # what ``WithdrawnUnit.as_dict`` wrote: kind, id, then session_id when it had one
    for u in report.units:
        old.append({"kind": u.kind, "id": u.id} | ({"session_id": u.session_id} if u.session_id else {}))
    assert {"kind": "segment", "id": adm.segment.id, "session_id": s.id} in old
    assert json.dumps(report.unit_dicts()) == json.dumps(old)
    out = w.QuarantineOut(ref=report.ref, units=report.unit_dicts(), mode=report.mode,
                          audit_index=report.audit_index, pending=report.pending)
    assert json.dumps(out.model_dump(mode="json")["units"]) == json.dumps(old)
    assert STORED_UNITS.dump(report.units) == json.dumps(old)
    assert STORED_UNITS.load(json.dumps(old)) == report.units
    (ev,) = [e.event for e in k.audit.entries("acme") if e.event.type == "ref_quarantined"]
    assert ev.units == [u for u in report.units if u.kind == "segment"]  # logged before the effect
