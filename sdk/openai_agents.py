"""OpenAI Agents SDK (``openai-agents``) adapter: a tool output guardrail that admits
every output of a function tool through a fak session.

    from agents import Agent, function_tool
    from fak.sdk import Client
    from fak.sdk.openai_agents import fak_output_guardrail

    fak = Client("http://127.0.0.1:8077", api_key="fak_...")
    session = fak.create_session()
    gate = fak_output_guardrail(session)

    @function_tool(tool_output_guardrails=[gate])
    def fetch(url: str) -> str:
        ...

    agent = Agent(name="assistant", tools=[fetch])   # or: tools=guard_tools([fetch], session)

The Agents SDK runs tool output guardrails after a function tool returns and before
its output reaches the model (``agents.tool_guardrails``). This one admits the output
(``fak.sdk.gate``) and answers:

- ``ALLOW`` (or an audit-only policy): ``allow`` — the model gets the original output;
- ``REDACT``: ``reject_content`` with the redacted text, which the model gets instead;
- ``QUARANTINE`` / ``DENY``: ``reject_content`` with a refusal notice (tool, verdict,
  rule, ref) and nothing of the output; with ``on_block="raise"``, ``raise_exception``
  instead (the run stops with ``ToolOutputGuardrailTripwireTriggered``).

``output_info`` carries the ``AdmissionOut`` (verdict, rule, ref, audit index) into the
run result's ``tool_output_guardrail_results``. The session may be a ``Session``,
``LocalSession`` or ``AsyncSession``; a blocking one runs in a worker thread.

What the guardrail does not do: it does not decide what the framework's model saw
earlier, and it applies to function tools only (the Agents SDK runs no output
guardrails for hosted tools such as web search).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, Literal

from agents import FunctionTool, ToolGuardrailFunctionOutput, ToolOutputGuardrail, ToolOutputGuardrailData

from fak.sdk.gate import ascreen

__all__ = ["fak_output_guardrail", "guard_tools"]


def fak_output_guardrail(session: Any, *, on_block: Literal["reject", "raise"] = "reject",
                         media_type: str | None = None, tags: Iterable[str] = (),
                         name: str = "fak_admission") -> ToolOutputGuardrail[Any]:
    """A ``ToolOutputGuardrail`` admitting each tool output through ``session``."""
    if on_block not in ("reject", "raise"):
        raise ValueError("on_block is 'reject' or 'raise'")
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


def guard_tools(tools: Iterable[Any], session: Any, **options: Any) -> list[Any]:
    """Copies of ``tools`` whose function tools also run ``fak_output_guardrail(session)``
    (after any guardrails they had); other tools are returned unchanged."""
    guardrail = fak_output_guardrail(session, **options)
    out = []
    for tool in tools:
        if isinstance(tool, FunctionTool):
            tool = dataclasses.replace(tool, tool_output_guardrails=[*(tool.tool_output_guardrails or []), guardrail])
        out.append(tool)
    return out
