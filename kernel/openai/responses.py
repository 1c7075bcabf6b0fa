"""The OpenAI Responses API in the core: what ``POST /v1/responses`` does, apart from HTTP,
built on the chat door (``fak.kernel.openai.chat``, whose notes hold for everything not
said here). A request becomes one ``fak.wire.ChatCompletionRequest``; its answer (or its
stream of chunks) is translated back into a ``response`` object (or the Responses events).
Like the chat core, this module never imports ``fak.api``. Creating needs the ``agent``
right, reading the ``read`` right; a response is visible to its own tenant only.

**Input.** ``input`` is a string (one user message) or a list of items: messages (``role``
user, system, developer or assistant; ``content`` a string or ``input_text``/``output_text``/
``refusal`` parts; image, file and audio parts are refused with ``unsupported_content``),
``function_call`` items (``call_id``, ``name``, ``arguments``: consecutive ones, and those
right after an assistant message, become one assistant message with ``tool_calls``) and
``function_call_output`` items (``call_id``, ``output``: a ``tool`` message, admitted through
the gate as the chat door does, under the name of the call it answers: a ``function_call``
item of the same input, or a call of the previous response). ``reasoning`` items are
skipped (the model emits none); the MCP items are ``responses_mcp``'s (``mcp_approval_response``
answered, ``mcp_call`` resent as the call and its output, ``mcp_list_tools`` and
``mcp_approval_request`` skipped); any other item type is a 400. ``instructions`` become a
system message first, on a new chain only (see below).

**Parameters.** ``tools`` (function tools, and ``mcp`` tools of the servers the deployment
declares, which fak runs itself: ``responses_mcp``, docs/mcp.md; another hosted tool such as
``web_search`` is a 400 ``unsupported_parameter`` naming it), ``tool_choice``, ``parallel_tool_calls``,
``temperature``, ``top_p``, ``max_output_tokens``, ``text.format`` and ``seed`` (extension)
are mapped to their chat forms, and the chat core decides what it honours (a refusal there
is reported with the Responses name, e.g. ``text.format``). ``include`` with
``message.output_text.logprobs`` asks the chat core for logprobs (``top_logprobs``); other
``include`` values, ``reasoning``, ``truncation``, ``service_tier``, ``prompt_cache_key``,
``safety_identifier`` and unknown fields are accepted and ignored (named in ``fak.ignored``);
``user``, ``metadata`` (both echoed) and the chat door's extension ``fak_held_calls`` go to
the chat core as they are. ``background: true``, ``conversation``, ``prompt``,
``max_tool_calls`` and ``context_management`` are refused (``unsupported_parameter``).

**Chains and sessions.** A response's conversation lives in one persistent fak session,
so a follow-up sends only its new items and nothing is resent or admitted again:

- a response without ``previous_response_id`` starts a chain: with ``store`` (the default,
  true) its session is created for it, named ``resp-<hex>`` after the response
  ``resp_<hex>``, and kept; with ``store: false`` it runs in an ephemeral session, deleted
  after it, and is not kept (no GET, no follow-up);
- ``previous_response_id`` continues that response's session: 404 if no stored response of
  the tenant has that id (or its session was deleted), 409 if it is not the latest
  response of its chain (its session already holds the later turns: fak keeps one linear
  session per chain and never forks one), or still in progress. The chain is linear by
  construction: a unique index on (tenant, previous response) in ``fak_responses``
  lets only one of two racing follow-ups claim a response;
- ``instructions`` are part of the chain's session from its first response. A follow-up
  may repeat the same instructions (the Agents SDK sends them on every call) or leave them
  out: either way nothing is added and the response echoes the chain's instructions.
  Different instructions are a 409 ``conflict``: they cannot replace what the session's
  KV already holds (OpenAI would swap them; start a new chain instead);
- a follow-up with ``store: false`` runs in the chain's session (the session keeps the
  turn), but is not kept: it ends the chain for follow-ups (it cannot be named as
  ``previous_response_id``, and its predecessor is no longer the latest).

A response that fails, or whose stream the client drops, leaves no record when its session
is as it was before (the chain continues from its predecessor); a new chain's session is
deleted. When the failure happened after its input entered the session (e.g. the
generation failed), it is kept as a ``failed`` response whose input the session holds, and
the chain continues from it. ``DELETE /v1/responses/{id}`` keeps a tombstone (the chain
stays linear) and deletes the chain's session once every response of it is deleted.

**Persistence.** ``fak_responses`` (``fak.state.schema.ResponseRow``): tenant, id, the
chain's session, the previous response, the chain's instructions, state and the response
body as JSON. A body generated while tool content was live in the session (any ref in a
live segment's content provenance, or in the content provenance of any attempt whose text
the body keeps: a streamed body keeps the text a denied call's attempt already sent, though
``evict_and_retry`` evicted that turn and its refs) may repeat it, so it is kept like such a
segment (``fak.state.seal``): sealed under the data keys of those refs, so a forget of any
of them makes it unreadable (GET answers 410 ``forgotten``) in every copy of the database.
Other bodies (and failed ones, which have no output) are kept in the clear. The tenant erase
deletes the rows.

**Output.** The ``response`` object: a ``message`` item with an ``output_text`` part (when
the answer has text, or nothing else) and a ``refusal`` part (when fak refused, e.g. a
denied call), then one ``function_call`` item per tool call of the chat answer (``call_id``
is the chat tool call's id), ``status`` ``completed`` or ``incomplete``
(``max_output_tokens`` reached), ``usage`` from the chat usage
(``input_tokens_details.cached_tokens`` as the chat's ``cached_tokens``), the echoed request
settings, and ``fak``: the chat turn's extension (session, fingerprint, admissions, ignored
fields). **Streaming** yields the Responses events (``response.created``,
``response.in_progress``, ``response.output_item.added``, ``response.content_part.added``,
``response.output_text.delta``..., ``response.refusal.delta``, their ``done`` events,
``response.function_call_arguments.delta``/``.done`` for a call, then ``response.completed``
or ``response.incomplete``), each with its ``sequence_number``; the final response equals
the non-streamed one's shape.

**Modules.** This module keeps the entry points (``plan``, ``create``, ``open_stream``; ``get``
and ``delete`` are ``responses_store``'s): the request's translation is
``responses_request`` (and its ``Plan``), the response object's output ``responses_output``,
the chain's records in ``fak_responses`` ``responses_store``, and the event stream
``responses_stream`` (``ResponseStream``, reading the chat stream's typed chunks,
``fak.kernel.openai.chunks``).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fak import wire_responses as wr
from fak.errors import InvalidInput, NotFound
from fak.kernel.openai import chat, responses_mcp
from fak.kernel.openai.responses_output import output_items, status_of, usage_of
from fak.kernel.openai.responses_request import (
    Plan,
    chat_request,
    ignored_fields,
    input_items,
    renamed,
)
from fak.kernel.openai.responses_store import abandon, claim, delete, finish, get, resolve_chain
from fak.kernel.openai.responses_stream import ResponseStream
from fak.kernel.session.caller import Caller, Right

if TYPE_CHECKING:
    from fak.kernel.facade import Kernel

__all__ = ["McpEvents", "Plan", "ResponseStream", "create", "delete", "get", "open_stream", "plan"]


def plan(k: Kernel, c: Caller, body: wr.ResponseCreateRequest, *, stream: bool = False) -> Plan:
    """Validate the request and resolve its chain (nothing is created yet)."""
    c.require(Right.AGENT)
    items = input_items(body)
    hexid = uuid.uuid4().hex
    store = body.store is not False
    chain = resolve_chain(k, c, body, hexid, store)
    mcp = responses_mcp.prepare(k, body.tools or [])  # the servers listed now: a 400 or 502 before any effect
    if mcp is not None and chain.session_id is None:  # the loop's turns share a session, deleted after it
        chain = replace(chain, session_id="resp-" + hexid)
    chat_body = chat_request(body, items, chain, stream=False if mcp is not None else stream,
                             hosted_tools=mcp.definitions() if mcp is not None else None)
    # an upstream's responses name it (docs/gateway.md); any other name runs on fak's own model
    model = body.model if k.services.upstreams.find(body.model) is not None else k.model_id
    return Plan("resp_" + hexid, int(time.time()), model, chain, store, body, chat_body, ignored_fields(body), mcp)


def _run(p: Plan, k: Kernel, c: Caller, start: Callable[[], Any]) -> Any:
    """Claim, then run the chat step; a failure abandons the response."""
    claim(k, c, p)
    try:
        return start()
    except InvalidInput as exc:
        abandon(k, c, p, exc)
        raise renamed(exc) from None
    except BaseException as exc:
        abandon(k, c, p, exc)
        raise


def _with_mcp(k: Kernel, c: Caller, p: Plan) -> wr.ResponseObject:
    """A response with MCP tools: the loop of ``responses_mcp`` (claimed, kept or abandoned as
    any other); a ``store: false`` chain's own session is deleted after it."""
    try:
        m = p.mcp
        assert m is not None  # create and open_stream come here with MCP tools only
        ran: tuple[wr.ResponseObject, frozenset[str]] = _run(p, k, c, lambda: responses_mcp.run(k, c, p, m))
        response, provenance = ran
        try:
            finish(k, c, p, response, provenance)
        except BaseException as exc:
            abandon(k, c, p, exc)
            raise
        return response
    finally:
        if not p.store and p.chain.new and p.chain.session_id is not None:
            with contextlib.suppress(NotFound):
                k.delete_session(c.tenant, p.chain.session_id)


