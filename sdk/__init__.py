"""fak.sdk: the Python SDK (docs/sdk.md).

- ``Client`` / ``AsyncClient``: the REST API over httpx, typed results, retries for
  idempotent calls, streamed generation as an iterator of text pieces;
- ``local()``: the same interface over an in-process ``Kernel`` (no HTTP);
- ``Agent``: a minimal tool-calling loop whose tool results go through the gate;
- adapters (imported on use): ``fak.sdk.openai_agents`` (an OpenAI Agents SDK tool
  output guardrail) and ``fak.sdk.langchain`` (a LangChain tool wrapper).

Importing ``fak.sdk`` does not import torch; ``local()`` does. ``pip install fak`` is this
client alone (httpx, pydantic); ``local()`` needs ``pip install 'fak[server]'``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fak.sdk.agent import Agent, AgentResult, ToolCall, parse_tool_call
    from fak.sdk.client import AsyncClient, AsyncSession, AsyncTextStream, Client, Session, TextStream
    from fak.sdk.errors import FakAPIError, FakConnectionError, FakSDKError
    from fak.sdk.inprocess import LocalClient, LocalSession, local

_EXPORTS = {
    "Client": "fak.sdk.client",
    "AsyncClient": "fak.sdk.client",
    "Session": "fak.sdk.client",
    "AsyncSession": "fak.sdk.client",
    "TextStream": "fak.sdk.client",
    "AsyncTextStream": "fak.sdk.client",
    "FakAPIError": "fak.sdk.errors",
    "FakConnectionError": "fak.sdk.errors",
    "FakSDKError": "fak.sdk.errors",
    "local": "fak.sdk.inprocess",
    "LocalClient": "fak.sdk.inprocess",
    "LocalSession": "fak.sdk.inprocess",
    "Agent": "fak.sdk.agent",
    "AgentResult": "fak.sdk.agent",
    "ToolCall": "fak.sdk.agent",
    "parse_tool_call": "fak.sdk.agent",
}
__all__ = [
    "Agent", "AgentResult", "AsyncClient", "AsyncSession", "AsyncTextStream", "Client", "FakAPIError",
    "FakConnectionError", "FakSDKError", "LocalClient", "LocalSession", "Session", "TextStream", "ToolCall",
    "local", "parse_tool_call",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fak.sdk' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
