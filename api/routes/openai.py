"""OpenAI-compatible chat: ``POST /v1/chat/completions`` (JSON, or server-sent events with
``stream: true``) and ``GET /v1/models``, so agent frameworks that speak the OpenAI chat
API run unchanged against fak (``openai.OpenAI(base_url=URL + "/v1", api_key=FAK_KEY)``).
Authentication is the same as everywhere: the Bearer API key names the tenant; chat
needs the ``agent`` (or ``admin``) role, the model list any role; the held calls' queue and
decisions (``/v1/tool-calls``) the ``approver`` (or ``admin``) role.

A thin adapter: what a request does to a session (sessions, messages, parameters, the
response, the chunks of a stream, cleanup) is ``fak.kernel.openai.chat``, whose module
notes are this door's contract; the bodies are ``fak.wire``'s OpenAI models. This module
keeps the HTTP side: the role check, the worker threads, the SSE framing (``data: …``,
``data: [DONE]``) and the cleanup of a stream however its response ends (a client that
disconnects mid-stream leaves the session as it was before the generation)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Literal

from fastapi import APIRouter, Depends, Query, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from fak import wire as w
from fak.api.deps import AGENT, APPROVER, READER, caller, kernel
from fak.api.keys import Principal
from fak.api.streaming import open_sse, steps
from fak.kernel.facade import Kernel
from fak.kernel.openai import chat

router = APIRouter(prefix="/v1", tags=["openai"])


@router.get("/models", response_model=w.ModelList)
def list_models(who: Principal = Depends(READER), k: Kernel = Depends(kernel)) -> w.ModelList:  # noqa: B008
    """The kernel's one model."""
    return chat.list_models(k, caller(who))


@router.get("/models/{model_id:path}", response_model=w.ModelCard)
def get_model(model_id: str, who: Principal = Depends(READER), k: Kernel = Depends(kernel)) -> w.ModelCard:  # noqa: B008
    return chat.get_model(k, caller(who), model_id)


@router.post("/chat/completions", response_model=w.ChatCompletion,
             responses={200: {"content": {"text/event-stream": {}}}})
async def chat_completions(body: w.ChatCompletionRequest, response: Response,
                           who: Principal = Depends(AGENT),  # noqa: B008
                           k: Kernel = Depends(kernel)) -> w.ChatCompletion | StreamingResponse:  # noqa: B008
    """OpenAI chat completions over a session of the caller's tenant (see the module notes)."""
    c = caller(who)
    if not body.stream:
        answer = await run_in_threadpool(chat.complete, k, c, body)
        if answer.fak.tool_calls:  # frameworks that drop unknown body fields still see the verdicts
            response.headers["fak-tool-calls"] = chat.verdict_header(answer.fak)
        return answer
    return await open_sse(lambda: chat.open_stream(k, c, body), server_sent_events)


@router.get("/tool-calls", response_model=w.HeldCallList)
def list_held_calls(state: Literal["pending", "approved", "rejected"] = "pending",
                    limit: int = Query(100, ge=1, le=1000),  # noqa: B008
                    who: Principal = Depends(APPROVER), k: Kernel = Depends(kernel)) -> w.HeldCallList:  # noqa: B008
    """The tenant's tool calls held for a person, oldest first (``state=pending``: the approver's
    queue): approver and admin keys only."""
    return chat.held_calls(k, caller(who), state, limit)


@router.get("/tool-calls/{call_id}", response_model=w.HeldCallOut)
def get_held_call(call_id: str, who: Principal = Depends(APPROVER),  # noqa: B008
                  k: Kernel = Depends(kernel)) -> w.HeldCallOut:  # noqa: B008
    """One held call: what it would do, why it was held, who produced it, what became of it."""
    return chat.held_call(k, caller(who), call_id)


@router.post("/tool-calls/{call_id}/approve", response_model=w.ToolCallApprovalOut)
def approve_tool_call(call_id: str, who: Principal = Depends(APPROVER),  # noqa: B008
                      k: Kernel = Depends(kernel)) -> w.ToolCallApprovalOut:  # noqa: B008
    """A person approves a call the policy held (CONFIRM): audited, naming the key that approved.
    Approver and admin keys only; never the key whose request produced the call (403)."""
    return chat.decide_held_call(k, caller(who), call_id, approve=True)


@router.post("/tool-calls/{call_id}/reject", response_model=w.ToolCallApprovalOut)
def reject_tool_call(call_id: str, who: Principal = Depends(APPROVER),  # noqa: B008
                     k: Kernel = Depends(kernel)) -> w.ToolCallApprovalOut:  # noqa: B008
    """A person rejects a held call: its result can never enter the conversation."""
    return chat.decide_held_call(k, caller(who), call_id, approve=False)


async def server_sent_events(stream: chat.ChatStream) -> AsyncIterator[str]:
    """The stream's chunks as SSE events (model steps in the stream's thread), then ``[DONE]``."""
    async with aclosing(steps(stream.next_chunks)) as steps_:
        async for chunks in steps_:
            for chunk in chunks:
                yield f"data: {json.dumps(chunk.as_dict(), ensure_ascii=False)}\n\n"
    yield "data: [DONE]\n\n"
