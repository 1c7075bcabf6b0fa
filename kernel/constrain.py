"""Constrained decoding: a grammar (a JSON schema, or tool calls in the model family's own
syntax, ``fak.kernel.tool_formats``' ``CallSyntax``) turned into a ``TokenHook`` that masks, at each
step, every token the grammar forbids; what the endpoint needs for ``response_format``
(``json_object``, ``json_schema``) and ``tool_choice`` (``required``, a named function, and the
strict tools of ``auto``).

**Engine.** llguidance: a Rust token-mask engine (an Earley parser over a lazily built
lexer automaton) that reads the model's own ``tokenizers`` JSON, so any tokenizer fak loads
works without a per-model table. Nothing is precompiled over the vocabulary per grammar
(outlines-core builds a regex index per schema): on SmolLM2's 49k vocabulary a request's
grammar and matcher take 1-5 ms and a mask 0.15-0.3 ms a token (median; the first ~2 ms),
against ~30 ms a decode step. It takes lark grammars with inline ``%json`` schemas, lazy
lexemes and ``&``/``~`` in terminals, which "free text, or tool calls once ``<tool_call>``
appears" needs, and ships abi3 wheels with no torch pin.

**Format.** JSON is written compactly (``", "`` and ``": "`` between items, no other
whitespace: ``json.dumps``'s separators, which ``render_call`` uses too; keys come in the
schema's ``properties`` order), so a weak model cannot spend its token budget on whitespace. A tool
call is written as the family's ``CallSyntax`` says (Hermes, the default:
``<tool_call>\\n{"name": "<name>", "arguments": <arguments>}\\n</tool_call>``, several
(``parallel``) separated by ``"\\n"``; Llama 3: ``{"name": ..., "parameters": ...}`` joined by
``"; "``; Mistral: ``[TOOL_CALLS]`` (a special token is ``<[id]>`` in lark) then the array of
``{"name": ..., "arguments": ..., "id": <9 letters or digits>}``); the turn then ends with a
stop token. A call object not behind a tag of its own is written as JSON-sized literals
(``"{"``, ``"\\"name\\""``, ``": "``...): one literal ``{"name": ...`` beside a ``%json``
answer shuts the answer's ``{`` lexeme out.

**Auto mode** (``auto_grammar``) is one lark grammar with a free-text alternative rather
than a hook that switches to a grammar once ``<tool_call>`` shows up in the decoded text:
the token that completes ``<tool_call>`` may carry the bytes after it (``>\\n{``), which a
matcher started afterwards could not take as tokens; in one grammar llguidance's lexer
follows the split inside the token. Free text is any text without ``<tool_call>`` (and no
special tokens but the stop tokens); once it appears, the block must be a call of a listed
tool (strict tools: their schema; the others: any JSON object), then more calls
(``parallel``) or the end of the turn. Families whose calls are the whole turn (Llama 3,
Mistral: ``CallSyntax.text_first`` False) are free text or calls from the first byte: free
text may not begin (after whitespace) with what the family's reader takes for a call.

Hooks change only which token is drawn: the KV of a constrained turn is the KV of its
tokens, and a replay or an eviction of it is as exact as of any turn.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import llguidance
import numpy as np

from fak.errors import FakError, InvalidInput
from fak.kernel.model.config import ModelError
from fak.kernel.model.generate import only
from fak.kernel.model.tokenizer import ChatTokenizer
from fak.kernel.tool_formats import HERMES_SYNTAX, CallSyntax

__all__ = ["ANY_OBJECT", "CallSyntax", "ConstraintViolation", "Constrainer", "Grammar", "GrammarHook", "ToolLike",
           "ToolSpec", "auto_grammar", "json_grammar", "json_or_calls_grammar", "tool_calls_grammar"]

# Python's whitespace (``str.isspace``: what the family readers strip), as a regex class
_PY_SPACE = r"[\t\n\x0b\x0c\r\x1c-\x1f \x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}]"
_JSON_PIECES = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\],:] *|[^"{}\[\],:]+')
ANY_OBJECT: dict[str, Any] = {"type": "object"}
# llguidance's JSON compile options: json.dumps's separators and no other whitespace
JSON_FORMAT: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_ERROR_CHARS = 400
_CACHE_SIZE = 8


class ConstraintViolation(FakError):
    """A drawn token the grammar forbids (a hook after the grammar's undid its mask) or a
    matcher that failed mid-turn: a bug or a limit, not the client's input (code
    ``internal``, status 500); the turn is rolled back."""


class ToolLike(Protocol):
    """What a tool grammar needs of a tool (``fak.kernel.openai_tools.ToolSpec`` has it)."""

    @property
    def name(self) -> str: ...

    @property
    def parameters(self) -> dict[str, Any]: ...

    @property
    def strict(self) -> bool: ...


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the grammar sees it: its name, the JSON schema of its arguments, and
    whether its calls must follow that schema (``strict``)."""

    name: str
    parameters: dict[str, Any]
    strict: bool = True


