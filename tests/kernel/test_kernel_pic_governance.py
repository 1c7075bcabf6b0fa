"""PIC through the Kernel: served only where the policy allows approximate reuse, reported
as an approximate HIT with its source positions, and dropped by forget, quarantine and
eviction (a session that was served a dropped chunk is replayed exactly)."""

from __future__ import annotations

import shutil

import pytest
from support.kernel_facade_helpers import events

from fak import Kernel
from fak.kernel.facade import default_policy_path

DOC = (b"Release notes 4.2: the scheduler now retries failed jobs three times with exponential "
       b"backoff; the web console shows per-queue latency; exports to Parquet keep column types; "
       b"the CLI gained a --dry-run flag for migrations; deprecated v1 endpoints return 410. ") * 3


@pytest.fixture
def pic_kernel(tmp_path, settings, tiny_lm):
    policy = tmp_path / "policy.yaml"
    shutil.copy(default_policy_path(), policy)
    policy.write_text(policy.read_text().replace("pic_approximate: false", "pic_approximate: true"))
    settings.policy_path = policy
    with Kernel.open(settings, model=tiny_lm, progress=None) as k:
        yield k


def _seeded(k: Kernel, header: str):  # noqa: ANN202
    s = k.session("acme")
    s.append("system", header)
    return s


def test_pic_is_off_unless_the_policy_allows_it(kernel) -> None:
    first = _seeded(kernel, "You are a release assistant.")
    ref = first.admit("changelog", DOC).ref
    second = _seeded(kernel, "Request 7f3a, locale en-GB, user 4411. You are a release assistant.")
    result = second.materialise({"refs": [ref]})
    assert [(p.verdict.value, p.reason, p.exact) for p in result.pieces] == [("RECOMPUTE", "position_changed", True)]
    assert kernel.pic.entries(kernel.namespace("acme")) == []


def test_a_shifted_piece_is_an_approximate_hit_with_its_source_position(pic_kernel) -> None:
    k = pic_kernel
    first = _seeded(k, "You are a release assistant.")
    ref = first.admit("changelog", DOC).ref
    second = _seeded(k, "Request 7f3a, locale en-GB, user 4411. You are a release assistant.")
    result = second.materialise({"refs": [ref]})
    (piece,) = result.pieces
    assert (piece.verdict.value, piece.reason, piece.exact) == ("HIT", "pic", False)
    assert piece.pic_tokens > 0 and piece.source_positions
    logged = events(k, "materialisation")[-1].pieces[0]
    assert (logged.verdict, logged.exact, logged.source_positions) == ("HIT", False, list(piece.source_positions))
    # another tenant with the same bytes gets nothing from acme's chunks
    other = k.session("globex")
    other.append("system", "Request 7f3a, locale en-GB, user 4411. You are a release assistant.")
    other_ref = other.admit("changelog", DOC).ref
    other_piece = other.materialise({"refs": [other_ref]}).pieces[0]
    assert other_piece.reason != "pic" and other_piece.exact is not False


def test_forget_drops_the_chunks_and_replays_their_consumers_exactly(pic_kernel) -> None:
    k = pic_kernel
    first = _seeded(k, "You are a release assistant.")
    ref = first.admit("changelog", DOC).ref
    consumer = _seeded(k, "Request 7f3a, locale en-GB, user 4411. You are a release assistant.")
    consumer.materialise({"refs": [ref]})
    assert consumer.fingerprint() != consumer.replay_fingerprint()  # approximate rows
    receipt = k.forget("acme", ref)
    kinds = {u.kind for u in receipt.units_dropped}
    assert "pic_chunk" in kinds
    assert k.pic.entries(k.namespace("acme")) == []
    assert consumer.fingerprint() == consumer.replay_fingerprint()
    assert ref not in consumer.refs()


def test_quarantine_replays_a_session_that_was_served_a_chunk_beside_it(pic_kernel) -> None:
    k = pic_kernel
    first = _seeded(k, "You are a release assistant.")
    bad = first.admit("changelog", b"Vendor note: " + DOC).ref
    first.append("user", "Summarise the notes above for the team.")
    user_doc = "Summarise the notes above for the team. " * 6
    first.append("user", user_doc)
    consumer = _seeded(k, "Request 7f3a, locale en-GB, user 4411. You are a release assistant.")
    consumer.append("user", user_doc)
    if not consumer._mech.pic_hit_tokens:
        pytest.skip("the tiny tokenizer cut no reusable chunk from this text")
    assert bad in consumer.refs()  # the served rows attended to the first session's context
    k.quarantine("acme", bad, reason="late_detector")
    assert bad not in consumer.refs()
    assert consumer.fingerprint() == consumer.replay_fingerprint()


def test_a_reload_that_forbids_approximate_reuse_stops_pic(pic_kernel) -> None:
    k = pic_kernel
    first = _seeded(k, "You are a release assistant.")
    ref = first.admit("changelog", DOC).ref
    second = _seeded(k, "Request 7f3a, locale en-GB, user 4411. You are a release assistant.")
    policy = k.policy_path
    policy.write_text(policy.read_text().replace("pic_approximate: true", "pic_approximate: false"))
    k.reload_policy(principal="ops")
    piece = second.materialise({"refs": [ref]}).pieces[0]
    assert (piece.verdict.value, piece.reason, piece.exact, piece.pic_tokens) == ("RECOMPUTE", "policy_drift", True, 0)
    assert second.fingerprint() == second.replay_fingerprint()



def test_identical_prompts_never_hit_across_tenants(pic_kernel) -> None:
    """Tenant B sends what tenant A sent (and A's chunks sit in the registry): B gets no PIC
    and no prefix hit; A, sending the same, does (so the probe can see a hit)."""
    k = pic_kernel
    body = DOC.decode() + " Which of these changes affect the CLI?"
    seed = k.session("acme")
    seed.append("system", "You are a release assistant.")
    seed.append("user", body)
    probes = {}
    for tenant in ("globex", "acme"):
        shifted = k.session(tenant)  # A's body after another header: the PIC registry's probe
        shifted.append("system", "Request 7f3a, locale en-GB, user 4411. You are a release assistant.")
        shifted.append("user", body)
        same = k.session(tenant)  # A's very prompt: the exact prefix cache's probe
        same.append("system", "You are a release assistant.")
        same.append("user", body)
        probes[tenant] = (same.prefix_hit_tokens, shifted._mech.pic_hit_tokens)
    assert probes["globex"] == (0, 0)
    assert probes["acme"][0] > 0 and probes["acme"][1] > 0
