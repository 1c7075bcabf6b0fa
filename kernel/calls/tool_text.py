"""Tool calling in the model's text: how a request's ``tools`` are shown to the model and how
the calls it writes are read back (the chat and Responses doors share this; docs/openai.md).

**The format.** A model whose chat template has a tool format of its own is shown its tools
and read back in it (``fak.kernel.calls.formats``: Qwen's is this one, Llama 3's and Mistral's
differ). A model whose chat template defines no tool format (SmolLM2's has none) is
shown its tools, and writes its calls, in the Hermes format (the one Qwen2.5 and many
open models are trained on): a system block listing each tool as one JSON line inside
``<tools>`` … ``</tools>``, and each call as ::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

An assistant message a client resends with ``tool_calls`` is written back in exactly this
form (``render_call``), so the model reads its own earlier calls the way it wrote them and a
resent turn renders to the tokens the session already holds (arguments keep their key
order; spacing is ``json.dumps``'s, the form constrained decoding writes). The tool block is rendered deterministically (``render_tools``: tools in request
order, each a canonical JSON line), so the same tools give the same bytes, hence the same
ref, the same tokens and prefix-cache hits across requests.

**Reading calls back** (``parse_calls``): every complete ``<tool_call>`` block whose body is a
JSON object with a string ``name`` naming one of the request's tools and an object (or a
JSON string of an object) ``arguments`` becomes a call; anything else (text, a malformed or
unterminated block, an unknown tool) stays in the message's content, so nothing the model
wrote is silently lost.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal

from fak.errors import InvalidInput
from fak.types import TOOL_DEFINITIONS

__all__ = ["TOOL_DEFINITIONS", "ParsedCall", "ToolChoice", "ToolSpec", "call_of", "canonical_turn", "parse_calls", "render_call",
           "render_tools", "tool_choice", "tool_specs"]
OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_TOOLS = 128
_DECODER = json.JSONDecoder()
_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")

PREAMBLE = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n")
POSTAMBLE = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
             "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
             '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


@dataclass(frozen=True)
class ToolSpec:
    """One callable function of a request: its name, description, the JSON schema of its
    arguments (an object schema), and whether its calls must validate (``strict``); ``where``:
    the request parameter that holds the schema, as a grammar's errors name it (default
    ``tools[<name>].parameters``; ``fak.kernel.openai.constrain``)."""

    name: str
    description: str
    parameters: dict[str, Any]
    strict: bool
    where: str = ""
    # the tool name its calls are decided and logged under, when it is not ``name``: an MCP
    # server's tool, shown to the model by its own name, is governed as ``mcp:<label>/<tool>``
    governed: str | None = None

    @property
    def decided_as(self) -> str:
        """The tool name the policy decides this tool's calls under."""
        return self.governed or self.name

    def line(self) -> str:
        """The tool as the model sees it: one canonical JSON line."""
        return self.canonical

    @functools.cached_property
    def canonical(self) -> str:
        """``line()``, computed once per spec: the authorizer keys a tool's class on it for
        every call of the tool."""
        return json.dumps(self.definition(), ensure_ascii=False, sort_keys=True)

    def definition(self) -> dict[str, Any]:
        """The tool as a chat template reads it (``tools=``): its schema's keys sorted, so the
        same tools render to the same bytes however a client ordered them."""
        fn: dict[str, Any] = {"name": self.name}
        if self.description:
            fn["description"] = self.description
        fn["parameters"] = json.loads(json.dumps(self.parameters, sort_keys=True))
        return {"type": "function", "function": fn}


Choice = Literal["auto", "none", "required"]


@dataclass(frozen=True)
class ToolChoice:
    """What the model may do: ``auto`` (text or calls), ``none`` (text only), ``required`` (one
    or more calls of any tool), or ``function`` (calls of the one named tool)."""

    mode: Literal["auto", "none", "required", "function"]
    function: str | None = None


