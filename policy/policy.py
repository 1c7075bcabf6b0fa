"""Loading policies: YAML text → validated document → ``Policy`` with its digest.

A directory is read as a base policy plus overlays, in file-name order: each
file must be a valid policy on its own; later files replace the spec sections
they set, and merge ``tools`` (by name) and ``detectors`` (by id).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import blake3
import rfc8785
from pydantic import ValidationError

from fak.policy.errors import Located, PolicyError
from fak.policy.schema import PolicyDocument, Spec
from fak.policy.yamlsrc import SourceMap, read_yaml


@dataclass(frozen=True)
class Policy:
    """A validated policy, its canonical digest and the regexes compiled for it."""

    document: PolicyDocument
    source: str
    digest: str
    custom: dict[str, re.Pattern[str]] = field(default_factory=dict, repr=False, compare=False)

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
    return Policy(document, source, digest, custom)


def _message(err: dict) -> str:
    loc = ".".join(str(p) for p in err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        return f"unknown field {loc!r}"
    if kind == "missing":
        return f"missing required field {loc!r}"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


def _validate(data: object, smap: SourceMap) -> PolicyDocument:
    if not isinstance(data, dict):
        raise PolicyError([smap.error((), "a policy must be a mapping with apiVersion, kind, metadata, spec")])
    try:
        return PolicyDocument.model_validate(data)
    except ValidationError as exc:
        problems: list[Located] = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            problems.append(smap.error(loc, _message(err), key=err["type"] == "extra_forbidden"))
        problems.sort(key=lambda p: (p.line, p.column))
        raise PolicyError(problems) from None


def parse_document(text: str, source: str = "<string>") -> PolicyDocument:
    data, smap = read_yaml(text, source)
    return _validate(data, smap)


def load_policy_text(text: str, source: str = "<string>") -> Policy:
    """Validate one policy given as YAML text; errors name ``source``:line:col."""
    return build(parse_document(text, source), source)


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


def _merge(base: PolicyDocument, over: PolicyDocument) -> PolicyDocument:
    spec = base.spec.model_dump()
    for name in over.spec.model_fields_set:
        if name == "tools":
            merged = {t.name: t.model_dump() for t in base.spec.tools}
            merged.update({t.name: t.model_dump() for t in over.spec.tools})
            spec["tools"] = list(merged.values())
        elif name == "detectors":
            rules: dict[str, dict] = {d.id: d.model_dump() for d in base.spec.detectors}
            rules.update({d.id: d.model_dump() for d in over.spec.detectors})
            spec["detectors"] = list(rules.values())
        else:
            spec[name] = over.spec.model_dump()[name]
    labels = {**base.metadata.labels, **over.metadata.labels}
    return PolicyDocument.model_validate(
        {"apiVersion": base.api_version, "kind": "Policy",
         "metadata": {"name": base.metadata.name, "labels": labels}, "spec": spec}
    )


def load_policy(path: str | Path) -> Policy:
    """Load a policy file, or a directory of base + overlay files (see module doc).
    Every file is validated; all errors are reported together."""
    path = Path(path)
    if not path.exists():
        raise PolicyError([Located(str(path), 1, 1, "no such file or directory")])
    docs: list[PolicyDocument] = []
    problems: list[Located] = []
    for file in policy_files(path):
        try:
            docs.append(parse_document(_read(file), str(file)))
        except PolicyError as exc:
            problems.extend(exc.problems)
    if problems:
        raise PolicyError(problems)
    document = docs[0]
    for over in docs[1:]:
        document = _merge(document, over)
    return build(document, str(path))

