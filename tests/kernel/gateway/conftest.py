"""The gateway's world: an upstream ``fak serve`` (the tiny model, a permissive policy of its
own) behind a recording proxy, and a gateway ``fak serve`` whose deployment declares it as the
model ``up`` (docs/gateway.md). Both are real servers on loopback; the gateway runs the default
policy with whole-context rules for send_email and transfer_money (``GATEWAY_RULES``), so the
upstream's calls are judged by it. (The tests force the upstream's calls with an ``enum`` in the
tool's schema: the value is then in the tools block, trusted, and the default's argument rules
would pass it; the whole-context rules hold it for what is in attention.)"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from support.upstream import PERMISSIVE_POLICY, RecordingProxy, recording_proxy

UPSTREAM_KEY_ENV = "GATEWAY_TEST_UPSTREAM_KEY"
GATEWAY_RULES = """    rules:
      - {id: email-after-untrusted, tools: [send_email], when_in_attention: {trust: [untrusted]}, verdict: CONFIRM}
      - {id: payment-after-untrusted, tools: [transfer_money], when_in_attention: {trust: [untrusted]}, verdict: DENY}
"""


@dataclass
class GatewayWorld:
    upstream: object  # fak.api.server.LiveServer
    proxy: RecordingProxy
    gateway: object  # fak.api.server.LiveServer
    upstream_key: str

    def key(self, tenant: str, role: str = "agent") -> str:
        return self.gateway.key(tenant, role)  # type: ignore[attr-defined]


@pytest.fixture
def gateway_world(tmp_path, tiny_dir, tiny_lm, monkeypatch) -> Iterator[GatewayWorld]:
    from fak import Kernel, Settings
    from fak.api.server import serve

    policy = tmp_path / "upstream-policy.yaml"
    policy.write_text(PERMISSIVE_POLICY)
    up_kernel = Kernel.open(Settings(data_dir=tmp_path / "up", model_path=tiny_dir, policy_path=policy, chunk_size=16),
                            model=tiny_lm, progress=None)
    try:
        with serve(up_kernel) as upstream, recording_proxy(upstream.url) as proxy:
            up_key = upstream.key("upstream-tenant", "agent")
            monkeypatch.setenv(UPSTREAM_KEY_ENV, up_key)
            from fak.kernel.facade import default_policy_path

            gw_policy = tmp_path / "gateway-policy.yaml"
            text = default_policy_path().read_text()
            assert "    rules: []\n" in text
            gw_policy.write_text(text.replace("    rules: []\n", GATEWAY_RULES, 1))
            settings = Settings(data_dir=tmp_path / "gw", model_path=tiny_dir, chunk_size=16, policy_path=gw_policy,
                                upstreams={"up": {"url": proxy.url + "/v1", "api_key_env": UPSTREAM_KEY_ENV,
                                                  "cache_salt": True, "timeout_s": 60}})
            gw_kernel = Kernel.open(settings, model=tiny_lm, progress=None)
            try:
                with serve(gw_kernel) as gateway:
                    yield GatewayWorld(upstream, proxy, gateway, up_key)
            finally:
                gw_kernel.close()
    finally:
        up_kernel.close()