@dataclass(frozen=True)
class Grammar:
    """A grammar llguidance accepts (``spec``: its serialized form), checked when built;
    ``what`` names it in errors."""

    spec: str
    what: str


# --- grammars ---------------------------------------------------------------------------------


def json_grammar(schema: dict[str, Any] | None, *, what: str = "response_format") -> Grammar:
    """One JSON value following ``schema``; ``None``: any JSON object (``json_object``). A
    schema llguidance cannot enforce raises ``InvalidInput`` naming the problem."""
    if schema is not None and not isinstance(schema, dict):
        raise InvalidInput(f"{what}: a JSON schema is an object")
    body = _schema_json(ANY_OBJECT if schema is None else schema, what)
    return _checked(llguidance.LLMatcher.grammar_from_lark(f"%llguidance {{}}\nstart: %json {body}\n"), what)


def tool_calls_grammar(tools: Sequence[ToolLike], *, parallel: bool, syntax: CallSyntax = HERMES_SYNTAX) -> Grammar:
    """One tool call (``parallel``: one or more) in the family's ``syntax`` and nothing else,
    each calling one of ``tools`` with arguments that follow its schema: ``tool_choice``
    ``required`` (every tool of the request) or a named function (that one). A non-strict
    tool's schema is enforced as far as llguidance can (unknown keywords ignored); one it
    cannot read leaves any JSON object."""
    body = _bodies(tools, forced=True, syntax=syntax)
    lark = f"%llguidance {{}}\nstart: {_calls(syntax, parallel)}\n{_call_rule(syntax)}{body}"
    return _checked(llguidance.LLMatcher.grammar_from_lark(lark), "tools")


def auto_grammar(tools: Sequence[ToolLike], *, parallel: bool, syntax: CallSyntax = HERMES_SYNTAX) -> Grammar:
    """``tool_choice`` ``auto``: free text, or calls in the family's ``syntax`` (after free text
    where it allows that: the module notes). Strict tools' arguments follow their schema, the
    others' any JSON object."""
    body = _bodies(tools, forced=False, syntax=syntax)
    free = "FREE: /(?s:.*)/" + "".join(f" & ~/(?s:.*){_regex_lit(x)}(?s:.*)/" for x in syntax.free_not_holding) + "".join(
        f" & ~/{_PY_SPACE}*(?:{x})(?s:.*)/" for x in syntax.free_not_starting)
    if syntax.text_first:  # free text, then the calls once the first opens (a lazy lexeme ends at it)
        if syntax.marker is not None or syntax.opening or not syntax.call_open:
            raise ValueError("free text before calls needs a textual call opening")
        more = f" ({_lit(syntax.separator)} {_lit(syntax.call_open)} body)*" if parallel else ""
        lark = (
            "%llguidance {}\n"
            f"start: FREE | head body{more}\n"
            f"{free}\n"
            f"head[lazy]: /(?s:.*){_regex_lit(syntax.call_open)}/\n"
            f"{body}"
        )
    else:
        lark = f"%llguidance {{}}\nstart: FREE | {_calls(syntax, parallel)}\n{free}\n{_call_rule(syntax)}{body}"
    return _checked(llguidance.LLMatcher.grammar_from_lark(lark), "tools")


def _calls(syntax: CallSyntax, parallel: bool) -> str:
    """The lark expression of a turn's calls: marker, opening, ``call`` (several joined by the
    separator: ``parallel``), closing."""
    parts = [f"<[{syntax.marker}]>"] if syntax.marker is not None else []
    parts += [_lit(syntax.opening)] if syntax.opening else []  # one lexeme: free text may begin with its "["
    parts.append("call" + (f" ({_lit(syntax.separator)} call)*" if parallel else ""))
    parts += _texts(syntax.closing, syntax)
    return " ".join(parts)


def _call_rule(syntax: CallSyntax) -> str:
    return "call: " + " ".join([*_texts(syntax.call_open, syntax), "body"]) + "\n"


def _texts(text: str, syntax: CallSyntax) -> list[str]:
    """``text`` as lark literals: one, or, where a call object is not behind a tag of its own
    (it could begin a JSON answer too), pieces at JSON's punctuation and strings, so that the
    call and a ``%json`` answer share their first lexemes (one literal ``{"name": ...`` would
    shut the answer's ``{`` out)."""
    if not text:
        return []
    if syntax.call_open:
        return [_lit(text)]
    return [_lit(p) for p in _JSON_PIECES.findall(text)]


