"""LangGraph adapter: a call fak's model door held for a person (CONFIRM) becomes a LangGraph
``interrupt``, and the person's answer becomes fak's audited approval or rejection.

    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.prebuilt import create_react_agent
    from langgraph.types import Command
    from fak.sdk import Client
    from fak.sdk.langgraph import FAK_HELD_CALLS, fak_held_tools

    fak = Client("http://127.0.0.1:8077", api_key=APPROVER_KEY)  # the person who decides: an approver key
    llm = ChatOpenAI(base_url="http://127.0.0.1:8077/v1", api_key="fak_...", extra_body=FAK_HELD_CALLS)
    agent = create_react_agent(llm, fak_held_tools([send_email], fak), checkpointer=InMemorySaver())
    cfg = {"configurable": {"thread_id": "t1"}}
    state = agent.invoke({"messages": [("user", "...")]}, cfg)
    for i in state.get("__interrupt__", ()):       # i.value: {"tool_call_id", "name", "args", ...}
        state = agent.invoke(Command(resume=True), cfg)   # True approves; anything else rejects

Why: fak judges every call its model writes before the answer leaves the server; a CONFIRM
call is held (id ``call_held_…``) until a person decides at ``POST /v1/tool-calls/{id}/approve``
(or ``/reject``), and until then fak refuses its result. With ``fak_held_calls: "return"`` the
held call reaches the framework, so the framework's own human-in-the-loop is where the person
decides. Each wrapped tool, invoked with a ``ToolCall`` whose id is a held one, calls
``langgraph.types.interrupt`` (so it must run inside a graph with a checkpointer, as
``ToolNode`` runs it). On resume, ``True`` approves at fak (audited, naming the client's key:
the person's ``approver`` or ``admin`` key, never the agent's, which fak refuses)
and runs the tool; any other value rejects at fak and returns a ``ToolMessage`` saying the
call did not run (fak shows the model its own rejection notice in its place). A call that
was not held runs unchanged. The interrupt's value says what waits: the call's id, tool
name and arguments, and ``verdict: "CONFIRM"``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterable
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.types import interrupt
from pydantic import ConfigDict, Field

from fak.wire import HELD_PREFIX

__all__ = ["FAK_HELD_CALLS", "HELD_PREFIX", "FakHeldTool", "fak_held_tools"]

FAK_HELD_CALLS: dict[str, Any] = {"fak_held_calls": "return"}  # ChatOpenAI(extra_body=...): held calls come back


def _held_call(value: Any) -> dict[str, Any] | None:
    """The ToolCall ``value`` when it is one and fak held it, else None."""
    if isinstance(value, dict) and value.get("type") == "tool_call":
        call_id = value.get("id")
        if isinstance(call_id, str) and call_id.startswith(HELD_PREFIX):
            return value
    return None


def _rejected(call: dict[str, Any], name: str) -> ToolMessage:
    return ToolMessage(content=f"[fak] A person rejected this call to {name}; it did not run.",
                       tool_call_id=call["id"], name=name, status="error")


class FakHeldTool(BaseTool):
    """A ``BaseTool`` that asks a person (LangGraph ``interrupt``) before running a call fak held."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: BaseTool = Field(description="the wrapped tool")
    client: Any = Field(description="a fak.sdk Client or AsyncClient with the deciding person's approver key")

    def _ask(self, call: dict[str, Any]) -> bool:
        """The person's answer (the resume value; only ``True`` approves)."""
        answer = interrupt({"tool_call_id": call["id"], "name": self.inner.name, "args": call.get("args", {}),
                            "verdict": "CONFIRM"})
        return answer is True

    def invoke(self, input: str | dict[str, Any] | Any, config: RunnableConfig | None = None,
               **kwargs: Any) -> Any:
        call = _held_call(input)
        if call is not None:
            approved = self._ask(call)
            decide = self.client.approve_tool_call if approved else self.client.reject_tool_call
            if inspect.iscoroutinefunction(decide):
                raise TypeError("an AsyncClient needs ainvoke (LangGraph's async run)")
            decide(call["id"])
            if not approved:
                return _rejected(call, self.inner.name)
        return self.inner.invoke(input, config, **kwargs)

    async def ainvoke(self, input: str | dict[str, Any] | Any, config: RunnableConfig | None = None,
                      **kwargs: Any) -> Any:
        call = _held_call(input)
        if call is not None:
            approved = self._ask(call)
            decide = self.client.approve_tool_call if approved else self.client.reject_tool_call
            if inspect.iscoroutinefunction(decide):
                await decide(call["id"])
            else:
                await asyncio.to_thread(decide, call["id"])
            if not approved:
                return _rejected(call, self.inner.name)
        return await self.inner.ainvoke(input, config, **kwargs)

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        """Only reached without a ToolCall (no id, so nothing held): the wrapped tool's answer."""
        return self.inner.invoke(args[0] if args and not kwargs else kwargs)

    async def _arun(self, *args: Any, **kwargs: Any) -> Any:
        return await self.inner.ainvoke(args[0] if args and not kwargs else kwargs)


def fak_held_tools(tools: Iterable[BaseTool], client: Any) -> list[BaseTool]:
    """Copies of ``tools`` (same name, description and argument schema) that interrupt the
    graph for a person's decision on each call fak held, and tell fak that decision."""
    return [FakHeldTool(name=t.name, description=t.description, args_schema=t.args_schema,
                        return_direct=t.return_direct, inner=t, client=client) for t in tools]
