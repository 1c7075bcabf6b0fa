"""Streams under pressure through real HTTP (docs/serving.md, "The door"): a slow reader's
stream pauses once its buffers are full (it sends no row while paused and the other streams'
steps go on; that the engine does not wait for its row is tests/kernel/model/test_scheduler_pause.py's)
and resumes when its client reads, with the tokens a fast read gets; a client that disconnects
frees its row within one step (its thread sends at most one more row; its generation slot and
its ephemeral session go)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import pytest

from fak import Kernel, Settings
from fak.api import server as api_server
from fak.api import streaming
from fak.api.server import serve
from fak.kernel.model import scheduler
from fak.kernel.model.loader import LoadedModel, load_model

SLOW_TOKENS = 800  # ~220 kB of events: well past the socket buffers below


@pytest.fixture(scope="module")
def gguf_lm(tiny_dir) -> LoadedModel:  # noqa: ANN001 - a conftest fixture
    return load_model(tiny_dir, weight_format="gguf")


@pytest.fixture
def served(tmp_path, tiny_dir, gguf_lm, monkeypatch) -> Iterator[SimpleNamespace]:  # noqa: ANN001
    # the OS's socket buffers are outside fak's bound (on loopback they grow to megabytes):
    # small ones here, so a stream that is not read fills them within a few hundred tokens
    listening = api_server._listening_socket

    def small_buffers(host: str, port: int) -> socket.socket:
        sock = listening(host, port)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)  # accepted sockets inherit it
        return sock

    monkeypatch.setattr(api_server, "_listening_socket", small_buffers)
    pauses: list[list[float]] = []  # [session's cache id, began, ended] of each pause (ended: inf while it lasts)
    stops: list[float] = []
    pause, stop = streaming._Steps._pause, streaming._Steps.stop

    def counted_pause(self: streaming._Steps) -> None:  # type: ignore[type-arg]
        mine = [scheduler._rows.last[1], time.monotonic(), float("inf")]  # the stream thread's session
        pauses.append(mine)
        try:
            pause(self)
        finally:
            mine[2] = time.monotonic()

    def counted_stop(self: streaming._Steps) -> None:  # type: ignore[type-arg]
        stops.append(time.monotonic())
        stop(self)

    rows: list[tuple[str, int, float]] = []  # (tenant, cache id, when) of every decode row handed to the engine
    run = scheduler.Scheduler.run

    def counted_run(self: scheduler.Scheduler, model, tokens, cache, *rest):  # noqa: ANN001, ANN202
        if len(tokens) == 1:
            rows.append((scheduler._tenant.get(), id(cache), time.monotonic()))
        return run(self, model, tokens, cache, *rest)

    monkeypatch.setattr(streaming._Steps, "_pause", counted_pause)
    monkeypatch.setattr(streaming._Steps, "stop", counted_stop)
    monkeypatch.setattr(scheduler.Scheduler, "run", counted_run)
    k = Kernel.open(Settings(data_dir=tmp_path / "data", model_path=tiny_dir, chunk_size=16, weights="gguf"),
                    model=gguf_lm, progress=None)
    try:
        with serve(k) as live:
            yield SimpleNamespace(url=live.url, kernel=k, keys={t: live.key(t, "agent") for t in ("acme", "globex")},
                                  pauses=pauses, stops=stops, rows=rows)
    finally:
        k.close()


def _body(tokens: int, text: str) -> dict[str, object]:
    return {"model": "m", "stream": True, "temperature": 0, "max_tokens": tokens, "min_tokens": tokens,
            "stream_options": {"include_usage": True}, "messages": [{"role": "user", "content": text}]}


def _client(s: SimpleNamespace, tenant: str, *, small_window: bool = False) -> httpx.Client:
    options = [(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)] if small_window else []
    return httpx.Client(base_url=s.url, headers={"Authorization": f"Bearer {s.keys[tenant]}"}, trust_env=False,
                        timeout=120, transport=httpx.HTTPTransport(socket_options=options))


def _answer(lines: Iterator[str]) -> tuple[str, str, int]:
    """(content, the fak fingerprint, completion tokens) of a stream's events."""
    text, fingerprint, tokens = [], "", 0
    for line in lines:
        if not line.startswith("data: {"):
            continue
        event = json.loads(line[6:])
        for choice in event.get("choices") or []:
            text.append(choice["delta"].get("content") or "")
        fingerprint = (event.get("fak") or {}).get("fingerprint") or fingerprint
        tokens = (event.get("usage") or {}).get("completion_tokens") or tokens
    return "".join(text), fingerprint, tokens


