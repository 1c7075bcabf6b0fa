"""The tool-call syntax a model was trained on, chosen from its chat template: how the calls it
writes are read back, how a stream knows a call has begun, and how a call is written in the
model's own form (docs/openai.md, "The tool format").

Four families, one small class each:

- ``hermes`` (``HermesFormat``): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
  blocks; Qwen2.5's and Qwen3's templates, and the fallback for a template that defines no
  tool format (SmolLM2's): ``fak.kernel.calls.tool_text`` is this format's implementation.
- ``llama3_json`` (``Llama3JsonFormat``): the whole assistant turn is one JSON object
  ``{"name": ..., "parameters": {...}}``, possibly after ``<|python_tag|>`` (Llama 3.1/3.2).
- ``mistral`` (``MistralFormat``): ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]``
  (Mistral Nemo and the v3-tekken templates), where the template wants 9-character ids.
- ``gemma`` (``GemmaFormat``): each call a ``{"name": ..., "arguments": {...}}`` object in a
  ````` ```tool_code ````` block, results in ````` ```tool_output ````` blocks of user turns (Gemma 3,
  which has no tool role: Google's function-calling guide for it has the model write its calls in
  ``tool_code`` blocks and read results in ``tool_output`` blocks; fak's Gemma 3 template,
  ``fak.kernel.model.tokenizer.GEMMA3_TEMPLATE``, teaches the JSON object form, which the call
  grammars can constrain as they do the other families').

``format_of`` picks the family from the template's source (the markers its tool-call
rendering writes). Every family's reader also takes Hermes blocks, so a model that was shown
the Hermes fallback block and follows it is still read.

Constrained decoding (``fak.kernel.openai.constrain``) writes each family's own syntax: a format
gives the call grammars its ``CallSyntax`` (``call_syntax``), and ``call_blocks`` finds where
each call lies in a turn's text (what ``fak.kernel.calls.generated`` needs for call evidence).
"""

from __future__ import annotations

import functools
import json
import string
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import blake3

from fak.kernel.calls import tool_text
from fak.kernel.calls.tool_text import CallBlock, ParsedCall, json_text

if TYPE_CHECKING:
    from fak.kernel.model.tokenizer import ChatTokenizer

__all__ = ["HERMES_SYNTAX", "CallSyntax", "GemmaFormat", "HermesFormat", "Llama3JsonFormat", "MistralFormat",
           "ToolFormat", "format_for", "format_of", "template_has_tools"]

_DECODER = json.JSONDecoder()
_ALNUM = string.ascii_letters + string.digits
_JSON_WS = " \t\n\r"


@dataclass(frozen=True)
class CallSyntax:
    """A family's call syntax as the call grammars (``fak.kernel.openai.constrain``) write it: the calls
    are ``marker`` (a special token's id, or None) and ``opening``, then each call as
    ``call_open`` + ``body_open`` + ``{"name": <name>, "<key>": <arguments>[, "id": <9 letters or
    digits>]}`` + ``body_close``, the calls joined by ``separator``, then ``closing``.
    ``text_first``: under ``auto`` free text may precede the calls (its first ``call_open`` then
    begins them); otherwise a turn is free text or calls from its start, and free text may not
    begin (after whitespace) with a match of a ``free_not_starting`` regex. Free text never
    holds a ``free_not_holding`` text (what the family's reader would take for a call)."""

    opening: str = ""
    marker: int | None = None
    call_open: str = tool_text.OPEN
    body_open: str = "\n"
    body_close: str = "\n" + tool_text.CLOSE
    key: str = "arguments"
    call_id: bool = False
    separator: str = "\n"
    closing: str = ""
    text_first: bool = True
    free_not_starting: tuple[str, ...] = ()
    free_not_holding: tuple[str, ...] = (tool_text.OPEN,)


HERMES_SYNTAX = CallSyntax()


@dataclass(frozen=True)
class CallOut:
    """A call to write in the model's form: its name, its arguments (a JSON object, or the
    JSON text of one) and its id (a client's, when it resends a turn)."""

    name: str
    arguments: dict[str, Any] | str
    id: str | None = None


