"""YAML reading that remembers where every node came from.

PyYAML's composer gives each node a start mark; we walk the node tree once and
record the mark of every value (and of every mapping key) under its path, so a
pydantic error location such as ``('spec', 'detectors', 2, 'pattern')`` can be
turned back into ``file:line:col``. Duplicate keys, which PyYAML would silently
collapse, are reported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from fak.policy.errors import Located, PolicyError

Path = tuple[str | int, ...]


@dataclass
class SourceMap:
    """Marks (1-based line, column) of values and keys by their path in the document."""

    source: str
    values: dict[Path, tuple[int, int]] = field(default_factory=dict)
    keys: dict[Path, tuple[int, int]] = field(default_factory=dict)

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


def _walk(node: yaml.Node, path: Path, smap: SourceMap, problems: list[Located],
          seen: set[int] | None = None) -> None:
    seen = set() if seen is None else seen
    if id(node) in seen:  # an alias: the composer shares the anchored node
        line, col = _mark(node)
        problems.append(Located(smap.source, line, col, "YAML anchors and aliases are not allowed in a policy"))
        return  # never expanded: a few hundred bytes of nested aliases would otherwise take minutes
    seen.add(id(node))
    smap.values[path] = _mark(node)
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else repr(key_node.value)
            if key in seen:
                line, col = _mark(key_node)
                problems.append(Located(smap.source, line, col, f"duplicate key {key!r}"))
            seen.add(key)
            smap.keys[path + (key,)] = _mark(key_node)
            _walk(value_node, path + (key,), smap, problems, seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, path + (index,), smap, problems, seen)


def read_yaml(text: str, source: str) -> tuple[Any, SourceMap]:
    """Parse one YAML document; return its data and the source map of its nodes."""
    smap = SourceMap(source)
    try:
        loader = yaml.SafeLoader(text)  # the reader checks the characters here already
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
            problems: list[Located] = []
            _walk(node, (), smap, problems)  # before constructing: it refuses aliases unexpanded
            if problems:
                raise PolicyError(problems)
            data = loader.construct_document(node)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
            msg = " ".join(p for p in (exc.context, exc.problem) if p) or "invalid YAML"
            raise PolicyError([Located(source, line, col, f"YAML: {msg}")]) from None
        except yaml.YAMLError as exc:
            raise PolicyError([Located(source, 1, 1, f"YAML: {exc}")]) from None
    finally:
        loader.dispose()
    return data, smap
