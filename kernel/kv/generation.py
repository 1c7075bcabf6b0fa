"""Generate an assistant turn in a session: the chat opener, the decode loop, the closing
tokens, then one closed assistant segment in the ledger, all or nothing."""

from __future__ import annotations

from collections.abc import Generator

from fak.kernel.kv.ledger import LedgerError, Segment, SegmentKind
from fak.kernel.kv.prefill import insert_prefix
from fak.kernel.kv.state import SessionState
from fak.kernel.model.generate import SamplingParams, generate


def generate_turn(s: SessionState, params: SamplingParams | None = None, *,
                  ref: str | None = None, keep: bool = True) -> Generator[int, None, None]:  # fmt: skip
    """Generate an assistant turn; yields token ids as they come. When the
    iterator is exhausted the turn is a closed assistant segment in the ledger
    whose content provenance is every ref live while it was produced; with
    ``keep=False`` the whole turn is undone instead (a sibling answer, ``n > 1``).

    All or nothing: a consumer that stops early (closes the iterator, drops
    it, or a client that disconnects) or an error mid-way leaves cache and
    ledger exactly as they were before the call."""
    if s.tokenizer is None:
        raise LedgerError("generate needs a tokenizer")
    tok = s.tokenizer
    # default: the model's own end-of-turn tokens; a caller's params are used as given
    params = params or SamplingParams(stop_token_ids=frozenset(tok.stop_token_ids))
    opener = tok.generation_prompt(s.live_messages())
    start, logits_before = s.cache.length, s.last_logits
    done = False
    try:
        chunks = [len(opener)]
        logits = s.model.forward(opener, s.cache)
        produced: list[int] = []
        for t in generate(s.model, s.cache, None, params, logits=logits):
            produced.append(t)
            yield t
        if not produced or not keep:
            return
        # every token but the last was appended one at a time by the decode loop
        chunks += [1] * (len(produced) - 1)
        closing = tok.close_turn(produced[-1])
        last = s.model.forward(closing, s.cache)
        chunks.append(len(closing))
        ids = opener + produced[:-1] + closing
        live = s.ledger.live()
        seg = Segment(
            id=s.ledger.new_id(),
            kind=SegmentKind.ASSISTANT,
            tokens=ids,
            chunks=chunks,
            ref=ref,
            protected=SegmentKind.ASSISTANT in s.protected_kinds,
            content=frozenset[str]().union(*(x.provenance | x.content for x in live)) | ({ref} if ref else set()),
        )
        seg.provenance = s.ledger.provenance_before(len(s.ledger.segments)) | ({ref} if ref else set())
        s.ledger.append(seg)
        text = tok.decode([t for t in produced if t not in tok.stop_token_ids])
        s.messages[seg.id] = {"role": "assistant", "content": text}
        s.last_logits = last
        done = True
        insert_prefix(s)
        s.emit("append", seg)
    finally:
        if not done:
            s.cache.truncate(start)
            s.last_logits = logits_before