class ToolFormat:
    """One family's call syntax. ``opens``: the texts whose appearance in a turn begins a call
    (a stream holds back everything from there on)."""

    name: ClassVar[str] = "hermes"
    opens: ClassVar[tuple[str, ...]] = (tool_text.OPEN,)

    def parse_calls(self, text: str, names: Collection[str] | None) -> tuple[str, list[ParsedCall]]:
        """(content, calls) of a generated turn; what is not a well-formed call of a known
        tool (``names`` None: any) stays in the content."""
        return tool_text.parse_calls(text, names)

    def render_calls(self, calls: Sequence[CallOut]) -> str:
        """The calls as the model writes them (what a turn holding only these calls says)."""
        return "\n".join(tool_text.render_call(c.name, c.arguments) for c in calls)

    def safe_text_len(self, text: str) -> int:
        """How much of a streamed turn can be sent as content now."""
        return tool_text.safe_text_len(text)

    def call_syntax(self, tokenizer: ChatTokenizer | None = None) -> CallSyntax:
        """The syntax the call grammars write for this family (``tokenizer``: the model's, whose
        special tokens the syntax may use; None: their text form)."""
        return HERMES_SYNTAX

    def call_blocks(self, text: str, names: Collection[str] | None) -> list[CallBlock]:
        """Where each call ``parse_calls`` reads lies in ``text`` (its JSON object's start and
        end), in order: what call evidence locates among a turn's tokens."""
        return tool_text.call_blocks(text, names)

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
    """``<tool_call>`` blocks (``fak.kernel.calls.tool_text``)."""


class Llama3JsonFormat(ToolFormat):
    """Llama 3.x: a turn that is a call is the call's JSON object and nothing else
    (``{"name": ..., "parameters": {...}}``), possibly after ``<|python_tag|>``."""

    name: ClassVar[str] = "llama3_json"
    PYTHON_TAG: ClassVar[str] = "<|python_tag|>"
    opens: ClassVar[tuple[str, ...]] = ("{", PYTHON_TAG, tool_text.OPEN)

    def parse_calls(self, text: str, names: Collection[str] | None) -> tuple[str, list[ParsedCall]]:
        blocks = self._blocks(text, names)
        if blocks:
            return "", [b.call for b in blocks]
        return tool_text.parse_calls(text, names)

    def call_blocks(self, text: str, names: Collection[str] | None) -> list[CallBlock]:
        return self._blocks(text, names) or tool_text.call_blocks(text, names)

    def _blocks(self, text: str, names: Collection[str] | None) -> list[CallBlock] | None:
        """The calls of a turn that is nothing but calls in this family's form (else None)."""
        end = len(text.rstrip())
        at = len(text) - len(text.lstrip())
        if text.startswith(self.PYTHON_TAG, at):
            at = end - len(text[at + len(self.PYTHON_TAG):end].lstrip())
        whole = text[:end]
        blocks: list[CallBlock] = []
        while at < end:  # one object, or several separated by ';' (what Llama 3.2 writes for parallel calls)
            try:
                obj, stop = _DECODER.raw_decode(whole, at)
            except (ValueError, RecursionError):
                break
            call = _call(obj, names, "parameters")
            if call is None:
                break
            blocks.append(CallBlock(call, at, at, stop, stop))
            at = end - len(whole[stop:].lstrip().lstrip(";").lstrip())
        return blocks if blocks and at >= end else None

    def call_syntax(self, tokenizer: ChatTokenizer | None = None) -> CallSyntax:
        """The whole turn is the call objects joined by ``"; "`` (``render_calls``); free text
        may not begin with ``{`` or ``<|python_tag|>``, nor hold ``<tool_call>``."""
        return CallSyntax(call_open="", body_open="", body_close="", key="parameters", separator="; ",
                          text_first=False, free_not_starting=(r"\{", r"<\|python_tag\|>"))

    def render_calls(self, calls: Sequence[CallOut]) -> str:
        return "; ".join('{"name": ' + json.dumps(c.name, ensure_ascii=False) + ', "parameters": '
                         + json_text(c.arguments) + "}" for c in calls)

    def safe_text_len(self, text: str) -> int:
        """A turn that begins (after whitespace) with ``{`` or ``<|python_tag|>`` may be a call
        in its whole: nothing of it is sent until it ends; otherwise Hermes' rule."""
        head = text.lstrip()
        if not head or head.startswith(("{", self.PYTHON_TAG)) or self.PYTHON_TAG.startswith(head):
            return 0
        return tool_text.safe_text_len(text)


