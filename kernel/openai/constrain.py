"""Constrained decoding: a grammar (a JSON schema, or tool calls in the model family's own
syntax, ``fak.kernel.calls.formats``' ``CallSyntax``) turned into a ``TokenHook`` that masks, at each
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

**Checked before anything runs.** A grammar is compiled once, with the model's tokenizer and
the limits decoding runs under (``Constrainer.compile``, cached), when the request is
validated: what llguidance refuses, and what would fail only once decoding starts, is a 400
naming the parameter before the session gets anything. The latter are (a) a subschema the
grammar can reach that has no finite value (a ``$ref`` that only refers to itself, a required
property or a non-empty array of its own schema: ``NoExtensionBias`` at the first mask, or
runaway work once the model enters it), found by a static pass over the schema, and (b) an
Earley row over llguidance's ``max_items_in_row`` (an object with ~500 optional properties
fills 2,000 items after its ``{``): decoding allows twice ``MAX_GRAMMAR_SYMBOLS`` items a row,
a grammar is refused over ``MAX_GRAMMAR_SYMBOLS`` symbols when it is built, and a row holds at
most ~0.6 items per symbol (measured: optional properties, unions of objects, ``allOf``
expansions), so a grammar that compiles never overflows a row. The first mask is computed
at the check too. Each turn's hook is a copy of the compiled matcher: nothing is compiled twice.

**Calls always complete.** A call grammar (``tool_calls_grammar``: ``required`` and a named
function; ``auto_grammar``: strict tools) closes a call it opened within the turn's budget: the
generate loop tells the hook ``max_tokens`` as it runs it (the request's, capped to the room the
context leaves: ``fak.kernel.model.generate.BudgetedHook``), so at each step it knows how many
tokens may still be drawn. While a call is open (the matcher does not accept) the hook finds,
each step, the *closing*: the tokens that complete what is open, then a stop token
(``GrammarHook.closing``). It is found on the turn's own matcher and rolled back (llguidance's
``rollback``; microseconds a step: no mask but in the rare fallback), each step taking the
first that applies: the tokens the grammar forces (``compute_ff_tokens``: the rest of a
literal, ``"}\n</tool_call>``); the longest single token of the bytes it forces; the longest
token of what closes the open JSON (``JsonScan``, a byte scanner of the call's JSON: the open
string, then the open objects and arrays innermost first, ``"}]}``) that the grammar takes;
a short value (``0``, ``""``, ``null``, ...: a required property still to write); the longest
token the grammar allows (a tool's name among several, an id's letters). Every token is one
the grammar takes, so the closing is a valid end whatever the schema; it is the fewest tokens
fak finds, not proven the fewest. Then, with ``left`` tokens to draw and a closing of ``L``:

- ``left > L + CLOSING_SLACK``: the draw is the grammar's alone;
- otherwise the draw is narrowed to the closing's next token, and, inside a string (not in an
  escape or a character) while ``left > L``, to the *neutral* tokens too (whole UTF-8 text with
  no quote, backslash or control character: they leave the closing as it is). So a string
  argument is written until exactly the closing's tokens are left, then closed (cut to fit);
  outside strings the closing begins at once (at most ``CLOSING_SLACK`` tokens unused). The
  slack is the window in which no draw can make the closing longer than what is left: a token
  drawn before it would have to open more than ``CLOSING_SLACK`` tokens of closing at once (it
  is tokens, not bytes: ``"``, ``}`` and the call's closing markup);
- once the calls are complete and another would not fit (the shortest call from the start,
  plus the slack), only the stop tokens.

A turn whose budget the hook narrowed says so (``GrammarHook.closed_to_fit``: the call's verdict
``closed_to_fit`` in the answer). The shortest call a ``required``/named grammar can write is
the closing from its first state (``Constrainer.shortest_call``): a ``max_tokens`` below it is
a 400 naming it, before anything runs. ``response_format`` grammars are not closed: a JSON answer
cut by ``max_tokens`` still ends with ``finish_reason: "length"``.

Hooks change only which token is drawn: the KV of a constrained turn is the KV of its
tokens, and a replay or an eviction of it is as exact as of any turn.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import unquote

import llguidance
import numpy as np

from fak.errors import FakError, InvalidInput
from fak.kernel.calls.formats import HERMES_SYNTAX, CallSyntax
from fak.kernel.calls.tool_text import ToolSpec
from fak.kernel.model.config import ModelError
from fak.kernel.model.generate import only
from fak.kernel.model.tokenizer import ChatTokenizer

__all__ = ["ANY_OBJECT", "CallSyntax", "CompiledGrammar", "ConstraintViolation", "Constrainer", "Grammar",
           "GrammarHook", "auto_grammar", "json_grammar", "json_or_calls_grammar",
           "tool_calls_grammar"]

# Python's whitespace (``str.isspace``: what the family readers strip), as a regex class
_PY_SPACE = r"[\t\n\x0b\x0c\r\x1c-\x1f \x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}]"
_JSON_PIECES = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\],:] *|[^"{}\[\],:]+')
ANY_OBJECT: dict[str, Any] = {"type": "object"}
# llguidance's JSON compile options: json.dumps's separators and no other whitespace
JSON_FORMAT: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_ERROR_CHARS = 400
_CACHE_SIZE = 8
_COMPILED = 32  # compiled grammars kept per tokenizer (an agent sends the same tools every request)
# the most grammar symbols a request's grammar may have (llguidance's ``max_grammar_size``; its
# default, 500,000, lets one grammar take minutes to compile): ~2,500 optional or ~5,000
# required properties; decoding allows twice as many Earley items a row (the module notes)
MAX_GRAMMAR_SYMBOLS = 20_000


def limits() -> llguidance.LLParserLimits:
    """llguidance's limits for fak's grammars, the same when they are checked and decoded."""
    return llguidance.LLParserLimits(max_grammar_size=MAX_GRAMMAR_SYMBOLS, max_items_in_row=2 * MAX_GRAMMAR_SYMBOLS,
                                     verbose_errors=False)


class ConstraintViolation(FakError):
    """A drawn token the grammar forbids (a hook after the grammar's undid its mask) or a
    matcher that failed mid-turn: a bug or a limit, not the client's input (code
    ``internal``, status 500); the turn is rolled back."""


@dataclass(frozen=True)
class Grammar:
    """A grammar llguidance accepts (``spec``: its serialized form), checked when built;
    ``what`` names it in errors (the request parameter it comes from)."""

    spec: str
    what: str
    closes: bool = False  # a call grammar: a call it opens is closed within the turn's token budget
    call_open: str = ""  # where a call begins after free text (auto mode): the closing's JSON scan starts there


# --- grammars ---------------------------------------------------------------------------------


def json_grammar(schema: dict[str, Any] | None, *, what: str = "response_format") -> Grammar:
    """One JSON value following ``schema``; ``None``: any JSON object (``json_object``). A
    schema llguidance cannot enforce raises ``InvalidInput`` naming the problem."""
    if schema is not None and not isinstance(schema, dict):
        raise InvalidInput(f"{what}: a JSON schema is an object", param=what)
    body = _schema_json(ANY_OBJECT if schema is None else schema, what)
    return _checked(llguidance.LLMatcher.grammar_from_lark(f"%llguidance {{}}\nstart: %json {body}\n"), what)


def tool_calls_grammar(tools: Sequence[ToolSpec], *, parallel: bool, syntax: CallSyntax = HERMES_SYNTAX) -> Grammar:
    """One tool call (``parallel``: one or more) in the family's ``syntax`` and nothing else,
    each calling one of ``tools`` with arguments that follow its schema: ``tool_choice``
    ``required`` (every tool of the request) or a named function (that one). A non-strict
    tool's schema is enforced as far as llguidance can (unknown keywords ignored); one it
    cannot read leaves any JSON object."""
    body = _bodies(tools, forced=True, syntax=syntax)
    lark = f"%llguidance {{}}\nstart: {_calls(syntax, parallel)}\n{_call_rule(syntax)}{body}"
    return replace(_checked(llguidance.LLMatcher.grammar_from_lark(lark), "tools"), closes=True)


def auto_grammar(tools: Sequence[ToolSpec], *, parallel: bool, syntax: CallSyntax = HERMES_SYNTAX) -> Grammar:
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
    return replace(_checked(llguidance.LLMatcher.grammar_from_lark(lark), "tools"), closes=True,
                   call_open=syntax.call_open if syntax.text_first else "")


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


def _bodies(tools: Sequence[ToolSpec], *, forced: bool, syntax: CallSyntax = HERMES_SYNTAX) -> str:
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


def _arguments(tool: ToolSpec, forced: bool) -> str:
    """The ``%json`` body of a tool's arguments (the rules in ``tool_calls_grammar``/``auto_grammar``)."""
    what = tool.where or f"tools[{tool.name}].parameters"
    schema = tool.parameters if tool.parameters is not None else ANY_OBJECT
    if not isinstance(schema, dict):
        raise InvalidInput(f"{what}: a JSON schema is an object", param=what)
    if tool.strict:
        return _schema_json(schema, what)
    if not forced:
        return _schema_json(ANY_OBJECT, what)
    try:
        text = json.dumps({**schema, "x-guidance": {**JSON_FORMAT, "lenient": True}}, ensure_ascii=False,
                          allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return _schema_json(ANY_OBJECT, what)
    graph = SchemaGraph(schema)  # before llguidance reads it: a chain too deep crashes its compiler
    if graph.depth() > MAX_SCHEMA_DEPTH or graph.dead_end() is not None or llguidance.LLMatcher.validate_grammar(
            llguidance.LLMatcher.grammar_from_lark(f"start: %json {text}"), limits=limits()):
        return _schema_json(ANY_OBJECT, what)  # a non-strict tool's schema fak cannot enforce: any object
    return text


def _schema_json(schema: dict[str, Any], what: str) -> str:
    """``schema`` with fak's JSON format, as the text of a ``%json`` body; checked on its own
    first, so that an error names the schema rather than the grammar around it: what
    llguidance refuses, then a subschema without a finite value (``SchemaGraph.dead_end``); a
    schema deeper than ``MAX_SCHEMA_DEPTH`` is refused before llguidance reads it."""
    try:
        text = json.dumps({**schema, "x-guidance": JSON_FORMAT}, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInput(f"{what}: not a JSON schema ({exc})", param=what) from None
    graph = SchemaGraph(schema)
    depth = graph.depth()
    if depth > MAX_SCHEMA_DEPTH:  # checked before llguidance compiles it: its compiler recurses on the stack
        raise InvalidInput(f"{what}: the schema is nested {depth:,} levels deep through its subschemas and $refs; "
                           f"at most {MAX_SCHEMA_DEPTH:,} can be enforced", param=what)
    _checked(llguidance.LLMatcher.grammar_from_lark(f"start: %json {text}"), what)
    where = graph.dead_end()
    if where is not None:
        raise InvalidInput(f"{what}: the subschema at {where!r} has no finite value (it refers to itself through "
                           "$ref with nothing that ends the recursion: a required property, a non-empty array or "
                           "a bare $ref of its own schema), so constrained decoding could never complete it",
                           param=what)
    return text


def _checked(spec: str, what: str) -> Grammar:
    message = llguidance.LLMatcher.validate_grammar(spec, limits=limits())
    if message:
        raise InvalidInput(f"{what}: {explain(message)}", param=what)
    return Grammar(spec, what)


def explain(message: str) -> str:
    """llguidance's error about a grammar, in a user's words (its own text kept, cut)."""
    text = message.strip()
    if "grammar size" in text and "too big" in text:
        return (f"the schema is too large to enforce: its grammar exceeds {MAX_GRAMMAR_SYMBOLS:,} symbols "
                "(about 2,500 optional or 5,000 required properties in all); use fewer properties, "
                "alternatives or enum values")
    if "max is" in text and "items" in text:
        return ("the schema offers too many choices at one point for constrained decoding "
                f"(llguidance: {_cut(text)}); use fewer optional properties or alternatives in one object")
    if "NoExtensionBias" in text:
        return ("the schema admits no value where decoding begins (a $ref that refers only to itself?); "
                "give it something to write")
    if "Too many items" in text:
        return (f"the schema needs unbounded work at one point (llguidance: {_cut(text)}); a recursion "
                "without an end, or too many alternatives")
    return f"the schema cannot be enforced: {_cut(text)}"


# --- a static check: every subschema the grammar can reach has a finite value -------------------

_Path = tuple[str | int, ...]
_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_MAPS = ("properties", "patternProperties")
_ONE = ("additionalProperties", "items")


# the longest path of subschemas (nesting and local $refs, recursion counted once) a schema may
# have: llguidance's compiler recurses along it on the thread's stack, and a $ref chain of ~2,500
# (or 300 $refs each 10 levels deep) overflowed an 8 MiB stack: the process died (SIGSEGV)
MAX_SCHEMA_DEPTH = 1000


class SchemaGraph:
    """The subschemas of a schema a value may be written under (nested keywords and local
    ``$ref`` targets), by their path in the document: what the static checks read."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        self.nodes: dict[_Path, Any] = {}
        self.edges: dict[_Path, list[_Path]] = {}
        todo: list[_Path] = [()]
        while todo:  # every node reachable from the root
            path = todo.pop()
            if path in self.nodes:
                continue
            node = _at(schema, path)
            self.nodes[path] = node
            self.edges[path] = _children(schema, path, node) if isinstance(node, dict) else []
            todo += [p for p in self.edges[path] if p not in self.nodes]

    def depth(self) -> int:
        """The most subschemas on a path from the root, a recursion (a cycle of them) counted as
        one: Tarjan's components, which come out successors first, then the longest path."""
        index: dict[_Path, int] = {}
        low: dict[_Path, int] = {}
        component: dict[_Path, int] = {}
        longest: list[int] = []
        stack: list[_Path] = []
        on_stack: set[_Path] = set()

        def visit(v: _Path) -> None:
            index[v] = low[v] = len(index)
            stack.append(v)
            on_stack.add(v)

        visit(())
        work: list[tuple[_Path, Iterator[_Path]]] = [((), iter(self.edges[()]))]
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    visit(w)
                    work.append((w, iter(self.edges[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[v])
                if low[v] == index[v]:  # v roots a component: every successor's is done
                    c = len(longest)
                    members = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component[w] = c
                        members.append(w)
                        if w == v:
                            break
                    longest.append(1 + max((longest[component[x]] for m in members for x in self.edges[m]
                                            if component.get(x, c) != c), default=0))
        return longest[component[()]]

    def dead_end(self) -> str | None:
        """The JSON pointer of a subschema the grammar can reach that has no finite value, or
        None. llguidance compiles such a schema and fails once decoding reaches it:
        ``NoExtensionBias`` where nothing can follow (a ``$ref`` that only refers to itself),
        runaway Earley items where the value can never close (a required property, or a
        non-empty array, of its own schema). A node is finite when its ``$ref`` target, every
        ``allOf`` part and some ``anyOf``/``oneOf`` alternative are, and some type it allows can
        be written: an object whose required properties are finite, an array whose first
        ``minItems`` items are; the least fixpoint over the nodes (as a grammar's productive
        symbols are found), by a worklist: a node is looked at again only when one of its
        subschemas became finite. Keywords it does not read (remote ``$ref``, ``not``, ...)
        count as finite: llguidance judges them."""
        parents: dict[_Path, list[_Path]] = {}
        for v, children in self.edges.items():
            for w in children:
                parents.setdefault(w, []).append(v)
        finite: set[_Path] = set()
        queue = deque(reversed(self.nodes))  # found after their parents: subschemas first
        queued = set(queue)
        while queue:
            path = queue.popleft()
            queued.discard(path)
            if path in finite or not _finite(self.schema, path, self.nodes[path], finite):
                continue
            finite.add(path)
            for parent in parents.get(path, ()):
                if parent not in finite and parent not in queued:
                    queue.append(parent)
                    queued.add(parent)
        dead = sorted((p for p, node in self.nodes.items() if p not in finite and node is not False),
                      key=lambda p: (len(p), str(p)))
        return _pointer(dead[0]) if dead else None  # a ``false`` subschema forbids a value, it is never entered


def dead_end(schema: dict[str, Any]) -> str | None:
    """``SchemaGraph(schema).dead_end()``."""
    return SchemaGraph(schema).dead_end()


def _at(schema: Any, path: _Path) -> Any:
    node = schema
    for key in path:
        node = node[key]
    return node


def _target(schema: dict[str, Any], ref: Any) -> _Path | None:
    """The path of a local ``$ref`` (``#``, ``#/...``) in the document, or None (elsewhere, or not there)."""
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        return None
    node: Any = schema
    path: list[str | int] = []
    for raw in ref[2:].split("/") if ref != "#" else []:
        key = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            path.append(key)
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            path.append(int(key))
            node = node[int(key)]
        else:
            return None
    return tuple(path)


def _children(schema: dict[str, Any], path: _Path, node: dict[str, Any]) -> list[_Path]:
    """The subschemas a value of ``node`` may be written under."""
    out: list[_Path] = []
    target = _target(schema, node.get("$ref"))
    if target is not None:
        out.append(target)
    for key in _LISTS:
        if isinstance(node.get(key), list):
            out += [(*path, key, i) for i in range(len(node[key]))]
    for key in _MAPS:
        if isinstance(node.get(key), dict):
            out += [(*path, key, name) for name in node[key]]
    for key in _ONE:
        if isinstance(node.get(key), (dict, bool)):
            out.append((*path, key))
        elif key == "items" and isinstance(node.get(key), list):  # the older tuple form
            out += [(*path, key, i) for i in range(len(node[key]))]
    return out


def _finite(schema: dict[str, Any], path: _Path, node: Any, finite: set[_Path]) -> bool:
    """Whether ``node`` has a finite value, given the nodes known ``finite`` so far."""
    if node is False:
        return False
    if not isinstance(node, dict):
        return True
    target = _target(schema, node.get("$ref"))
    if target is not None and target not in finite:
        return False
    parts = node.get("allOf")
    if isinstance(parts, list) and not all((*path, "allOf", i) in finite for i in range(len(parts))):
        return False
    for key in ("anyOf", "oneOf"):
        parts = node.get(key)
        if isinstance(parts, list) and not any((*path, key, i) in finite for i in range(len(parts))):
            return False
    if node.get("enum") == []:
        return False
    kinds = node.get("type")
    if kinds is None:
        return True  # a value of any type: one the object and array keywords do not constrain
    kinds = [kinds] if isinstance(kinds, str) else kinds
    return not isinstance(kinds, list) or any(_writable(path, node, kind, finite) for kind in kinds)


def _writable(path: _Path, node: dict[str, Any], kind: Any, finite: set[_Path]) -> bool:
    """Whether a finite value of type ``kind`` satisfies ``node``."""
    if kind == "object":
        props = node.get("properties")
        required = node.get("required")
        if not isinstance(props, dict) or not isinstance(required, list):
            return True
        return all((*path, "properties", name) in finite for name in required if isinstance(name, str) and name in props)
    if kind == "array":
        least = node.get("minItems")
        least = least if isinstance(least, int) else 0
        items = node.get("items")
        key, prefix = ("prefixItems", node["prefixItems"]) if isinstance(node.get("prefixItems"), list) else (
            "items", items if isinstance(items, list) else [])
        if any((*path, key, i) not in finite for i in range(min(least, len(prefix)))):
            return False
        return least <= len(prefix) or not isinstance(items, (dict, bool)) or (*path, "items") in finite
    return True


def _pointer(path: _Path) -> str:
    return "#" + "".join("/" + str(k).replace("~", "~0").replace("/", "~1") for k in path)


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

# the closing (module notes, "Calls always complete")
CLOSING_SLACK = 8  # tokens before the closing must begin from which the draw is kept on a closable path
MAX_CLOSING = 256  # tokens a closing may take; a grammar state fak finds no closing for within it is left alone
STOP = -1  # a closing's last step: one of the stop tokens
_VALUES = (b"0", b'""', b'"', b"null", b"false", b"{}", b"{", b"[]", b"[")  # short values, tried in order
_QUOTE, _BACKSLASH = ord('"'), ord("\\")


@dataclass(frozen=True)
class TokenTable:
    """Each token's bytes as llguidance reads them, the ordinary token of each byte string
    (the lowest id), and ``neutral``: the tokens that leave a JSON string open and ready to be
    closed by the same closing (whole UTF-8 text without a quote, a backslash or a control
    character; no special token)."""

    pieces: tuple[bytes, ...]
    ids: dict[bytes, int]
    neutral: np.ndarray

    @classmethod
    def of(cls, ll: llguidance.LLTokenizer) -> TokenTable:
        pieces = tuple(ll.decode_bytes([i]) for i in range(ll.vocab_size))
        special = [ll.is_special_token(i) for i in range(ll.vocab_size)]
        ids: dict[bytes, int] = {}
        neutral = np.zeros(ll.vocab_size, dtype=np.bool_)
        for i, (piece, sp) in enumerate(zip(pieces, special, strict=True)):
            if sp or not piece:
                continue
            ids.setdefault(piece, i)
            if _QUOTE not in piece and _BACKSLASH not in piece and min(piece) >= 0x20 and _utf8(piece):
                neutral[i] = True
        return cls(pieces, ids, neutral)

    def prefix_token(self, data: bytes, ok: Any) -> int | None:
        """The token of the longest prefix of ``data`` that is one token and that ``ok`` takes."""
        for k in range(min(len(data), 64), 0, -1):
            t = self.ids.get(data[:k])
            if t is not None and ok(t):
                return t
        return None


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@dataclass
class JsonScan:
    """Where a call's JSON stands, byte by byte: the closers of the open objects and arrays
    (innermost last), whether a string is open and whether it is in the middle of an escape or
    of a UTF-8 character. A quote outside any object or array is not JSON (a call's JSON
    begins with ``{`` or ``[``): it is text around the calls."""

    stack: list[int] = field(default_factory=list)
    string: bool = False
    escape: int = 0  # -1: after a backslash; n > 0: hex digits of a \\u escape to go
    utf8: int = 0  # continuation bytes to go

    def copy(self) -> JsonScan:
        return JsonScan(list(self.stack), self.string, self.escape, self.utf8)

    def feed(self, data: bytes) -> None:
        for b in data:
            if not self.string:
                if b == _QUOTE and self.stack:
                    self.string = True
                elif b in (0x7B, 0x5B):  # { [
                    self.stack.append(b + 2)  # } ]
                elif b in (0x7D, 0x5D) and self.stack:
                    self.stack.pop()
            elif self.utf8:
                self.utf8 = self.utf8 - 1 if 0x80 <= b < 0xC0 else 0
            elif self.escape == -1:
                self.escape = 4 if b == ord("u") else 0
            elif self.escape > 0:
                self.escape -= 1
            elif b == _BACKSLASH:
                self.escape = -1
            elif b == _QUOTE:
                self.string = False
            elif b >= 0xC0:
                self.utf8 = 1 if b < 0xE0 else 2 if b < 0xF0 else 3

    @property
    def settled(self) -> bool:
        """In a string, not in an escape nor a character: a neutral token keeps the closing as it is."""
        return self.string and not self.escape and not self.utf8

    def closer(self) -> bytes:
        """What closes the open string, objects and arrays, innermost first."""
        return (b'"' if self.string else b"") + bytes(reversed(self.stack))




@dataclass(frozen=True)
class CompiledGrammar:
    """A grammar compiled for one tokenizer under ``limits()``, its first mask computed
    (``Constrainer.compile``): the matcher every turn under it starts from a copy of."""

    grammar: Grammar
    matcher: llguidance.LLMatcher  # in its initial state; never advanced

    @property
    def spec(self) -> str:
        return self.grammar.spec

    @property
    def what(self) -> str:
        return self.grammar.what


class Constrainer:
    """llguidance's view of one ``ChatTokenizer`` (its token bytes, special tokens and stop
    tokens): built once per tokenizer (``for_tokenizer``, ~0.2 s for a 49k vocabulary) and
    shared by every constrained turn; ``compile`` checks a grammar against it (cached),
    ``hook`` makes a turn's ``GrammarHook``."""

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
        self._compiled: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._compiling = threading.Lock()
        self._table: TokenTable | None = None

    @property
    def table(self) -> TokenTable:
        """The token table the closing reads (built on first use: ~15 ms for a 49k vocabulary)."""
        if self._table is None:
            self._table = TokenTable.of(self.ll)
        return self._table

    def shortest_call(self, grammar: CompiledGrammar) -> int | None:
        """The tokens of the shortest turn the closing writes under a call grammar that must
        call (``tool_calls_grammar``), its stop token included: the least ``max_tokens`` such a
        turn can complete in (fak's closing; module notes). None: not a closing grammar, or
        it may end at once (free text)."""
        if not grammar.grammar.closes:
            return None
        plan = self.hook(grammar).closing()
        return len(plan) if plan is not None else None

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

    def compile(self, grammar: Grammar) -> CompiledGrammar:
        """``grammar`` compiled for this tokenizer under ``limits()`` with its first mask
        computed: what llguidance refuses of it, at compile time or at the first token, is an
        ``InvalidInput`` naming ``grammar.what`` (a request's 400, before anything runs). The
        last ``_COMPILED`` grammars are kept: the same grammar is compiled once."""
        with self._compiling:
            found = self._compiled.get(grammar.spec)
            if found is not None:
                self._compiled.move_to_end(grammar.spec)
                return CompiledGrammar(grammar, found.matcher)
        matcher = llguidance.LLMatcher(self.ll, grammar.spec, log_level=0, limits=limits())
        if not matcher.is_error():
            words = np.zeros((self.ll.vocab_size + 31) // 32, dtype=np.uint32)
            matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)  # kept: each copy starts with it
        if matcher.is_error():
            raise InvalidInput(f"{grammar.what}: {explain(matcher.get_error())}", param=grammar.what)
        compiled = CompiledGrammar(grammar, matcher)
        with self._compiling:
            self._compiled[grammar.spec] = compiled
            while len(self._compiled) > _COMPILED:
                self._compiled.popitem(last=False)
        return compiled

    def hook(self, grammar: Grammar | CompiledGrammar) -> GrammarHook:
        """A fresh hook for one turn under ``grammar`` (compiled here if it is not yet)."""
        return GrammarHook(self, grammar if isinstance(grammar, CompiledGrammar) else self.compile(grammar))


class GrammarHook:
    """A ``TokenHook`` that keeps one turn inside a grammar: ``adjust`` sets the logit of every
    token the grammar forbids at this step to -inf (the others unchanged) and, once the
    grammar is complete, allows only the stop tokens; ``chosen`` advances the matcher.
    Greedy or sampled alike: the draw only ever sees allowed tokens. One turn's own.

    The end of the turn is the tokenizer's stop tokens (``Constrainer.stop_token_ids``, the
    session's default ``stop_token_ids``); a turn's ``min_tokens`` must be 0, since a grammar
    that is complete allows nothing else (the generate loop then finds no token to draw).

    A call grammar's hook is told the turn's budget (``budget``, by the generate loop) and
    closes an open call within it (module notes, "Calls always complete"); ``closed_to_fit``
    then says the budget narrowed the draw."""

    def __init__(self, constrainer: Constrainer, grammar: CompiledGrammar) -> None:
        self.constrainer = constrainer
        self.grammar = grammar.grammar
        self._matcher = grammar.matcher.deep_copy()  # the compiled matcher, never compiled again
        self._words = np.zeros((constrainer.ll.vocab_size + 31) // 32, dtype=np.uint32)
        self._stops = np.array(sorted(constrainer.stop_token_ids), dtype=np.int64)
        self._steps = 0
        self._budget: int | None = None
        self._scan = JsonScan()
        self._recent = b""  # the turn's last bytes: where a call after free text begins
        self._opened = False  # a call was opened (the grammar stopped accepting)
        self._fresh: int | None = None  # the shortest call from the start (not-yet-accepting grammars)
        self.closed_to_fit = False

    def budget(self, max_tokens: int) -> None:
        """The turn draws at most ``max_tokens`` tokens (``fak.kernel.model.generate.BudgetedHook``)."""
        if self.grammar.closes:
            self._budget = max_tokens
            if self._fresh is None and not self._matcher.is_accepting():
                plan = self.closing()
                self._fresh = len(plan) if plan is not None else None

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
        if self._budget is not None:
            mask = self._fit(self._budget - step, mask)
        n = min(len(row), len(mask))
        np.putmask(row[:n], ~mask[:n], -np.inf)
        row[n:] = -np.inf  # ids past the tokenizer's vocabulary (a padded LM head) are never text
        return row

    def chosen(self, step: int, token: int) -> None:
        was = self._matcher.is_accepting()
        if not self._matcher.consume_token(token):
            raise ConstraintViolation(f"{self.grammar.what}: token {token} at step {step} breaks the grammar "
                                      f"({_cut(self._matcher.get_error())})")
        self._steps += 1
        if not self.grammar.closes:
            return
        piece = self.constrainer.table.pieces[token] if token < len(self.constrainer.table.pieces) else b""
        self._recent = (self._recent + piece)[-1024:]
        if self._matcher.is_accepting():
            return
        self._opened = True
        opening = self.grammar.call_open.encode()
        if was and opening and (at := self._recent.rfind(opening)) >= 0:
            self._scan = JsonScan()  # a call begins after free text: its JSON is read from its opening
            self._scan.feed(self._recent[at + len(opening):])
        else:
            self._scan.feed(piece)

    # --- the closing -------------------------------------------------------------------------

    def _fit(self, left: int, mask: np.ndarray) -> np.ndarray:
        """``mask`` narrowed so that what is open closes within the ``left`` tokens the turn may
        still draw: unchanged while the closing needs fewer than ``left - CLOSING_SLACK``; then
        its next token, or a neutral token inside a string while one more fits; once the calls
        are complete and another would not fit, the end of the turn."""
        keep = np.zeros_like(mask)
        if self._matcher.is_accepting():
            if self._opened and self._fresh is not None and left <= self._fresh + CLOSING_SLACK:
                keep[self._stops[self._stops < len(keep)]] = True
                return keep
            return mask
        plan = self.closing()
        if plan is None or left > len(plan) + CLOSING_SLACK:
            return mask
        self.closed_to_fit = True
        keep[plan[0]] = True  # a closing's first step is a token: the grammar is not complete yet
        if left > len(plan) and self._scan.settled:
            n = min(len(keep), len(self.constrainer.table.neutral))
            keep[:n] |= mask[:n] & self.constrainer.table.neutral[:n]
        return keep

    def closing(self) -> list[int] | None:
        """The tokens that close what the turn has open, fewest first found, then ``STOP``; None
        when nothing is open (the grammar accepts) or no closing within ``MAX_CLOSING`` tokens is
        found. Each step: the tokens the grammar forces; else the longest token of the bytes it
        forces; else the longest token of the closer the JSON scan reads (``"}}`` ...); else a
        short value (``0``, ``""``, ``null``, ...); else the longest token the grammar allows.
        Found on the turn's own matcher, rolled back after."""
        m, table = self._matcher, self.constrainer.table
        if m.is_accepting():
            return None
        scan = self._scan.copy()
        plan: list[int] = []
        try:
            while len(plan) < MAX_CLOSING:
                if m.is_accepting():
                    return [*plan, STOP]
                tokens = m.compute_ff_tokens()
                if not tokens:
                    step = self._step(scan)
                    if step is None:
                        return None
                    tokens = [step]
                for t in tokens:
                    if not m.consume_token(t):  # a forced or validated token: never refused
                        return None
                    plan.append(t)
                    scan.feed(table.pieces[t])
            return None
        finally:
            if plan:
                m.rollback(len(plan))

    def _step(self, scan: JsonScan) -> int | None:
        m, table = self._matcher, self.constrainer.table

        def ok(t: int) -> bool:
            return bool(m.validate_tokens([t]) == 1)

        for data in (m.compute_ff_bytes(), scan.closer()):
            if data and (t := table.prefix_token(data, ok)) is not None:
                return t
        for value in _VALUES:
            t = table.ids.get(value)
            if t is not None and ok(t):
                return t
        allowed = np.flatnonzero(self.allowed())
        allowed = allowed[~np.isin(allowed, self._stops)]
        if not len(allowed):
            return None
        sizes = np.array([len(table.pieces[t]) for t in allowed])
        return int(allowed[int(sizes.argmax())])



def json_or_calls_grammar(schema: dict[str, Any] | None, tools: Sequence[ToolSpec], *, parallel: bool,
                          syntax: CallSyntax = HERMES_SYNTAX, what: str = "response_format") -> Grammar:
    """``tool_choice`` ``auto`` with ``response_format`` json: the answer is either one JSON
    value following ``schema`` (``None``: any object) or calls in the family's ``syntax`` (what
    an agent with an output type and tools may do: call a tool, or give its final, typed
    answer). Where calls are bare JSON (Llama 3), an answer that is itself a call object of a
    listed tool is read back as that call."""
    body = _bodies(tools, forced=False, syntax=syntax)
    answer = _schema_json(ANY_OBJECT if schema is None else schema, what)
    lark = f"%llguidance {{}}\nstart: %json {answer} | {_calls(syntax, parallel)}\n{_call_rule(syntax)}{body}"
    return _checked(llguidance.LLMatcher.grammar_from_lark(lark), "response_format")
