"""YAML reading that remembers where every node came from.

PyYAML's composer gives each node a start mark; we walk the node tree once and
record the mark of every value (and of every mapping key) under its path, so a
pydantic error location such as ``('spec', 'detectors', 2, 'pattern')`` can be
turned back into ``file:line:col``. Duplicate keys, which PyYAML would silently
collapse, are reported here.

A syntax error is explained in an operator's words at the place the problem began
(``_explain``): where an unclosed quote or bracket opened, the line whose indentation
does not fit, the tab used for indentation; not PyYAML's parser states.

Reading costs time linear in the text, whatever the text (``_Loader``): an alias is refused
where it stands and never composed (one alias is a shared subtree, a few hundred bytes of
them expand to billions of nodes), collections nest at most ``MAX_DEPTH`` deep (the composer
recurses), a document holds at most ``MAX_NODES`` values, an integer literal is at most
``MAX_INT_CHARS`` long (decimal ones past 4,300 digits raise, sexagesimal ones cost time
quadratic in their length), and a scalar that a tag cannot read is a located error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import yaml

from fak.policy.errors import Located, PolicyError

Path = tuple[str | int, ...]
_ALIASES = "YAML anchors and aliases are not allowed in a policy"

MAX_DEPTH = 32  # collections inside collections; a policy needs fewer than 10
MAX_NODES = 20_000  # values (scalars and collections) of one document; the default policy has about 400
MAX_INT_CHARS = 100  # characters of an integer literal; a policy's numbers are below 2^53 (16 digits)
MAX_ALIAS_REPORTS = 20  # aliases reported one by one; the rest are counted in one more line


@dataclass
class SourceMap:
    """Marks (1-based line, column) of values and keys by their path in the document."""

    source: str
    values: dict[Path, tuple[int, int]] = field(default_factory=dict)
    keys: dict[Path, tuple[int, int]] = field(default_factory=dict)
    # problems found while reading that do not stop it (duplicate keys), reported with the rest
    problems: list[Located] = field(default_factory=list)

    def locate(self, path: Path, *, key: bool = False) -> tuple[int, int]:
        """The mark of ``path``, or of its nearest ancestor that has one."""
        path = tuple(path)
        if key and path in self.keys:
            return self.keys[path]
        while path:
            if path in self.values:
                return self.values[path]
            path = path[:-1]
        return self.values.get((), (1, 1))

    def error(self, path: Path, message: str, *, key: bool = False) -> Located:
        line, col = self.locate(path, key=key)
        return Located(self.source, line, col, message)


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


class Position(Protocol):
    """Where a YAML event or node stands, 0-based: PyYAML's ``Mark``, from its Python or its C parser."""

    @property
    def line(self) -> int: ...

    @property
    def column(self) -> int: ...


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader whose composer never composes an alias, nests collections at most
    ``MAX_DEPTH`` deep and composes at most ``MAX_NODES`` values, so that reading any text costs
    time and memory linear in its length (module doc)."""

    def __init__(self, text: str, source: str) -> None:
        super().__init__(text)
        self.source = source
        self.depth = 0
        self.nodes = 0
        self.aliases: list[yaml.Mark] = []  # where each alias stands, refused after composing

    def _refuse(self, mark: Position | None, message: str) -> PolicyError:
        line, col = _at(mark)
        return PolicyError([Located(self.source, line, col, message)])

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.get_event()  # type: ignore[no-untyped-call]  # types-PyYAML leaves Parser.get_event untyped
            self.aliases.append(event.start_mark)
            # a fresh placeholder, never the anchored node: nothing can expand it
            return yaml.ScalarNode("tag:yaml.org,2002:null", "", event.start_mark, event.end_mark)
        event = self.peek_event()  # type: ignore[no-untyped-call]  # types-PyYAML leaves it untyped
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise self._refuse(event.start_mark, f"more than {MAX_NODES} values in one policy document")
        if not isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
            return super().compose_node(parent, index)
        if self.depth >= MAX_DEPTH:
            raise self._refuse(event.start_mark, f"lists and mappings nested deeper than {MAX_DEPTH} levels")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """A scalar its tag cannot read (``!!int abc``, the date 2001-02-30) is a located YAML
        error, not the constructor's ValueError."""
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError) as exc:
            tag = node.tag.removeprefix("tag:yaml.org,2002:")
            raise yaml.constructor.ConstructorError(
                None, None, f"{_short(node.value)} is not a valid {tag} ({exc})", node.start_mark) from None


