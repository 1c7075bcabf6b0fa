"""Issue 25.6: where a late-detector judge may send tool results and which key it may send.

Egress destinations and the environment variables a policy may name are the deployment's
settings (``judge_egress``, ``judge_key_envs``; empty by default: no judge egress), never
the policy's: a policy replaced over ``PUT /v1/policy`` that names anything else is refused
at its line. Which tenants' results a judge sees is the policy's (``tenants``), audited in
``policy_loaded``. Everything here goes through a real uvicorn server and real judge servers
on 127.0.0.1 (``tests/late_models.JudgeStub``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.kernel_facade_helpers import events
from support.late_models import JudgeStub

from fak.kernel.facade import default_policy_path

ACME_TEXT = "Flight LH123 on time, acme's itinerary 7f3a."
GLOBEX_TEXT = "Payroll run for globex: account 0042-9917, approved."


def _origin(url: str) -> str:
    return url.split("/v1", 1)[0]  # http://127.0.0.1:<port>


def judge_policy(url: str, *, tenants: str | None = "[acme]", api_key_env: str | None = None) -> str:
    """A policy whose only late detector is a judge at ``url``. Line numbers (1-based):
    7 ``- id: judge``, 9 ``url``, then ``tenants`` and ``api_key_env`` in that order."""
    lines = ["apiVersion: fak.dev/v1", "kind: Policy", "metadata: {name: egress-test}", "spec:",
             "  defaults: {trust: untrusted}", "  late_detectors:", "    - id: judge", "      kind: judge",
             f"      url: \"{url}\""]
    if tenants is not None:
        lines.append(f"      tenants: {tenants}")
    if api_key_env is not None:
        lines.append(f"      api_key_env: {api_key_env}")
    return "\n".join(lines) + "\n"


def line_of(text: str, prefix: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.strip().startswith(prefix))


@pytest.fixture
def judge() -> Iterator[JudgeStub]:
    stub = JudgeStub()
    yield stub
    stub.close()


@pytest.fixture
def elsewhere() -> Iterator[JudgeStub]:
    """A second real judge server that the deployment never allowed."""
    stub = JudgeStub()
    yield stub
    stub.close()


@pytest.fixture
def settings(settings, tmp_path, judge):  # noqa: ANN001
    """A writable policy file, operator tenant acme, and ``judge`` (only) allow-listed."""
    path = tmp_path / "policy.yaml"
    path.write_bytes(default_policy_path().read_bytes())
    return settings.model_copy(update={"policy_path": path, "operator_tenant": "acme",
                                       "judge_egress": [_origin(judge.url)], "judge_key_envs": ["JUDGE_KEY"]})


def _admit(live, tenant: str, text: str) -> str:  # noqa: ANN001
    with live.client(live.key(tenant, "agent")) as c:
        sid = c.post("/v1/sessions").json()["id"]
        r = c.post(f"/v1/sessions/{sid}/tool-results", json={"tool": "web_fetch", "content": text})
        assert r.status_code == 201, r.text
        return r.json()["ref"]


def _put(live, text: str):  # noqa: ANN001, ANN202
    with live.client(live.key("acme", "admin")) as c:
        return c.put("/v1/policy", json={"text": text})


def _errors_at(body: dict, line: int) -> list[str]:
    return [e for e in body.get("errors", []) if e.split(":")[1] == str(line)]


# --- the attacks of issue 25.6, over a real HTTP server ------------------------------------
def test_put_policy_with_a_judge_url_not_allow_listed_is_refused_at_its_line(live_server, elsewhere):
    k = live_server.kernel
    before = k.policy.digest
    text = judge_policy(elsewhere.url, tenants=None)  # what an operator key could PUT before the fix
    r = _put(live_server, text)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"].endswith("/policy_invalid")
    (err,) = _errors_at(body, line_of(text, "url:"))
    assert "judge_egress" in err and _origin(elsewhere.url) in err, err
    assert k.policy.digest == before
    _admit(live_server, "acme", ACME_TEXT)
    assert k.wait_late(10) and elsewhere.requests == []  # nothing ever left for the unlisted host


@pytest.mark.parametrize("variable", ["FAK_MASTER_SECRET", "FAK_DATA_DIR", "HOME"])
def test_put_policy_naming_a_variable_off_the_allow_list_is_refused(live_server, judge, monkeypatch,
                                                                      variable):
    monkeypatch.setenv("FAK_MASTER_SECRET", "ab" * 32)  # what a leak would have sent
    k = live_server.kernel
    before = k.policy.digest
    text = judge_policy(judge.url, tenants=None, api_key_env=variable)
    r = _put(live_server, text)
    assert r.status_code == 400, r.text
    (err,) = _errors_at(r.json(), line_of(text, "api_key_env:"))
    assert variable in err and "judge_key_envs" in err, err
    with live_server.client(live_server.key("acme", "auditor")) as c:  # validate says the same
        v = c.post("/v1/policy/validate", json={"text": text})
    assert v.status_code == 400 and _errors_at(v.json(), line_of(text, "api_key_env:")), v.text
    assert k.policy.digest == before
    _admit(live_server, "acme", ACME_TEXT)
    assert k.wait_late(10) and judge.requests == []
    assert all(os.environ.get(variable, "") not in str(req) for req in judge.requests)


def test_a_judge_scoped_to_one_tenant_never_receives_another_tenants_results(live_server, judge):
    k = live_server.kernel
    r = _put(live_server, judge_policy(judge.url, tenants="[acme]"))
    assert r.status_code == 200, r.text
    _admit(live_server, "globex", GLOBEX_TEXT)
    _admit(live_server, "acme", ACME_TEXT)
    _admit(live_server, "globex", GLOBEX_TEXT + " (2)")
    assert k.wait_late(10)
    seen = [req["body"]["messages"][-1]["content"] for req in judge.requests]
    assert len(seen) == 1 and ACME_TEXT in seen[0]
    assert not any("globex" in s for s in seen)
    # widened explicitly by the policy: now globex's results go there too
    assert _put(live_server, judge_policy(judge.url, tenants="all")).status_code == 200
    _admit(live_server, "globex", GLOBEX_TEXT + " (3)")
    assert k.wait_late(10) and any(GLOBEX_TEXT in req["body"]["messages"][-1]["content"] for req in judge.requests)


def test_the_judges_destination_and_tenant_scope_are_in_the_audit_log(live_server, judge):
    k = live_server.kernel
    assert _put(live_server, judge_policy(judge.url, tenants="[acme, initech]")).status_code == 200
    loaded = events(k, "policy_loaded")[-1]
    assert loaded.principal and loaded.principal.startswith("key:")
    (scope,) = loaded.judges
    assert scope.detector_id == "judge" and scope.destination == _origin(judge.url)
    assert scope.tenants == ["acme", "initech"] and scope.all_tenants is False
    assert _put(live_server, judge_policy(judge.url, tenants="all")).status_code == 200
    (scope,) = events(k, "policy_loaded")[-1].judges
    assert scope.all_tenants is True and scope.tenants == []


def test_a_judge_must_name_the_tenants_it_sees(live_server, judge):
    """No default scope: a judge without ``tenants`` is refused at its line (closed and loud,
    rather than silently sending every tenant's results, or silently judging nothing)."""
    text = judge_policy(judge.url, tenants=None)
    r = _put(live_server, text)
    assert r.status_code == 400
    (err,) = _errors_at(r.json(), line_of(text, "- id: judge"))
    assert "tenants" in err, err
    for bad, why in (("[]", "names no tenant"), ("[all]", "tenants: all"), ("'*'", "tenants")):
        text = judge_policy(judge.url, tenants=bad)
        r = _put(live_server, text)
        assert r.status_code == 400, (bad, r.text)
        assert any(why in e for e in r.json()["errors"]), (bad, r.json()["errors"])


# --- the loader, the settings, the runner and the kernel ----------------------------------
def test_egress_matching() -> None:
    from fak.policy.egress import JudgeEgress

    egress = JudgeEgress.of(["http://127.0.0.1:8000", "https://Judge.Example.com/v1", "https://api.example.org/"],
                            ["JUDGE_KEY"])
    allowed = ["http://127.0.0.1:8000/v1", "http://127.0.0.1:8000", "https://judge.example.com/v1",
               "https://judge.example.com:443/v1/chat/completions", "https://api.example.org/x"]
    refused = ["http://127.0.0.1:8001/v1", "https://127.0.0.1:8000/v1", "http://localhost:8000/v1",
               "https://judge.example.com/v2", "https://judge.example.com/v1evil", "http://judge.example.com/v1",
               "https://judge.example.com.evil.net/v1", "https://api.example.org:444/x"]
    assert [u for u in allowed if not egress.allows_url(u)] == []
    assert [u for u in refused if egress.allows_url(u)] == []
    assert egress.allows_key_env("JUDGE_KEY") and not egress.allows_key_env("judge_key")
    assert not JudgeEgress.of([], []).allows_url("http://127.0.0.1:8000/v1")  # closed by default
    for bad in ["ftp://x", "http://", "http://user:pw@host", "http://h/v1?x=1", "http://h/#f", "host:80", ""]:
        with pytest.raises(ValueError):
            JudgeEgress.of([bad], [])
    for bad in ["FAK_MASTER_SECRET", "fak_data_dir", "1X", "A-B", ""]:
        with pytest.raises(ValueError):
            JudgeEgress.of([], [bad])


def test_settings_refuse_fak_variables_and_bad_destinations(monkeypatch) -> None:
    from fak.settings import Settings, SettingsError

    monkeypatch.setenv("FAK_JUDGE_KEY_ENVS", '["FAK_MASTER_SECRET"]')
    with pytest.raises(SettingsError, match="judge_key_envs.*FAK_"):
        Settings.load()
    monkeypatch.setenv("FAK_JUDGE_KEY_ENVS", '["JUDGE_KEY"]')
    monkeypatch.setenv("FAK_JUDGE_EGRESS", '["http://judge.internal:8000/v1"]')
    s = Settings.load()
    assert s.judge_egress == ["http://judge.internal:8000/v1"] and s.judge_key_envs == ["JUDGE_KEY"]
    monkeypatch.setenv("FAK_JUDGE_EGRESS", '["http://a@judge.internal/"]')
    with pytest.raises(SettingsError, match="judge_egress"):
        Settings.load()
    monkeypatch.delenv("FAK_JUDGE_EGRESS")
    monkeypatch.delenv("FAK_JUDGE_KEY_ENVS")
    assert Settings().judge_egress == [] and Settings().judge_key_envs == []  # closed by default


def test_loader_refuses_unlisted_egress_at_the_line_and_is_closed_by_default() -> None:
    from fak.policy import PolicyError, load_policy_text
    from fak.policy.egress import JudgeEgress

    text = judge_policy("http://127.0.0.1:8000/v1", api_key_env="JUDGE_KEY")
    with pytest.raises(PolicyError) as exc:
        load_policy_text(text, "p.yaml")  # no egress given: nothing is allowed
    lines = sorted(p.line for p in exc.value.problems)
    assert lines == [line_of(text, "url:"), line_of(text, "api_key_env:")], exc.value
    ok = JudgeEgress.of(["http://127.0.0.1:8000"], ["JUDGE_KEY"])
    p = load_policy_text(text, "p.yaml", egress=ok)
    assert p.spec.late_detectors[0].tenants == ["acme"]
    with pytest.raises(PolicyError, match=r"p.yaml:9:\d+: .*judge_egress"):
        load_policy_text(judge_policy("http://127.0.0.1:8000@evil.example/v1"), "p.yaml", egress=ok)
    classifier = ("apiVersion: fak.dev/v1\nkind: Policy\nmetadata: {name: c}\nspec:\n  late_detectors:\n"
                  "    - {id: c, kind: classifier, path: /models/x, tenants: [acme]}\n")
    with pytest.raises(PolicyError, match="tenants"):
        load_policy_text(classifier, "c.yaml")  # a local classifier sends nothing anywhere: no scope
    assert load_policy_text(classifier.replace(", tenants: [acme]", ""), "c.yaml").spec.late_detectors[0].kind \
        == "classifier"  # a classifier needs no egress


def test_runner_sends_a_job_only_to_judges_whose_scope_has_its_tenant() -> None:
    import time

    from fak.policy.late import LateFinding, LateJob, LateRunner, applies
    from fak.policy.schema import LateDetectorRule

    class Seen:
        def __init__(self, rule: LateDetectorRule) -> None:
            self.rule, self.texts = rule, []

        def detect(self, text: str) -> LateFinding | None:
            self.texts.append(text)
            return None

    acme = Seen(LateDetectorRule(id="a", kind="judge", url="http://127.0.0.1:9", tenants=["acme"]))
    every = Seen(LateDetectorRule(id="e", kind="judge", url="http://127.0.0.1:9", tenants="all"))
    local = Seen(LateDetectorRule(id="c", kind="classifier", path="/x"))
    assert applies(acme.rule, "web", "untrusted", "acme") and not applies(acme.rule, "web", "untrusted", "globex")
    runner = LateRunner(lambda job, f: None)
    try:
        runner.set_detectors([acme])
        job = LateJob("globex", "s", "r1", "web", "untrusted", "globex secret", time.time())
        assert not runner.submit(job)  # no detector may see globex: not even queued
        runner.set_detectors([acme, every, local])
        assert runner.submit(job) and runner.submit(LateJob("acme", "s", "r2", "web", "untrusted", "acme", time.time()))
        assert runner.wait_idle(10)
    finally:
        runner.close()
    assert acme.texts == ["acme"] and every.texts == ["globex secret", "acme"] and local.texts == every.texts


def test_kernel_refuses_to_start_on_a_policy_with_an_unlisted_judge(tmp_path: Path, tiny_dir: Path, tiny_lm) -> None:
    from fak import Kernel, Settings
    from fak.policy import PolicyError

    policy = tmp_path / "policy.yaml"
    policy.write_text(judge_policy("http://judge.example:8000/v1"))
    with pytest.raises(PolicyError, match=r"policy.yaml:9:\d+: .*judge_egress"):
        Kernel.open(Settings(data_dir=tmp_path / "data", model_path=tiny_dir, policy_path=policy),
                    model=tiny_lm, progress=None)
    k = Kernel.open(Settings(data_dir=tmp_path / "data", model_path=tiny_dir, policy_path=policy,
                             judge_egress=["http://judge.example:8000"]), model=tiny_lm, progress=None)
    try:
        (scope,) = events(k, "policy_loaded")[-1].judges
        assert (scope.destination, scope.tenants) == ("http://judge.example:8000", ["acme"])
    finally:
        k.close()


def test_policy_check_cli_reads_the_deployments_allow_list(tmp_path: Path, monkeypatch, capsys) -> None:
    from fak.cli import main

    policy = tmp_path / "p.yaml"
    policy.write_text(judge_policy("http://judge.example:8000/v1"))
    monkeypatch.delenv("FAK_JUDGE_EGRESS", raising=False)
    assert main(["policy", "check", str(policy)]) == 1
    assert "judge_egress" in capsys.readouterr().err
    monkeypatch.setenv("FAK_JUDGE_EGRESS", '["http://judge.example:8000"]')
    assert main(["policy", "check", str(policy)]) == 0


def test_policy_loaded_judge_scope_shape() -> None:
    from fak.audit import AuditError, canonical, parse_event, to_event

    P = "blake3:" + "0" * 64
    old = {"type": "policy_loaded", "policy_id": "p", "policy_digest": P, "ts": 1}
    assert canonical(parse_event(canonical(to_event(old)))) == canonical(to_event(old))  # old entries unchanged
    assert b"judges" not in canonical(to_event(old))
    ok = {**old, "judges": [{"detector_id": "j", "destination": "https://judge.example.com:443", "tenants": ["acme"]},
                            {"detector_id": "k", "destination": "http://[::1]:8000", "all_tenants": True}]}
    event = parse_event(canonical(to_event(ok)))
    assert [j.destination for j in event.judges] == ["https://judge.example.com:443", "http://[::1]:8000"]
    for bad in ({"destination": "https://judge.example.com:443/v1"}, {"destination": "judge.example.com"},
                {"destination": "https://a b:1"}, {"tenants": ["has space"]}, {"secret": "x"}):
        judge = {"detector_id": "j", "destination": "https://h:1", **bad}
        with pytest.raises(AuditError):
            to_event({**old, "judges": [judge]})
