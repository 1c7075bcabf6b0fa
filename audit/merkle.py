"""RFC 9162 Merkle tree hashing, proof generation and proof verification.

Why this shape: proofs are generated from *stored complete subtrees*. Every
node hash of a complete, power-of-two aligned subtree is immutable once its
last leaf is appended, so a log can store them as it grows and answer any
inclusion or consistency proof with O(log n) node reads, for any tree size up
to the current one. ``NodeGetter`` abstracts where the nodes live (database
rows or the in-memory ``MemoryTree`` used by the offline verifier).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence

from fak.audit.errors import VerificationError

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()
LEVEL_SHIFT = 48  # node id = level << 48 | index; 2^48 leaves is plenty

# Given node ids, return {node id: hash}; missing ids are an error of the caller's store.
NodeGetter = Callable[[Sequence[int]], dict[int, bytes]]


class ProofError(VerificationError, ValueError):
    """A proof does not verify, or a proof was requested for impossible sizes."""


def hash_leaf(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def hash_children(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def node_id(level: int, index: int) -> int:
    return (level << LEVEL_SHIFT) | index


def _split(n: int) -> int:
    """Largest power of two strictly smaller than n (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


# ---------------------------------------------------------------- range planning


def range_pieces(start: int, end: int) -> list[tuple[int, int]]:
    """Complete aligned subtrees (level, index) covering [start, end), left to right."""
    pieces = []
    while start < end:
        size = start & -start if start else 1 << ((end - start).bit_length() - 1)
        while size > end - start:
            size >>= 1
        level = size.bit_length() - 1
        pieces.append((level, start >> level))
        start += size
    return pieces


def fold_pieces(hashes: Sequence[bytes]) -> bytes:
    """MTH of a range from its left-to-right decreasing complete pieces."""
    if not hashes:
        return EMPTY_ROOT
    acc = hashes[-1]
    for h in reversed(hashes[:-1]):
        acc = hash_children(h, acc)
    return acc


def inclusion_ranges(index: int, size: int) -> list[tuple[int, int]]:
    """The leaf ranges whose MTH form PATH(index, D[0:size]), leaf sibling first."""
    if not 0 <= index < size:
        raise ProofError(f"index {index} is outside a tree of size {size}")
    out = []
    lo, hi = 0, size
    while hi - lo > 1:
        k = _split(hi - lo)
        if index < lo + k:
            out.append((lo + k, hi))
            hi = lo + k
        else:
            out.append((lo, lo + k))
            lo += k
    out.reverse()
    return out


def consistency_ranges(size1: int, size2: int) -> list[tuple[int, int]]:
    """The leaf ranges whose MTH form PROOF(size1, D[0:size2]) (RFC 9162 2.1.4.1)."""
    if not 0 <= size1 <= size2:
        raise ProofError(f"no consistency proof from size {size1} to size {size2}")
    out: list[tuple[int, int]] = []
    if size1 == 0 or size1 == size2:
        return out
    # iterative SUBPROOF(m, D[lo:hi], b); appended hashes come after the inner proof
    tail: list[tuple[int, int]] = []
    m, lo, hi, b = size1, 0, size2, True
    while m != hi - lo:
        k = _split(hi - lo)
        if m <= k:
            tail.append((lo + k, hi))
            hi = lo + k
        else:
            tail.append((lo, lo + k))
            m -= k
            lo += k
            b = False
    if not b:
        out.append((lo, hi))
    out.extend(reversed(tail))
    return out


def resolve(ranges: Iterable[tuple[int, int]], get: NodeGetter) -> list[bytes]:
    """Hash each range from stored complete subtrees, in one batched node read."""
    ranges = list(ranges)
    plans = [range_pieces(a, b) for a, b in ranges]
    wanted = sorted({node_id(lv, ix) for plan in plans for lv, ix in plan})
    found = get(wanted) if wanted else {}
    missing = [w for w in wanted if w not in found]
    if missing:
        raise ProofError(f"{len(missing)} stored subtree hashes are missing")
    return [fold_pieces([found[node_id(lv, ix)] for lv, ix in plan]) for plan in plans]


def root_from(size: int, get: NodeGetter) -> bytes:
    return resolve([(0, size)], get)[0] if size else EMPTY_ROOT


def inclusion_proof(index: int, size: int, get: NodeGetter) -> list[bytes]:
    return resolve(inclusion_ranges(index, size), get)


def consistency_proof(size1: int, size2: int, get: NodeGetter) -> list[bytes]:
    return resolve(consistency_ranges(size1, size2), get)


# ---------------------------------------------------------------- verification (RFC 9162 2.1.3.2, 2.1.4.2)


def _walk(fn: int, sn: int, path: Iterable[bytes], too_long: str, too_short: str) -> Iterator[tuple[bytes, bool]]:
    """The walk both verifications share: from node ``fn`` of a level whose last node is ``sn`` up
    to the root, each path hash with whether it is the left sibling (hashed first). ProofError
    when a hash has the wrong length or the path is longer (``too_long``) or shorter (``too_short``)
    than the walk."""
    for p in path:
        if len(p) != HASH_SIZE:
            raise ProofError("proof hash has the wrong length")
        if sn == 0:
            raise ProofError(too_long)
        left = bool(fn & 1) or fn == sn
        if left:
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        yield p, left
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError(too_short)


def root_from_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes]) -> bytes:
    if not 0 <= index < size:
        raise ProofError(f"index {index} is outside a tree of size {size}")
    r = leaf
    for p, left in _walk(index, size - 1, proof, "inclusion proof is too long", "inclusion proof is too short"):
        r = hash_children(p, r) if left else hash_children(r, p)
    return r


