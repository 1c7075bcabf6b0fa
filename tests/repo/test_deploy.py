"""The production image and compose file (docs/deploy.md) are what the page says.

Always, without a Docker daemon: the ``Dockerfile`` parses (``dockerfile-parse``), every ``COPY``
source exists, the torch and model pins are the Makefile's with the CPU index and ``--no-deps``,
the image runs as a user other than root and bakes in no secret, its ``CMD`` parses with the real
``fak`` parser and binds 0.0.0.0, the exposed port is ``compose.yaml``'s and ``fak serve``'s;
``compose.yaml`` is valid under the Compose Specification's JSON schema (``check-jsonschema``'s
vendored copy), has fak and PostgreSQL, the volumes and healthchecks the page names, and no
secret value. Where ``docker info`` answers (and the compose plugin is there), the stack is built
and started and ``/healthz`` answers through the published port."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from fak.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
SECRET_VARS = ("FAK_MASTER_SECRET", "FAK_AUDIT_SIGNING_KEY", "FAK_PG_PASSWORD", "POSTGRES_PASSWORD")


def _instructions() -> list[dict[str, Any]]:
    parser = DockerfileParser(path=str(ROOT / "Dockerfile"))
    return [i for i in parser.structure if i["instruction"] != "COMMENT"]


def _stages() -> list[list[dict[str, Any]]]:
    stages: list[list[dict[str, Any]]] = []
    for i in _instructions():
        if i["instruction"] == "FROM":
            stages.append([])
        stages[-1].append(i)
    return stages


def _makefile_pin(name: str) -> str:
    m = re.search(rf"^{name}\s*:=\s*(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert m, f"the Makefile defines no {name}"
    return m.group(1)


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def _exec_form(value: str) -> list[str]:
    words = json.loads(value)
    assert isinstance(words, list) and all(isinstance(w, str) for w in words), value
    return words


def _serve_args(argv: list[str]) -> Any:
    assert argv[:2] == ["fak", "serve"], argv
    return build_parser().parse_args(argv[1:])


def test_dockerfile_parses_into_two_stages() -> None:
    stages = _stages()
    assert len(stages) == 2, "a build stage and a runtime stage"
    assert all(s[0]["value"].startswith("python:3.11-slim") for s in stages)


def test_every_copy_source_exists() -> None:
    copies = [i for i in _instructions() if i["instruction"] == "COPY"]
    assert len(copies) >= 8
    local = [shlex.split(i["value"]) for i in copies if "--from=" not in i["value"]]
    sources = [src for words in local for src in words[:-1]]
    assert "pyproject.toml" in sources and "kernel" in sources
    missing = [s for s in sources if not (ROOT / s).exists()]
    assert missing == [], f"COPY sources missing from the repository: {missing}"
    # every package pyproject.toml maps is copied, or the install would miss one
    mapped = set(re.findall(r'"fak[\w.]*" = "(\w+)"', (ROOT / "pyproject.toml").read_text()))
    assert mapped and mapped <= set(sources), mapped - set(sources)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert not set(sources) & set(ignored), "a COPY source the .dockerignore leaves out of the context"


def test_pins_are_the_makefiles_torch_from_the_cpu_index() -> None:
    runs = [i["value"] for i in _stages()[0] if i["instruction"] == "RUN"]
    torch, model = _makefile_pin("TORCH"), _makefile_pin("MODEL")
    torch_runs = [r for r in runs if re.search(r"\btorch==", r)]
    assert len(torch_runs) == 1 and torch in shlex.split(torch_runs[0]), (torch, torch_runs)
    assert f"--index-url {CPU_INDEX}" in torch_runs[0]
    model_runs = [r for r in runs if model in shlex.split(r)]
    assert len(model_runs) == 1 and "--no-deps" in shlex.split(model_runs[0])
    fak_runs = [r for r in runs if '".[' in r]
    assert len(fak_runs) == 1
    # the Makefile's order: torch, then the model, then fak (which then pulls no other torch)
    assert runs.index(torch_runs[0]) < runs.index(model_runs[0]) < runs.index(fak_runs[0])


def test_runtime_runs_as_a_user_and_bakes_in_no_secret() -> None:
    runtime = _stages()[-1]
    users = [i["value"] for i in runtime if i["instruction"] == "USER"]
    assert users and users[-1] not in ("root", "0"), users
    text = (ROOT / "Dockerfile").read_text()
    for var in SECRET_VARS:
        assert var not in text, f"the Dockerfile names {var}"
    assert not re.search(r"master\.key|audit_signing\.key|PRIVATE\+KEY", text)


def test_cmd_is_fak_serve_on_all_interfaces_and_the_exposed_port() -> None:
    runtime = _stages()[-1]
    (cmd,) = [i["value"] for i in runtime if i["instruction"] == "CMD"]
    args = _serve_args(_exec_form(cmd))
    assert args.host == "0.0.0.0" and args.replicas == 1
    (expose,) = [i["value"] for i in runtime if i["instruction"] == "EXPOSE"]
    assert int(expose) == args.port == build_parser().parse_args(["serve"]).port
    (health,) = [i["value"] for i in runtime if i["instruction"] == "HEALTHCHECK"]
    assert f"127.0.0.1:{args.port}/healthz" in health


def test_compose_has_fak_and_postgres_with_volumes_and_healthchecks() -> None:
    compose = _compose()
    services = compose["services"]
    assert set(services) == {"fak", "db"}
    db, fak = services["db"], services["fak"]
    assert db["image"].startswith("postgres:") and "pg_isready" in db["healthcheck"]["test"]
    assert fak["build"] == "." and fak["depends_on"]["db"]["condition"] == "service_healthy"
    args = _serve_args(fak["command"])
    assert args.host == "0.0.0.0"
    (port,) = fak["ports"]
    host_ip, host_port, container_port = port.split(":")
    assert host_ip == "127.0.0.1" and int(container_port) == args.port, "published on the host's loopback only"
    expose = next(i["value"] for i in _stages()[-1] if i["instruction"] == "EXPOSE")
    assert int(container_port) == int(expose) and int(host_port) == args.port
    assert f"127.0.0.1:{args.port}/healthz" in " ".join(fak["healthcheck"]["test"])
    env = fak["environment"]
    assert env["FAK_DATABASE_URL"].startswith("postgresql+psycopg://") and "@db:5432/" in env["FAK_DATABASE_URL"]
    mounts = dict(v.split(":", 1) for v in fak["volumes"])
    assert mounts == {"fak-data": env["FAK_DATA_DIR"], "fak-keys": "/var/lib/fak-keys"}
    assert env["FAK_CAS_KEY_URL"] == "sqlite:////var/lib/fak-keys/cas-keys.db", "the key database on its own volume"
    assert set(compose["volumes"]) == {"fak-data", "fak-keys", "pg-data"}
    assert db["volumes"] == ["pg-data:/var/lib/postgresql/data"]


def _compose_spec_check(path: Path) -> subprocess.CompletedProcess[str]:
    """``compose.yaml`` against the Compose Specification's own JSON schema, as
    ``check-jsonschema`` vendors it (``vendor.compose-spec``): the syntax check that needs no
    Docker and no compose plugin."""
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
                           str(path)], capture_output=True, text=True, timeout=120)


def test_compose_file_is_valid_under_the_compose_specification(tmp_path: Path) -> None:
    checked = _compose_spec_check(ROOT / "compose.yaml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    misspelt = tmp_path / "compose.yaml"  # the same check refuses a key the specification lacks
    misspelt.write_text((ROOT / "compose.yaml").read_text().replace("healthcheck:", "healthchek:", 1))
    refused = _compose_spec_check(misspelt)
    assert refused.returncode != 0 and "healthchek" in refused.stdout, refused.stdout


def test_compose_names_secrets_only_by_required_variables() -> None:
    compose = _compose()
    for service in compose["services"].values():
        for name, value in service.get("environment", {}).items():
            if any(s in name for s in ("SECRET", "PASSWORD", "SIGNING_KEY")):
                assert re.fullmatch(r"\$\{[A-Z_]+:\?[^}]+\}", value), f"{name} must come from a required variable"
    url = compose["services"]["fak"]["environment"]["FAK_DATABASE_URL"]
    assert "${FAK_PG_PASSWORD:?" in url
    # the .env the page allows beside compose.yaml (the build context's root) is never sent to the builder
    assert {".env", ".env.*"} <= set((ROOT / ".dockerignore").read_text().split())


def test_deploy_page_names_the_files_and_ports() -> None:
    page = (ROOT / "docs" / "deploy.md").read_text()
    assert "fak serve --host 0.0.0.0 --port 8077" in page and "127.0.0.1:8077" in page
    for name in ("fak-data", "fak-keys", "pg-data", _makefile_pin("TORCH"), _makefile_pin("MODEL")):
        assert name in page, name


def test_uvicorn_proxy_defaults_are_as_documented(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/deploy.md, "TLS behind a reverse proxy": ``fak serve`` passes uvicorn nothing about
    proxies, so uvicorn's defaults decide which forwarded headers are trusted, from whom."""
    import inspect

    import uvicorn

    from fak.api import cli

    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)
    config = uvicorn.Config(app=lambda *a: None)
    assert config.proxy_headers is True and config.forwarded_allow_ips == "127.0.0.1,::1"
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "172.18.0.1")
    assert uvicorn.Config(app=lambda *a: None).forwarded_allow_ips == "172.18.0.1"
    call = inspect.getsource(cli._serve)
    assert "uvicorn.run(" in call and "proxy_headers" not in call and "forwarded_allow_ips" not in call


