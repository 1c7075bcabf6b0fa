"""What every adapter does with a tool's output: admit it through a fak session and
decide what the framework's model may see instead.

``screen(session, tool, output)`` admits the output (any Python value: text as is,
bytes as bytes, anything else as JSON) and returns a ``Screened``:

- the verdict let the bytes in unchanged (``ALLOW``, or any verdict of an audit-only
  policy, which records but does not enforce): ``passed`` is True and ``text`` is the
  output as admitted; adapters hand the framework the ORIGINAL output object;
- ``REDACT``: ``text`` is the redacted bytes as fak admitted them (read back from the
  CAS), which the framework gets in place of the output;
- ``QUARANTINE`` / ``DENY``: ``text`` is a short refusal notice naming the tool, the
  verdict, the rule and the ref, and nothing of the output.

Works with every session flavour: ``Session``, ``LocalSession`` (blocking) and
``AsyncSession`` (``ascreen``; a blocking session there runs in a worker thread).

What every adapter does *before* a tool runs: ``authorize(session, tool, arguments)``
(``aauthorize`` from asyncio) asks the session whether the call may run now, given what
is in the attention of its context (the policy's ``tool_calls`` rules), and returns the
``ToolCallDecisionOut``. Only ``ALLOW`` runs the tool; for anything else
``call_notice(decision)`` is what the framework's model gets instead of a result. The
decision does not depend on which model produced the call: fak's, or a framework's own
model that merely reports it.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fak.sdk.models import AdmissionOut, ToolCallDecisionOut

NOTICE = ("[fak] The output of tool '{tool}' was withheld: verdict {verdict} (rule {rule}, ref {ref}). "
          "It never entered the context; treat the tool call as failed.")


CALL_NOTICE = "[fak] The call of tool '{tool}' was not run: verdict {verdict} (rule {rule}{refs}). {why}"
_WHY = {
    "CONFIRM": "A person must approve this call first.",
    "DENY": "The policy does not allow calling it now.",
}
_WHY_REFS = ("Content now in the context (the refs named) makes the policy refuse it; the call may be made "
             "once that content is dropped from the context.")


@dataclass(frozen=True)
class Screened:
    """One tool output after the gate."""

    tool: str
    admission: AdmissionOut
    passed: bool  # the output entered unchanged: give the framework the original
    text: str  # what the model may see: the admitted text, the redacted text or a notice

    @property
    def verdict(self) -> str:
        return self.admission.verdict


def payload(output: Any) -> tuple[str | bytes, str]:
    """A tool output as the bytes fak admits, and their media type."""
    if isinstance(output, str):
        return output, "text/plain"
    if isinstance(output, bytes | bytearray | memoryview):
        return bytes(output), "application/octet-stream"
    dump = getattr(output, "model_dump_json", None)  # a pydantic model
    if callable(dump):
        return dump(), "application/json"
    try:
        return json.dumps(output, ensure_ascii=False, default=str), "application/json"
    except (TypeError, ValueError):
        return str(output), "text/plain"


def _text(content: str | bytes) -> str:
    return content if isinstance(content, str) else content.decode("utf-8", errors="replace")


def notice(tool: str, a: AdmissionOut) -> str:
    return NOTICE.format(tool=tool, verdict=a.verdict, rule=a.rule_id, ref=a.ref)


def _client(session: Any) -> Any:
    return getattr(session, "client", None)


def _decide(tool: str, content: str | bytes, a: AdmissionOut, redacted: bytes | None, *, exact: bool) -> Screened:
    """``exact``: the output is the very text that was admitted (a string). Any other
    object reaches the model however its framework serialises it, which is not what the
    gate read: the admitted text is given instead."""
    if not a.admitted:
        return Screened(tool, a, False, notice(tool, a))
    if a.admitted_ref is None or a.admitted_ref == a.ref:
        return Screened(tool, a, exact, _text(content))
    if redacted is None:  # cannot read the redacted bytes back: withhold rather than pass the original
        return Screened(tool, a, False, notice(tool, a))
    return Screened(tool, a, False, redacted.decode("utf-8", errors="replace"))


def _needs_read(a: AdmissionOut) -> bool:
    return a.admitted and a.admitted_ref is not None and a.admitted_ref != a.ref


def screen(session: Any, tool: str, output: Any, *, media_type: str | None = None,
           tags: tuple[str, ...] = ()) -> Screened:
    """Admit ``output`` of ``tool`` through ``session`` (blocking session)."""
    content, kind = payload(output)
    a = session.admit(tool, content, media_type=media_type or kind, tags=tags)
    redacted = _client(session).ref_content(a.admitted_ref) if _needs_read(a) else None
    return _decide(tool, content, a, redacted, exact=isinstance(output, str))


async def ascreen(session: Any, tool: str, output: Any, *, media_type: str | None = None,
                  tags: tuple[str, ...] = ()) -> Screened:
    """``screen`` from asyncio: awaits an ``AsyncSession``, runs a blocking one in a thread."""
    if not inspect.iscoroutinefunction(session.admit):
        return await asyncio.to_thread(screen, session, tool, output, media_type=media_type, tags=tags)
    content, kind = payload(output)
    a = await session.admit(tool, content, media_type=media_type or kind, tags=tags)
    redacted = await _client(session).ref_content(a.admitted_ref) if _needs_read(a) else None
    return _decide(tool, content, a, redacted, exact=isinstance(output, str))


# --- before a tool runs: tool-call authorization ---------------------------------------
def _arguments(arguments: Any) -> dict[str, Any] | str | None:
    """The call's arguments as the API takes them: an object, a JSON string (as OpenAI sends
    them) or None; any other value goes through JSON (``str`` for what JSON cannot hold),
    so that both session flavours see the same arguments."""
    if arguments is None or isinstance(arguments, str):
        return arguments
    value = json.loads(json.dumps(arguments, ensure_ascii=False, default=str))
    return value if isinstance(value, dict) else {"input": value}


def authorize(session: Any, tool: str, arguments: Any = None,
              definition: Mapping[str, Any] | None = None) -> ToolCallDecisionOut:
    """May ``tool`` be called with ``arguments`` now? (blocking session). ``definition``: the
    tool's schema as the framework declares it (classifies a tool no policy rule names)."""
    decision: ToolCallDecisionOut = session.authorize_tool_call(tool, _arguments(arguments), tool=definition)
    return decision


