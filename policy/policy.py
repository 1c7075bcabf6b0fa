"""Loading policies: YAML text → validated document → ``Policy`` with its digest.

A directory is read as a base policy plus overlays, in file-name order: each
file must be a valid policy on its own; later files replace the spec sections
they set, and merge by id what has ids: ``tools`` (by name and sources),
``detectors``, ``tool_calls.rules``, ``late_detectors`` and ``exceptions``. An
exception in an overlay may name a detector rule of any file of the directory.

Every problem of every file is reported together, each at its own line: schema
errors (pydantic), and the checks across items that pydantic would only make once
everything else is valid (duplicate ids, exceptions naming no rule) are made on the
parsed data directly (``_cross_checks``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, TypeVar

import blake3
import rfc8785
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from fak.policy.egress import CLOSED, SERVER_PREFIX, JudgeEgress, origin_of
from fak.policy.errors import Located, PolicyError
from fak.policy.schema import PolicyDocument, Spec
from fak.policy.yamlsrc import Path as DocPath
from fak.policy.yamlsrc import SourceMap, read_yaml

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Policy:
    """A validated policy, its canonical digest and the regexes compiled for it."""

    document: PolicyDocument
    source: str
    digest: str
    custom: dict[str, re.Pattern[str]] = field(default_factory=dict, repr=False, compare=False)
    # compiled ``pattern`` of each exception that has one, by exception id
    exception_patterns: dict[str, re.Pattern[str]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def spec(self) -> Spec:
        return self.document.spec

    @property
    def name(self) -> str:
        return self.document.metadata.name

    @property
    def enforcing(self) -> bool:
        return self.spec.mode == "enforce"


def canonical(document: PolicyDocument) -> bytes:
    """RFC 8785 JSON of the document with every default filled in."""
    return rfc8785.dumps(document.model_dump(mode="json", by_alias=True))


def build(document: PolicyDocument, source: str) -> Policy:
    digest = "blake3:" + blake3.blake3(canonical(document)).hexdigest()
    custom = {}
    for rule in document.spec.detectors:
        if rule.detector == "regex" and rule.pattern:
            custom[rule.id] = re.compile(rule.pattern, re.IGNORECASE if rule.ignore_case else 0)
    patterns = {e.id: re.compile(e.pattern, re.IGNORECASE if e.ignore_case else 0)
                for e in document.spec.exceptions if e.pattern is not None}
    return Policy(document, source, digest, custom, patterns)


def _message(err: ErrorDetails) -> str:
    loc = ".".join(str(p) for p in err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        return f"unknown field {loc!r}"
    if kind == "missing":
        return f"missing required field {loc!r}"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


def _validate(data: object, smap: SourceMap, known: set[str] | None = None,
              egress: JudgeEgress | None = None) -> PolicyDocument:
    """The document, or a PolicyError with every problem: schema errors and the cross checks
    (``known``: the detector rule ids an exception may name; default those of ``data``;
    ``egress``: where judges may send results, default nowhere)."""
    if not isinstance(data, dict):
        raise PolicyError([*smap.problems, smap.error((), "a policy must be a mapping with apiVersion, kind, metadata, "
                                                          "spec")])
    problems = [*smap.problems, *_cross_checks(data, smap, _detector_ids(data) if known is None else known),
                *_unrepresentable_numbers(data, smap), *_egress_checks(data, smap, egress or CLOSED)]
    document = None
    try:
        document = PolicyDocument.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            loc = tuple(err["loc"])
            if loc == ("spec",) and "duplicate " in err["msg"]:
                continue  # found by _cross_checks already, at the duplicate's own line
            problems.append(smap.error(loc, _message(err), key=err["type"] == "extra_forbidden"))
    if problems or document is None:
        problems.sort(key=lambda p: (p.line, p.column))
        raise PolicyError(problems)
    return document


def _unrepresentable_numbers(data: object, smap: SourceMap) -> list[Located]:
    """Numbers the policy's digest (RFC 8785 JSON) cannot carry: integers of 2^53 or more
    and NaN or infinities, each at its line (found by fuzzing: they raised out of the loader)."""
    out: list[Located] = []
    stack: list[tuple[DocPath, object]] = [((), data)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict):
            stack.extend((path + (k,), v) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((path + (i,), v) for i, v in enumerate(node))
        elif isinstance(node, int) and not isinstance(node, bool) and abs(node) >= 2**53:
            out.append(smap.error(path, f"{'.'.join(map(str, path))}: a number of magnitude 2^53 or more"))
        elif isinstance(node, float) and not math.isfinite(node):
            out.append(smap.error(path, f"{'.'.join(map(str, path))}: {node} is not a finite number"))
    return out


# (path of a list under spec, the field that names an item, what the name is called)
_IDS: tuple[tuple[DocPath, str, str], ...] = (
    (("tools",), "name", "tool entry"),
    (("detectors",), "id", "detector id"),
    (("tool_calls", "rules"), "id", "tool-call rule id"),
    (("late_detectors",), "id", "late detector id"),
    (("exceptions",), "id", "exception id"),
)


def _items(data: object, path: DocPath) -> list[tuple[int, dict[Any, Any]]]:
    node = data.get("spec") if isinstance(data, dict) else None
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, list):
        return []
    return [(i, item) for i, item in enumerate(node) if isinstance(item, dict)]


def _detector_ids(data: object) -> set[str]:
    return {item["id"] for _, item in _items(data, ("detectors",)) if isinstance(item.get("id"), str)}


def _detector_kinds(data: object) -> dict[str, object]:
    return {item["id"]: item.get("detector") for _, item in _items(data, ("detectors",))
            if isinstance(item.get("id"), str)}


def _cross_checks(data: object, smap: SourceMap, known: set[str]) -> list[Located]:
    """Problems across items, each at the line of the item it is about: duplicate names and
    ids, and exceptions whose ``rules`` name no detector rule (a typo there would leave the
    false positive it was written for, silently) or name an oversize rule (decided unread)."""
    problems: list[Located] = []
    for path, name_field, what in _IDS:
        first: dict[object, int] = {}
        for index, item in _items(data, path):
            name = item.get(name_field)
            if not isinstance(name, str):
                continue
            key: object = name
            if path == ("tools",):
                sources = item.get("sources")
                key = (name, tuple(sources) if isinstance(sources, list) and all(isinstance(x, str) for x in sources)
                       else repr(sources))
            where = ("spec", *path, index, name_field)
            if key in first:
                line = smap.locate(("spec", *path, first[key]), key=False)[0]
                also = " with the same sources" if path == ("tools",) and item.get("sources") else ""
                problems.append(smap.error(where, f"duplicate {what} {name!r}{also} (first at line {line})", key=True))
            else:
                first[key] = index
    kinds = _detector_kinds(data)
    for index, item in _items(data, ("exceptions",)):
        rules = item.get("rules")
        if not isinstance(rules, list):
            continue
        for j, name in enumerate(rules):
            if not isinstance(name, str) or name.strip("*") == "":
                continue  # the schema reports these
            where = ("spec", "exceptions", index, "rules", j)
            hits = [i for i in known if fnmatchcase(i, name)]
            if not hits:
                listed = ", ".join(sorted(known)) or "none"
                problems.append(smap.error(where, f"exception rule {name!r} names no detector rule of this policy "
                                                  f"(its rules: {listed})"))
            elif kinds.get(name) == "oversize":
                problems.append(smap.error(where, f"{name!r} is an oversize rule: it decides before the result is "
                                                  "read, so nothing can be exempted; raise the tool's max_bytes instead"))
    return problems


def _egress_checks(data: object, smap: SourceMap, egress: JudgeEgress) -> list[Located]:
    """Judges that would send results, or a variable's value, where the deployment's settings
    do not allow (``fak.policy.egress``): each at the line of its ``url`` or ``api_key_env``."""
    problems: list[Located] = []
    for index, item in _items(data, ("late_detectors",)):
        if item.get("kind") != "judge":
            continue
        where = ("spec", "late_detectors", index)
        url, env = item.get("url"), item.get("api_key_env")
        if isinstance(url, str) and not egress.allows_url(url):
            problems.append(smap.error((*where, "url"), _refused_url(url)))
        if isinstance(env, str) and not egress.allows_key_env(env):
            if env.upper().startswith(SERVER_PREFIX):
                why = (f"{env} is one of the server's own variables ({SERVER_PREFIX}*: its data dir, its master "
                       "secret, …); they are never sent to a judge, whatever the settings' judge_key_envs say")
            else:
                why = (f"{env} is not in this deployment's judge_key_envs (settings judge_key_envs, "
                       "FAK_JUDGE_KEY_ENVS): only the variables it lists may be sent to a judge")
            problems.append(smap.error((*where, "api_key_env"), f"api_key_env: {why}"))
    return problems


def _refused_url(url: str) -> str:
    where = "this deployment's judge_egress (settings judge_egress, FAK_JUDGE_EGRESS)"
    try:
        origin = origin_of(url)
    except ValueError as exc:
        return f"url: {exc}; judges may send tool results only inside {where}"
    return (f"url: judge egress to {origin} is not in {where}: where judges may send tool results is the "
            "deployment's setting, not the policy's")


def parse_document(text: str, source: str = "<string>", egress: JudgeEgress | None = None) -> PolicyDocument:
    data, smap = read_yaml(text, source)
    return _validate(data, smap, egress=egress)


def load_policy_text(text: str, source: str = "<string>", egress: JudgeEgress | None = None) -> Policy:
    """Validate one policy given as YAML text; errors name ``source``:line:col. ``egress`` is
    the deployment's judge allow-lists (None: no judge may send anything anywhere)."""
    return build(parse_document(text, source, egress), source)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError([Located(str(path), 1, 1, f"not UTF-8 text: {exc.reason}")]) from None
    except OSError as exc:
        raise PolicyError([Located(str(path), 1, 1, f"cannot read: {exc.strerror or exc}")]) from None