@dataclass(frozen=True)
class ParsedCall:
    """A call read from the model's text: its name, its arguments (a JSON object), the
    arguments as the JSON text the response carries, and the id the model wrote (Mistral's
    calls carry one; ``fak.kernel.calls.formats``)."""

    name: str
    arguments: dict[str, Any]
    id: str | None = None

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


def tool_specs(tools: list[dict[str, Any]] | None, where: str = "tools") -> list[ToolSpec]:
    """Validate a request's ``tools`` (chat-completions shape) into specs; other tool types
    (custom, web search, ...) are refused naming them."""
    specs: list[ToolSpec] = []
    if tools is None:
        return specs
    if len(tools) > MAX_TOOLS:
        raise InvalidInput(f"{where}: at most {MAX_TOOLS} tools")
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        at = f"{where}[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise InvalidInput(f"{at}: only function tools are supported, not {str(kind)[:40]!r}", param=at)
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise InvalidInput(f"{at}.function: a function tool has a 'function' object", param=f"{at}.function")
        specs.append(spec_of(fn, f"{at}.function"))
        if specs[-1].name in seen:
            raise InvalidInput(f"{at}.function.name: {specs[-1].name!r} is defined twice", param=f"{at}.function.name")
        seen.add(specs[-1].name)
    return specs


def spec_of(fn: dict[str, Any], at: str) -> ToolSpec:
    """One function definition (``name``, ``description``, ``parameters``, ``strict``)."""
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidInput(f"{at}.name: a function name is 1-64 letters, digits, '_', '.', ':' or '-'",
                           param=f"{at}.name")
    description = fn.get("description") or ""
    if not isinstance(description, str):
        raise InvalidInput(f"{at}.description: a string", param=f"{at}.description")
    parameters = fn.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise InvalidInput(f"{at}.parameters: a JSON schema object", param=f"{at}.parameters")
    strict = fn.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidInput(f"{at}.strict: true or false", param=f"{at}.strict")
    return ToolSpec(name, description, parameters, bool(strict))


def tool_choice(value: str | dict[str, Any] | None, specs: list[ToolSpec]) -> ToolChoice:
    """A request's ``tool_choice`` (chat or Responses shape) against its tools."""
    if value is None:
        return ToolChoice("auto" if specs else "none")
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise InvalidInput(f"tool_choice: 'auto', 'none', 'required' or a named function, not {value[:40]!r}",
                               param="tool_choice")
        if value == "required" and not specs:
            raise InvalidInput("tool_choice: 'required' needs tools", param="tool_choice")
        return ToolChoice(value if specs else "none")  # type: ignore[arg-type]
    kind = value.get("type")
    fn = value.get("function")
    name = fn.get("name") if isinstance(fn, dict) else value.get("name")  # chat shape, Responses shape
    if kind != "function" or not isinstance(name, str):
        raise InvalidInput("tool_choice: a named function is {'type': 'function', 'function': {'name': ...}}",
                           param="tool_choice")
    if name not in {s.name for s in specs}:
        raise InvalidInput(f"tool_choice: no tool named {name[:64]!r} in tools", param="tool_choice")
    return ToolChoice("function", name)


def render_tools(specs: list[ToolSpec]) -> str:
    """The system block that shows the model its tools (the module notes' format)."""
    return PREAMBLE + "\n".join(s.line() for s in specs) + POSTAMBLE


def json_text(value: str | dict[str, Any] | Any) -> str:
    """Arguments as JSON text in ``json.dumps``'s form, keys in the order given (the order the
    model wrote them: a call resent as it was returned renders to the tokens the model
    produced); a string that is not JSON stays a JSON string."""
    raw = value if isinstance(value, str) else None
    try:
        return json.dumps(json.loads(raw) if raw is not None else value, ensure_ascii=False)
    except (ValueError, RecursionError, TypeError):
        return json.dumps(raw if raw is not None else str(value), ensure_ascii=False)


