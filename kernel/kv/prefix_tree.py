"""Radix tree over token ids whose nodes hold the KV rows of their own edge.

Mechanism only (the policy — namespaces, retention, budgets, provenance
rules, stats — lives in ``prefix_cache``). A node stores the ``KVBlock`` of
its edge tokens and nothing of its ancestors, so memory grows with the number
of unique tokens, not with nodes × prefix length. Splitting an edge clones
both halves, so neither half pins the other's storage and ``KVBlock.nbytes``
is the real footprint.

Locks are counts on every node of a root path. A split copies the count to
the new upper half and keeps the original object as the lower half, so a lock
is always released by walking up the parent chain from the deepest node it
took, whatever splits happened in between.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import blake3
import torch

from fak.kernel.model.kv_cache import KVBlock

_LEN_SHIFT = 40  # token ids stay below 2**40
_MAX_CALL = 1 << 21  # call lengths stay below this (bits 40-60)
CALL_START = 1 << 62  # keys stay signed 64-bit (node ids hash them as int64)


def call_keys(tokens: Sequence[int], call_starts: Iterable[int]) -> list[int]:
    """Keys of ``tokens`` computed by forward calls beginning at ``call_starts`` (the last
    call runs to the end). The tree is keyed by token ids *and* the calls that computed
    them: a row's bytes depend on the length of its call and on every row before it (a
    different split into calls may round differently), so each key carries its call's
    length and the first key of a call ``CALL_START``. A prefix is then served only to a
    consumer whose calls over it were the same."""
    keys = [int(t) for t in tokens]
    starts = sorted(p for p in set(call_starts) if 0 <= p < len(keys))
    if keys and (not starts or starts[0] != 0):
        raise ValueError("call starts must begin at position 0")
    for i, p in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(keys)
        length = end - p
        if length >= _MAX_CALL:
            raise ValueError(f"a forward call of {length} tokens is too long to key")
        for j in range(p, end):
            keys[j] |= length << _LEN_SHIFT
        keys[p] |= CALL_START
    return keys


def token_of(key: int) -> int:
    return key & ((1 << _LEN_SHIFT) - 1)


RowSource = Callable[[int, int], KVBlock]
"""``rows(start, end)`` → a fresh (cloned) block of the rows for tokens ``[start, end)``."""


def node_id(ns: bytes, path_tokens: Sequence[int]) -> str:
    """Stable name of the KV of one prefix in one namespace: keyed by the
    (secret-derived) namespace, so it cannot be confirmed by hashing guesses."""
    h = blake3.blake3(ns)
    h.update(array("q", path_tokens).tobytes())
    return "pfx:" + h.hexdigest()[:32]


def slice_block(block: KVBlock, start: int, end: int) -> KVBlock:
    """Rows ``[start, end)`` of a block as fresh tensors (never a view)."""
    return block.rows(start, end)


@dataclass(eq=False)
class Node:
    """One edge of the tree. The retention fields are set by the policy layer."""

    id: str
    tokens: tuple[int, ...]
    start: int  # absolute position of the first edge token
    block: KVBlock | None  # None only for the root
    parent: Node | None = None
    children: dict[int, Node] = field(default_factory=dict)
    locks: int = 0
    priority: int = 0
    last_access: float = 0.0
    expires_at: float | None = None
    prov: dict[str, int] = field(default_factory=dict)  # ref -> first token of its span
    removed: bool = False

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    @property
    def nbytes(self) -> int:
        return self.block.nbytes if self.block is not None else 0

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def path(self) -> list[Node]:
        """Non-root nodes from the top of the tree down to this one."""
        out: list[Node] = []
        node: Node | None = self
        while node is not None and node.parent is not None:
            out.append(node)
            node = node.parent
        out.reverse()
        return out


def _common(edge: tuple[int, ...], tokens: Sequence[int], offset: int) -> int:
    """Length of the common prefix of ``edge`` and ``tokens[offset:]``."""
    n = min(len(edge), len(tokens) - offset)
    if tuple(tokens[offset : offset + n]) == edge[:n]:
        return n
    i = 0
    while i < n and edge[i] == tokens[offset + i]:
        i += 1
    return i


class RadixTree:
    """One namespace's tree. Not thread-safe: the policy layer serialises calls."""

    def __init__(self, ns: bytes) -> None:
        self.ns = ns
        self.root = Node(id=node_id(ns, ()), tokens=(), start=0, block=None)
        self.nbytes = 0
        self.num_nodes = 0  # excluding the root

    # --- structure ----------------------------------------------------------
    def split(self, node: Node, k: int, path_tokens: Sequence[int]) -> Node:
        """Cut ``node``'s edge after ``k`` tokens; return the new upper half.
        ``path_tokens`` holds at least the tokens from the root to the cut."""
        if not 0 < k < len(node.tokens):
            raise ValueError(f"cannot split an edge of {len(node.tokens)} tokens at {k}")
        assert node.parent is not None and node.block is not None
        cut = node.start + k
        upper = Node(
            id=node_id(self.ns, path_tokens[:cut]),
            tokens=node.tokens[:k],
            start=node.start,
            block=slice_block(node.block, 0, k),
            parent=node.parent,
            locks=node.locks,
            priority=node.priority,
            last_access=node.last_access,
            expires_at=node.expires_at,
            prov={r: s for r, s in node.prov.items() if s < cut},
        )
        old = node.nbytes
        node.parent.children[node.tokens[0]] = upper
        node.block = slice_block(node.block, k, len(node.tokens))
        node.tokens = node.tokens[k:]
        node.start = cut
        node.parent = upper
        upper.children[node.tokens[0]] = node
        self.nbytes += upper.nbytes + node.nbytes - old
        self.num_nodes += 1
        return upper

    def match(self, tokens: Sequence[int], stop: Callable[[Node], bool] | None = None) -> tuple[int, list[Node]]:
        """Longest cached prefix of ``tokens``: (length, nodes on its path).
        An edge that diverges (or that the query ends inside) is split, so the
        last node ends exactly at the matched length. ``stop(node)`` refuses a
        node (and so everything below it)."""
        node, depth, path = self.root, 0, []
        while depth < len(tokens):
            child = node.children.get(tokens[depth])
            if child is None or (stop is not None and stop(child)):
                break
            k = _common(child.tokens, tokens, depth)
            if k < len(child.tokens):
                child = self.split(child, k, tokens)
            path.append(child)
            depth += k
            node = child
            if node.end != depth:  # pragma: no cover - split guarantees equality
                raise AssertionError("edge split left a node past the match")
        return depth, path

    def insert(self, tokens: Sequence[int], rows: RowSource) -> tuple[list[Node], list[Node]]:
        """Make ``tokens`` a root path ending exactly at a node boundary.
        Returns (every node on the path, the nodes newly created). Rows are
        fetched only for tokens not already cached: a prefix is never paid for twice."""
        depth, path = self.match(tokens)
        parent = path[-1] if path else self.root
        created: list[Node] = []
        if depth < len(tokens):
            block = rows(depth, len(tokens))
            if len(block) != len(tokens) - depth:
                raise ValueError(f"row source gave {len(block)} rows for {len(tokens) - depth} tokens")
            leaf = Node(
                id=node_id(self.ns, tokens),
                tokens=tuple(tokens[depth:]),
                start=depth,
                block=block,
                parent=parent,
            )
            parent.children[leaf.tokens[0]] = leaf
            self.nbytes += leaf.nbytes
            self.num_nodes += 1
            path.append(leaf)
            created.append(leaf)
        return path, created

    def remove(self, node: Node) -> list[Node]:
        """Detach ``node`` and its subtree; return the removed nodes (top first).
        Parent links are kept so that a lock taken before can still be released."""
        if node is self.root:
            raise ValueError("the root cannot be removed")
        if node.removed:
            return []
        assert node.parent is not None
        del node.parent.children[node.tokens[0]]
        gone = list(self.walk(node))
        for n in gone:
            n.removed = True
            self.nbytes -= n.nbytes
            self.num_nodes -= 1
        return gone

    # --- locks --------------------------------------------------------------
    @staticmethod
    def lock(node: Node) -> None:
        """Pin ``node`` and every ancestor (eviction skips locked nodes)."""
        n: Node | None = node
        while n is not None and n.parent is not None:
            n.locks += 1
            n = n.parent

    @staticmethod
    def unlock(node: Node) -> None:
        n: Node | None = node
        while n is not None and n.parent is not None:
            if n.locks <= 0:
                raise RuntimeError(f"unlock of an unlocked prefix node {n.id}")
            n.locks -= 1
            n = n.parent

    # --- traversal ----------------------------------------------------------
    def walk(self, top: Node | None = None) -> Iterator[Node]:
        """Every node under ``top`` (default: all non-root nodes), parents first."""
        stack = [top] if top is not None else list(self.root.children.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def full_copy_bytes(self) -> int:
        """What the same nodes would hold if each stored its whole prefix
        (the simple design): Σ node.end × bytes per row."""
        total = 0
        for n in self.walk():
            if n.tokens:
                total += n.nbytes // len(n.tokens) * n.end
        return total


def same_layout(a: KVBlock, b: KVBlock) -> bool:
    """Blocks from the same model geometry, dtype and device (safe to concatenate)."""
    return (
        a.k.shape[0] == b.k.shape[0]
        and a.k.shape[2:] == b.k.shape[2:]
        and a.k.dtype == b.k.dtype
        and a.k.device == b.k.device
    )


def concat_rows(blocks: Sequence[KVBlock], start: int, end: int) -> KVBlock:
    """Rows ``[start, end)`` of the concatenation of ``blocks``, as fresh tensors."""
    parts: list[KVBlock] = []
    offset = 0
    for b in blocks:
        lo, hi = max(start, offset), min(end, offset + len(b))
        if lo < hi:
            parts.append(slice_block(b, lo - offset, hi - offset))
        offset += len(b)
    if len(parts) == 1:
        return parts[0]
    if not parts:
        raise ValueError(f"no rows in [{start}, {end})")
    return KVBlock(
        k=torch.cat([p.k for p in parts], dim=1),
        kraw=torch.cat([p.kraw for p in parts], dim=1),
        v=torch.cat([p.v for p in parts], dim=1),
        tokens=torch.cat([p.tokens for p in parts]),
        positions=torch.cat([p.positions for p in parts]),
    )
