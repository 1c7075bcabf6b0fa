"""The served engine loop through real HTTP: two tenants' agents at once in batched steps get
the answers they get alone (nothing in a batch reads another session's rows), the engine's
series are in /metrics, and a server with no room left answers 429 with Retry-After."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import pytest

from fak import Kernel, Settings
from fak.api.server import serve
from fak.kernel.model.loader import LoadedModel, load_model

SYSTEM = "You are a booking assistant. Answer briefly."


@pytest.fixture(scope="module")
def gguf_lm(tiny_dir) -> LoadedModel:  # noqa: ANN001 - a conftest fixture
    return load_model(tiny_dir, weight_format="gguf")


def _served(tmp_path, tiny_dir, lm: LoadedModel, **options: object) -> Iterator[SimpleNamespace]:  # noqa: ANN001
    k = Kernel.open(Settings(data_dir=tmp_path / "data", model_path=tiny_dir, chunk_size=16, weights="gguf",
                             **options), model=lm, progress=None)
    try:
        with serve(k) as live:
            yield SimpleNamespace(url=live.url, kernel=k, keys={t: live.key(t, "agent") for t in ("acme", "globex")},
                                  auditor=live.key("acme", "auditor"))
    finally:
        k.close()


def _body(i: int, tokens: int) -> dict[str, object]:
    return {"model": "m", "temperature": 0, "max_tokens": tokens, "min_tokens": tokens,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": f"Find me a table for {i + 2} tonight, request {i}."}]}


def _ask(url: str, key: str, body: dict[str, object]) -> tuple[str, str]:
    with httpx.Client(base_url=url, trust_env=False, timeout=120) as h:
        r = h.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    out = r.json()
    return out["choices"][0]["message"]["content"], out["fak"]["fingerprint"]


def test_two_tenants_at_once_get_what_they_get_alone(tmp_path, tiny_dir, gguf_lm) -> None:
    server = _served(tmp_path, tiny_dir, gguf_lm)
    s = next(server)
    try:
        requests = [(tenant, i) for i in range(6) for tenant in ("acme", "globex")]
        alone = {(t, i): _ask(s.url, s.keys[t], _body(i, 20)) for t, i in requests}
        engine = s.kernel.services.engine
        before = engine.batched_rows
        together: dict[tuple[str, int], tuple[str, str]] = {}
        start = threading.Barrier(len(requests))

        def run(tenant: str, i: int) -> None:
            start.wait()
            together[(tenant, i)] = _ask(s.url, s.keys[tenant], _body(i, 20))

        threads = [threading.Thread(target=run, args=r) for r in requests]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert engine.batched_rows > before  # the requests did share steps
        assert together == alone  # same text, same fingerprint: no row read another session's
        with httpx.Client(base_url=s.url, trust_env=False, timeout=30) as h:
            text = h.get("/metrics", headers={"Authorization": f"Bearer {s.auditor}"}).text
        assert "fak_engine_batch_rows_bucket" in text and "fak_generation_queue_depth" in text
        count = next(line for line in text.splitlines() if line.startswith("fak_engine_batch_rows_count"))
        assert float(count.split()[-1]) > 0
    finally:
        server.close()


def test_no_room_left_answers_429_with_retry_after(tmp_path, tiny_dir, gguf_lm) -> None:
    server = _served(tmp_path, tiny_dir, gguf_lm, max_generating=1, max_generating_per_tenant=1,
                     generation_queue=0)
    s = next(server)
    try:
        headers = {"Authorization": f"Bearer {s.keys['acme']}"}
        long = _body(0, 4000) | {"stream": True}
        with httpx.Client(base_url=s.url, trust_env=False, timeout=60) as h, \
                h.stream("POST", "/v1/chat/completions", json=long, headers=headers) as first:
            assert first.status_code == 200
            lines = first.iter_lines()
            next(line for line in lines if line.startswith("data: ") and '"content"' in line)  # generating
            for tenant in ("acme", "globex"):  # the one place is taken: the queue holds nobody
                r = h.post("/v1/chat/completions", json=_body(1, 4),
                           headers={"Authorization": f"Bearer {s.keys[tenant]}"})
                assert r.status_code == 429, r.text
                assert int(r.headers["Retry-After"]) >= 1
                assert r.json()["error"]["type"] == "rate_limit_error"
                assert r.json()["type"].endswith("overloaded")
        # the stream was closed: its place is free again once the server saw the client leave
        deadline = time.monotonic() + 30
        with httpx.Client(base_url=s.url, trust_env=False, timeout=60) as h:
            while (r := h.post("/v1/chat/completions", json=_body(1, 4), headers=headers)).status_code == 429:
                assert time.monotonic() < deadline, "the closed stream never gave its place back"
                time.sleep(0.05)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
    finally:
        server.close()