def verify_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes) -> None:
    """Raise ProofError unless ``proof`` proves ``leaf`` at ``index`` under ``root``."""
    if root_from_inclusion(index, size, leaf, proof) != root:
        raise ProofError(f"inclusion proof for index {index} does not match the root of size {size}")


def verify_consistency(size1: int, size2: int, root1: bytes, root2: bytes, proof: Sequence[bytes]) -> None:
    """Raise ProofError unless ``proof`` shows tree ``size1`` is a prefix of tree ``size2``."""
    if not 0 <= size1 <= size2:
        raise ProofError(f"sizes {size1} > {size2}: a log never shrinks")
    if any(len(p) != HASH_SIZE for p in proof):
        raise ProofError("proof hash has the wrong length")
    if size1 == size2:
        if proof or root1 != root2:
            raise ProofError("equal sizes need an empty proof and equal roots")
        return
    if size1 == 0:
        if proof:
            raise ProofError("consistency from the empty tree needs an empty proof")
        return
    if not proof:
        raise ProofError("consistency proof is empty")
    path = list(proof)
    if size1 & (size1 - 1) == 0:
        path.insert(0, root1)
    fn, sn = size1 - 1, size2 - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    failed = f"consistency proof from size {size1} to {size2} does not verify"
    for c, left in _walk(fn, sn, path[1:], "consistency proof is too long", failed):
        if left:
            fr = hash_children(c, fr)
            sr = hash_children(c, sr)
        else:
            sr = hash_children(sr, c)
    if fr != root1 or sr != root2:
        raise ProofError(failed)


# ---------------------------------------------------------------- compact range and in-memory tree


class Frontier:
    """Right edge of the tree: the complete subtrees covering [0, size). Appending a
    leaf yields the nodes that became complete, which the log stores."""

    def __init__(self, size: int = 0, hashes: Sequence[bytes] = ()) -> None:
        self.size = size
        self.hashes = list(hashes)  # one per set bit of size, largest first
        if len(self.hashes) != bin(size).count("1"):
            raise ValueError("frontier hashes do not match the size")

    def append(self, leaf: bytes) -> list[tuple[int, bytes]]:
        """Add a leaf hash; return the new (node id, hash) pairs, leaf included."""
        index, level, h = self.size, 0, leaf
        new = [(node_id(0, index), h)]
        while (index >> level) & 1:
            h = hash_children(self.hashes.pop(), h)
            level += 1
            new.append((node_id(level, index >> level), h))
        self.hashes.append(h)
        self.size += 1
        return new

    def root(self) -> bytes:
        return fold_pieces(self.hashes)


class MemoryTree:
    """All complete subtree hashes in memory: the verifier's and the tests' tree."""

    def __init__(self) -> None:
        self.nodes: dict[int, bytes] = {}
        self.frontier = Frontier()

    @property
    def size(self) -> int:
        return self.frontier.size

    def append_leaf(self, leaf: bytes) -> None:
        self.nodes.update(self.frontier.append(leaf))

    def append(self, data: bytes) -> None:
        self.append_leaf(hash_leaf(data))

    def get(self, ids: Sequence[int]) -> dict[int, bytes]:
        return {i: self.nodes[i] for i in ids if i in self.nodes}

    def root(self, size: int | None = None) -> bytes:
        return self.frontier.root() if size is None or size == self.size else root_from(size, self.get)

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        return inclusion_proof(index, self.size if size is None else size, self.get)

    def consistency_proof(self, size1: int, size2: int | None = None) -> list[bytes]:
        return consistency_proof(size1, self.size if size2 is None else size2, self.get)
