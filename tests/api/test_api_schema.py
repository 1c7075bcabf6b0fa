"""schemathesis over the published OpenAPI document, against a real server: generated
requests for every operation (and the coverage phase's edge cases), no 5xx, none
slower than the request timeout. Path ids are drawn half the time from objects that exist
(a session, a call fak held under a CONFIRM rule, a stored response), so the OpenAI door's
approve/reject and response routes are fuzzed against real state, not only 404s."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ST = str(Path(sys.executable).with_name("st"))
EXAMPLES = 170  # per operation: the smallest route group (forget: 3 operations) gets >= 500 requests
POLICY = """\
apiVersion: fak.dev/v1
kind: Policy
metadata: {name: fuzz}
spec:
  tool_calls:
    rules:
      - {id: pay-needs-a-person, tools: [pay], verdict: CONFIRM}
"""
PAY = {"type": "function", "function": {"name": "pay", "parameters": {
    "type": "object", "properties": {"amount": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["amount"], "additionalProperties": False}}}


@pytest.fixture
def settings(tmp_path, tiny_dir):  # conftest's, with a policy that holds calls of `pay`
    from fak import Settings

    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    return Settings(data_dir=tmp_path / "data", model_path=tiny_dir, chunk_size=16, policy_path=policy)


def test_schemathesis_finds_no_server_error(live_server, tmp_path) -> None:
    live = live_server
    key = live.key("fuzz", "admin")
    with live.client(key) as c:
        schema = c.get("/openapi.json")
        assert schema.status_code == 200
        # a session and a ref that exist, so that generated ids sometimes hit real objects
        sid = c.post("/v1/sessions", json={}).json()["id"]
        c.post(f"/v1/sessions/{sid}/messages", json={"role": "system", "content": "fuzz"})
    # the held calls come from an agent key's requests: the admin key that fuzzes may then decide them
    # (the key whose request produced a call may not approve it)
    with live.client(live.key("fuzz", "agent")) as agent:
        held = [agent.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "pay"}], "tools": [PAY], "max_tokens": 200,
            "tool_choice": "required", "temperature": 0, "seed": i, "fak_held_calls": "return"})
            .json()["choices"][0]["message"]["tool_calls"][0]["id"] for i in range(3)]
        assert all(h.startswith("call_held_") for h in held)
    with live.client(key) as c:
        stored = [c.post("/v1/responses", json={"model": "m", "input": f"hi {i}", "max_output_tokens": 4}).json()["id"]
                  for i in range(2)]
    path = tmp_path / "openapi.json"
    path.write_text(json.dumps(schema.json()))
    config = tmp_path / "schemathesis.toml"
    config.write_text(textwrap.dedent(f"""\
        [dictionaries.sessions]
        values = {json.dumps([sid])}
        [dictionaries.held]
        values = {json.dumps(held)}
        [dictionaries.responses]
        values = {json.dumps(stored)}
        [parameters]
        "path.sid" = {{ dictionary = "sessions", probability = 0.5 }}
        "path.call_id" = {{ dictionary = "held", probability = 0.5 }}
        "path.response_id" = {{ dictionary = "responses", probability = 0.5 }}
        """))
    run = subprocess.run(
        [ST, "--config-file", str(config), "run", str(path), "--url", live.url, "-H", f"Authorization: Bearer {key}",
         "-c", "not_a_server_error", "-n", str(EXAMPLES), "--request-timeout", "20", "--seed", "1",
         "--phases", "examples,coverage,fuzzing", "--no-color"],
        capture_output=True, text=True, timeout=1200,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    calls = re.search(r"(\d+) generated", out)
    assert calls is None or int(calls.group(1)) > 0, out[-2000:]
    # the fuzzer reached the real held calls: each got a person's decision, audited
    decided = {e.event.call_id for e in live.kernel.audit.entries("fuzz") if e.event.type == "tool_call_approval"}
    assert decided == set(held), (decided, held)
