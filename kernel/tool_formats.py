"""The tool-call syntax a model was trained on, chosen from its chat template: how the calls it
writes are read back, how a stream knows a call has begun, and how a call is written in the
model's own form (docs/openai.md, "The tool format").

Three families, one small class each:

- ``hermes`` (``HermesFormat``): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
  blocks; Qwen2.5's and Qwen3's templates, and the fallback for a template that defines no
  tool format (SmolLM2's): ``fak.kernel.openai_tools`` is this format's implementation.
- ``llama3_json`` (``Llama3JsonFormat``): the whole assistant turn is one JSON object
  ``{"name": ..., "parameters": {...}}``, possibly after ``<|python_tag|>`` (Llama 3.1/3.2).
- ``mistral`` (``MistralFormat``): ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]``
  (Mistral Nemo and the v3-tekken templates), where the template wants 9-character ids.

``format_of`` picks the family from the template's source (the markers its tool-call
rendering writes). Every family's reader also takes Hermes blocks, so a model that was shown
the Hermes fallback block and follows it is still read.

Constrained decoding (``fak.kernel.constrain``) writes Hermes blocks only: ``constrained`` is
False for the other families, and a request that would need a call grammar is decoded
without one there (the door lists the grammar among what it ignored).
"""

from __future__ import annotations

import json
import string
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import blake3

from fak.kernel import openai_tools
from fak.kernel.openai_tools import ParsedCall, json_text

if TYPE_CHECKING:
    from fak.kernel.model.tokenizer import ChatTokenizer

__all__ = ["HermesFormat", "Llama3JsonFormat", "MistralFormat", "ToolFormat", "format_for", "format_of",
           "template_has_tools"]

_DECODER = json.JSONDecoder()
_ALNUM = string.ascii_letters + string.digits


@dataclass(frozen=True)
class CallOut:
    """A call to write in the model's form: its name, its arguments (a JSON object, or the
    JSON text of one) and its id (a client's, when it resends a turn)."""

    name: str
    arguments: dict[str, Any] | str
    id: str | None = None


class ToolFormat:
    """One family's call syntax. ``opens``: the texts whose appearance in a turn begins a call
    (a stream holds back everything from there on); ``constrained``: whether constrain.py's
    call grammar writes this syntax."""

    name: ClassVar[str] = "hermes"
    opens: ClassVar[tuple[str, ...]] = (openai_tools.OPEN,)
    constrained: ClassVar[bool] = True

    def parse_calls(self, text: str, names: Collection[str] | None) -> tuple[str, list[ParsedCall]]:
        """(content, calls) of a generated turn; what is not a well-formed call of a known
        tool (``names`` None: any) stays in the content."""
        return openai_tools.parse_calls(text, names)

    def render_calls(self, calls: Sequence[CallOut]) -> str:
        """The calls as the model writes them (what a turn holding only these calls says)."""
        return "\n".join(openai_tools.render_call(c.name, c.arguments) for c in calls)

    def safe_text_len(self, text: str) -> int:
        """How much of a streamed turn can be sent as content now."""
        return openai_tools.safe_text_len(text)

    def template_call(self, call: CallOut) -> dict[str, Any]:
        """A call as the chat template reads it from an assistant message's ``tool_calls``:
        arguments as an object (the templates ``tojson`` them), the id as given."""
        out: dict[str, Any] = {"type": "function", "function": {"name": call.name, "arguments": _object(call.arguments)}}
        if call.id is not None:
            out["id"] = call.id
        return out

    def template_call_id(self, call_id: str) -> str:
        """A call id as the template takes it (unchanged, but for Mistral's)."""
        return call_id


class HermesFormat(ToolFormat):
    """``<tool_call>`` blocks (``fak.kernel.openai_tools``)."""


class Llama3JsonFormat(ToolFormat):
    """Llama 3.x: a turn that is a call is the call's JSON object and nothing else
    (``{"name": ..., "parameters": {...}}``), possibly after ``<|python_tag|>``."""

    name: ClassVar[str] = "llama3_json"
    PYTHON_TAG: ClassVar[str] = "<|python_tag|>"
    opens: ClassVar[tuple[str, ...]] = ("{", PYTHON_TAG, openai_tools.OPEN)
    constrained: ClassVar[bool] = False

    def parse_calls(self, text: str, names: Collection[str] | None) -> tuple[str, list[ParsedCall]]:
        body = text.strip()
        if body.startswith(self.PYTHON_TAG):
            body = body[len(self.PYTHON_TAG):].lstrip()
        calls: list[ParsedCall] = []
        at = 0
        while at < len(body):  # one object, or several separated by ';' (what Llama 3.2 writes for parallel calls)
            try:
                obj, end = _DECODER.raw_decode(body, at)
            except (ValueError, RecursionError):
                break
            call = _call(obj, names, "parameters")
            if call is None:
                break
            calls.append(call)
            at = len(body) - len(body[end:].lstrip().lstrip(";").lstrip())
        if calls and at >= len(body):
            return "", calls
        return openai_tools.parse_calls(text, names)

    def render_calls(self, calls: Sequence[CallOut]) -> str:
        return "; ".join('{"name": ' + json.dumps(c.name, ensure_ascii=False) + ', "parameters": '
                         + json_text(c.arguments) + "}" for c in calls)

    def safe_text_len(self, text: str) -> int:
        """A turn that begins (after whitespace) with ``{`` or ``<|python_tag|>`` may be a call
        in its whole: nothing of it is sent until it ends; otherwise Hermes' rule."""
        head = text.lstrip()
        if not head or head.startswith(("{", self.PYTHON_TAG)) or self.PYTHON_TAG.startswith(head):
            return 0
        return openai_tools.safe_text_len(text)