async def aauthorize(session: Any, tool: str, arguments: Any = None,
                     definition: Mapping[str, Any] | None = None) -> ToolCallDecisionOut:
    """``authorize`` from asyncio: awaits an ``AsyncSession``, runs a blocking one in a thread."""
    if not inspect.iscoroutinefunction(session.authorize_tool_call):
        return await asyncio.to_thread(authorize, session, tool, arguments, definition)
    decision: ToolCallDecisionOut = await session.authorize_tool_call(tool, _arguments(arguments), tool=definition)
    return decision


def call_notice(d: ToolCallDecisionOut) -> str:
    """What the model gets instead of the result of a call that was not run: the verdict,
    the rule and the offending refs (the exact remedy is to drop them from the context)."""
    refs = f", offending refs {', '.join(d.offending)}" if d.offending else ""
    why = _WHY_REFS if d.offending and d.verdict == "DENY" else _WHY.get(d.verdict, "")
    notice = CALL_NOTICE.format(tool=d.tool, verdict=d.verdict, rule=d.rule_id, refs=refs, why=why)
    return " ".join([notice, *findings_text(d)])


def findings_text(d: ToolCallDecisionOut) -> list[str]:
    """Why a rule fired, per argument, as a person reads it: where its value was found."""
    out = []
    for f in d.findings:
        what = f"argument {f.argument}" + (f" ({f.entity} inside it)" if f.entity else "")
        where = "; ".join(f"{s.ref or s.segment} chars {s.start}-{s.end}" + (f" field {s.field}" if s.field else "")
                          for s in f.sources[:3])
        out.append(f"{what}: {f.origin}" + (f", found in {where}." if where else ", found in no text of the context."))
    return out
