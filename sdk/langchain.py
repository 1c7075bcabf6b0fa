"""LangChain (``langchain-core``) adapter: ``fak_tool(tool, session)`` wraps any
``BaseTool`` so that each call is authorized by a fak session before the tool runs, and
its result is admitted through that session before the model sees it.

    from langchain_core.tools import tool
    from fak.sdk import local
    from fak.sdk.langchain import fak_tool

    @tool
    def read_page(url: str) -> str:
        "Fetch a web page."
        ...

    session = local().create_session()
    safe = fak_tool(read_page, session)       # same name, description and arguments
    msg = safe.invoke({"name": "read_page", "args": {"url": "..."}, "id": "call_1", "type": "tool_call"})

The wrapper first asks the session whether the call may run now
(``session.authorize_tool_call`` with the tool's name and the call's arguments: the
policy's ``tool_calls`` rules over the refs in attention, e.g. no ``send_email`` while an
untrusted tool's output is in the context). Anything but ``ALLOW`` (``DENY``, or
``CONFIRM``: a person must approve) returns a notice naming the verdict, the rule and
the offending refs, and the wrapped tool is not run. The framework's messages are not
fak's to evict: the application may drop the offending tool outputs (``screened[i]
.admission.ref`` names each) and call ``session.evict_refs(decision.offending)``. Each
decision is kept in ``decisions`` (newest last), whether the tool ran or not.

Once authorized, the wrapper runs the wrapped tool (``invoke``/``ainvoke``, callbacks
passed on), admits its result (``fak.sdk.gate``) and returns:

- ``ALLOW`` (or an audit-only policy): the wrapped tool's result, unchanged;
- ``REDACT``: the redacted text fak admitted;
- ``QUARANTINE`` / ``DENY``: a refusal notice (tool, verdict, rule, ref), nothing of the result.

Invoked with a ``ToolCall`` it returns a ``ToolMessage`` as every LangChain tool does,
so agents built on LangChain (or LangGraph's ``ToolNode``) use it unchanged. Each
admission of a result is kept in ``screened`` (newest last) for inspection. A wrapped tool with
``response_format="content_and_artifact"`` loses its artifact (the wrapper returns
content only).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForToolRun, CallbackManagerForToolRun
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field, PrivateAttr

from fak.sdk.gate import Screened, aauthorize, ascreen, authorize, call_notice, screen
from fak.sdk.models import ToolCallDecisionOut

__all__ = ["FakTool", "fak_tool"]


SCREENED_KEPT = 256  # also the number of decisions kept


class FakTool(BaseTool):
    """A ``BaseTool`` whose calls are authorized by a fak session and whose results go
    through its admission gate."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: BaseTool = Field(description="the wrapped tool")
    session: Any = Field(description="a fak Session, LocalSession or AsyncSession")
    media_type: str | None = Field(None, description="media type of the results (default: by their type)")
    fak_tags: tuple[str, ...] = Field((), description="tags recorded with each admitted ref")
    _screened: deque[Screened] = PrivateAttr(default_factory=lambda: deque(maxlen=SCREENED_KEPT))
    _decisions: deque[ToolCallDecisionOut] = PrivateAttr(default_factory=lambda: deque(maxlen=SCREENED_KEPT))

    @property
    def screened(self) -> list[Screened]:
        """The latest results' screenings (the last ``SCREENED_KEPT``; a long-running agent
        does not grow). A call that was not authorized ran nothing and is not here."""
        return list(self._screened)

    @property
    def decisions(self) -> list[ToolCallDecisionOut]:
        """The latest calls' authorizations (the last ``SCREENED_KEPT``), run or not."""
        return list(self._decisions)

    def _refused(self, d: ToolCallDecisionOut) -> str | None:
        """None when the call may run, else the notice the model gets instead of a result."""
        self._decisions.append(d)
        return None if d.verdict == "ALLOW" else call_notice(d)

    @property
    def definition(self) -> dict[str, Any] | None:
        """The wrapped tool as an OpenAI tool definition (its name, description and argument
        schema): a policy with ``from_schemas`` classifies it by its schema."""
        try:
            return convert_to_openai_tool(self.inner)
        except Exception:  # noqa: BLE001 - a tool LangChain cannot describe is classified by its call
            return None

    @staticmethod
    def _input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return args[0] if args and not kwargs else kwargs

    @staticmethod
    def _arguments(tool_input: Any) -> dict[str, Any]:
        """The call's arguments for the authorization: the keywords, or a single input
        (a plain string is not a JSON arguments string) as ``{"input": ...}``."""
        return tool_input if isinstance(tool_input, dict) else {"input": tool_input}

    def _outcome(self, result: Any, s: Screened) -> Any:
        self._screened.append(s)
        return result if s.passed else s.text

    def _run(self, *args: Any, run_manager: CallbackManagerForToolRun | None = None, **kwargs: Any) -> Any:
        tool_input = self._input(args, kwargs)
        refused = self._refused(authorize(self.session, self.inner.name, self._arguments(tool_input),
                                          self.definition))
        if refused is not None:
            return refused
        config = RunnableConfig(callbacks=run_manager.get_child()) if run_manager else None
        result = self.inner.invoke(tool_input, config=config)
        return self._outcome(result, screen(self.session, self.inner.name, result, media_type=self.media_type,
                                            tags=self.fak_tags))

    async def _arun(self, *args: Any, run_manager: AsyncCallbackManagerForToolRun | None = None,
                    **kwargs: Any) -> Any:
        tool_input = self._input(args, kwargs)
        refused = self._refused(await aauthorize(self.session, self.inner.name, self._arguments(tool_input),
                                                 self.definition))
        if refused is not None:
            return refused
        config = RunnableConfig(callbacks=run_manager.get_child()) if run_manager else None
        result = await self.inner.ainvoke(tool_input, config=config)
        return self._outcome(result, await ascreen(self.session, self.inner.name, result,
                                                   media_type=self.media_type, tags=self.fak_tags))


def fak_tool(tool: BaseTool, session: Any, *, media_type: str | None = None, tags: tuple[str, ...] = ()) -> FakTool:
    """Wrap ``tool``: same name, description and argument schema; calls authorized and
    results admitted through ``session``."""
    return FakTool(name=tool.name, description=tool.description, args_schema=tool.args_schema,
                   return_direct=tool.return_direct, inner=tool, session=session, media_type=media_type,
                   fak_tags=tuple(tags))