def create(k: Kernel, c: Caller, body: wr.ResponseCreateRequest) -> wr.ResponseObject:
    """One response, not streamed."""
    p = plan(k, c, body)
    if p.mcp is not None:
        return _with_mcp(k, c, p)
    done: chat.Completed = _run(p, k, c, lambda: chat.completed(k, c, p.chat_body))
    choice = done.completion.choices[0]
    response = p.response(status_of(choice.finish_reason), output_items(p, choice),
                          usage_of(done.completion.usage), done.completion.fak.model_dump())
    try:
        finish(k, c, p, response, done.provenance)
    except BaseException as exc:
        abandon(k, c, p, exc)
        raise
    return response


class McpEvents:
    """A streamed response with MCP tools: the loop ran before the first event, whose events
    then go out item by item (``responses_mcp.events``); ``ResponseStream``'s interface."""

    def __init__(self, response: wr.ResponseObject, skeleton: dict[str, Any]) -> None:
        self.response: wr.ResponseObject | None = response
        self._events = list(responses_mcp.events(response, skeleton))

    def next_events(self) -> list[dict[str, Any]] | None:
        out, self._events = self._events, []
        return out or None

    def close(self) -> None:
        self._events = []


def open_stream(k: Kernel, c: Caller, body: wr.ResponseCreateRequest) -> ResponseStream | McpEvents:
    """Validate, claim and open the chat stream (its first token sampled): errors come before any event."""
    p = plan(k, c, body, stream=True)
    if p.mcp is not None:
        skeleton = p.response("in_progress", []).model_dump(mode="json")
        return McpEvents(_with_mcp(k, c, p), skeleton)
    stream: chat.ChatStream = _run(p, k, c, lambda: chat.open_stream(k, c, p.chat_body))
    return ResponseStream(k, c, p, stream)