def policy_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
        if not files:
            raise PolicyError([Located(str(path), 1, 1, "directory holds no .yaml or .yml policy file")])
        return files
    return [path]


def _by_key(base: list[M], over: list[M], key: Callable[[M], Hashable]) -> list[dict[str, Any]]:
    merged = {key(item): item.model_dump() for item in base}
    merged.update({key(item): item.model_dump() for item in over})
    return list(merged.values())


def _merge(base: PolicyDocument, over: PolicyDocument) -> PolicyDocument:
    """``over`` laid on ``base``: sections ``over`` sets replace base's, except the lists of
    items with ids, merged by id (an item of ``over`` replaces base's item of the same id)."""
    b, o = base.spec, over.spec
    spec = b.model_dump()
    for name in o.model_fields_set:
        if name == "tools":
            spec["tools"] = _by_key(b.tools, o.tools, lambda t: t.key)
        elif name in ("detectors", "late_detectors", "exceptions"):
            spec[name] = _by_key(getattr(b, name), getattr(o, name), lambda item: item.id)
        elif name == "tool_calls":
            calls = b.tool_calls.model_dump()
            # what the overlay sets (on_deny, classes, ...) replaces the base's
            calls.update(o.tool_calls.model_dump(include=o.tool_calls.model_fields_set))
            calls["rules"] = _by_key(b.tool_calls.rules, o.tool_calls.rules, lambda r: r.id)
            spec["tool_calls"] = calls
        else:
            spec[name] = o.model_dump()[name]
    labels = {**base.metadata.labels, **over.metadata.labels}
    return PolicyDocument.model_validate(
        {"apiVersion": base.api_version, "kind": "Policy",
         "metadata": {"name": base.metadata.name, "labels": labels}, "spec": spec}
    )


def load_policy(path: str | Path, egress: JudgeEgress | None = None) -> Policy:
    """Load a policy file, or a directory of base + overlay files (see module doc).
    Every file is validated; all errors are reported together. ``egress``: as for
    ``load_policy_text``."""
    path = Path(path)
    if not path.exists():
        raise PolicyError([Located(str(path), 1, 1, "no such file or directory")])
    parsed: list[tuple[object, SourceMap]] = []
    problems: list[Located] = []
    for file in policy_files(path):
        try:
            parsed.append(read_yaml(_read(file), str(file)))
        except PolicyError as exc:
            problems.extend(exc.problems)
    known = set().union(*(_detector_ids(data) for data, _ in parsed))  # merging never drops a rule
    docs: list[PolicyDocument] = []
    for data, smap in parsed:
        try:
            docs.append(_validate(data, smap, known, egress))
        except PolicyError as exc:
            problems.extend(exc.problems)
    if problems:
        raise PolicyError(problems)
    document = docs[0]
    for over in docs[1:]:
        document = _merge(document, over)
    return build(document, str(path))
