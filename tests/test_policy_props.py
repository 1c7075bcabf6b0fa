"""Properties: the gate never raises on arbitrary bytes; normalisation is idempotent;
the committed corpus is exactly what its generator writes."""

from __future__ import annotations

import base64
import importlib.util
import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from fak.policy import VerdictKind, gate, load_policy, normalize
from fak.policy.normalize import fold

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = load_policy(ROOT / "examples/policies/default.yaml")

# Bytes biased towards the tricky parts: encodings, invisible characters, markup.
FRAGMENTS = st.sampled_from([
    b"ignore", b" all ", b"previous", b"instructions", b"<|im_start|>", b"\xe2\x80\x8b", b"\xff", b"\xc3",
    b"%20", b"&#105;", b"aWdub3Jl", b"==", b"<!--", b"-->", b"\xf3\xa0\x81\xa9", b"ghp_", b"\n", b"i g n o r e",
])
INPUTS = st.one_of(st.binary(max_size=4096), st.lists(FRAGMENTS, max_size=60).map(b"".join))


@settings(max_examples=300, deadline=None)
@given(INPUTS)
def test_gate_never_raises_and_spans_are_in_bounds(data):
    for policy in (DEFAULT,):
        v = gate(policy, "web_fetch", data)
        assert v.kind in VerdictKind and v.policy_digest == policy.digest
        for m in v.matches:
            assert 0 <= m.start <= m.end <= len(data)
        if v.kind is VerdictKind.REDACT:
            assert v.redacted_bytes is not None


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_normalisation_is_idempotent(text):
    once = normalize(text)
    assert normalize(once) == once
    assert fold(fold(text)) == fold(text)


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
def test_fold_removes_invisible_and_lowercases(text):
    out = fold(text)
    assert not any(c in out for c in "\u200b\u200c\u200d\u2060\ufeff\u202e")
    assert out == out.lower()


def test_committed_corpus_matches_its_generator():
    spec = importlib.util.spec_from_file_location("make_gate_corpus", ROOT / "tests/data/make_gate_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.build()
    committed = [json.loads(line) for line in (ROOT / "tests/data/gate_corpus.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [r["id"] for r in committed]
    assert [r["text"] for r in rows] == [r["text"] for r in committed]
    labels = {(r["split"], r["label"]) for r in committed}
    assert {("dev", "injected"), ("heldout", "injected"), ("dev", "benign"), ("heldout", "benign")} <= labels
    assert sum(r["label"] == "injected" for r in committed) >= 200
    assert sum(r["label"] == "benign" for r in committed) >= 200


TEXTS = st.lists(st.sampled_from(["a", "B", " ", "\u200b", "ﬁ", "é", "Ａ", "\u0301", "\U000e0041", "\udcff", "—", "ß",
                                  "İ", "😀", "ǅ", "\ufe0f", "x", "\n"]), max_size=40).map("".join)


@settings(max_examples=150, deadline=None)
@given(TEXTS)
def test_fold_view_maps_every_position_to_the_character_it_came_from(text):
    """Each folded character maps back to the one character whose fold produced it."""
    from fak.policy.normalize import View, fold_char, fold_view

    view = fold_view(View(text, "text"))
    assert view.text == "".join(fold_char(c) if ord(c) >= 128 else c.lower() for c in text)
    for pos in range(len(view.text)):
        start, end, _ = view.to_parent(pos, pos + 1)
        assert end == start + 1 and view.text[pos] in fold_char(text[start]).lower() + text[start].lower()


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet="AZaz09+/-_=", max_size=40))
def test_base64_decoding_is_the_standard_library_s(run):
    """The direct binascii decoding gives what ``base64`` gives (validated standard alphabet,
    or the URL-safe one), including where it refuses."""
    import base64
    import binascii

    from fak.policy.normalize import _b64

    body = run.rstrip("=")
    padded = body + "=" * (-len(body) % 4)
    try:
        if "-" in body or "_" in body:
            expected = base64.urlsafe_b64decode(padded)
        else:
            expected = base64.b64decode(padded, validate=True)
    except (binascii.Error, ValueError):
        expected = None
    assert _b64(run) == expected


def test_base64_of_hex_digits_cannot_spell_an_instruction():
    """Why ``payloads`` decodes a run of hex digits as hex only: every byte that
    base64 made of hex digits can decode to, at each position of a 3-byte group, leaves out
    the letters e and r (and b c d j, H-L R-U X Y) everywhere, so no English instruction fits."""
    import itertools

    from fak.policy.normalize import _HEX_DIGITS

    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    values = [alphabet.index(c) for c in _HEX_DIGITS]
    reachable: set[int] = set()
    for c0, c1, c2, c3 in itertools.product(values, repeat=4):
        reachable |= {(c0 << 2) | (c1 >> 4), ((c1 & 15) << 4) | (c2 >> 2), ((c2 & 3) << 6) | c3}
    letters = {chr(b) for b in reachable if chr(b).isascii() and chr(b).isalpha()}
    assert not letters & set("bcdejrHIJKLRSTUXY")
    assert "e" not in letters and "r" not in letters
    from fak.policy.normalize import payloads

    gibberish = "aF00" * 8  # hex digits that base64-decode to printable "h]4h]4…", and nothing more
    assert base64.b64decode(gibberish) == b"h]4" * 8
    assert payloads(f'"id": "{gibberish}"', [1 << 20]) == []  # tried as hex only
