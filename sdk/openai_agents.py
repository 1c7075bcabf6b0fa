"""OpenAI Agents SDK (``openai-agents``) adapter: a tool *input* guardrail that asks a fak
session whether each function-tool call may run, and a tool *output* guardrail that
admits every output through that session.

    from agents import Agent, function_tool
    from fak.sdk import Client
    from fak.sdk.openai_agents import fak_input_guardrail, fak_output_guardrail, guard_tools

    fak = Client("http://127.0.0.1:8077", api_key="fak_...")
    session = fak.create_session()

    @function_tool(tool_input_guardrails=[fak_input_guardrail(session)],
                   tool_output_guardrails=[fak_output_guardrail(session)])
    def fetch(url: str) -> str:
        ...

    agent = Agent(name="assistant", tools=[fetch])   # or: tools=guard_tools([fetch, send_email], session)

**Before the tool runs** (input guardrail): the call (tool name, the JSON arguments
string) is authorized by the session (``session.authorize_tool_call``: the policy's
``tool_calls`` rules over the refs in attention, i.e. the tool outputs this session
admitted and has not evicted). ``ALLOW``: ``allow``, the tool runs. ``DENY`` /
``CONFIRM``: ``reject_content`` with a notice naming the verdict, the rule and the
offending refs — the tool does not run and the model gets the notice as the call's
result; with ``on_block="raise"``, ``raise_exception`` instead (the run stops with
``ToolInputGuardrailTripwireTriggered``). ``output_info`` is the ``ToolCallDecisionOut``
(in the run result's ``tool_input_guardrail_results``). The decision does not care which
model made the call: here it is the framework's.

**After the tool runs** (output guardrail): the output is admitted (``fak.sdk.gate``):

- ``ALLOW`` (or an audit-only policy): ``allow`` — the model gets the original output;
- ``REDACT``: ``reject_content`` with the redacted text, which the model gets instead;
- ``QUARANTINE`` / ``DENY``: ``reject_content`` with a refusal notice (tool, verdict,
  rule, ref) and nothing of the output; with ``on_block="raise"``, ``raise_exception``
  instead (the run stops with ``ToolOutputGuardrailTripwireTriggered``).

``output_info`` carries the ``AdmissionOut`` (verdict, rule, ref, audit index) into the
run result's ``tool_output_guardrail_results``. The session may be a ``Session``,
``LocalSession`` or ``AsyncSession``; a blocking one runs in a worker thread.

**The remedy is the framework's.** The framework's model context (its run items) is not
fak's to evict. A DENY names the offending refs; each is the ``output_info.ref`` of an
output guardrail result, so the application can drop those tool outputs from the
items it sends the model next, and call ``session.evict_refs(decision.offending)`` so
that fak's session (what the next authorization reads) matches. Until then every
authorization of that tool is refused again.

**fak as the model** (``fak serve``'s OpenAI door; docs/openai.md): fak judges every call
its model writes before the response leaves the server, and holds a CONFIRM call for a
person. ``fak_approvals`` maps that hold onto the SDK's own tool approval; the client it
records decisions with holds the person's ``approver`` key (fak refuses an agent key's)::

    from fak.sdk.openai_agents import FAK_MODEL_SETTINGS, approve, fak_approvals, reject

    person = Client("http://127.0.0.1:8077", api_key=APPROVER_KEY)
    agent = Agent(name="assistant", tools=fak_approvals([send_email], person), model_settings=FAK_MODEL_SETTINGS)
    result = await Runner.run(agent, "...")
    state = result.to_state()
    for item in result.interruptions:          # the calls fak held
        await approve(state, item, person)     # or: await reject(state, item, person)
    result = await Runner.run(agent, state)

``FAK_MODEL_SETTINGS`` asks fak to return held calls (marked, ids ``call_held_…``) instead of
withholding them; a held call then needs the SDK's approval (``needs_approval``); ``approve``
and ``reject`` record the person's decision at fak (audited) and in the run state. A held
call's tool tells fak it was approved before it runs, so a run approved through the SDK alone
still reaches fak's record; a rejection recorded only in the SDK is refused by fak
(``tool_call_held``), never silently run.

What the guardrails do not do: they apply to function tools only (the Agents SDK runs
no tool guardrails for hosted tools such as web search), and they do not see what the
framework's model was given other than through these tools.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Iterable
from typing import Any, Literal

from agents import (
    FunctionTool,
    ModelSettings,
    RunContextWrapper,
    RunState,
    ToolApprovalItem,
    ToolGuardrailFunctionOutput,
    ToolInputGuardrail,
    ToolInputGuardrailData,
    ToolOutputGuardrail,
    ToolOutputGuardrailData,
)

from fak.sdk.gate import aauthorize, ascreen, call_notice
from fak.wire import HELD_PREFIX

__all__ = ["FAK_MODEL_SETTINGS", "HELD_PREFIX", "approve", "fak_approvals", "fak_input_guardrail",
           "fak_output_guardrail", "guard_tools", "reject"]

FAK_MODEL_SETTINGS = ModelSettings(extra_body={"fak_held_calls": "return"})

OnBlock = Literal["reject", "raise"]


def _check(on_block: str) -> None:
    if on_block not in ("reject", "raise"):
        raise ValueError("on_block is 'reject' or 'raise'")


def _definition(agent: Any, name: str) -> dict[str, Any] | None:
    """The agent's function tool ``name`` as a bare function definition (its description and
    JSON schema): a policy with ``from_schemas`` classifies it by its schema."""
    for t in getattr(agent, "tools", None) or ():
        if isinstance(t, FunctionTool) and t.name == name:
            return {"name": t.name, "description": t.description or "", "parameters": t.params_json_schema}
    return None


def fak_input_guardrail(session: Any, *, on_block: OnBlock = "reject",
                        name: str = "fak_authorization") -> ToolInputGuardrail[Any]:
    """A ``ToolInputGuardrail`` authorizing each function-tool call through ``session``."""
    _check(on_block)

    async def fak_authorization(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        ctx = data.context
        tool = getattr(ctx, "tool_name", None) or "tool"
        d = await aauthorize(session, tool, getattr(ctx, "tool_arguments", None) or None,
                             _definition(data.agent, tool))
        if d.verdict == "ALLOW":
            return ToolGuardrailFunctionOutput.allow(output_info=d)
        if on_block == "raise":
            return ToolGuardrailFunctionOutput.raise_exception(output_info=d)
        return ToolGuardrailFunctionOutput.reject_content(call_notice(d), output_info=d)

    return ToolInputGuardrail(guardrail_function=fak_authorization, name=name)


def fak_output_guardrail(session: Any, *, on_block: OnBlock = "reject",
                         media_type: str | None = None, tags: Iterable[str] = (),
                         name: str = "fak_admission") -> ToolOutputGuardrail[Any]:
    """A ``ToolOutputGuardrail`` admitting each tool output through ``session``."""
    _check(on_block)
    tag_list = tuple(tags)

    async def fak_admission(data: ToolOutputGuardrailData) -> ToolGuardrailFunctionOutput:
        tool = getattr(data.context, "tool_name", None) or "tool"
        s = await ascreen(session, tool, data.output, media_type=media_type, tags=tag_list)
        if s.passed:
            return ToolGuardrailFunctionOutput.allow(output_info=s.admission)
        if on_block == "raise" and not s.admission.admitted:
            return ToolGuardrailFunctionOutput.raise_exception(output_info=s.admission)
        return ToolGuardrailFunctionOutput.reject_content(s.text, output_info=s.admission)

    return ToolOutputGuardrail(guardrail_function=fak_admission, name=name)


def guard_tools(tools: Iterable[Any], session: Any, *, authorize: bool = True, on_block: OnBlock = "reject",
                media_type: str | None = None, tags: Iterable[str] = ()) -> list[Any]:
    """Copies of ``tools`` whose function tools also run ``fak_input_guardrail(session)``
    (unless ``authorize=False``) and ``fak_output_guardrail(session)``, after any
    guardrails they had; other tools are returned unchanged."""
    check = fak_input_guardrail(session, on_block=on_block) if authorize else None
    gate = fak_output_guardrail(session, on_block=on_block, media_type=media_type, tags=tags)
    out = []
    for tool in tools:
        if isinstance(tool, FunctionTool):
            inputs = [*(tool.tool_input_guardrails or []), *([check] if check else [])]
            tool = dataclasses.replace(tool, tool_input_guardrails=inputs,
                                       tool_output_guardrails=[*(tool.tool_output_guardrails or []), gate])
        out.append(tool)
    return out


async def _decide(client: Any, call_id: str, approved: bool) -> None:
    method = client.approve_tool_call if approved else client.reject_tool_call
    if inspect.iscoroutinefunction(method):
        await method(call_id)
    else:
        await asyncio.to_thread(method, call_id)


def _call_id(item: ToolApprovalItem) -> str:
    raw = item.raw_item
    call_id = raw.get("call_id") if isinstance(raw, dict) else getattr(raw, "call_id", None)
    if not isinstance(call_id, str):
        raise ValueError("this approval item has no call id")
    return call_id


def fak_approvals(tools: Iterable[Any], client: Any) -> list[Any]:
    """Copies of ``tools`` whose function tools need the SDK's approval for a call fak held
    (besides any approval they needed already), and tell fak a held call was approved before
    running it. ``client``: a ``fak.sdk.Client`` or ``AsyncClient`` with the key of the person
    who decides (an ``approver`` or ``admin`` key): fak refuses an approval from an agent key,
    and from the key whose request produced the call."""
    out = []
    for tool in tools:
        if isinstance(tool, FunctionTool):
            tool = dataclasses.replace(tool, needs_approval=_needs(tool.needs_approval),
                                       on_invoke_tool=_invoke(tool.on_invoke_tool, client))
        out.append(tool)
    return out


def _needs(before: Any) -> Any:
    async def needs_approval(ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str) -> bool:
        if call_id.startswith(HELD_PREFIX):
            return True
        if callable(before):
            return bool(await before(ctx, params, call_id))
        return bool(before)

    return needs_approval


def _invoke(run: Any, client: Any) -> Any:
    async def on_invoke_tool(ctx: Any, arguments: str) -> Any:
        call_id = getattr(ctx, "tool_call_id", "")
        if isinstance(call_id, str) and call_id.startswith(HELD_PREFIX):
            await _decide(client, call_id, True)  # idempotent: approve() may have told fak already
        return await run(ctx, arguments)

    return on_invoke_tool


async def approve(state: RunState[Any], item: ToolApprovalItem, client: Any) -> None:
    """A person approved ``item``: tell fak (audited), then the run's state (``result.to_state()``)."""
    call_id = _call_id(item)
    if call_id.startswith(HELD_PREFIX):
        await _decide(client, call_id, True)
    state.approve(item)


async def reject(state: RunState[Any], item: ToolApprovalItem, client: Any, *, message: str | None = None) -> None:
    """A person rejected ``item``: tell fak (the model then reads fak's rejection notice), then the run's state."""
    call_id = _call_id(item)
    if call_id.startswith(HELD_PREFIX):
        await _decide(client, call_id, False)
    state.reject(item, rejection_message=message)
