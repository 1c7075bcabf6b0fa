"""Segment views are typed (issue 26 part 4): the kernel reads ``KernelSession.segments()``
(``SegmentView``: enums, tuples, ints), and only the edges take the JSON form, which is
what ``ledger()`` and the API have always shown."""

from __future__ import annotations

from support.kernel_facade_helpers import CLEAN, POISON

from fak.kernel.kv.ledger import SegmentKind, SegmentState, SegmentView
from fak.types import VerdictKind


def test_views_are_typed_and_their_dicts_are_the_ledger(kernel) -> None:
    ks = kernel.session("acme")
    ks.append("system", "You are a travel assistant.")
    allowed = ks.admit("flight_status", CLEAN)
    kept_out = ks.admit("web_fetch", POISON)
    views = ks.segments()

    assert all(isinstance(v, SegmentView) for v in views)
    system, tool, quarantined = views
    assert system.kind is SegmentKind.SYSTEM and system.protected and system.verdict is None
    assert tool.kind is SegmentKind.TOOL and tool.verdict is VerdictKind.ALLOW
    assert tool.state is SegmentState.LIVE and tool.start == system.length and tool.length > 0
    assert tool.provenance == (allowed.ref,) and tool.content_provenance == (allowed.ref,)
    assert quarantined.verdict is VerdictKind.QUARANTINE and quarantined.state is SegmentState.QUARANTINED
    assert quarantined.start is None and quarantined.ref == kept_out.ref

    ledger = ks.ledger()
    assert ledger == [v.as_dict() for v in views]
    assert ledger[1]["verdict"] == "ALLOW" and ledger[1]["kind"] == "tool"
    assert ledger[1]["provenance"] == [allowed.ref] and ledger[2]["state"] == "quarantined"
