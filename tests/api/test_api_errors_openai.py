"""Problems carry OpenAI's error envelope beside RFC 9457's members, so that the official
``openai`` client (which reads ``error.message``) shows why a request was refused. A real
uvicorn server on 127.0.0.1, tiny model."""

from __future__ import annotations

import httpx
import openai
import pytest

from fak.api.server import serve

MSGS = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def live(kernel):
    with serve(kernel) as server:
        yield server


def _client(live, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key=key, max_retries=0, timeout=60,
                         http_client=openai.DefaultHttpxClient(trust_env=False))


def _envelope(body: dict, status: int, kind: str, code: str, param: str | None) -> None:
    assert body["status"] == status and body["type"].endswith("/" + code)  # RFC 9457 members kept
    assert body["error"] == {"message": body["detail"], "type": kind, "param": param, "code": code}


def test_refused_parameter_shows_its_reason(live) -> None:
    c = _client(live, live.key("acme", "agent"))
    with pytest.raises(openai.BadRequestError) as bad:
        c.chat.completions.create(model="m", messages=MSGS, modalities=["audio"])
    assert "modalities: the model writes text only" in str(bad.value)  # was "Error code: 400" alone
    assert bad.value.code == "unsupported_parameter" and bad.value.param == "modalities"
    assert bad.value.type == "invalid_request_error"
    _envelope(bad.value.response.json(), 400, "invalid_request_error", "unsupported_parameter", "modalities")
    with pytest.raises(openai.BadRequestError) as bad:
        c.chat.completions.create(model="m", messages=MSGS, web_search_options={})
    assert "fak runs no web search" in str(bad.value) and bad.value.param == "web_search_options"


def test_request_validation_names_the_field(live) -> None:
    c = _client(live, live.key("acme", "agent"))
    with pytest.raises(openai.BadRequestError) as bad:
        c.chat.completions.create(model="m", messages=MSGS, temperature="hot")  # type: ignore[arg-type]
    assert bad.value.param == "temperature" and "temperature" in str(bad.value)
    _envelope(bad.value.response.json(), 400, "invalid_request_error", "invalid_input", "temperature")


def test_unauthenticated_carries_the_envelope(live) -> None:
    with pytest.raises(openai.AuthenticationError) as denied:
        _client(live, "fak_nope_nope").models.list()
    assert "API key" in str(denied.value) and denied.value.type == "authentication_error"
    r = denied.value.response
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    _envelope(r.json(), 401, "authentication_error", "unauthorized", None)


def test_forbidden_and_not_found(live) -> None:
    auditor = _client(live, live.key("acme", "auditor"))  # may read, not generate
    with pytest.raises(openai.PermissionDeniedError) as no:
        auditor.chat.completions.create(model="m", messages=MSGS)
    assert no.value.type == "permission_error" and no.value.code == "forbidden"
    with pytest.raises(openai.NotFoundError) as missing:
        _client(live, live.key("acme", "agent")).models.retrieve("no-such-model")
    assert missing.value.type == "not_found_error" and "no-such-model" in str(missing.value)


def test_unknown_route_says_so(live) -> None:
    key = live.key("acme", "agent")
    with httpx.Client(base_url=live.url, trust_env=False, timeout=30) as h:
        for headers in ({"Authorization": f"Bearer {key}"}, {}):  # the same answer with or without a key
            r = h.post("/v1/nonexistent", json={}, headers=headers)
            assert r.status_code == 404 and r.headers["content-type"].startswith("application/problem+json")
            body = r.json()
            assert body["detail"].startswith("no route POST /v1/nonexistent:"), body
            _envelope(body, 404, "not_found_error", "not_found", None)
        r = h.get("/v1/refs/" + "0" * 64, headers={"Authorization": f"Bearer {key}"})  # a route's own 404
        assert r.status_code in (400, 404) and "no route" not in r.json()["detail"]
        r = h.delete("/v1/policy", headers={"Authorization": f"Bearer {key}"})  # the route exists: 405
        assert r.status_code == 405 and "GET" in r.headers["allow"]
        _envelope(r.json(), 405, "invalid_request_error", "method_not_allowed", None)
    with pytest.raises(openai.NotFoundError) as gone:
        _client(live, key).post("/nonexistent", cast_to=object, body={})
    assert "no route POST /v1/nonexistent" in str(gone.value)
