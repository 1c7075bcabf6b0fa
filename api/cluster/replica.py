"""One replica of a replicated deployment: a whole kernel and its app in a Ray actor (a Serve
deployment of one replica, made one by ``fak.api.cluster.lifecycle.build_app``), and what
placing a request on it would mean (``score_request``, asked by the router)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from fak.api.cluster.asgi import Head, stream_asgi

if TYPE_CHECKING:
    from fak.api.keys import KeyStore
    from fak.kernel.facade import Kernel


def score_request(kernel: Kernel, keys: KeyStore, key: str | None, session_id: str | None,
                  messages: list[dict[str, str]], response_id: str | None = None) -> dict[str, Any]:
    """What placing a request on ``kernel`` would mean: ``authorized`` (the key, checked as the
    app checks it), ``owner`` (the replica holding the named session, or the session of the
    named response's chain; None when there is none), ``hit_tokens`` (the prompt's tokens in
    this kernel's prefix cache for the key's tenant) and ``load`` (sessions loaded + generations)."""
    check = keys.check(key)
    if check.principal is None:
        return {"authorized": False}
    tenant = check.principal.tenant
    if session_id is None and response_id is not None:  # a Responses chain lives in its first response's session
        row = kernel.state.response(tenant, response_id)
        session_id = row.session_id if row is not None else None
    owner = kernel.placement_of(tenant, session_id) if session_id is not None else None
    hit = kernel.prefix_hit_tokens(tenant, messages) if messages and owner is None else 0
    return {"authorized": True, "owner": owner, "hit_tokens": hit, "load": kernel.replica_load()}


class Replica:
    """One kernel and its app in a Ray actor (a Serve deployment of one replica)."""

    def __init__(self, settings: dict[str, Any], name: str) -> None:
        from fak.api.app import create_app
        from fak.api.malloc import limit_arenas
        from fak.kernel.facade import Kernel
        from fak.settings import Settings

        limit_arenas()  # the actor's process is this kernel's, as fak serve's is (api/malloc.py)
        self.name = name
        self._closed = True  # until the kernel is open (Serve calls __del__ after a failed constructor too)
        self._lifespan: AbstractAsyncContextManager[Any] | None = None
        self._starting = asyncio.Lock()
        self.kernel: Kernel = Kernel.open(Settings(**settings, replica=name))
        self.app = create_app(self.kernel)
        self.keys: KeyStore = self.app.state.keys
        self._closed = False

    async def _started(self) -> None:
        """The app's lifespan startup, once, on the actor's event loop (the constructor has none)."""
        if self._lifespan is not None:
            return
        async with self._starting:
            if self._lifespan is None:
                lifespan = self.app.router.lifespan_context(self.app)
                await lifespan.__aenter__()
                self._lifespan = lifespan

    def pid(self) -> int:
        """This replica's process (a test SIGKILLs it to watch Serve restart it)."""
        return os.getpid()

    def check_health(self) -> None:
        """Serve's health hook: a closed or broken kernel fails it, and Serve replaces the actor."""
        if self._closed:
            raise RuntimeError(f"{self.name}: kernel closed")
        self.kernel.replica_load()

    async def handle(self, method: str, path: str, query: bytes, headers: list[tuple[str, str]], body: bytes,
                     client: tuple[str, int] | None = None) -> AsyncIterator[Head | bytes]:
        """One request through this replica's app (``stream_asgi``), streamed back."""
        await self._started()
        async for item in stream_asgi(self.app, method, path, query, headers, body, client, name=self.name):
            yield item

    async def score(self, key: str | None, session_id: str | None, messages: list[dict[str, str]],
                    response_id: str | None = None) -> dict[str, Any]:
        """What placing a request here would mean (``score_request``), off the event loop."""
        return await asyncio.to_thread(score_request, self.kernel, self.keys, key, session_id, messages, response_id)

    async def shutdown(self) -> None:
        """The app's lifespan shutdown, then the kernel closed (once)."""
        if self._closed:
            return
        self._closed = True
        if self._lifespan is not None:
            with contextlib.suppress(Exception):
                await self._lifespan.__aexit__(None, None, None)
        await asyncio.to_thread(self.kernel.close)

    async def __del__(self) -> None:  # Serve awaits it when it stops the replica
        await self.shutdown()
