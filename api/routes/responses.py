"""The OpenAI Responses API: ``POST /v1/responses`` (JSON, or server-sent events with
``stream: true``), ``GET /v1/responses/{id}`` and ``DELETE /v1/responses/{id}``, so clients and
agent frameworks that speak the Responses API (the ``openai`` package's
``client.responses``, the OpenAI Agents SDK) run against fak. Creating and deleting need
the ``agent`` (or ``admin``) role, reading any role; a response is its tenant's only.

A thin adapter: what a request does (its chain's session, the input items, the
parameters, the events of a stream, what is kept) is ``fak.kernel.openai.responses``, whose
module notes are this door's contract; the bodies are ``fak.wire_responses``. This module
keeps the HTTP side: the role check, the worker threads, the SSE framing (``event: <type>``
and ``data: <json>``) and the cleanup of a stream however its response ends."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import APIRouter, Depends, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from fak import wire_responses as wr
from fak.api.deps import AGENT, READER, caller, kernel
from fak.api.keys import Principal
from fak.api.streaming import open_sse, steps
from fak.kernel.facade import Kernel
from fak.kernel.openai import responses
from fak.kernel.openai.chat import verdict_header

router = APIRouter(prefix="/v1", tags=["openai"])


@router.post("/responses", response_model=wr.ResponseObject, responses={200: {"content": {"text/event-stream": {}}}})
async def create_response(body: wr.ResponseCreateRequest, response: Response,
                          who: Principal = Depends(AGENT),  # noqa: B008
                          k: Kernel = Depends(kernel)) -> wr.ResponseObject | StreamingResponse:  # noqa: B008
    """A model response over the chain's session (see the module notes)."""
    c = caller(who)
    if not body.stream:
        answer = await run_in_threadpool(responses.create, k, c, body)
        if answer.fak is not None and answer.fak.tool_calls:  # for clients that drop unknown body fields
            response.headers["fak-tool-calls"] = verdict_header(answer.fak)
        return answer
    return await open_sse(lambda: responses.open_stream(k, c, body), server_sent_events)


@router.get("/responses/{response_id}", response_model=wr.ResponseObject)
def get_response(response_id: str, who: Principal = Depends(READER),  # noqa: B008
                 k: Kernel = Depends(kernel)) -> wr.ResponseObject:  # noqa: B008
    """A stored response of the caller's tenant."""
    return responses.get(k, caller(who), response_id)


@router.delete("/responses/{response_id}", response_model=wr.ResponseDeleted)
def delete_response(response_id: str, who: Principal = Depends(AGENT),  # noqa: B008
                    k: Kernel = Depends(kernel)) -> wr.ResponseDeleted:  # noqa: B008
    """Delete a stored response; its chain's session goes with the chain's last response."""
    return responses.delete(k, caller(who), response_id)


async def server_sent_events(stream: responses.ResponseStream | responses.McpEvents) -> AsyncIterator[str]:
    """The stream's events (chat steps in the stream's thread)."""
    async with aclosing(steps(stream.next_events)) as steps_:
        async for events in steps_:
            for event in events:
                yield f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