class MistralFormat(ToolFormat):
    """Mistral: ``[TOOL_CALLS]`` then a JSON array of ``{"name", "arguments", "id"}`` objects.
    ``[TOOL_CALLS]`` is a control token, left out of a decoded turn: a turn that is such an
    array, with the marker or without it, is read as calls."""

    name: ClassVar[str] = "mistral"
    MARKER: ClassVar[str] = "[TOOL_CALLS]"
    opens: ClassVar[tuple[str, ...]] = (MARKER, "[{", openai_tools.OPEN)
    constrained: ClassVar[bool] = False

    def parse_calls(self, text: str, names: Collection[str] | None) -> tuple[str, list[ParsedCall]]:
        at = text.find(self.MARKER)
        start = at + len(self.MARKER) if at >= 0 else 0
        head = text[:at] if at >= 0 else ""
        body = text[start:].strip()
        try:
            arr, end = _DECODER.raw_decode(body)
        except (ValueError, RecursionError):
            arr, end = None, 0
        if isinstance(arr, list) and arr and not body[end:].strip():
            calls = [_call(obj, names, "arguments") for obj in arr]
            if all(c is not None for c in calls):
                return head.strip(), [c for c in calls if c is not None]
        return openai_tools.parse_calls(text, names)

    def render_calls(self, calls: Sequence[CallOut]) -> str:
        items = []
        for c in calls:
            item = '{"name": ' + json.dumps(c.name, ensure_ascii=False) + ', "arguments": ' + json_text(c.arguments)
            if c.id is not None:
                item += ', "id": ' + json.dumps(self.template_call_id(c.id))
            items.append(item + "}")
        return self.MARKER + "[" + ", ".join(items) + "]"

    def safe_text_len(self, text: str) -> int:
        at = text.find(self.MARKER)
        head = text.lstrip()
        if at >= 0:
            return at
        if not head or head.startswith("[") or self.MARKER.startswith(head):
            return 0  # an array from the start may be the calls (their marker decoded away)
        for k in range(min(len(self.MARKER) - 1, len(text)), 0, -1):
            if self.MARKER.startswith(text[-k:]):
                return min(len(text) - k, openai_tools.safe_text_len(text))
        return openai_tools.safe_text_len(text)

    def template_call_id(self, call_id: str) -> str:
        """Mistral's templates refuse ids that are not 9 letters or digits: such an id is
        kept, any other becomes 9 characters derived from it (the same id, the same 9)."""
        if len(call_id) == 9 and call_id.isalnum() and call_id.isascii():
            return call_id
        digest = blake3.blake3(call_id.encode()).digest()
        return "".join(_ALNUM[b % len(_ALNUM)] for b in digest[:9])

    def template_call(self, call: CallOut) -> dict[str, Any]:
        out = super().template_call(call)
        out["id"] = self.template_call_id(call.id or call.name)
        return out


def template_has_tools(source: str | None) -> bool:
    """Whether a chat template renders a request's tools itself (its source reads ``tools``)."""
    return bool(source) and "tools" in (source or "")


def format_of(source: str | None) -> ToolFormat:
    """The call syntax of the model whose chat template is ``source``: the family whose
    marker its tool-call rendering writes; Hermes where it writes none (or there is no template)."""
    if not template_has_tools(source):
        return HermesFormat()
    text = source or ""
    if MistralFormat.MARKER in text:
        return MistralFormat()
    if "<tool_call>" in text:
        return HermesFormat()
    if '"parameters": ' in text or "<|python_tag|>" in text:
        return Llama3JsonFormat()
    return HermesFormat()


def format_for(tokenizer: ChatTokenizer) -> ToolFormat:
    """The call syntax of the model ``tokenizer`` renders for (``format_of`` its template)."""
    return format_of(tokenizer.template_source)


def _object(arguments: dict[str, Any] | str) -> Any:
    """Arguments as the object they are (a JSON text parsed; a text that is not JSON kept)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except (ValueError, RecursionError):
            return arguments
    return arguments


def _call(obj: Any, names: Collection[str] | None, key: str) -> ParsedCall | None:
    """A call object of a known tool, its arguments under ``key`` (or the other family's key)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or (
            names is not None and obj["name"] not in names):
        return None
    args = obj.get(key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return None
    if not isinstance(args, dict):
        return None
    cid = obj.get("id")
    return ParsedCall(obj["name"], args, id=cid if isinstance(cid, str) else None)
