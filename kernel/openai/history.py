"""Which messages of a chat request a persistent session already holds, so the door appends
only the new suffix (the OpenAI door's ``fak_session``; the chat core calls ``new_suffix``).

A client may resend the whole conversation on every request (what OpenAI clients do), or
send only the messages that are new since its last call (the older protocol of
``fak_session``). The kernel stays the one source of truth: what it evicted, quarantined or
forgot is not appended again because a client resent it.

**Matching.** The request's items are matched in order against the session's ledger
segments (``HistorySource.history``), every state included:

- a ``tool`` item matches a ``tool`` segment whose ref is the tenant's keyed digest of the
  item's UTF-8 bytes (lone surrogates passed through, as the door admits them), whether the
  segment is live, quarantined, evicted, expired or forgotten (a REDACTed segment carries
  the redacted form's ref: it matches the original's digest through the link the admission
  recorded); the tool name is not compared;
- a ``system``, ``user`` or ``assistant`` item matches a live segment of its kind with equal
  text (an assistant segment the model generated also matches the text the door returned
  for it, which leaves special tokens out, compared in ``canonical_turn``'s form: its tool
  calls re-rendered, so other JSON spacing matches); the caller renders an assistant's tool
  calls into text first (``render_tool_call`` of ``fak.kernel.openai.chat``);
- a segment that left the KV (evicted, quarantined, forgotten, expired) keeps no text: it
  matches an item of its kind unless that item matches a later segment exactly, and it is
  skipped when the client leaves it out (it is not in attention either way);
- a segment the client never sent is skipped unless an item matches it exactly: the tools
  block the chat core admits (a tool segment whose ref's producer is ``fak.tool_definitions``,
  ``fak.types.TOOL_DEFINITIONS``), or any system, user or assistant segment carrying a ref.

When every segment is accounted for, the items matched so far are the history and the rest
are new: ``new_suffix`` returns how many lead (append ``messages[n:]``).

**Resend or new messages.** A request that does not match the session's history is either
new messages (the older protocol) or a resent history that diverges (an edited earlier
message, a history cut short). It is a resend, and the divergence a ``Conflict`` (409)
naming the first differing index, when it starts with a ``system`` message (a client never
sends one as a new message: that was refused with 409 before) or when at least its first
two items matched, one of them exactly. Otherwise its items are all new (0): e.g. a
``user`` message against a session that starts with a system message, or a user message
that repeats the session's first one. A request whose matches are all text-less (every
match against segments that left the KV) is new messages too, unless it starts with a
``system`` message: nothing in it is known to be the session's.

Limits: a resend without a system message whose first or second item was edited is taken
for new messages (appended whole); the history is read under the session's lock, but a
concurrent change between this call and the caller's appends is not seen (the caller
serialises a session's requests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

from fak.errors import Conflict, InvalidInput
from fak.kernel.calls.tool_text import canonical_turn
from fak.kernel.kv.ledger import SegmentKind, SegmentState, SegmentView
from fak.kernel.model.tokenizer import ChatTokenizer
from fak.kernel.services import Services
from fak.types import VerdictKind, is_tools_block

__all__ = ["HistoryItem", "HistoryKind", "new_suffix"]

HistoryKind = Literal["system", "user", "assistant", "tool"]


class HistorySource(Protocol):
    """What the matching reads of a session: a kernel session (``HistorySource``) or a
    persistent gateway session (``fak.kernel.gateway.session.GatewaySession``)."""

    services: Services
    tenant: str
    id: str

    @property
    def tokenizer(self) -> ChatTokenizer: ...

    def history(self) -> list[tuple[SegmentView, str | None]]: ...


@dataclass(frozen=True)
class HistoryItem:
    """One message of a request as the session would hold it: its kind, its text (a tool
    result's UTF-8 content; an assistant's tool calls rendered into its text) and, for a tool
    result, the tool's name (not matched: a result is its bytes)."""

    kind: HistoryKind
    text: str
    tool: str = ""

    def __post_init__(self) -> None:
        if self.kind not in get_args(HistoryKind):
            raise InvalidInput(f"a history item is one of {', '.join(get_args(HistoryKind))}, not {self.kind!r}")
        if not isinstance(self.text, str):
            raise InvalidInput("a history item's text is a string")


@dataclass(frozen=True)
class _Segment:
    view: SegmentView
    text: str | None  # of a live segment; None once it left the KV
    kernel_added: bool  # no client sent it (``_kernel_added``)

    @property
    def optional(self) -> bool:
        """May be skipped: out of the KV, or never sent by a client."""
        return self.view.state is not SegmentState.LIVE or self.kernel_added


def _kernel_added(ks: HistorySource, view: SegmentView) -> bool:
    """The tools block (its ref's producer is ``TOOL_DEFINITIONS``), or a text segment carrying a
    ref (a client's text carries none)."""
    if view.ref is None:
        return False
    if view.kind is not SegmentKind.TOOL:
        return True
    tool, _ = ks.services.producers.of(ks.tenant, view.ref)
    return is_tools_block(tool)


