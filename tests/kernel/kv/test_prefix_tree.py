"""Radix tree mechanism: edge splits, matching, storing only new tokens, byte accounting.

The KV rows here are synthetic but prefix-dependent: row i of a sequence is
a hash of its whole prefix ``s[:i+1]``, so serving rows from the wrong branch
(or the wrong offset of an edge) changes the bytes and fails the test."""

from __future__ import annotations

import hashlib

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fak.kernel.kv.prefix_tree import RadixTree, concat_rows, node_id
from fak.kernel.model.kv_cache import KVBlock

LAYERS, HEADS, DIM = 2, 1, 4
NS = b"t" + bytes(32)


def prefix_rows(seq: list[int]) -> KVBlock:
    vals = [int.from_bytes(hashlib.sha256(repr(seq[: i + 1]).encode()).digest()[:3], "big") for i in range(len(seq))]
    base = torch.tensor(vals, dtype=torch.float32)[None, :, None, None].expand(LAYERS, -1, HEADS, DIM)
    return KVBlock(
        k=base.clone(),
        kraw=base.clone() + 1,
        v=base.clone() + 2,
        tokens=torch.tensor(seq, dtype=torch.int64),
        positions=torch.arange(len(seq), dtype=torch.int64),
    )


def insert(tree: RadixTree, seq: list[int]):
    full = prefix_rows(seq)
    return tree.insert(seq, lambda s, e: concat_rows([full], s, e))


def served(path) -> KVBlock:
    return concat_rows([n.block for n in path], 0, sum(len(n.block) for n in path))


def same(a: KVBlock, b: KVBlock) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("k", "kraw", "v", "tokens", "positions"))


def row_bytes() -> int:
    return prefix_rows([1]).nbytes


def test_split_at_end_of_shared_prefix_stores_only_new_tokens():
    tree = RadixTree(NS)
    a, b, c = [5, 6, 7, 8], [1, 2, 3], [9, 9]
    _, created = insert(tree, a + b)
    assert [len(n.tokens) for n in created] == [7]
    path, created = insert(tree, a + c)
    assert [len(n.tokens) for n in created] == [2]  # A is not paid for twice
    assert [n.end for n in path] == [4, 6]
    assert tree.num_nodes == 3
    assert tree.nbytes == (len(a) + len(b) + len(c)) * row_bytes()
    for seq in (a + b, a + c):
        length, nodes = tree.match(seq)
        assert length == len(seq)
        assert same(served(nodes), prefix_rows(seq))


def test_split_inside_an_edge_serves_exact_rows_and_keeps_ids_stable():
    tree = RadixTree(NS)
    seq = list(range(10, 30))
    path, _ = insert(tree, seq)
    leaf_id = path[-1].id
    assert leaf_id == node_id(NS, seq)
    length, nodes = tree.match(seq[:7] + [99, 98])
    assert length == 7 and len(nodes) == 1 and nodes[0].end == 7
    assert same(served(nodes), prefix_rows(seq[:7]))
    assert nodes[0].id == node_id(NS, seq[:7])
    # the lower half kept its identity, its rows and its id
    lower = nodes[0].children[seq[7]]
    assert lower.id == leaf_id and lower.start == 7
    assert same(lower.block, concat_rows([prefix_rows(seq)], 7, 20))
    assert tree.nbytes == len(seq) * row_bytes()
    # neither half is a view of the other's storage
    assert lower.block.k.untyped_storage().nbytes() == lower.block.k.numel() * 4


def test_remove_takes_the_subtree_and_lock_survives_splits():
    tree = RadixTree(NS)
    insert(tree, [1, 2, 3, 4, 5, 6])
    insert(tree, [1, 2, 3, 7, 8])
    _, nodes = tree.match([1, 2, 3, 4, 5, 6])
    deepest = nodes[-1]
    tree.lock(deepest)
    insert(tree, [1, 2, 3, 4, 9])  # splits the locked edge [4, 5, 6] after 4
    insert(tree, [1, 10])  # splits the locked edge [1, 2, 3] after 1
    locked = [n for n in tree.walk() if n.locks]
    assert sorted(n.end for n in locked) == [1, 3, 4, 6]
    tree.unlock(deepest)
    assert all(n.locks == 0 for n in tree.walk())
    top = tree.root.children[1].children[2]
    gone = tree.remove(top)
    assert {n.end for n in gone} == {3, 4, 5, 6}
    assert tree.match([1, 2, 3])[0] == 1
    assert tree.nbytes == sum(n.nbytes for n in tree.walk()) == 2 * row_bytes()


def test_full_copy_bytes_counts_whole_prefixes():
    tree = RadixTree(NS)
    shared = list(range(100, 110))
    for i in range(3):
        insert(tree, shared + [i] * 4)
    # one 10-token shared node and three leaves ending at 14
    assert tree.full_copy_bytes() == (10 + 3 * 14) * row_bytes()
    assert tree.nbytes == (10 + 3 * 4) * row_bytes()


seqs = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(seqs, st.lists(st.lists(st.integers(0, 3), max_size=12), max_size=6))
def test_any_insert_order_serves_every_sequence_exactly(inserted, queries):
    tree = RadixTree(NS)
    for s in inserted:
        insert(tree, s)
    unique_prefixes = {tuple(s[:i]) for s in inserted for i in range(1, len(s) + 1)}
    assert tree.nbytes == len(unique_prefixes) * row_bytes()
    for s in inserted + queries:
        length, nodes = tree.match(s)
        expect = max((i for i in range(len(s) + 1) if i == 0 or tuple(s[:i]) in unique_prefixes), default=0)
        assert length == expect
        if length:
            assert same(served(nodes), prefix_rows(s[:length]))
    assert tree.nbytes == len(unique_prefixes) * row_bytes()  # splits move bytes, never add them
