"""Tenant isolation of the PIC registry through the HTTP API (issue 19, part 4): with a
policy that allows approximate reuse, tenant B sending tenant A's content after another
header gets no PIC hit and no prefix hit, while A sending the same gets both kinds of
reuse — so the probe can see a hit — and each tenant's scrape counts only its own."""

from __future__ import annotations

import re

import pytest

from fak.kernel.facade import default_policy_path

DOC = ("Release notes 4.2: the scheduler now retries failed jobs three times with exponential "
       "backoff; the web console shows per-queue latency; exports to Parquet keep column types; "
       "the CLI gained a --dry-run flag for migrations; deprecated v1 endpoints return 410. ") * 3
BODY = DOC + " Which of these changes affect the CLI?"
HEADER = "You are a release assistant."
SHIFTED = "Request 7f3a, locale en-GB, user 4411. You are a release assistant."


@pytest.fixture
def settings(settings, tmp_path):
    """conftest's settings with a policy that allows PIC (approximate reuse)."""
    path = tmp_path / "policy.yaml"
    text = default_policy_path().read_text()
    assert "pic_approximate: false" in text
    path.write_text(text.replace("pic_approximate: false", "pic_approximate: true"))
    return settings.model_copy(update={"policy_path": path})


def _counter(live, tenant: str, name: str) -> float:  # noqa: ANN001
    with live.client(live.key(tenant, "admin")) as c:
        r = c.get("/metrics")
    assert r.status_code == 200, r.text[:300]
    m = re.search(rf"^{name}_total (\S+)$", r.text, re.M)
    assert m, (name, r.text[:500])
    return float(m.group(1))


def _reuse(live, tenant: str, header: str) -> tuple[float, float]:  # noqa: ANN001
    """(PIC hit tokens of a new conversation of ``tenant``, prefix hit tokens of its first
    message). Later messages hit the session's own earlier segments, so only the first
    shows what the tenant's prefix namespace held before."""
    pic0, prefix0 = _counter(live, tenant, "fak_pic_hit_tokens"), _counter(live, tenant, "fak_prefix_cache_hit_tokens")
    prefix1 = prefix0
    with live.client(live.key(tenant, "agent")) as c:
        sid = c.post("/v1/sessions", json={}).json()["id"]
        for role, content in (("system", header), ("user", BODY)):
            r = c.post(f"/v1/sessions/{sid}/messages", json={"role": role, "content": content})
            assert r.status_code == 201, r.text[:300]
            if role == "system":
                prefix1 = _counter(live, tenant, "fak_prefix_cache_hit_tokens")
    return _counter(live, tenant, "fak_pic_hit_tokens") - pic0, prefix1 - prefix0


def test_identical_content_is_never_reused_across_tenants_through_the_api(live_server) -> None:
    live = live_server
    _reuse(live, "acme", HEADER)  # acme's chunks and prefix nodes are in the caches now
    k = live.kernel
    assert k.pic.entries(k.namespace("acme")), "acme's conversation must leave chunks to probe"
    evil_pic = _reuse(live, "evil", SHIFTED)[0]  # acme's body after another header
    evil_prefix = _reuse(live, "evil", HEADER)[1]  # acme's very first message
    acme_pic = _reuse(live, "acme", SHIFTED)[0]
    acme_prefix = _reuse(live, "acme", HEADER)[1]
    assert evil_pic == 0, f"evil was served {evil_pic} PIC tokens of acme's content"
    assert evil_prefix == 0, f"evil's first message was served {evil_prefix} prefix tokens"
    assert acme_pic > 0 and acme_prefix > 0, f"the probe must see both hits within a tenant: {acme_pic, acme_prefix}"
    # the same chunk bytes sit under both namespaces with different keys (the key covers the salt)
    evil_chunks = {e.tokens: e.id for e in k.pic.entries(k.namespace("evil"))}
    acme_chunks = {e.tokens: e.id for e in k.pic.entries(k.namespace("acme"))}
    shared = evil_chunks.keys() & acme_chunks.keys()
    assert shared and all(evil_chunks[t] != acme_chunks[t] for t in shared)
