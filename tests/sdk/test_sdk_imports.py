"""The SDK's HTTP client is a client: importing it loads none of the server (``fak.api``,
FastAPI, Starlette, uvicorn), none of the storage (SQLAlchemy, the fak database) and none of
the kernel (torch, the model package, the façade). Its wire models come from ``fak.wire``,
which the server re-exports. Checked in a fresh interpreter (a test process has long imported
all of them); the in-process mode (``fak.sdk.local``) may load the server, and is not
imported here (issue 26 part 5)."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import json, sys
import fak.sdk
from fak.sdk import AsyncClient, Client, FakAPIError
import fak.sdk.agent, fak.sdk.gate, fak.sdk.models, fak.wire
from fak.sdk.models import ForgetReceipt, ReceiptCheck, SessionOut

with Client("http://127.0.0.1:9", api_key="fak_x") as c:  # built, never sent
    pass
SessionOut.model_validate({"id": "s", "tokens": 0, "fingerprint": "f", "segments": []})
HEAVY = ("fak.api", "fastapi", "starlette", "uvicorn", "sqlalchemy", "torch", "fak.kernel", "fak.kernel.facade",
         "fak.kernel.session.kernel_session", "fak.db", "fak.sdk.inprocess")
print(json.dumps(sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in HEAVY))))
"""


def _loaded(script: str) -> list[str]:
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_http_client_imports_no_server() -> None:
    """``import fak.sdk; from fak.sdk import Client`` (and the gate and agent helpers, the typed
    results, a forget receipt's model) leaves the server, the database and the kernel unloaded."""
    loaded = _loaded(SCRIPT)
    assert loaded == [], f"the HTTP client loaded {len(loaded)} server/storage/kernel modules: {loaded[:12]}"


def test_the_server_and_the_sdk_share_one_wire_model() -> None:
    """The routes declare the classes of ``fak.wire`` and ``fak.sdk.models`` (what the client
    parses) re-exports them: the OpenAPI document and the SDK cannot drift."""
    import fak.sdk.models as sdk_models
    import fak.wire as wire
    from fak.api.routes import audit, sessions

    for name in ("SessionOut", "SegmentOut", "AdmissionOut", "GenerateOut", "ToolCallDecisionOut", "EntriesOut"):
        assert getattr(wire, name) is getattr(sdk_models, name), name
    declared = {getattr(r, "response_model", None) for r in (*sessions.router.routes, *audit.router.routes)}
    assert {wire.SessionOut, wire.AdmissionOut, wire.GenerateOut, wire.EntriesOut} <= declared
