"""Properties: the gate never raises on arbitrary bytes; normalisation is idempotent;
the committed corpus is exactly what its generator writes."""

from __future__ import annotations

import base64
import importlib.util
import json
import time
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fak.policy import PolicyError, VerdictKind, gate, load_policy, load_policy_text, normalize
from fak.policy.normalize import fold

ROOT = Path(__file__).resolve().parents[2]
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


# --- the policy loader against alias graphs and deep nesting (issue 25.5) ----------------------
HEAD = "apiVersion: fak.dev/v1\nkind: Policy\nmetadata: {name: t}\n"
BOUND_S = 5.0  # a generous safety bound of CPU time; each example answers in milliseconds


def _mapping_alias_bomb(depth: int) -> str:
    """The reported one: two anchors a level, each a mapping of aliases to both of the level
    below (2^depth nodes once expanded); 35 s and 3.7 GB at depth 19 through the API."""
    text = HEAD + "x0: &x0 {a: 1}\ny0: &y0 {a: 1}\n"
    for n in range(1, depth + 1):
        text += f"x{n}: &x{n} {{a: *x{n - 1}, b: *y{n - 1}}}\ny{n}: &y{n} {{a: *x{n - 1}, b: *y{n - 1}}}\n"
    return text


def _item(draw, earlier: list[str], depth: int = 0) -> str:
    """A scalar, an alias to one of the last three anchors, or a flow collection of items."""
    choice = draw(st.integers(0, 4 if depth < 3 else 1))
    if choice <= 1 and earlier:
        return "*" + earlier[-draw(st.integers(1, min(len(earlier), 3)))]
    if choice == 2:
        return "[" + ", ".join(_item(draw, earlier, depth + 1) for _ in range(draw(st.integers(0, 3)))) + "]"
    if choice == 3:
        return "{" + ", ".join(f"k{j}: {_item(draw, earlier, depth + 1)}" for j in range(draw(st.integers(0, 3)))) + "}"
    return draw(st.sampled_from(["1", "x", "''", "null"]))


@st.composite
def alias_graphs(draw) -> str:
    """A document of anchored values (lists and mappings, flow and block, nested), each made of
    scalars, nested collections and aliases to earlier anchors (the last few, so chains form
    and share): graphs whose expansion is exponential in their length."""
    names = [f"n{i}" for i in range(draw(st.integers(1, 24)))]
    under = draw(st.sampled_from(["", "spec:\n", "metadata:\n  labels:\n"]))
    pad = "  " * under.count(":")
    lines = []
    for i, name in enumerate(names):
        children = [_item(draw, names[:i]) for _ in range(draw(st.integers(1, 4)))]
        style = draw(st.sampled_from(["flow-seq", "flow-map", "block-seq", "block-map"]))
        if style == "flow-seq":
            lines.append(f"{pad}{name}: &{name} [{', '.join(children)}]")
        elif style == "flow-map":
            lines.append(f"{pad}{name}: &{name} {{{', '.join(f'k{j}: {c}' for j, c in enumerate(children))}}}")
        elif style == "block-seq":
            lines.append(f"{pad}{name}: &{name}\n" + "\n".join(f"{pad}  - {c}" for c in children))
        else:
            lines.append(f"{pad}{name}: &{name}\n" + "\n".join(f"{pad}  k{j}: {c}" for j, c in enumerate(children)))
    return HEAD + under + "\n".join(lines) + "\n"


@st.composite
def deep_nesting(draw) -> str:
    """Collections nested up to 3,000 deep: flow lists and mappings, block lists and
    mappings, closed or not."""
    depth = draw(st.integers(1, 3000))
    style = draw(st.sampled_from(["[", "{k: ", "block-seq", "block-map", "mixed"]))
    closed = draw(st.booleans())
    if style in ("[", "{k: "):
        closer = "]" if style == "[" else "}"
        body = style * depth + "1" + (closer * depth if closed else "")
    elif style == "mixed":
        body = "[{k: " * (depth // 2) + "1" + ("}]" * (depth // 2) if closed else "")
    elif style == "block-seq":
        body = "\n" + "".join(" " * (i + 1) + "-\n" for i in range(depth))
    else:
        body = "\n" + "".join(" " * (i + 1) + f"k{i}:\n" for i in range(depth))
    return HEAD + "spec:\n  x: " + body + "\n"


def _answered_in_bound(text: str) -> PolicyError | None:
    """The loader's answer to ``text``: a policy, or a PolicyError whose every problem is
    located in the file; never another exception, and within ``BOUND_S``."""
    start = time.process_time()
    try:
        load_policy_text(text, "fuzz.yaml")
        error = None
    except PolicyError as exc:
        assert exc.problems and all(str(p).startswith("fuzz.yaml:") for p in exc.problems), exc
        error = exc
    assert time.process_time() - start < BOUND_S
    return error


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(_mapping_alias_bomb(19))
@example(HEAD + "a: &a [1, 1]\n" + "".join(f"a{i}: &a{i} [*{'a' if i == 0 else f'a{i - 1}'}] \n" for i in range(40)))
@given(alias_graphs())
def test_alias_graphs_are_refused_at_once(text: str) -> None:
    error = _answered_in_bound(text)
    if "*" in text:  # every alias is refused where it stands, expanded never
        assert error is not None and any("anchors and aliases are not allowed" in p.message for p in error.problems)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(HEAD + "[" * 50_000)
@given(deep_nesting())
def test_deep_nesting_is_answered_at_once(text: str) -> None:
    _answered_in_bound(text)