def _bodies(tools: Sequence[ToolLike], *, forced: bool, syntax: CallSyntax = HERMES_SYNTAX) -> str:
    """The lark rules of a call after its opening: ``body`` and one ``fn_i`` per tool."""
    if not tools:
        raise InvalidInput("tools: a tool-call grammar needs at least one tool")
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise InvalidInput("tools: two tools have the same name")
    rules = []
    for i, tool in enumerate(tools):
        if not isinstance(tool.name, str) or not tool.name:
            raise InvalidInput(f"tools[{i}]: a tool needs a name")
        head = '{"name": ' + json.dumps(tool.name, ensure_ascii=False) + f', "{syntax.key}": '
        tail = [*_texts(', "id": ', syntax), f"/{_regex_lit(chr(34))}[A-Za-z0-9]{{9}}{_regex_lit(chr(34))}/"] if (
            syntax.call_id) else []
        rules.append(f"fn_{i}: {' '.join(_texts(head, syntax))} %json {_arguments(tool, forced)} "
                     + " ".join([*tail, _lit("}")]))
    alternatives = " | ".join(f"fn_{i}" for i in range(len(tools)))
    body = " ".join([*_texts(syntax.body_open, syntax), f"({alternatives})", *_texts(syntax.body_close, syntax)])
    return f"body: {body}\n" + "\n".join(rules) + "\n"


def _arguments(tool: ToolLike, forced: bool) -> str:
    """The ``%json`` body of a tool's arguments (the rules in ``tool_calls_grammar``/``auto_grammar``)."""
    what = f"tools[{tool.name}].parameters"
    schema = tool.parameters if tool.parameters is not None else ANY_OBJECT
    if not isinstance(schema, dict):
        raise InvalidInput(f"{what}: a JSON schema is an object")
    if tool.strict:
        return _schema_json(schema, what)
    if not forced:
        return _schema_json(ANY_OBJECT, what)
    lenient = {**schema, "x-guidance": {**JSON_FORMAT, "lenient": True}}
    text = json.dumps(lenient, ensure_ascii=False)
    if llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(f"start: %json {text}")):
        return _schema_json(ANY_OBJECT, what)
    return text


def _schema_json(schema: dict[str, Any], what: str) -> str:
    """``schema`` with fak's JSON format, as the text of a ``%json`` body; checked on its own
    first, so that an error names the schema rather than the grammar around it."""
    try:
        text = json.dumps({**schema, "x-guidance": JSON_FORMAT}, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInput(f"{what}: not a JSON schema ({exc})") from None
    _checked(llguidance.LLMatcher.grammar_from_lark(f"start: %json {text}"), what)
    return text


def _checked(spec: str, what: str) -> Grammar:
    message = llguidance.LLMatcher.validate_grammar(spec)
    if message:
        raise InvalidInput(f"{what}: the schema cannot be enforced: {_cut(message)}")
    return Grammar(spec, what)


def _lit(text: str) -> str:
    """``text`` as a lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def _regex_lit(text: str) -> str:
    """``text`` as literal characters inside a lark ``/.../`` regex."""
    return "".join(c if c.isalnum() or c == "_" or ord(c) > 127 else f"\\x{ord(c):02x}" for c in text)


def _cut(message: str) -> str:
    message = message.strip()
    return message if len(message) <= MAX_ERROR_CHARS else message[: MAX_ERROR_CHARS - 3] + "..."


# --- the tokenizer side ------------------------------------------------------------------------


class Constrainer:
    """llguidance's view of one ``ChatTokenizer`` (its token bytes, special tokens and stop
    tokens): built once per tokenizer (``for_tokenizer``, ~0.2 s for a 49k vocabulary) and
    shared by every constrained turn; ``hook`` makes a turn's ``GrammarHook``."""

    _cache: dict[tuple[str, frozenset[int], int], Constrainer] = {}
    _lock = threading.Lock()

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        stops = sorted(tokenizer.stop_token_ids)
        if not stops:
            raise ModelError("constrained decoding needs the tokenizer's stop tokens; this one has none")
        self.vocab_size = tokenizer.vocab_size
        self.stop_token_ids: frozenset[int] = frozenset(stops)
        try:
            self.ll = llguidance.LLTokenizer(tokenizer.tk.to_str(), n_vocab=self.vocab_size, eos_token=stops)
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"constrained decoding cannot read this tokenizer: {exc}") from exc

    @classmethod
    def for_tokenizer(cls, tokenizer: ChatTokenizer) -> Constrainer:
        """The (cached) constrainer of ``tokenizer``, keyed by its digest and stop tokens."""
        key = (tokenizer.digest, frozenset(tokenizer.stop_token_ids), tokenizer.vocab_size)
        with cls._lock:
            found = cls._cache.get(key)
            if found is None:
                found = cls(tokenizer)
                if len(cls._cache) >= _CACHE_SIZE:
                    cls._cache.pop(next(iter(cls._cache)))
                cls._cache[key] = found
            return found

    def hook(self, grammar: Grammar) -> GrammarHook:
        """A fresh hook for one turn under ``grammar``."""
        return GrammarHook(self, grammar)