def _short(value: object) -> str:
    if not isinstance(value, str):
        return "this value"
    text = repr(value)
    return text if len(text) <= 40 else text[:30] + f"...' ({len(value)} characters)"


def _construct_int(loader: _Loader, node: yaml.ScalarNode) -> int:
    if len(node.value) > MAX_INT_CHARS:
        raise yaml.constructor.ConstructorError(
            None, None, f"an integer of {len(node.value)} characters (at most {MAX_INT_CHARS})", node.start_mark)
    return loader.construct_yaml_int(node)


_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def _mark_at(mark: yaml.Mark) -> tuple[int, int]:
    return mark.line + 1, mark.column + 1


def _walk(node: yaml.Node, path: Path, smap: SourceMap, problems: list[Located],
          seen: set[int] | None = None) -> None:
    """Record marks; report duplicate keys. ``seen`` (ids of nodes walked) is a second guard
    against a shared node: ``_Loader`` composes none."""
    seen = set() if seen is None else seen
    if id(node) in seen:
        line, col = _mark(node)
        problems.append(Located(smap.source, line, col, _ALIASES))
        return  # never expanded
    seen.add(id(node))
    smap.values[path] = _mark(node)
    if isinstance(node, yaml.MappingNode):
        keys: set[Any] = set()  # this mapping's keys; not ``seen``, which the whole walk shares
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else repr(key_node.value)
            if key in keys:
                line, col = _mark(key_node)
                problems.append(Located(smap.source, line, col, f"duplicate key {key!r}"))
            keys.add(key)
            smap.keys[path + (key,)] = _mark(key_node)
            _walk(value_node, path + (key,), smap, problems, seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, path + (index,), smap, problems, seen)


def read_yaml(text: str, source: str) -> tuple[Any, SourceMap]:
    """Parse one YAML document; return its data and the source map of its nodes."""
    smap = SourceMap(source)
    try:
        loader = _Loader(text, source)  # the reader checks the characters here already
    except yaml.reader.ReaderError as exc:
        before = text[: exc.position]
        line, col = before.count("\n") + 1, exc.position - (before.rfind("\n") + 1) + 1
        raise PolicyError([Located(source, line, col, f"YAML: character U+{exc.character:04X} is not allowed "
                                                      "(control characters other than tab and line breaks)")]) from None
    try:
        try:
            node = loader.get_single_node()
            if node is None:
                raise PolicyError([Located(source, 1, 1, "empty policy document")])
            if loader.aliases:  # refused before anything is walked or constructed
                raise PolicyError(_alias_problems(source, loader.aliases))
            problems: list[Located] = []
            _walk(node, (), smap, problems)
            if any(p.message.startswith(_ALIASES) for p in problems):
                raise PolicyError(problems)
            smap.problems = problems  # duplicate keys: the schema's problems are reported beside them
            data = loader.construct_document(node)
        except yaml.MarkedYAMLError as exc:
            line, col, msg = _explain(exc, loader, text)
            raise PolicyError([Located(source, line, col, f"YAML: {msg}")]) from None
        except yaml.YAMLError as exc:
            raise PolicyError([Located(source, 1, 1, f"YAML: {exc}")]) from None
    finally:
        loader.dispose()
    return data, smap


def _alias_problems(source: str, marks: list[yaml.Mark]) -> list[Located]:
    problems = [Located(source, *_mark_at(m), _ALIASES) for m in marks[:MAX_ALIAS_REPORTS]]
    if len(marks) > MAX_ALIAS_REPORTS:
        more = marks[MAX_ALIAS_REPORTS]
        problems.append(Located(source, *_mark_at(more), f"and {len(marks) - MAX_ALIAS_REPORTS} more aliases"))
    return problems


def _at(mark: Position | None) -> tuple[int, int]:
    return (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)


def _line(text: str, number: int) -> str:
    lines = text.split("\n")
    return lines[number - 1] if 0 < number <= len(lines) else ""


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _open_flow(loader: yaml.SafeLoader, text: str) -> tuple[int, int, str] | None:
    """The innermost ``[`` or ``{`` the parser is still inside, if any."""
    for mark in reversed(getattr(loader, "marks", [])):
        if mark.pointer < len(text) and text[mark.pointer] in "[{":
            return mark.line + 1, mark.column + 1, text[mark.pointer]
    return None