class MistralFormat(ToolFormat):
    """Mistral: ``[TOOL_CALLS]`` then a JSON array of ``{"name", "arguments", "id"}`` objects.
    ``[TOOL_CALLS]`` is a control token, left out of a decoded turn: a turn that is such an
    array, with the marker or without it, is read as calls."""

    name: ClassVar[str] = "mistral"
    MARKER: ClassVar[str] = "[TOOL_CALLS]"
    opens: ClassVar[tuple[str, ...]] = (MARKER, "[{", tool_text.OPEN)

    def parse_calls(self, text: str, names: Collection[str] | None) -> tuple[str, list[ParsedCall]]:
        blocks = self._blocks(text, names)
        if blocks:
            at = text.find(self.MARKER)
            return (text[:at] if at >= 0 else "").strip(), [b.call for b in blocks]
        return tool_text.parse_calls(text, names)

    def call_blocks(self, text: str, names: Collection[str] | None) -> list[CallBlock]:
        return self._blocks(text, names) or tool_text.call_blocks(text, names)

    def _blocks(self, text: str, names: Collection[str] | None) -> list[CallBlock] | None:
        """The calls of the array after the marker (or of a turn that is such an array), each
        object's span; None when it is not an array of calls of known tools."""
        at = text.find(self.MARKER)
        start = at + len(self.MARKER) if at >= 0 else 0
        end = len(text.rstrip())
        body = max(start, end - len(text[start:end].lstrip()))
        whole = text[:end]
        try:
            arr, stop = _DECODER.raw_decode(whole, body)
        except (ValueError, RecursionError):
            return None
        if not isinstance(arr, list) or not arr or whole[stop:].strip():
            return None
        blocks: list[CallBlock] = []
        i = body + 1
        for obj in arr:  # the array is well-formed: between its items only JSON whitespace and commas
            while whole[i] in _JSON_WS + ",":
                i += 1
            call = _call(obj, names, "arguments")
            if call is None:
                return None
            _, j = _DECODER.raw_decode(whole, i)
            blocks.append(CallBlock(call, i, i, j, j))
            i = j
        return blocks

    def call_syntax(self, tokenizer: ChatTokenizer | None = None) -> CallSyntax:
        """``[TOOL_CALLS]`` (the special token where the vocabulary has it, else its text) then
        the array of call objects, each with a 9-character id, as the template writes them; free
        text may not begin with an array of objects, nor hold ``[TOOL_CALLS]`` or ``<tool_call>``."""
        marker = _special_id(tokenizer, self.MARKER)
        return CallSyntax(opening="[" if marker is not None else self.MARKER + "[", marker=marker, call_open="",
                          body_open="", body_close="", call_id=True, separator=", ", closing="]",
                          text_first=False, free_not_starting=(r"\[[ \t\n\r]*\{",),
                          free_not_holding=(self.MARKER, tool_text.OPEN))

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
                return min(len(text) - k, tool_text.safe_text_len(text))
        return tool_text.safe_text_len(text)

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


