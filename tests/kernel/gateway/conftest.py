"""The gateway's world: an upstream ``fak serve`` (the tiny model, a permissive policy of its
own) behind a recording proxy, and a gateway ``fak serve`` whose deployment declares it as the
model ``up`` (docs/gateway.md). Both are real servers on loopback; the gateway runs the default
policy, so the upstream's calls are judged by it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from support.upstream import PERMISSIVE_POLICY, RecordingProxy, recording_proxy

UPSTREAM_KEY_ENV = "GATEWAY_TEST_UPSTREAM_KEY"


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
            settings = Settings(data_dir=tmp_path / "gw", model_path=tiny_dir, chunk_size=16,
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
