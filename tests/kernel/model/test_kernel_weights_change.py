"""A session recorded under one weight format and opened under another (``FAK_WEIGHTS``
changed between two starts) rebuilds and records why, instead of refusing to serve."""

from __future__ import annotations

import pytest
from support.kernel_facade_helpers import events

from fak import Kernel


def test_a_session_recorded_under_other_weights_rebuilds_and_says_so(settings) -> None:
    """FAK_WEIGHTS changed between two starts: the same ledger computes other bytes, so the
    replay becomes the session's state (audited as model_changed), not a refusal."""
    from fak.kernel.model.quant import fbgemm_supported

    if not fbgemm_supported():
        pytest.skip("float16 weights need fbgemm (x86-64 torch)")
    with Kernel.open(settings.model_copy(update={"weights": "float32"}), progress=None) as k:
        s = k.session("acme")
        s.append("system", "You are a release assistant.")
        s.append("user", "What changed in 4.2?")
        sid, before = s.id, s.fingerprint()
    with Kernel.open(settings.model_copy(update={"weights": "float16"}), progress=None) as k:
        again = k.session("acme", sid)
        assert again.fingerprint() != before and again.fingerprint() == again.replay_fingerprint()
        assert [e.cause for e in events(k, "session_rebuilt")] == ["model_changed"]
        assert again.chat("Summarise.", max_tokens=3)  # and it serves
