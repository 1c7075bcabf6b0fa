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
STRICT = load_policy(ROOT / "examples/policies/strict.yaml")

# Bytes biased towards the tricky parts: encodings, invisible characters, markup.
FRAGMENTS = st.sampled_from([
    b"ignore", b" all ", b"previous", b"instructions", b"<|im_start|>", b"\xe2\x80\x8b", b"\xff", b"\xc3",
    b"%20", b"&#105;", b"aWdub3Jl", b"==", b"<!--", b"-->", b"\xf3\xa0\x81\xa9", b"ghp_", b"\n", b"i g n o r e",
])
INPUTS = st.one_of(st.binary(max_size=4096), st.lists(FRAGMENTS, max_size=60).map(b"".join))


@settings(max_examples=200, deadline=None)
@given(INPUTS)
def test_gate_never_raises_and_spans_are_in_bounds(data):
    for policy in (DEFAULT, STRICT):
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
                                  "İ", "😀", "ǅ", "\ufe0f", "x"]), max_size=40).map("".join)


@settings(max_examples=120, deadline=None)
@given(TEXTS)
def test_sparse_position_maps_agree_with_the_cumulative_arrays(text):
    """``Shifts`` (built from the changed characters only) maps positions exactly as the
    cumulative arrays over every character do: folded text back to its parent, characters
    to UTF-8 bytes."""
    from fak.policy.normalize import char_byte_offsets, fold_offsets, fold_shifts, utf8_shifts

    cum, sparse = fold_offsets(text), fold_shifts(text)
    for pos in range(len(fold(text)) + 1):
        assert sparse.back(pos) == int(cum.searchsorted(pos, side="right")) - 1
    cum, sparse = char_byte_offsets(text), utf8_shifts(text)
    for i in range(len(text) + 1):
        assert sparse.forward(i) == int(cum[i])


@settings(max_examples=50, deadline=None)
@given(TEXTS, st.integers(1, 200))
def test_fold_of_long_text_is_per_character(text, times):
    """Long text finds its non-ASCII runs another way (vectorised): the fold is still the
    per-character one."""
    from fak.policy.normalize import _TABLE

    long = (text + "plain ASCII words ") * times
    assert fold(long) == "".join(ch.lower() if ord(ch) < 128 else _TABLE[ord(ch)] for ch in long)


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
    """Why ``decoded_payloads`` decodes a run of hex digits as hex only: every byte that
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
    from fak.policy.normalize import View, decoded_payloads

    gibberish = "aF00" * 8  # hex digits that base64-decode to printable "h]4h]4…", and nothing more
    assert base64.b64decode(gibberish) == b"h]4" * 8
    assert decoded_payloads(View(f'"id": "{gibberish}"', "text"), 1 << 20) == []  # tried as hex only


def _string_spans(doc: str) -> list[tuple[int, int, bool]]:
    """(content start, content end, is a key) of every string in a JSON text."""
    out: list[tuple[int, int, bool]] = []
    i = 0
    while i < len(doc):
        if doc[i] != '"':
            i += 1
            continue
        j = i + 1
        while doc[j] != '"':
            j += 2 if doc[j] == "\\" else 1
        out.append((i + 1, j, doc[j + 1 :].lstrip().startswith(":")))
        i = j + 1
    return out


_JSON_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
_JSON_DOC = st.recursive(_JSON_TEXT | st.integers() | st.none(),
                         lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_JSON_TEXT, inner, max_size=4),
                         max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(_JSON_DOC, st.sampled_from([None, 2]), st.booleans())
def test_json_string_start_finds_the_string_a_place_is_in(doc, indent, ascii_only):
    """Every place inside a string value (of an object or an array) of a JSON text, compact
    or pretty-printed, escaped or not, is found to lie in that string."""
    from fak.policy.detectors import _json_string_start

    text = json.dumps({"k": doc}, indent=indent, ensure_ascii=ascii_only)
    for start, end, is_key in _string_spans(text):
        if is_key:
            continue
        for at in range(start, end + 1):
            assert _json_string_start(text, at) == start, (text, at)
