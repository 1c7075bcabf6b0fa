"""A streamed turn is given up however its response ends (``fak.api.streaming.ClosingStream``):
a client gone before the body started (the generator's own ``finally`` never runs) or during
it leaves the session released and as it was before the generation; a finished turn is kept."""

from __future__ import annotations

import anyio
import pytest
from starlette.requests import ClientDisconnect

from fak import wire as w
from fak.api.routes.sessions import _sse
from fak.api.streaming import ClosingStream
from fak.kernel import operations as ops
from fak.kernel.services import SessionBusy
from fak.kernel.session.caller import Caller

CALLER = Caller("acme", "test")


async def _gone(_message: object) -> None:
    raise OSError("the client went away")


async def _receive() -> dict[str, object]:
    await anyio.sleep_forever()
    return {}


def _serve(turn: ops.Turn, send) -> None:  # noqa: ANN001
    response = ClosingStream(_sse(turn), turn.close)
    scope = {"type": "http", "asgi": {"spec_version": "2.4"}}

    async def run() -> None:
        with pytest.raises(ClientDisconnect):  # starlette's word for the OSError of a gone client
            await response(scope, _receive, send)

    anyio.run(run)


def _opened(kernel) -> tuple[object, ops.Turn, str]:  # noqa: ANN001
    ks = kernel.session("acme")
    ks.append("system", "You are terse.")
    ks.append("user", "Say something.")
    before = ks.fingerprint()
    turn = ops.open_turn(kernel, CALLER, ks.id, w.GenerateIn(max_tokens=8, min_tokens=8, stream=True))
    with pytest.raises(SessionBusy):
        ks.acquire(wait=False)  # the open turn holds the session
    return ks, turn, before


def test_a_client_gone_before_the_body_releases_the_session(kernel) -> None:
    ks, turn, before = _opened(kernel)
    _serve(turn, _gone)  # the response start already fails: the body never runs
    ks.acquire(wait=False)  # released, not left to the garbage collector
    ks.release()
    assert ks.fingerprint() == before and ks.segments()[-1].kind.value == "user"


def test_a_client_gone_mid_stream_rolls_the_turn_back(kernel) -> None:
    ks, turn, before = _opened(kernel)
    sent: list[object] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)
        if message.get("type") == "http.response.body" and len(sent) > 3:
            raise OSError("the client went away")

    _serve(turn, send)
    assert len(sent) > 3  # some tokens went out first
    ks.acquire(wait=False)
    ks.release()
    assert ks.fingerprint() == before and ks.segments()[-1].kind.value == "user"