def _key_column(line: str) -> int:
    """1-based column where the first key of ``line`` starts (after any '- ' item markers)."""
    col = _indent(line)
    while line[col : col + 2] == "- ":
        col += 2
        while line[col : col + 1] == " ":
            col += 1
    return col + 1


def _previous_content_line(text: str, number: int) -> int | None:
    lines = text.split("\n")  # once: per line it was quadratic in the blank lines above
    for n in range(min(number, len(lines) + 1) - 1, 0, -1):
        stripped = lines[n - 1].strip()
        if stripped and not stripped.startswith("#"):
            return n
    return None


def _explain(exc: yaml.MarkedYAMLError, loader: yaml.SafeLoader, text: str) -> tuple[int, int, str]:
    """(line, column, message) for a YAML syntax error, located where the problem began."""
    context, problem = exc.context or "", exc.problem or ""
    pline, pcol = _at(exc.problem_mark)
    end = "the end of the file" if "end of stream" in problem or "stream end" in problem else f"line {pline}"
    closer = {"[": "]", "{": "}"}
    if "quoted scalar" in context:
        line, col = _at(exc.context_mark)
        if "end of stream" in problem or "document separator" in problem:
            quote = text[exc.context_mark.pointer] if exc.context_mark else "'"
            return line, col, (f"the quoted string that starts here is never closed (no closing {quote} "
                               f"before {end})")
        if "escape" in problem:
            return pline, pcol, (f"{problem.removeprefix('found ')} in a double-quoted string: write the value "
                                 "in single quotes (a regex, a Windows path) or double the backslash")
        return line, col, f"in the quoted string that starts here: {problem}"
    if "character '\\t'" in problem:
        where = "indents this line" if not _line(text, pline)[: pcol - 1].strip() else "is used here"
        return pline, pcol, f"a tab {where}: YAML allows only spaces for indentation and between tokens"
    flow = _open_flow(loader, text)
    if "flow" in context or (flow is not None and problem.startswith("expected")):
        if flow is not None:
            line, col, opener = flow
        else:
            (line, col), opener = _at(exc.context_mark), "["
        return line, col, (f"the '{opener}' opened here is not closed: expected ',' or '{closer[opener]}' "
                           f"before {end}" + (f", column {pcol}" if end.startswith("line") else ""))
    if "mapping values are not allowed" in problem:
        before = _line(text, pline)[: pcol - 1]
        if ":" in before.split("#", 1)[0] and before.lstrip().split(":", 1)[0].strip():
            return pline, pcol, ("a second ': ' on this line: a value that contains ': ' must be quoted "
                                 "(key: 'a: b')")
        prev = _previous_content_line(text, pline)
        col = _indent(_line(text, pline)) + 1
        cause = f"line {prev} lacks a ':' after its key, or this line is indented deeper than the keys beside it"
        return pline, col, (f"this line reads as the continuation of the value on line {prev}, not as a new key: "
                            f"{cause}" if prev else "unexpected ':'")
    if "simple key" in context and "expected ':'" in problem:
        line, col = _at(exc.context_mark)
        return line, col, "this key has no ':' after it (a key needs ': ' before its value)"
    if "block" in context and problem.startswith("expected <block end>"):
        row = _line(text, pline)
        cline, ccol = _at(exc.context_mark)
        mark = exc.context_mark
        what = "list" if "collection" in context and mark is not None and text[mark.pointer : mark.pointer + 1] == "-" \
            else "block"
        found = problem.split("but found ", 1)[-1]
        if found in ("']'", "'}'"):
            return pline, pcol, f"a closing {found} that no bracket opened"
        if found == "'-'":
            detail = "a list item ('- ') where a key was expected"
        elif what == "list" and _indent(row) + 1 == ccol:
            detail = f"this line is inside the list that starts at line {cline} but is not an item: start it " \
                     "with '- ', or indent it under the item it belongs to"
            return pline, _indent(row) + 1, detail
        else:
            prev = _previous_content_line(text, pline)
            spaces = _indent(row)
            detail = f"this line is indented by {spaces} space{'s' if spaces != 1 else ''}, which lines up with " \
                     "no block above it" + (f" (the keys of line {prev} start at column {_key_column(_line(text, prev))})"
                                            if prev else "")
        return pline, _indent(row) + 1, f"{detail}: indent it like the entries beside it"
    if "expected a single document" in context:
        return pline, pcol, "a second YAML document ('---'): a policy file holds one document"
    msg = problem or context or "invalid YAML"
    return pline, pcol, msg.replace("<stream end>", "the end of the file").replace("<block end>", "the end of a block")
