"""The approvals webhook (docs/approvals.md): a signed notice of each new held call to the
deployment's receiver, a real HTTP server on loopback (``tests/support/webhook_receiver.py``),
with the tiny model behind a real fak server deciding the calls (greedy decode). The signature
is checked by the Standard Webhooks spec's own steps written out with ``hmac``, and those steps
against the spec's published test vector."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import httpx
import pytest
from standardwebhooks import Webhook
from support.webhook_receiver import Receiver, receiving, signature, verify

from fak.kernel.calls.held import HeldCall
from fak.kernel.calls.webhook import HeldCallWebhook, WebhookConfig, notice
from fak.settings import Settings, SettingsError

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # the spec's example secret (24 bytes)
SECRET_ENV = "APPROVALS_WEBHOOK_SECRET"
POLICY = """\
apiVersion: fak.dev/v1
kind: Policy
metadata: {name: approvals-webhook}
spec:
  defaults: {trust: untrusted}
  tool_calls:
    on_deny: refuse
    rules:
      - {id: no-mail, tools: [send_email], verdict: DENY}
      - {id: payments-need-a-person, tools: [pay], verdict: CONFIRM}
"""
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
    "additionalProperties": False}}}
MAIL = {"type": "function", "function": {"name": "send_email", "parameters": {
    "type": "object", "properties": {"to": {"enum": ["a@example.com"]}}, "required": ["to"],
    "additionalProperties": False}}}
PAY = {"type": "function", "function": {"name": "pay", "parameters": {
    "type": "object", "properties": {"iban": {"enum": ["DE89370400440532013000"]}}, "required": ["iban"],
    "additionalProperties": False}}}
USER = [{"role": "user", "content": "Do it."}]
DATA_KEYS = {"id", "tenant", "session_id", "tool", "verdict", "rule_id", "decision_audit_index", "produced_by",
             "created", "expires", "links"}


def test_the_signature_steps_reproduce_the_published_standard_webhooks_vector() -> None:
    """The spec's vector: the hand-written steps the tests verify with, and the library fak signs with."""
    expected = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    body = b'{"test": 2432232314}'
    assert signature(SECRET, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", body) == expected
    from datetime import UTC, datetime

    stamp = datetime.fromtimestamp(1614265330, UTC)
    assert Webhook(SECRET).sign("msg_p5jXN8AQM9LWM0D4loKWxJek", stamp, body) == expected
    assert signature(SECRET, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265331", body) != expected


# --- against a real server ------------------------------------------------------------------
@contextmanager
def fak_with_webhook(tmp_path, tiny_dir, tiny_lm, receiver: Receiver, **extra) -> Iterator[SimpleNamespace]:
    from fak import Kernel
    from fak.api.server import serve

    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    origin = receiver.url.split("/hooks")[0]
    settings = Settings(data_dir=tmp_path / "data", model_path=tiny_dir, chunk_size=16, policy_path=policy,
                        judge_egress=[origin + "/hooks"], approvals_webhook_url=receiver.url,
                        approvals_webhook_secret_env=SECRET_ENV, approvals_link_base="https://fak.example.com",
                        **extra)
    k = Kernel.open(settings, model=tiny_lm, progress=None)
    try:
        with serve(k) as live:
            yield SimpleNamespace(url=live.url, kernel=k, live=live, agent=live.key("acme", "agent"))
    finally:
        k.close()


def chat(fak: SimpleNamespace, tool: dict) -> tuple[dict, float]:
    """One greedy chat turn forced to call ``tool``: its body and how long it took."""
    started = time.monotonic()
    with httpx.Client(base_url=fak.url, trust_env=False, timeout=120) as c:
        r = c.post("/v1/chat/completions", headers={"Authorization": f"Bearer {fak.agent}"}, json={
            "model": "m", "messages": USER, "tools": [tool], "tool_choice": "required", "temperature": 0,
            "max_tokens": 160})
    assert r.status_code == 200, r.text
    return r.json(), time.monotonic() - started


def test_a_held_call_is_notified_once_signed_and_without_its_arguments(tmp_path, tiny_dir, tiny_lm, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, SECRET)
    with receiving(Receiver()) as receiver, fak_with_webhook(tmp_path, tiny_dir, tiny_lm, receiver) as fak:
        verdicts = [chat(fak, tool)[0]["fak"]["tool_calls"][0]["verdict"] for tool in (WEATHER, MAIL)]
        assert verdicts == ["ALLOW", "DENY"]
        answer, _ = chat(fak, PAY)
        [held] = answer["fak"]["tool_calls"]
        assert held["verdict"] == "CONFIRM" and held["held"]
        # notices go in order: one sent for the ALLOW or the DENY would have come first
        [got] = receiver.wait_for(1)
        time.sleep(0.5)
        assert len(receiver.received) == 1
        assert verify(SECRET, got) and got.headers["webhook-id"] == held["id"]
        assert abs(int(got.headers["webhook-timestamp"]) - time.time()) < 60
        body = json.loads(got.body)
        data = body["data"]
        assert body["type"] == "tool_call.held" and set(data) == DATA_KEYS  # no arguments, no findings
        assert (data["id"], data["tenant"], data["tool"], data["verdict"], data["rule_id"]) == (
            held["id"], "acme", "pay", "CONFIRM", "payments-need-a-person")
        assert data["session_id"] == answer["fak"]["session_id"] and answer["fak"]["ephemeral"]
        assert data["decision_audit_index"] == held["audit_index"] and data["produced_by"].startswith("key:")
        assert data["links"]["approve"] == f"https://fak.example.com/v1/tool-calls/{held['id']}/approve"
        assert data["links"]["console"] == f"https://fak.example.com/console/tool-calls/held/{held['id']}"
        assert b"DE89370400440532013000" not in got.body and b"iban" not in got.body
        # what the approver reads through the authenticated route: the arguments
        with fak.live.client(fak.live.key("acme", "approver")) as c:
            pending = c.get("/v1/tool-calls", params={"state": "pending"}).json()["data"]
            assert [p["id"] for p in pending] == [held["id"]]
            assert json.loads(pending[0]["tool_call"]["function"]["arguments"]) == {"iban": "DE89370400440532013000"}
        with fak.live.client(fak.live.key("acme", "auditor")) as c:
            scraped = c.get("/metrics").text
        assert 'fak_approval_webhooks_total{outcome="delivered"} 1.0' in scraped


def test_a_dead_receiver_neither_slows_nor_fails_the_request(tmp_path, tiny_dir, tiny_lm, monkeypatch):
    """A receiver that takes the connection and never answers: the request that held the call
    answers at once, and so does the next while the first notice still hangs."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    hang = threading.Event()
    with receiving(Receiver(hang=hang)) as receiver, fak_with_webhook(
            tmp_path, tiny_dir, tiny_lm, receiver, approvals_webhook_timeout_s=30, approvals_webhook_attempts=1) as fak:
        first, took_first = chat(fak, PAY)
        receiver.wait_for(1)  # the notice is in the receiver's hands, unanswered
        second, took = chat(fak, PAY)
        # answered while the delivery still waits (a notice sent in line would take the 30 s timeout)
        assert not hang.is_set() and took_first < 15 and took < 15
        assert first["fak"]["tool_calls"][0]["held"] and second["fak"]["tool_calls"][0]["held"]
        with fak.live.client(fak.live.key("acme", "approver")) as c:
            assert len(c.get("/v1/tool-calls").json()["data"]) == 2  # polling still sees both
        started = time.monotonic()
    assert time.monotonic() - started < 10  # closing does not wait for the hung notice


# --- delivery, retries and refusals (the delivery object on its own, a real receiver) ----------
def held_call(call_id: str = "call_held_0123456789abcdef01234567") -> HeldCall:
    return HeldCall(tenant="acme", session_id="chatcmpl-1", call_id=call_id, tool="pay", arguments={"iban": "X"},
                    rule_id="payments-need-a-person", offending=(), decision_index=7, created=time.time(),
                    producer="key:abc")


def deliveries(receiver: Receiver, queue_size: int = 1000, **config) -> tuple[HeldCallWebhook, list[tuple[str, str]]]:
    outcomes: list[tuple[str, str]] = []
    hook = HeldCallWebhook(WebhookConfig(url=receiver.url, secret=SECRET, backoff_s=0.05, timeout_s=5, **config),
                           lambda tenant, outcome: outcomes.append((tenant, outcome)), queue_size=queue_size)
    return hook, outcomes


def _settled(outcomes: list, n: int = 1) -> None:
    deadline = time.monotonic() + 10
    while len(outcomes) < n and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_5xx_is_retried_with_the_same_id_each_try_signed_anew() -> None:
    with receiving(Receiver(statuses=[500, 503])) as receiver:
        hook, outcomes = deliveries(receiver, attempts=5)
        hook.notify(held_call())
        _settled(outcomes)
        hook.close()
    assert outcomes == [("acme", "delivered")]
    assert len(receiver.received) == 3 and {r.headers["webhook-id"] for r in receiver.received} == {
        "call_held_0123456789abcdef01234567"}
    assert all(verify(SECRET, r) for r in receiver.received)
    assert len({r.body for r in receiver.received}) == 1  # the same notice, each try


def fate(statuses: list[int], attempts: int) -> tuple[list[tuple[str, str]], int]:
    """The outcome of one notice to a receiver answering ``statuses`` in turn, and its tries."""
    with receiving(Receiver(statuses=statuses)) as receiver:
        hook, outcomes = deliveries(receiver, attempts=attempts)
        hook.notify(held_call())
        _settled(outcomes)
        hook.close()
    return outcomes, len(receiver.received)


def test_tries_are_bounded_and_a_4xx_refusal_is_not_retried() -> None:
    assert fate([500] * 10, attempts=3) == ([("acme", "failed")], 3)
    assert fate([401, 200], attempts=3) == ([("acme", "refused")], 1)
    assert fate([429], attempts=3) == ([("acme", "delivered")], 2)  # too many requests: worth another try


def test_a_redirect_is_not_followed() -> None:
    """The receiver's answer cannot send a notice outside the egress allow-list."""
    assert fate([307, 307], attempts=2) == ([("acme", "failed")], 2)


def test_a_full_queue_drops_the_notice_and_never_blocks() -> None:
    with receiving(Receiver(hang=threading.Event())) as receiver:
        hook, outcomes = deliveries(receiver, queue_size=1)
        hook.notify(held_call("call_held_a"))
        receiver.wait_for(1)  # in flight, hanging: the next one waits in the queue, the one after has no room
        hook.notify(held_call("call_held_b"))
        started = time.monotonic()
        hook.notify(held_call("call_held_c"))
        assert time.monotonic() - started < 1 and outcomes == [("acme", "dropped")]
        hook.close(timeout_s=0.1)


def test_close_does_not_wait_for_a_try_in_flight_and_the_thread_closes_its_client() -> None:
    hang = threading.Event()
    with receiving(Receiver(hang=hang)) as receiver:
        hook, outcomes = deliveries(receiver)
        hook.notify(held_call())
        receiver.wait_for(1)
        started = time.monotonic()
        hook.close(timeout_s=0.2)
        assert time.monotonic() - started < 2 and not hook._client.is_closed  # the try still uses it
        hang.set()
        hook._thread.join(10)
    assert outcomes == [("acme", "delivered")] and hook._client.is_closed


def test_the_notice_names_the_call_and_where_to_decide_it() -> None:
    body = notice(held_call("call_held_x"), link_base="", ttl_s=60)
    assert set(body["data"]) == DATA_KEYS and "arguments" not in json.dumps(body)
    assert body["data"]["links"] == {"call": "/v1/tool-calls/call_held_x", "approve": "/v1/tool-calls/call_held_x/approve",
                                     "reject": "/v1/tool-calls/call_held_x/reject",
                                     "console": "/console/tool-calls/held/call_held_x"}


# --- settings -------------------------------------------------------------------------------
def test_a_receiver_outside_the_egress_allow_list_is_refused_when_settings_load(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    base = {"data_dir": tmp_path, "approvals_webhook_secret_env": SECRET_ENV}
    for egress, url in (([], "https://hooks.example.com/fak"),
                        (["https://judge.example.com"], "https://hooks.example.com/fak"),
                        (["https://hooks.example.com/other"], "https://hooks.example.com/fak"),
                        (["https://hooks.example.com"], "http://hooks.example.com/fak")):
        with pytest.raises(SettingsError, match="setting approvals_webhook_url: .*outside judge_egress"):
            Settings.load(judge_egress=egress, approvals_webhook_url=url, **base)
    ok = Settings.load(judge_egress=["https://hooks.example.com/fak"], approvals_webhook_url="https://hooks.example.com/fak/held", **base)
    config = WebhookConfig.from_settings(ok)
    assert config is not None and config.secret == SECRET and config.attempts == 5
    # a Settings changed without validation is checked again when the kernel builds the webhook
    with pytest.raises(SettingsError, match="approvals_webhook_url"):
        WebhookConfig.from_settings(ok.model_copy(update={"approvals_webhook_url": "https://evil.example.net/x"}))
    assert WebhookConfig.from_settings(Settings.load(data_dir=tmp_path)) is None  # off by default


def test_a_webhook_is_signed_or_refused(tmp_path, monkeypatch) -> None:
    where = {"data_dir": tmp_path, "judge_egress": ["https://hooks.example.com"],
             "approvals_webhook_url": "https://hooks.example.com/fak"}
    with pytest.raises(SettingsError, match="setting approvals_webhook_secret_env: .*signing secret"):
        Settings.load(**where)
    with pytest.raises(SettingsError, match="approvals_webhook_secret_env"):
        Settings.load(approvals_webhook_secret_env="FAK_MASTER_SECRET", **where)  # the server's own: never
    s = Settings.load(approvals_webhook_secret_env=SECRET_ENV, **where)
    monkeypatch.delenv(SECRET_ENV, raising=False)
    with pytest.raises(SettingsError, match=f"{SECRET_ENV} is not set"):
        WebhookConfig.from_settings(s)
    for bad in ("whsec_short", "not base64 at all!", "whsec_" + "A" * 200):
        monkeypatch.setenv(SECRET_ENV, bad)
        with pytest.raises(SettingsError, match="24 to 64"):
            WebhookConfig.from_settings(s)
