"""Sessions: create, list, read, append, admit, evict, materialise, generate (JSON or SSE).
Thin adapters: the logic is ``fak.kernel.operations``, shared with ``fak.sdk.local()``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from fak import wire as w
from fak.api.deps import AGENT, READER, caller, kernel
from fak.api.keys import Principal
from fak.api.streaming import open_sse, steps
from fak.kernel import operations as ops
from fak.kernel.facade import Kernel

__all__ = ["router"]

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])


@router.post("", status_code=201, response_model=w.SessionOut)
def create_session(body: w.SessionCreate | None = None, who: Principal = Depends(AGENT),  # noqa: B008
                   k: Kernel = Depends(kernel)) -> w.SessionOut:  # noqa: B008
    return ops.create_session(k, caller(who), body)


@router.get("", response_model=w.SessionList)
def list_sessions(who: Principal = Depends(READER), k: Kernel = Depends(kernel)) -> w.SessionList:  # noqa: B008
    return ops.list_sessions(k, caller(who))


@router.get("/{sid}", response_model=w.SessionOut)
def get_session(sid: str, who: Principal = Depends(READER), k: Kernel = Depends(kernel)) -> w.SessionOut:  # noqa: B008
    return ops.get_session(k, caller(who), sid)


@router.post("/{sid}/messages", status_code=201, response_model=w.SegmentOut)
def append_message(sid: str, body: w.MessageIn, who: Principal = Depends(AGENT),  # noqa: B008
                   k: Kernel = Depends(kernel)) -> w.SegmentOut:  # noqa: B008
    return ops.append(k, caller(who), sid, body)


@router.post("/{sid}/tool-results", status_code=201, response_model=w.AdmissionOut)
def admit_tool_result(sid: str, body: w.ToolResultIn, who: Principal = Depends(AGENT),  # noqa: B008
                      k: Kernel = Depends(kernel)) -> w.AdmissionOut:  # noqa: B008
    return ops.admit(k, caller(who), sid, body)


@router.post("/{sid}/evict", response_model=w.EvictionOut)
def evict(sid: str, body: w.EvictIn, who: Principal = Depends(AGENT),  # noqa: B008
          k: Kernel = Depends(kernel)) -> w.EvictionOut:  # noqa: B008
    return ops.evict(k, caller(who), sid, body)


@router.post("/{sid}/tool-calls/authorize", response_model=w.ToolCallDecisionOut)
def authorize_tool_call(sid: str, body: w.ToolCallIn, who: Principal = Depends(AGENT),  # noqa: B008
                        k: Kernel = Depends(kernel)) -> w.ToolCallDecisionOut:  # noqa: B008
    """May the agent make this call now, given what is in attention? ALLOW, CONFIRM or DENY."""
    return ops.authorize_tool_call(k, caller(who), sid, body)


@router.post("/{sid}/evict-refs", response_model=w.RefsEvictedOut)
def evict_refs(sid: str, body: w.EvictRefsIn, who: Principal = Depends(AGENT),  # noqa: B008
               k: Kernel = Depends(kernel)) -> w.RefsEvictedOut:  # noqa: B008
    """The exact remedy for a DENY/CONFIRM: evict the offending refs (and the turns they caused)."""
    return ops.evict_refs(k, caller(who), sid, body)


@router.post("/{sid}/materialise", response_model=w.MaterialiseOut)
def materialise(sid: str, body: dict[str, Any], who: Principal = Depends(AGENT),  # noqa: B008
                k: Kernel = Depends(kernel)) -> w.MaterialiseOut:  # noqa: B008
    return ops.materialise(k, caller(who), sid, body)


@router.post("/{sid}/generate", response_model=w.GenerateOut,
             responses={200: {"content": {"text/event-stream": {}}}})
async def generate(sid: str, body: w.GenerateIn, request: Request, who: Principal = Depends(AGENT),  # noqa: B008
                   k: Kernel = Depends(kernel)) -> w.GenerateOut | StreamingResponse:  # noqa: B008
    if not body.stream:
        return await run_in_threadpool(ops.generate, k, caller(who), sid, body)
    # errors before any 200; a handler cancelled while the turn opens closes it (open_sse), and
    # however the response ends (a client gone before or during the body), the turn is given up
    # and the session released; a finished turn is kept
    return await open_sse(lambda: ops.open_turn(k, caller(who), sid, body), _sse)


async def _sse(turn: ops.Turn) -> AsyncIterator[str]:
    async with aclosing(steps(turn.next_event)) as events:
        async for name, data in events:
            yield ("" if name == "message" else f"event: {name}\n") + f"data: {json.dumps(data)}\n\n"
