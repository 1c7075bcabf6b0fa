"""RFC 9162 Merkle tree: published known answers, exhaustive proof round trips
against a direct transcription of the RFC's recursive definitions, and tampered
proofs rejected."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from fak.audit import merkle

VECTORS = json.loads((Path(__file__).parents[1] / "data" / "audit_rfc6962_vectors.json").read_text())
N_MAX = 70


# --- reference: RFC 9162 section 2.1 definitions, recursive, independent of fak.audit.merkle
def _h(b: bytes) -> bytes:
    return hashlib.sha256(b).digest()


def _k(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def ref_mth(d: list[bytes]) -> bytes:
    if not d:
        return _h(b"")
    if len(d) == 1:
        return _h(b"\x00" + d[0])
    k = _k(len(d))
    return _h(b"\x01" + ref_mth(d[:k]) + ref_mth(d[k:]))


def ref_path(m: int, d: list[bytes]) -> list[bytes]:
    if len(d) == 1:
        return []
    k = _k(len(d))
    if m < k:
        return ref_path(m, d[:k]) + [ref_mth(d[k:])]
    return ref_path(m - k, d[k:]) + [ref_mth(d[:k])]


def ref_subproof(m: int, d: list[bytes], b: bool) -> list[bytes]:
    if m == len(d):
        return [] if b else [ref_mth(d)]
    k = _k(len(d))
    if m <= k:
        return ref_subproof(m, d[:k], b) + [ref_mth(d[k:])]
    return ref_subproof(m - k, d[k:], False) + [ref_mth(d[:k])]


LEAVES = [b"leaf-%d" % i for i in range(N_MAX)]


@pytest.fixture(scope="module")
def tree() -> merkle.MemoryTree:
    t = merkle.MemoryTree()
    for leaf in LEAVES:
        t.append(leaf)
    return t


def test_known_answer_roots_sizes_0_to_8():
    t = merkle.MemoryTree()
    leaves = [bytes.fromhex(x) for x in VECTORS["leaf_inputs_hex"]]
    assert t.root().hex() == VECTORS["roots_hex"][0]
    for n, leaf in enumerate(leaves, start=1):
        t.append(leaf)
        assert t.root().hex() == VECTORS["roots_hex"][n], n
        assert ref_mth(leaves[:n]).hex() == VECTORS["roots_hex"][n]


def test_known_answer_proofs():
    t = merkle.MemoryTree()
    for leaf in VECTORS["leaf_inputs_hex"]:
        t.append(bytes.fromhex(leaf))
    roots = [bytes.fromhex(r) for r in VECTORS["roots_hex"]]
    leaves = [bytes.fromhex(x) for x in VECTORS["leaf_inputs_hex"]]
    for case in VECTORS["inclusion"]:
        got = t.inclusion_proof(case["index"], case["size"])
        assert [h.hex() for h in got] == case["proof"]
        merkle.verify_inclusion(case["index"], case["size"], merkle.hash_leaf(leaves[case["index"]]),
                                got, roots[case["size"]])
    for case in VECTORS["consistency"]:
        got = t.consistency_proof(case["size1"], case["size2"])
        assert [h.hex() for h in got] == case["proof"]
        merkle.verify_consistency(case["size1"], case["size2"], roots[case["size1"]], roots[case["size2"]], got)


def _tampered(proof: list[bytes]):
    """Every single-hash bit flip, every truncation and one extension."""
    for i in range(len(proof)):
        bad = list(proof)
        bad[i] = bytes([bad[i][0] ^ 1]) + bad[i][1:]
        yield bad
    for cut in range(len(proof)):
        yield proof[:cut]
    yield [*proof, proof[-1] if proof else b"\x00" * 32]


def test_inclusion_round_trip_every_index_and_size(tree):
    for n in range(1, N_MAX + 1):
        root = tree.root(n)
        assert root == ref_mth(LEAVES[:n])
        for i in range(n):
            proof = tree.inclusion_proof(i, n)
            assert proof == ref_path(i, LEAVES[:n])
            leaf = merkle.hash_leaf(LEAVES[i])
            merkle.verify_inclusion(i, n, leaf, proof, root)
            for bad in _tampered(proof):
                with pytest.raises(merkle.ProofError):
                    merkle.verify_inclusion(i, n, leaf, bad, root)
            with pytest.raises(merkle.ProofError):  # wrong leaf
                merkle.verify_inclusion(i, n, merkle.hash_leaf(b"other"), proof, root)
            if n > 1:  # right proof, wrong index
                with pytest.raises(merkle.ProofError):
                    merkle.verify_inclusion((i + 1) % n, n, leaf, proof, root)


def test_consistency_round_trip_every_pair_of_sizes(tree):
    roots = [tree.root(n) for n in range(N_MAX + 1)]
    for n2 in range(1, N_MAX + 1):
        for n1 in range(1, n2 + 1):
            proof = tree.consistency_proof(n1, n2)
            assert proof == ref_subproof(n1, LEAVES[:n2], True)
            merkle.verify_consistency(n1, n2, roots[n1], roots[n2], proof)
            if n1 == n2:
                continue
            for bad in _tampered(proof):
                with pytest.raises(merkle.ProofError):
                    merkle.verify_consistency(n1, n2, roots[n1], roots[n2], bad)
            with pytest.raises(merkle.ProofError):  # a forked old root
                merkle.verify_consistency(n1, n2, merkle.hash_leaf(b"fork"), roots[n2], proof)
            with pytest.raises(merkle.ProofError):
                merkle.verify_consistency(n1, n2, roots[n1], merkle.hash_leaf(b"fork"), proof)


def test_consistency_from_empty_and_bad_sizes(tree):
    merkle.verify_consistency(0, 5, merkle.EMPTY_ROOT, tree.root(5), [])
    with pytest.raises(merkle.ProofError):
        merkle.verify_consistency(5, 4, tree.root(5), tree.root(4), [])
    with pytest.raises(merkle.ProofError):
        tree.inclusion_proof(5, 5)


def test_frontier_emits_every_complete_subtree_once():
    """The stored-subtree approach: after n appends exactly 2n - popcount(n) nodes exist."""
    t = merkle.MemoryTree()
    for n in range(1, 200):
        t.append(b"x%d" % n)
        assert len(t.nodes) == 2 * n - bin(n).count("1")


def test_proof_reads_are_logarithmic():
    """A proof in a large tree touches O(log n) stored nodes, fetched in one batch."""
    t = merkle.MemoryTree()
    for i in range(5000):
        t.append_leaf(hashlib.sha256(b"%d" % i).digest())
    calls: list[int] = []

    def counting_get(ids):
        calls.append(len(ids))
        return t.get(ids)

    merkle.inclusion_proof(1234, 4999, counting_get)
    merkle.consistency_proof(1000, 4999, counting_get)
    assert len(calls) == 2
    assert max(calls) <= 2 * (4999).bit_length()