class GrammarHook:
    """A ``TokenHook`` that keeps one turn inside a grammar: ``adjust`` sets the logit of every
    token the grammar forbids at this step to -inf (the others unchanged) and, once the
    grammar is complete, allows only the stop tokens; ``chosen`` advances the matcher.
    Greedy or sampled alike: the draw only ever sees allowed tokens. One turn's own.

    The end of the turn is the tokenizer's stop tokens (``Constrainer.stop_token_ids``, the
    session's default ``stop_token_ids``); a turn's ``min_tokens`` must be 0, since a grammar
    that is complete allows nothing else (the generate loop then finds no token to draw)."""

    def __init__(self, constrainer: Constrainer, grammar: Grammar) -> None:
        self.constrainer = constrainer
        self.grammar = grammar
        limits = llguidance.LLParserLimits(verbose_errors=False)
        self._matcher = llguidance.LLMatcher(constrainer.ll, grammar.spec, log_level=0, limits=limits)
        if self._matcher.is_error():
            raise InvalidInput(f"{grammar.what}: the grammar cannot be used: {_cut(self._matcher.get_error())}")
        self._words = np.zeros((constrainer.ll.vocab_size + 31) // 32, dtype=np.uint32)
        self._stops = np.array(sorted(constrainer.stop_token_ids), dtype=np.int64)
        self._steps = 0

    @property
    def accepting(self) -> bool:
        """The tokens so far are a complete match (a turn cut by ``max_tokens`` may not be)."""
        return self._matcher.is_accepting()

    @property
    def finished(self) -> bool:
        """The grammar allows nothing more but a stop token (or took one)."""
        return self._matcher.is_stopped()

    def allowed(self) -> np.ndarray:
        """A bool array over the vocabulary: the tokens the grammar allows next."""
        self._matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        if self._matcher.is_error():
            raise ConstraintViolation(f"{self.grammar.what}: constrained decoding failed: "
                                      f"{_cut(self._matcher.get_error())}")
        words = self._words if sys.byteorder == "little" else self._words.byteswap()
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")
        mask: np.ndarray = bits[: self.constrainer.ll.vocab_size].view(np.bool_)
        return mask

    def adjust(self, step: int, row: np.ndarray) -> np.ndarray:
        if step != self._steps:
            raise ConstraintViolation(f"a grammar hook was asked for step {step} after {self._steps} tokens "
                                      "(a hook serves one turn)")
        if self._matcher.is_stopped():
            return only(row, self._stops)
        mask = self.allowed()
        n = min(len(row), len(mask))
        np.putmask(row[:n], ~mask[:n], -np.inf)
        row[n:] = -np.inf  # ids past the tokenizer's vocabulary (a padded LM head) are never text
        return row

    def chosen(self, step: int, token: int) -> None:
        if not self._matcher.consume_token(token):
            raise ConstraintViolation(f"{self.grammar.what}: token {token} at step {step} breaks the grammar "
                                      f"({_cut(self._matcher.get_error())})")
        self._steps += 1



def json_or_calls_grammar(schema: dict[str, Any] | None, tools: Sequence[ToolLike], *, parallel: bool,
                          syntax: CallSyntax = HERMES_SYNTAX) -> Grammar:
    """``tool_choice`` ``auto`` with ``response_format`` json: the answer is either one JSON
    value following ``schema`` (``None``: any object) or calls in the family's ``syntax`` (what
    an agent with an output type and tools may do: call a tool, or give its final, typed
    answer). Where calls are bare JSON (Llama 3), an answer that is itself a call object of a
    listed tool is read back as that call."""
    body = _bodies(tools, forced=False, syntax=syntax)
    answer = _schema_json(ANY_OBJECT if schema is None else schema, "response_format")
    lark = f"%llguidance {{}}\nstart: %json {answer} | {_calls(syntax, parallel)}\n{_call_rule(syntax)}{body}"
    return _checked(llguidance.LLMatcher.grammar_from_lark(lark), "response_format")
