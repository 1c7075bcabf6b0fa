"""The span ledger: which rows of the KV cache came from which segment.

Segments are appended in order and their boundaries are prefill-chunk
boundaries. Appending renumbers nothing; evicting a segment renumbers the
``start`` of every later live segment. Each segment keeps its tokens and the
chunk sizes it was prefilled with, so a replay makes exactly the same calls.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum

from fak.errors import FakError
from fak.types import VerdictKind


class SegmentKind(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class SegmentState(StrEnum):
    LIVE = "live"
    QUARANTINED = "quarantined"
    EVICTED = "evicted"
    FORGOTTEN = "forgotten"  # evicted by a forget: its ref is erased
    EXPIRED = "expired"  # evicted because its ref's lifetime ended (policy expiry)


class LedgerError(FakError):
    """A ledger operation named a segment or range that cannot take it."""

    code = "invalid_segment"
    status = 400


class UnknownSegment(LedgerError):
    """No such segment in this session."""

    code = "segment_not_found"
    status = 404


@dataclass
class Segment:
    id: str
    kind: SegmentKind
    tokens: list[int]
    chunks: list[int]  # prefill call sizes, in order; sum == len(tokens)
    start: int = 0  # first cache row (meaningful while live)
    ref: str | None = None  # CAS digest of the content, if any
    state: SegmentState = SegmentState.LIVE
    verdict: VerdictKind | None = None  # the gate's verdict (tool segments); persisted as its string
    rule: str | None = None
    # attention provenance: refs this segment's KV attended to (own included); a RECOMPUTE
    # eviction of a ref removes it from the survivors, whose KV is recomputed without it
    provenance: frozenset[str] = frozenset()
    # content provenance: refs whose bytes this segment's tokens may carry (its own ref; for a
    # generated segment, every ref live while it was produced); kept through any eviction
    content: frozenset[str] = frozenset()
    protected: bool = False
    policy_digest: str | None = None  # the policy that admitted it (tool segments)
    removed_tokens: int = 0  # how many rows it held when it was evicted
    expires_turn: int | None = None  # the session's model-turn count at which its ref expires
    # the producer of a tool segment at its admission (tool name, source URL): its trust is the
    # segment's, never the bytes' (the same bytes from a trusted tool elsewhere change nothing)
    tool: str | None = None
    source: str | None = None
    # the media type a tool segment was admitted with (its base, lower case): a JSON, YAML or
    # mail type declares the structure whose field paths tool-call rules may read
    media_type: str | None = None

    def __post_init__(self) -> None:
        if self.verdict is not None:  # a persisted row carries the verdict's string
            self.verdict = VerdictKind(self.verdict)

    def mark(self, state: SegmentState) -> None:
        """Take the segment out of the cache's live set (its rows are being removed)."""
        if self.live:
            self.removed_tokens = self.length
        self.state = state

    @property
    def attention(self) -> frozenset[str]:
        return self.provenance

    def derived_from(self, ref: str) -> bool:
        """True when forgetting ``ref`` must drop this segment (its tokens may hold the ref's bytes)."""
        return self.ref == ref or ref in self.content

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def live(self) -> bool:
        return self.state is SegmentState.LIVE

    def view(self) -> SegmentView:
        """What the API and the audit log may show of this segment: ids and digests, never content."""
        return SegmentView(
            id=self.id,
            kind=self.kind,
            ref=self.ref,
            start=self.start if self.live else None,
            length=self.length if self.live else self.removed_tokens,
            state=self.state,
            verdict=self.verdict,
            rule=self.rule,
            provenance=tuple(sorted(self.provenance)),
            content_provenance=tuple(sorted(self.content)),
            protected=self.protected,
            expires_turn=self.expires_turn,
        )

    def summary(self) -> dict[str, object]:
        """The view as JSON-ready values (the wire's ``SegmentOut``, the audit's segment field)."""
        return self.view().as_dict()


@dataclass(frozen=True)
class SegmentView:
    """A segment as others may see it, typed: the kernel reads this; the edges (the API's
    ``SegmentOut``, audit events, session events) take ``as_dict()``."""

    id: str
    kind: SegmentKind
    ref: str | None
    start: int | None  # None once evicted
    length: int  # tokens in the cache, or the tokens it had before it was evicted
    state: SegmentState
    verdict: VerdictKind | None
    rule: str | None
    provenance: tuple[str, ...]  # refs this segment attended to (its own included)
    content_provenance: tuple[str, ...]  # refs whose content it carries
    protected: bool
    expires_turn: int | None

    def as_dict(self) -> dict[str, object]:
        """JSON-ready values: enums as their strings, provenance as sorted lists."""
        return {
            "id": self.id,
            "kind": self.kind.value,
            "ref": self.ref,
            "start": self.start,
            "length": self.length,
            "state": self.state.value,
            "verdict": self.verdict.value if self.verdict is not None else None,
            "rule": self.rule,
            "provenance": list(self.provenance),
            "content_provenance": list(self.content_provenance),
            "protected": self.protected,
            "expires_turn": self.expires_turn,
        }


@dataclass
class Ledger:
    segments: list[Segment] = field(default_factory=list)
    _next_id: int = 1

    def new_id(self) -> str:
        sid = f"seg_{self._next_id:04d}"
        self._next_id += 1
        return sid

    @property
    def next_number(self) -> int:
        """The number the next new segment id gets: persisted so a rebuilt session continues it."""
        return self._next_id

    def continue_from(self, number: int) -> None:
        """Number new segments from ``number`` on (a rebuild or replay keeps the original's ids)."""
        self._next_id = number

    def __iter__(self) -> Iterator[Segment]:
        return iter(self.segments)

    def __len__(self) -> int:
        return len(self.segments)

    def live(self) -> list[Segment]:
        return [s for s in self.segments if s.live]

    @property
    def live_length(self) -> int:
        return sum(s.length for s in self.segments if s.live)

    def get(self, segment_id: str) -> Segment:
        for s in self.segments:
            if s.id == segment_id:
                return s
        raise UnknownSegment(f"unknown segment {segment_id!r}")

    def append(self, seg: Segment) -> Segment:
        seg.start = self.live_length if seg.live else 0
        self.segments.append(seg)
        return seg

    def at_rows(self, start: int, end: int) -> Segment:
        """The live segment covering exactly rows ``[start, end)``."""
        for s in self.live():
            if s.start == start and s.end == end:
                return s
        raise LedgerError(f"rows [{start}, {end}) do not align with one live segment")

    def index(self, seg: Segment) -> int:
        for i, s in enumerate(self.segments):
            if s is seg:
                return i
        raise LedgerError(f"segment {seg.id} is not in this ledger")

    def provenance_before(self, index: int) -> frozenset[str]:
        """Every ref the live segments before position ``index`` attended to: what a segment
        prefilled after them attends to."""
        refs: set[str] = set()
        for s in self.segments[:index]:
            if s.live:
                refs |= s.provenance
        return frozenset(refs)

    def later_live(self, seg: Segment) -> list[Segment]:
        return [s for s in self.live() if s.start > seg.start]

    def renumber(self) -> None:
        """Re-derive every live segment's ``start`` from the order of live segments."""
        pos = 0
        for s in self.segments:
            if s.live:
                s.start = pos
                pos += s.length