def _docker_ready() -> str | None:
    """None when a daemon answers and compose is installed, else why not."""
    if shutil.which("docker") is None:
        return "no docker client on this machine"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        return f"docker info failed (no daemon answers): {(info.stderr or info.stdout).strip()[:200]}"
    compose = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=60)
    if compose.returncode != 0:
        return "the docker compose plugin is not installed"
    return None


def test_compose_builds_and_serves_healthz(tmp_path: Path) -> None:
    """Build the image and start the stack (minutes: torch and the model are downloaded)."""
    why = _docker_ready()
    if why is not None:
        pytest.skip(f"Docker stack not started: {why}; the checks above ran without a daemon")
    import secrets

    project = f"fak-test-{secrets.token_hex(4)}"
    env = {"FAK_MASTER_SECRET": secrets.token_hex(32), "FAK_PG_PASSWORD": secrets.token_hex(16),
           "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path)}
    base = ["docker", "compose", "--project-name", project, "--file", str(ROOT / "compose.yaml")]
    config = subprocess.run([*base, "config", "--quiet"], env=env, capture_output=True, text=True, timeout=120)
    assert config.returncode == 0, config.stderr
    try:
        up = subprocess.run([*base, "up", "--detach", "--build", "--wait"], env=env, capture_output=True,
                            text=True, timeout=3600)
        assert up.returncode == 0, up.stderr[-4000:]
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen("http://127.0.0.1:8077/healthz", timeout=5) as r:
                    assert r.status == 200
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(2)
        user = subprocess.run([*base, "exec", "-T", "fak", "id", "-u"], env=env, capture_output=True, text=True)
        assert user.stdout.strip() == "10001"
    finally:
        subprocess.run([*base, "down", "--volumes"], env=env, capture_output=True, timeout=600)