class _Matcher:
    """Exact and text-less matches of items against segments, with the digests and links cached."""

    def __init__(self, ks: HistorySource, items: Sequence[HistoryItem]) -> None:
        self.ks = ks
        self.items = items
        self._digests: dict[int, str] = {}
        self._linked: dict[str, frozenset[str]] = {}
        self._visible: dict[str, str] = {}
        self._canonical: dict[str, str] = {}

    def digest(self, i: int) -> str:
        if i not in self._digests:
            data = self.items[i].text.encode("utf-8", "surrogatepass")  # the bytes the door admits
            self._digests[i] = self.ks.services.store.digest_of(data, self.ks.tenant)
        return self._digests[i]

    def originals(self, ref: str) -> frozenset[str]:
        """The refs linked to ``ref`` by a redaction (its original among them)."""
        if ref not in self._linked:
            self._linked[ref] = frozenset(self.ks.services.state.linked_refs(self.ks.tenant, ref))
        return self._linked[ref]

    def canonical(self, text: str) -> str:
        """``canonical_turn`` of a text, once per text (the walk may compare a text again)."""
        if text not in self._canonical:
            self._canonical[text] = canonical_turn(text)
        return self._canonical[text]

    def visible(self, text: str) -> str:
        """A generated turn's text as the door returned it: special tokens left out."""
        if text not in self._visible:
            tok = self.ks.tokenizer
            self._visible[text] = tok.decode(tok.encode(text), skip_special=True)
        return self._visible[text]

    def exact(self, i: int, seg: _Segment) -> bool:
        item, view = self.items[i], seg.view
        if item.kind != view.kind.value:
            return False
        if item.kind == "tool":
            if view.ref is None:
                return False
            ref = self.digest(i)
            return ref == view.ref or (view.verdict is VerdictKind.REDACT and ref in self.originals(view.ref))
        if seg.text is None:
            return False
        if item.text == seg.text:
            return True
        # a generated turn as the client got it back: special tokens left out, its calls as
        # tool_calls (re-rendered by the door with its own spacing)
        return item.kind == "assistant" and self.canonical(item.text) == self.canonical(self.visible(seg.text))

    def textless(self, i: int, seg: _Segment) -> bool:
        """A text segment that left the KV: its kind is all that is left to match."""
        view = seg.view
        return (seg.text is None and view.kind is not SegmentKind.TOOL and not seg.kernel_added
                and self.items[i].kind == view.kind.value)


@dataclass(frozen=True)
class _Walk:
    matched: int  # items matched before the walk ended
    exact: int  # of them, matched exactly
    stop: _Segment | None  # the segment no item matched (None: the whole history matched)


def _walk(m: _Matcher, segments: list[_Segment]) -> _Walk:
    i = j = exact = 0
    n = len(m.items)
    while j < len(segments):
        seg = segments[j]
        if i == n:
            if seg.optional:
                j += 1
                continue
            return _Walk(i, exact, seg)
        if m.exact(i, seg):
            i, j, exact = i + 1, j + 1, exact + 1
            continue
        if not seg.optional:
            return _Walk(i, exact, seg)
        # an optional segment: skip it if the item is a later segment reachable over optional ones
        k = j + 1
        while k < len(segments) and segments[k].optional and not m.exact(i, segments[k]):
            k += 1
        if k < len(segments) and m.exact(i, segments[k]):
            j = k
        elif m.textless(i, seg):
            i, j = i + 1, j + 1
        else:
            j += 1
    return _Walk(i, exact, None)


def new_suffix(ks: HistorySource, messages: Sequence[HistoryItem]) -> int:
    """How many leading ``messages`` the session already holds: append ``messages[n:]``.
    Raises ``Conflict`` (naming the first differing index) for a resent history that diverges
    from the session; 0 for a request of new messages only (the module docstring's rules)."""
    items = list(messages)
    if not items:
        return 0
    segments = [_Segment(view, text, _kernel_added(ks, view)) for view, text in ks.history()]
    walk = _walk(_Matcher(ks, items), segments)
    leads_with_system = items[0].kind == "system"
    if walk.stop is None:
        return walk.matched if leads_with_system or walk.exact else 0
    if not leads_with_system and (walk.matched < 2 or not walk.exact):
        return 0
    i, seg = walk.matched, walk.stop
    if i == len(items):
        raise Conflict(f"the request's history ends at message {i} but session {ks.id} holds more (from segment "
                       f"{seg.view.id}): resend the whole conversation, or send only the new messages")
    raise Conflict(f"message {i} of the request differs from session {ks.id}'s history (segment {seg.view.id}, "
                   f"{seg.view.kind.value}): an earlier message was changed; resend the conversation as it was, "
                   "or send only the new messages")
