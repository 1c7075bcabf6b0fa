"""Key and audit commands run without the model: ``fak cas rotate`` on a host's cron, ``fak keys
list`` on an admin box, ``fak audit export`` for an auditor must not pay for (or need) torch,
and must not pull in the model package or the Kernel. Each runs for real, through
``fak.cli.main``, in a fresh interpreter (a test process has long imported torch), on a fresh
data directory, with the serving default for the weight format (``FAK_WEIGHTS`` unset: the
default is the one that used to be resolved by asking torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = r"""
import contextlib, io, json, sys
from fak.cli import main

MODEL = ("torch", "fak.kernel.session.kernel_session", "fak.kernel.facade", "fak.kernel.demo")
# the packages and command registrations every ``fak`` command imports to build its parser
REGISTRATIONS = ("fak.kernel.model", "fak.kernel.model.cli")
report = []
for argv in json.loads(sys.argv[1]):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(argv)
    loaded = sorted(m for m in sys.modules if m in MODEL or m.startswith("torch.")
                    or (m.startswith(("fak.kernel.model.", "fak.kernel.kv")) and m not in REGISTRATIONS))
    report.append({"argv": argv, "rc": rc, "loaded": loaded[:8], "out": buf.getvalue()})
print(json.dumps(report))
"""


def test_key_and_audit_commands_do_not_import_torch(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if k != "FAK_WEIGHTS"}
    env["FAK_DATA_DIR"] = str(data)
    commands = [
        ["cas", "put", "-", "--tenant", "acme"],  # a keyed blob: its tenant gets a KEK to rotate
        ["cas", "rotate"],
        ["cas", "destroy-retired", "--older-than", "0"],
        ["keys", "create", "--tenant", "acme", "--role", "admin"],
        ["keys", "list"],
        ["audit", "export", str(tmp_path / "export.json")],
    ]
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(commands)], env=env,
                          input=b"a tool result\n", capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(done.stdout.decode().splitlines()[-1])
    for step in report:
        assert step["rc"] == 0, step
        assert step["loaded"] == [], f"fak {' '.join(step['argv'])} imported {step['loaded']}"
    rotated = json.loads(report[1]["out"])["rotation"]
    assert "acme" in rotated["versions"]  # the command did rotate a real KEK
    destroyed = json.loads(report[2]["out"])
    assert destroyed["destroyed"], destroyed  # and destroyed the one it retired
    assert "acme" in report[4]["out"]  # the key just created is listed
    entries = [line.split(" ", 3)[3] for line in (tmp_path / "export.json").read_text().splitlines()
               if line.startswith("e ")]  # the export's entry lines: "e <index> <hash> <event JSON>"
    kinds = {json.loads(body)["type"] for body in entries}
    assert {"key_rotated", "keys_destroyed"} <= kinds, kinds  # the key operations were logged