class GemmaFormat(ToolFormat):
    """Gemma 3: each call a JSON object ``{"name": ..., "arguments": {...}}`` in a block that
    opens with ````` ```tool_code ````` and closes with ````` ``` `````; text may precede and follow
    the blocks. Hermes blocks are read too."""

    name: ClassVar[str] = "gemma"
    OPEN: ClassVar[str] = "```tool_code"
    CLOSE: ClassVar[str] = "```"
    opens: ClassVar[tuple[str, ...]] = (OPEN, tool_text.OPEN)

    def parse_calls(self, text: str, names: Collection[str] | None) -> tuple[str, list[ParsedCall]]:
        blocks = self._blocks(text, names)
        if not blocks:
            return tool_text.parse_calls(text, names)
        return tool_text.without_blocks(text, blocks)

    def call_blocks(self, text: str, names: Collection[str] | None) -> list[CallBlock]:
        return self._blocks(text, names) or tool_text.call_blocks(text, names)

    def _blocks(self, text: str, names: Collection[str] | None) -> list[CallBlock]:
        """Every well-formed ``tool_code`` block holding a call of a known tool, in order: after
        its opening, one JSON object (its strings may hold fences), then the closing fence."""
        found: list[CallBlock] = []
        start = 0
        while (at := text.find(self.OPEN, start)) >= 0:
            opened = at + len(self.OPEN)
            start = opened
            body = len(text) - len(text[opened:].lstrip())
            try:
                obj, body_end = _DECODER.raw_decode(text, body)
            except (ValueError, RecursionError):
                continue
            close = len(text) - len(text[body_end:].lstrip())
            call = _call(obj, names, "arguments")
            if call is None or not text.startswith(self.CLOSE, close):
                continue
            found.append(CallBlock(call, at, body, body_end, close + len(self.CLOSE)))
            start = close + len(self.CLOSE)
        return found

    def call_syntax(self, tokenizer: ChatTokenizer | None = None) -> CallSyntax:
        """Each call ````` ```tool_code\\n{"name": ..., "arguments": ...}\\n``` `````, calls one
        per line, free text before them; free text never holds ````` ```tool_code ````` or ``<tool_call>``."""
        return CallSyntax(call_open=self.OPEN, body_open="\n", body_close="\n" + self.CLOSE,
                          free_not_holding=(self.OPEN, tool_text.OPEN))

    def render_calls(self, calls: Sequence[CallOut]) -> str:
        return "\n".join(self.OPEN + '\n{"name": ' + json.dumps(c.name, ensure_ascii=False) + ', "arguments": '
                         + json_text(c.arguments) + "}\n" + self.CLOSE for c in calls)

    def safe_text_len(self, text: str) -> int:
        """Everything before a ````` ```tool_code ````` (or a tail that could still become one), and
        before Hermes' opening tag as Hermes' rule holds it back."""
        limit = tool_text.safe_text_len(text)
        at = text.find(self.OPEN)
        if at >= 0:
            return min(at, limit)
        for k in range(min(len(self.OPEN) - 1, len(text)), 0, -1):
            if self.OPEN.startswith(text[-k:]):
                return min(len(text) - k, limit)
        return limit


def template_has_tools(source: str | None) -> bool:
    """Whether a chat template renders a request's tools itself (its source reads ``tools``)."""
    return bool(source) and "tools" in (source or "")


@functools.lru_cache(maxsize=32)
def format_of(source: str | None) -> ToolFormat:
    """The call syntax of the model whose chat template is ``source``: the family whose
    marker its tool-call rendering writes; Hermes where it writes none (or there is no template).
    Cached: a door asks for it per token while it decides calls, and formats hold no state."""
    if not template_has_tools(source):
        return HermesFormat()
    text = source or ""
    if MistralFormat.MARKER in text:
        return MistralFormat()
    if GemmaFormat.OPEN in text:
        return GemmaFormat()
    if "<tool_call>" in text:
        return HermesFormat()
    if '"parameters": ' in text or "<|python_tag|>" in text:
        return Llama3JsonFormat()
    return HermesFormat()


def format_for(tokenizer: ChatTokenizer) -> ToolFormat:
    """The call syntax of the model ``tokenizer`` renders for (``format_of`` its template)."""
    return format_of(tokenizer.template_source)


def _special_id(tokenizer: ChatTokenizer | None, text: str) -> int | None:
    """The id of ``text`` when it is one special token of ``tokenizer``'s vocabulary."""
    if tokenizer is None:
        return None
    tid = tokenizer.tk.token_to_id(text)
    added = tokenizer.tk.get_added_tokens_decoder().get(tid) if tid is not None else None
    return tid if tid is not None and added is not None and added.special and tid < tokenizer.vocab_size else None


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
    return tool_text.call_of(obj, names, key, with_id=True)