def render_call(name: str, arguments: str | dict[str, Any], *, key: str = "arguments") -> str:
    """One call in the model's format (``key`` is ``input`` for a custom tool's raw string)."""
    body = json_text(arguments) if key == "arguments" else json.dumps(arguments, ensure_ascii=False)
    return OPEN + '\n{"name": ' + json.dumps(name, ensure_ascii=False) + f', "{key}": ' + body + "}\n" + CLOSE


@dataclass(frozen=True)
class CallBlock:
    """A well-formed call block of a text: the call, where the block starts (its ``<tool_call>``),
    where its JSON body starts and ends, and where its closing tag ends."""

    call: ParsedCall
    at: int
    body: int
    body_end: int
    end: int


def call_blocks(text: str, names: Collection[str] | None) -> list[CallBlock]:
    """Every well-formed block naming a known tool (any tool: ``names`` None), in order. A
    block's body is read as one JSON value (its strings may hold ``</tool_call>``), then its
    closing tag."""
    found: list[CallBlock] = []
    start = 0
    while (at := text.find(OPEN, start)) >= 0:
        block = _block(text, at, names)
        start = block.end if block is not None else at + len(OPEN)
        if block is not None:
            found.append(block)
    return found


def parse_calls(text: str, names: Collection[str] | None) -> tuple[str, list[ParsedCall]]:
    """(content, calls) of a generated text: the calls of its ``call_blocks``, and the rest of
    the text (blocks that are not calls kept as written)."""
    blocks = call_blocks(text, names)
    if not blocks:
        return text, []
    return without_blocks(text, blocks)


def without_blocks(text: str, blocks: list[CallBlock]) -> tuple[str, list[ParsedCall]]:
    """``text`` with the call ``blocks`` (in order, not overlapping) cut out, and their calls."""
    kept, pos = [], 0
    for b in blocks:
        kept.append(text[pos:b.at])
        pos = b.end
    kept.append(text[pos:])
    return "".join(kept).strip(), [b.call for b in blocks]


def _block(text: str, at: int, names: Collection[str] | None) -> CallBlock | None:
    """The call block at ``at`` (its ``<tool_call>``), if well-formed."""
    opened = at + len(OPEN)
    body = len(text) - len(text[opened:].lstrip())
    try:
        obj, body_end = _DECODER.raw_decode(text, body)
    except (ValueError, RecursionError):
        return None
    close = len(text) - len(text[body_end:].lstrip())
    if not text.startswith(CLOSE, close):
        return None
    call = call_of(obj, names)
    return CallBlock(call, at, body, body_end, close + len(CLOSE)) if call is not None else None


def call_of(obj: Any, names: Collection[str] | None, key: str = "arguments", *,
            with_id: bool = False) -> ParsedCall | None:
    """A call object of a known tool (``names`` None: any): its arguments (an object, or the JSON
    text of one) under ``key``, else the other family's key; its ``id`` when ``with_id`` (the
    formats whose calls carry one, ``fak.kernel.calls.formats``). None when it is not one."""
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
    cid = obj.get("id") if with_id else None
    return ParsedCall(obj["name"], args, id=cid if isinstance(cid, str) else None)


def canonical_turn(text: str) -> str:
    """An assistant turn in one form: its text outside tool-call blocks, stripped, then each
    call re-rendered (``render_call``). A turn the model wrote and the same turn a client
    resends (content and ``tool_calls``, with other spacing) are equal in this form."""
    content, calls = parse_calls(text, None)
    return "\n".join(([content] if content else []) + [render_call(c.name, c.arguments) for c in calls])


def safe_text_len(text: str) -> int:
    """How much of a streamed text can be sent as content: everything before a ``<tool_call>``
    (or before a tail that could still become one)."""
    at = text.find(OPEN)
    if at >= 0:
        return at
    for k in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-k:]):
            return len(text) - k
    return len(text)
