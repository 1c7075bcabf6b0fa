"""The agents' common prefix is computed once (issue 45, item 3), through the real HTTP server
and the real SmolLM2: requests of bench/serve.py's shape (streaming chat: a fixed system
prompt, the request's tools or none, a user question, an assistant tool call, its ~335-token
tool result, a question; ``support.agent_prefix``) are served the tokens they share with the
other requests from the tenant's prefix cache, and answer exactly what a server without a
prefix cache answers.

The shared tokens of a request are its longest common token prefix with any other request
of the run (the rendered prompts, read from the reference server's sessions); the rate is the
tokens served over the shared tokens of every request but one (somebody computes them once)."""

from __future__ import annotations

import re

import pytest
from support import agent_prefix as wl

REQUESTS = 4


def counter(live, key: str, name: str) -> float:  # noqa: ANN001
    with live.client(key) as c:
        text = c.get("/metrics").text
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, name
    return float(found.group(1))


@pytest.mark.real_model
@pytest.mark.parametrize("tools", [True, False], ids=["tools", "no-tools"])
def test_agents_share_their_common_prefix(tmp_path, smollm2, tools) -> None:
    """Four agents of one tenant send their first request at the same moment (a burst: no
    request has inserted anything when the others look up), then (with tools), on a fresh server,
    one after another. The segments every request carries (the system prompt, and the tools block when the
    request has tools) are computed once in all; with tools (what agent frameworks send) at
    least 0.9 of the shared tokens are served from the prefix cache. Without tools the requests
    share a few tokens of their first user message too (``What is the status of flight LH10``),
    inside a call that no request can know to cut there: those are computed, and the rate is
    below 0.9. Every answer, its logprobs and its KV fingerprint equal a server's without a prefix
    cache (bit-exact); /metrics shows the tenant's own served and computed rows, none to another
    tenant."""
    ref = wl.reference(tmp_path / "ref", smollm2, tools, REQUESTS)
    shared, whole = ref.shared, ref.whole
    assert all(w > 0 for w in whole) and not any(wl.served(ref.answers))
    for burst in (True, False) if tools else (True,):
        with wl.server(tmp_path / f"fak-{burst}", smollm2, prefix_cache=True) as live:
            answers = wl.run(live, tools, REQUESTS, burst=burst)
            served = wl.served(answers)
            auditor = live.key(wl.TENANT, "auditor")
            assert counter(live, auditor, "fak_prefix_cache_served_tokens_total") == sum(served)
            computed = counter(live, auditor, "fak_prefix_cache_computed_tokens_total")
            assert computed + sum(served) == sum(map(len, ref.prompts))  # every prompt row: copied or computed
            assert counter(live, live.key("globex", "auditor"), "fak_prefix_cache_served_tokens_total") == 0
        assert wl.same_answers(answers, ref.answers) and all(a["logprobs"] for a in answers)
        rate = wl.rate(served, shared)
        print(f"tools={tools} burst={burst}: shared {shared}, whole segments {whole}, served {served}, rate {rate:.3f}")
        assert all(s <= n for s, n in zip(served, shared, strict=True))
        # the segments all requests share were computed once in all (by one request, or part by one and
        # part by another when two started together)
        assert sum(max(w - s, 0) for s, w in zip(served, whole, strict=True)) == max(whole)
        if not burst:
            assert served[0] == 0 and all(s >= w for s, w in zip(served[1:], whole[1:], strict=True))
        if tools:
            assert rate >= 0.9
        else:
            assert sum(served) == sum(whole) - max(whole)  # the whole shared segments, nothing more
