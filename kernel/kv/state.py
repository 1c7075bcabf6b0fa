"""A session's state: its cache, ledger, chat messages, last logits and the shared-KV bindings,
with the small reads and writes every mechanism module needs (prefill, generation, eviction).
``Session`` (``kernel/kv/session.py``) adds the verbs; the mechanism modules take this class, so
none of them imports the session module that calls them."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fak.kernel.kv.ledger import Ledger, LedgerError, Segment, SegmentKind
from fak.kernel.kv.pic_serve import PicBinding, PicServed
from fak.kernel.kv.prefix_cache import PrefixBinding
from fak.kernel.model.llama import Llama
from fak.kernel.model.tokenizer import ChatTokenizer

DEFAULT_CHUNK = 512

# what a session tells its owner about each change: (what, {"session", "tenant", "segment", ...})
OnEvent = Callable[[str, dict[str, Any]], None]


class SessionState:
    def __init__(
        self,
        model: Llama,
        tokenizer: ChatTokenizer | None = None,
        *,
        session_id: str | None = None,
        tenant: str = "default",
        chunk_size: int = DEFAULT_CHUNK,
        protected_kinds: Sequence[SegmentKind | str] = (SegmentKind.SYSTEM,),
        on_event: OnEvent | None = None,
        prefix: PrefixBinding | None = None,
        pic: PicBinding | None = None,
    ) -> None:
        """``pic``: position-independent reuse (approximate), when the policy allows it.
        Segments are then prefilled in content-defined chunks, and a chunk the registry
        holds is served from it after the exact prefix hit."""
        if chunk_size < 1:
            raise LedgerError("chunk_size must be ≥ 1")
        self.model = model
        self.tokenizer = tokenizer
        self.id = session_id or "sess_" + uuid.uuid4().hex[:16]
        self.tenant = tenant
        self.chunk_size = chunk_size
        self.protected_kinds = {SegmentKind(k) for k in protected_kinds}
        self.cache = model.new_cache()
        self.ledger = Ledger()
        self.messages: dict[str, dict[str, str]] = {}  # segment id → chat message (text segments)
        # logits after the latest forward call (None after an edit that ended at the tail)
        self.last_logits: torch.Tensor | None = None
        self._on_event = on_event
        self.prefix = prefix
        self.pic = pic
        self.reroped = False  # set by REROPE: the KV then differs from any exact run
        self.pic_row: int | None = None  # first cache row served by PIC (rows before it are exact)
        self.prefix_hit_tokens = 0
        self.pic_hit_tokens = 0  # served from the PIC registry (approximate), recomputed rows excluded
        self.last_pic: list[PicServed] = []  # what the latest append served from the registry

    @property
    def approximate(self) -> bool:
        """Whether the KV differs from every exact run of the same calls (REROPE or PIC rows)."""
        return self.reroped or self.pic_row is not None

    @property
    def exact_rows(self) -> int:
        """How many leading rows are the bytes an exact run computes."""
        if self.reroped:
            return 0
        return self.cache.length if self.pic_row is None else self.pic_row

    def truncate(self, length: int) -> None:
        """Cut the cache at ``length`` rows; PIC rows cut with it no longer make it approximate."""
        self.cache.truncate(length)
        if self.pic_row is not None and self.pic_row >= length:
            self.pic_row = None


    def message(self, segment_id: str) -> dict[str, str] | None:
        """The chat message a text segment was appended with (a rebuild or persist carries it)."""
        return self.messages.get(segment_id)

    def live_messages(self) -> list[dict[str, str]]:
        """The chat messages of the live segments in order: the history a new message is encoded after."""
        return [self.messages[s.id] for s in self.ledger.live() if s.id in self.messages]

    def drop_logits(self) -> None:
        """Forget the last logits after an edit of the cache made outside this class (the next
        forward computes fresh ones)."""
        self.last_logits = None

    def fingerprint(self) -> str:
        return self.cache.fingerprint()

    def refs(self) -> set[str]:
        """Every ref that influenced the live KV."""
        out: set[str] = set()
        for s in self.ledger.live():
            out |= s.provenance
        return out

    def emit(self, what: str, seg: Segment, **extra: object) -> None:
        """Tell the owner (``on_event``) about a change to ``seg``: ids and digests, never content."""
        if self._on_event:
            self._on_event(what, {"session": self.id, "tenant": self.tenant, "segment": seg.summary(), **extra})
