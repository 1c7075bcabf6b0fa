"""The one ledger replay: a rebuild after a restart or a rollback, the exact rebuild a forget
or quarantine ends with, and the "never saw" fingerprint all prefill the same recorded chunks
through ``replay_into`` (``fak.kernel.kv.session.replay`` builds the fresh session for it)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from fak.kernel.kv.ledger import Segment

if TYPE_CHECKING:
    from fak.kernel.kv.session import Session


def replay_into(s: Session, segments: Iterable[Segment], messages: Mapping[str, dict[str, str]] | None = None
                ) -> Session:  # fmt: skip
    """Prefill every live segment of ``segments``, in order, into the fresh session ``s`` from
    its tokens in its recorded chunks, so the KV is the bytes the recorded calls computed. PIC
    is off while it runs (nothing served from chunks computed elsewhere) and bound after; a
    bound prefix cache serves only whole recorded calls (the same bytes). Each segment keeps
    its id, ref, verdict, content, protection and expiry, and gets its ``messages`` entry;
    attention provenance is derived again. Segments that are not live are kept as ledger
    records (the objects themselves). Returns ``s``."""
    pic, s.pic = s.pic, None
    for seg in segments:
        if not seg.live:
            s.ledger.append(seg)
            continue
        again = s.append(seg.kind, tokens=seg.tokens, chunks=seg.chunks, ref=seg.ref, verdict=seg.verdict,
                         rule=seg.rule, content=seg.content, policy_digest=seg.policy_digest, segment_id=seg.id,
                         message=messages.get(seg.id) if messages else None)
        again.protected, again.expires_turn = seg.protected, seg.expires_turn
    s.pic = pic
    return s
