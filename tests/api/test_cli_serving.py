"""The CLI on a data directory a real ``fak serve`` is running on (issue 25.1).

Every CLI command that touches the data directory is run against a live server's data
directory; afterwards the server is SIGKILLed and restarted, and everything it
acknowledged must still be there: sessions, admissions, audit entries (the export
verifies and extends the one taken while serving), and the signer is not in alarm.
Commands that would need the data directory to themselves (a second Kernel: forget
resumption, sweeper, in-memory sessions) refuse, naming the server's pid. A second
``fak serve`` on the same data directory refuses to start; SIGKILL frees the directory.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from support.serve_process import FAK, ServeProcess


def _env(data_dir: Path, tiny_dir: Path) -> dict[str, str]:
    return os.environ | {"FAK_DATA_DIR": str(data_dir), "FAK_MODEL_PATH": str(tiny_dir), "FAK_CHUNK_SIZE": "16"}


def _fak(args: list[str], env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([FAK, *args], input=stdin, capture_output=True, text=True, env=env, timeout=300)


def _ok(args: list[str], env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess:
    r = _fak(args, env, stdin)
    assert r.returncode == 0, f"fak {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


class Server(ServeProcess):
    """``fak serve`` in its own process on a free loopback port, with API clients."""

    def client(self, key: str) -> httpx.Client:
        return httpx.Client(base_url=self.base, headers={"Authorization": f"Bearer {key}"}, timeout=60,
                            trust_env=False)


@dataclass
class Acked:
    """What the server acknowledged: sessions with their segment ids, admissions by audit index."""

    sessions: dict[str, list[str]] = field(default_factory=dict)
    admissions: dict[int, str] = field(default_factory=dict)  # audit index -> ref

    def work(self, c: httpx.Client, tag: str, n: int = 2) -> None:
        for i in range(n):
            r = c.post("/v1/sessions", json={"id": f"{tag}-{i}"})
            assert r.status_code == 201, r.text
            sid = r.json()["id"]
            self.sessions[sid] = []
            r = c.post(f"/v1/sessions/{sid}/messages", json={"role": "user", "content": f"trip {tag} {i}?"})
            assert r.status_code == 201, r.text
            self.sessions[sid].append(r.json()["id"])
            for j in range(2):
                r = c.post(f"/v1/sessions/{sid}/tool-results",
                           json={"tool": "flight_status", "content": f"Flight LH{i}{j} ({tag}) is on time."})
                assert r.status_code == 201, r.text
                a = r.json()
                self.sessions[sid].append(a["segment"]["id"])
                self.admissions[a["audit_index"]] = a["ref"]

    def check(self, c: httpx.Client) -> None:
        listed = c.get("/v1/sessions").json()["sessions"]
        assert set(self.sessions) <= set(listed), f"sessions lost: {set(self.sessions) - set(listed)}"
        for sid, segments in self.sessions.items():
            r = c.get(f"/v1/sessions/{sid}")
            assert r.status_code == 200, r.text
            have = [s["id"] for s in r.json()["segments"]]
            assert all(s in have for s in segments), f"session {sid} lost segments"
        entries: dict[int, dict] = {}
        start: int | None = 0
        while start is not None:
            page = c.get("/v1/audit/entries", params={"start": start, "limit": 1000}).json()
            entries.update({e["index"]: json.loads(e["event"]) for e in page["entries"]})
            start = page["next_start"]
        for index, ref in self.admissions.items():
            assert index in entries, f"admission at audit index {index} lost"
            assert entries[index]["type"] == "admission_verdict" and entries[index]["ref"] == ref


def _export_indexes(path: Path) -> list[int]:
    return [int(line.split(" ", 2)[1]) for line in path.read_text().splitlines() if line.startswith("e ")]


def test_cli_while_serving_loses_nothing(tmp_path, tiny_dir) -> None:
    env = _env(tmp_path / "data", tiny_dir)
    key = json.loads(_ok(["keys", "create", "--tenant", "acme", "--role", "admin", "--json"], env).stdout)["key"]
    acked = Acked()
    first_export, final_export = tmp_path / "during.export", tmp_path / "final.export"
    server = Server(env, tmp_path / "server.log")
    try:
        server.wait_up()
        started = (tmp_path / "server.log").read_text()  # what it says it loaded (api/startup.py)
        assert f"fak serve on {server.base}" in started and "1 active API key" in started, started
        with server.client(key) as c:
            acked.work(c, "before")
            ref = next(iter(acked.admissions.values()))
            pubkey = c.get("/v1/audit/checkpoint").json()["public_key"]
        pid = server.proc.pid
        blob = tmp_path / "blob.txt"
        blob.write_text("a file put with the CLI")
        # read-only or transactional commands: they work while the server runs
        _ok(["keys", "list"], env)
        other = json.loads(_ok(["keys", "create", "--tenant", "other", "--role", "agent", "--json"], env).stdout)
        _ok(["keys", "revoke", other["key_id"]], env)
        assert set(json.loads(_ok(["sessions", "--tenant", "acme", "--json"], env).stdout)) == set(acked.sessions)
        assert set(json.loads(_ok(["sessions", "--json"], env).stdout)["acme"]) == set(acked.sessions)  # every tenant's
        _ok(["audit", "pubkey"], env)
        _ok(["audit", "checkpoint"], env)
        _ok(["audit", "proof", "0"], env)
        _ok(["audit", "export", str(first_export)], env)
        _ok(["audit", "verify", str(first_export), "--pubkey", pubkey], env)
        _ok(["cas", "head", ref, "--tenant", "acme"], env)
        _ok(["cas", "get", ref, "--tenant", "acme", "-o", str(tmp_path / "got")], env)
        _ok(["cas", "put", str(blob), "--tenant", "other"], env)
        _ok(["cas", "keks"], env)
        _ok(["cas", "rotate"], env)
        _ok(["cas", "destroy-retired", "--older-than", "7d"], env)
        _ok(["cas", "fsck"], env)
        _ok(["cas", "scrub"], env)
        _ok(["witness", "pubkey"], env)
        with server.client(key) as c:  # the operator's answer to a signer alarm works beside the server too
            size = c.get("/v1/audit/checkpoint").json()["size"]
        _ok(["audit", "signer-reset", "--accept-size", str(size), "--principal", "test"], env)
        # commands that would run a second Kernel (forget resumption, in-memory sessions): refused
        for args, stdin in ((["chat", "--tenant", "other"], ""),
                            (["forget", "blake3k:" + "0" * 64, "--tenant", "other"], ""),
                            (["quarantine", "blake3k:" + "0" * 64, "--tenant", "other", "--reason", "late"], ""),
                            (["erase-tenant", "other", "--confirm", "other"], ""),
                            (["cas", "forget", "blake3k:" + "0" * 64, "--tenant", "other"], ""),
                            (["cas", "erase-tenant", "other", "--confirm", "other"], "")):
            r = _fak(args, env, stdin)
            assert r.returncode != 0 and f"pid {pid}" in r.stderr, f"fak {' '.join(args)}: {r.stderr}"
        with server.client(key) as c:
            acked.work(c, "after")
            acked.check(c)
        server.kill()  # SIGKILL: nothing acknowledged may depend on a clean stop
        server = Server(env, tmp_path / "server.log")
        server.wait_up()
        with server.client(key) as c:
            acked.check(c)
            assert c.get("/v1/audit/checkpoint").status_code == 200  # no signer alarm
        server.stop()
        _ok(["audit", "export", str(final_export)], env)
        _ok(["audit", "verify", str(final_export), "--pubkey", pubkey, "--since", str(first_export)], env)
        indexes = _export_indexes(final_export)
        assert indexes == list(range(len(indexes))) and max(acked.admissions) < len(indexes)
        server = Server(env, tmp_path / "server.log")  # after a graceful stop too: no alarm, nothing lost
        server.wait_up()
        with server.client(key) as c:
            assert c.get("/v1/audit/checkpoint").status_code == 200, (tmp_path / "server.log").read_text()
            acked.check(c)
        assert "ALARM" not in (tmp_path / "server.log").read_text()
    finally:
        server.stop()


def test_second_server_refuses_and_sigkill_frees_the_data_dir(tmp_path, tiny_dir) -> None:
    env = _env(tmp_path / "data", tiny_dir)
    first = Server(env, tmp_path / "first.log")
    second = None
    try:
        first.wait_up()
        second = Server(env, tmp_path / "second.log")
        assert second.proc.wait(timeout=120) != 0, "a second server started on the same data directory"
        err = (tmp_path / "second.log").read_text()
        assert f"pid {first.proc.pid}" in err and "fak serve" in err, err
        first.kill()
        second = Server(env, tmp_path / "second.log")
        second.wait_up()  # the lock died with the killed server
    finally:
        first.stop()
        if second is not None:
            second.stop()
