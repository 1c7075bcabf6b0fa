"""Every signature of policy/signatures.yaml against its own examples, through the
reference path and the accelerated one, and the file's rules (families, bounded widths,
a native superset for each)."""

from __future__ import annotations

import pytest

from fak.policy import accel, reference, signatures
from fak.policy.schema import DETECTOR_FAMILIES

SIGS = signatures.load()


def _data(example: str | bytes) -> bytes:
    return example if isinstance(example, bytes) else example.encode("utf-8", "surrogatepass")


def _fires(sig: signatures.Signature, example: str | bytes, accelerated: bool = False) -> bool:
    data = _data(example)
    found = (accel.findings if accelerated else reference.findings)(data, {sig.detector})
    return any(f.name == sig.id for f in found.get(sig.detector, []))


@pytest.mark.parametrize("sig", SIGS, ids=lambda s: s.id)
def test_signature_examples(sig):
    assert sig.match, "every signature has at least one positive example"
    for example in sig.match:
        assert _fires(sig, example), f"{sig.id} should match {example!r}"
    for example in sig.no_match:
        assert not _fires(sig, example), f"{sig.id} should not match {example!r}"


@pytest.mark.skipif(not accel.available(), reason="Hyperscan is not installed")
@pytest.mark.parametrize("sig", SIGS, ids=lambda s: s.id)
def test_signature_examples_accelerated(sig):
    """The native superset reports each positive example, and the accelerated path agrees."""
    db = accel.native()
    pids = {p for p, name in enumerate(db.ids) if name == sig.id}  # none for root signatures: non-ASCII triggers
    for example in sig.match:  # the signature itself, or a view's trigger (de-spacing, an encoded run, …)
        hits = db.hits(_data(example))
        assert hits is None or pids & hits.keys() or max(hits, default=-1) >= db.count or not _data(example).isascii(), example
        assert _fires(sig, example, accelerated=True)
    for example in sig.no_match:
        assert not _fires(sig, example, accelerated=True)


def test_signatures_use_the_schema_s_detectors_and_families():
    assert len({s.id for s in SIGS}) == len(SIGS)
    for sig in SIGS:
        assert sig.family in DETECTOR_FAMILIES[sig.detector]
        assert 0 < sig.weight <= 1
    covered = {(s.detector, s.family) for s in SIGS}
    for family in ("override", "role_header", "tool_forgery", "exfiltration", "destructive_command"):
        assert ("injection", family) in covered
    assert {("obfuscation", "invisible"), ("obfuscation", "bidi"), ("encoding", "invalid_utf8")} <= covered


def test_widths_are_bounded():
    """Regions are sized by a pattern's longest match: none is unbounded."""
    for sig in SIGS:
        limit = 20000 if sig.id == "secret.private_key" else 1100
        assert accel.width(sig.regex) <= limit, sig.id


@pytest.mark.parametrize(("text", "error"), [
    ("signatures:\n  - {id: a, detector: injection, family: override, weight: 1, pattern: x}\n"
     "  - {id: a, detector: injection, family: override, weight: 1, pattern: y}\n", "signature a: duplicate id"),
    ("signatures:\n  - {id: b, detector: injection, family: cloud_key, weight: 1, pattern: x}\n", "signature b: family"),
    ("signatures:\n  - {id: c, detector: semantic, family: semantic, weight: 1, pattern: x}\n", "signature c: unknown detector"),
    ("signatures:\n  - {id: d, detector: secrets, family: jwt, weight: 2, pattern: x}\n", "signature d: weight"),
    ("signatures:\n  - {id: e, detector: secrets, family: jwt, weight: 1, pattern: '(x'}\n", "signature e:"),
])
def test_a_bad_signature_is_named(text, error):
    with pytest.raises(ValueError, match=error.replace("(", r"\(")):
        signatures.parse(text)