def _read_all(s: SimpleNamespace, tenant: str, body: dict[str, object]) -> tuple[str, str, int]:
    with _client(s, tenant) as h, h.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        return _answer(r.iter_lines())


def _wait(what: str, done: object, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_slow_reader_pauses_its_stream_and_gets_what_a_fast_one_gets(served: SimpleNamespace) -> None:
    s, engine = served, served.kernel.services.engine
    body = _body(SLOW_TOKENS, "Tell me a long story.")
    fast = _read_all(s, "acme", body)
    assert fast[2] == SLOW_TOKENS
    s.pauses.clear()  # (a reader on these small buffers may pause its stream for a moment too)

    with _client(s, "acme", small_window=True) as h, h.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = r.iter_lines()
        first = next(lines)
        # it stopped reading: the socket's buffers fill, the stream pauses (and resumes for a
        # moment when they take a little more), and stays paused
        _wait("the stream to stay paused", lambda: s.pauses and s.pauses[-1][2] == float("inf")
              and time.monotonic() - s.pauses[-1][1] > 1)
        session = s.pauses[-1][0]
        steps, began = engine.steps, time.monotonic()
        other = _read_all(s, "globex", _body(40, "Meanwhile, a short one."))  # others' steps go on
        ended = time.monotonic()
        assert other[2] == 40 and engine.steps > steps
        slow = _answer(iter([first, *lines]))  # the client reads again: the stream resumes
    pauses = [(a, b) for cache, a, b in s.pauses if cache == session]
    paused = sum(max(0.0, min(b, ended) - max(a, began)) for a, b in pauses)
    assert paused > 0.5 * (ended - began)  # paused for (most of) the other stream's run
    mine = [t for tenant, cache, t in s.rows if cache == session and tenant == "acme"]
    assert len(mine) >= SLOW_TOKENS - 1  # (its rows are counted)
    assert not [t for t in mine for a, b in pauses if a < t < b]  # and it sent no row while paused
    assert slow == fast  # the same tokens, text and KV fingerprint as the fast read


def test_a_client_that_disconnects_frees_its_row_within_one_step(served: SimpleNamespace) -> None:
    s, engine, slots = served, served.kernel.services.engine, served.kernel.services.generation_slots
    rows = s.rows
    other: list[tuple[str, str, int]] = []
    reader = threading.Thread(target=lambda: other.append(_read_all(s, "acme", _body(1500, "Keep going."))))
    reader.start()
    _wait("the other stream to generate", lambda: slots.active("acme") == 1)
    with _client(s, "globex") as h, h.stream("POST", "/v1/chat/completions", json=_body(3000, "Go on.")) as r:
        events = (line for line in r.iter_lines() if line.startswith("data: "))
        for _ in range(12):
            next(events)
        assert slots.active("globex") == 1
        closed = time.monotonic()  # the client closes the connection as the block ends
    # the client is gone: the server ends the response and stops the stream
    _wait("the server to stop the stream", lambda: [t for t in s.stops if t >= closed])
    gone = min(t for t in s.stops if t >= closed)
    _wait("the generation slot to be given back", lambda: slots.active("globex") == 0)
    assert engine.figures("globex", slots).waiting_calls == 0
    before = [t for tenant, _, t in rows if tenant == "globex" and t <= gone]
    after = [t for tenant, _, t in rows if tenant == "globex" and t > gone]
    assert len(before) >= 10 and len(after) <= 1  # at most the row of the step its thread was starting
    # the turn rolled back, then the ephemeral session is deleted
    _wait("the ephemeral session to go", lambda: not s.kernel.sessions("globex"))
    reader.join(timeout=120)
    assert other and other[0][2] == 1500  # the other stream went on to its end
    assert [t for tenant, _, t in rows if tenant == "acme" and t > gone]  # and had rows after the disconnect
