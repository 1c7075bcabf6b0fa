"""The policy document: a Kubernetes-style envelope around a typed spec.

Every model forbids unknown fields, so a typo is an error rather than a rule
silently ignored. Field names in YAML are the Python names below (snake_case),
except the envelope's ``apiVersion``.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class VerdictKind(StrEnum):
    """Admission verdicts, least to most restrictive (see DESIGN.md, Verdicts)."""

    ALLOW = "ALLOW"
    REDACT = "REDACT"
    QUARANTINE = "QUARANTINE"
    DENY = "DENY"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]


_SEVERITY = {VerdictKind.ALLOW: 0, VerdictKind.REDACT: 1, VerdictKind.QUARANTINE: 2, VerdictKind.DENY: 3}

Trust = Literal["untrusted", "internal", "trusted"]
SegmentKind = Literal["system", "user", "assistant", "tool"]
DetectorName = Literal["injection", "secrets", "obfuscation", "encoding", "oversize", "repetition", "regex", "semantic"]

# Families each detector can report; a rule may narrow itself to some of them.
DETECTOR_FAMILIES: dict[str, tuple[str, ...]] = {
    "injection": ("override", "role_header", "tool_forgery", "exfiltration", "destructive_command"),
    "secrets": ("cloud_key", "vcs_token", "chat_token", "jwt", "private_key", "api_key", "generic_secret"),
    "obfuscation": ("invisible", "bidi"),
    "encoding": ("invalid_utf8",),
    "oversize": ("oversize",),
    "repetition": ("repetition",),
    "regex": ("custom",),
    "semantic": ("semantic",),  # opt-in sentence-embedding classifier over the whole input (semantic.py)
}

_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
_RULE_ID = r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$"
_MEDIA = r"^[a-z*]+/[-+.a-z0-9*]+$"


def _no_duplicates(names: list[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"duplicate {what} {name!r}")
        seen.add(name)


def _check_media(value: list[str]) -> list[str]:
    for item in value:
        if not re.match(_MEDIA, item):
            raise ValueError(f"bad media type {item!r} (want type/subtype, '*' allowed)")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Metadata(_Strict):
    name: str = Field(pattern=_NAME, max_length=253)
    labels: dict[str, str] = {}


class Defaults(_Strict):
    """What applies to a tool that no ``tools`` entry names."""

    trust: Trust = "untrusted"
    max_bytes: int = Field(default=1 << 20, gt=0)
    media_types: list[str] = ["text/*", "application/json", "application/xml", "application/yaml"]
    verdict: VerdictKind = VerdictKind.ALLOW

    @field_validator("media_types")
    @classmethod
    def _media(cls, value: list[str]) -> list[str]:
        return _check_media(value)


class ToolRule(_Strict):
    """Per-tool settings; ``name`` is an exact tool name or a shell-style glob."""

    name: str = Field(min_length=1)
    trust: Trust | None = None
    max_bytes: int | None = Field(default=None, gt=0)
    media_types: list[str] | None = None
    verdict: VerdictKind | None = None

    @field_validator("media_types")
    @classmethod
    def _media(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else _check_media(value)


class DetectorRule(_Strict):
    """One detector, where it applies, and the verdict it triggers at or above ``threshold``."""

    id: str = Field(pattern=_RULE_ID, max_length=128)
    detector: DetectorName
    verdict: VerdictKind
    threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    families: list[str] | None = None
    tools: list[str] = ["*"]
    trust: list[Trust] = ["untrusted", "internal", "trusted"]
    pattern: str | None = None
    ignore_case: bool = False
    min_bytes: int = Field(default=4096, ge=0)
    description: str = ""

    @field_validator("pattern")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"bad regex: {exc}") from None
        return value

    @model_validator(mode="after")
    def _consistent(self) -> DetectorRule:
        if self.detector == "regex" and not self.pattern:
            raise ValueError("a regex detector needs a 'pattern'")
        if self.detector != "regex" and self.pattern is not None:
            raise ValueError(f"'pattern' only applies to the regex detector, not {self.detector!r}")
        known = DETECTOR_FAMILIES[self.detector]
        for family in self.families or ():
            if family not in known:
                raise ValueError(f"unknown family {family!r} for detector {self.detector!r}; known: {', '.join(known)}")
        return self


class Eviction(_Strict):
    """How the kernel removes a span quarantined after later tokens were prefilled."""

    mode: Literal["recompute", "rerope"] = "recompute"


class Reuse(_Strict):
    prefix: bool = True
    pic_approximate: bool = False
    # Segment kinds whose content is public: their prefix KV may be shared across tenants.
    shared_prefix: list[SegmentKind] = []


class Retention(_Strict):
    tool_result_ttl_s: int | None = Field(default=86400, ge=0)
    cache_priority: int = Field(default=35, ge=0, le=100)


class Normalization(_Strict):
    """Bounds on the work the normaliser does, so hostile input cannot make it slow."""

    max_decode_depth: int = Field(default=2, ge=0, le=4)
    max_decoded_bytes: int = Field(default=65536, ge=0)
    max_scan_bytes: int = Field(default=4 << 20, gt=0)


class Spec(_Strict):
    mode: Literal["enforce", "audit"] = "enforce"
    defaults: Defaults = Defaults()
    tools: list[ToolRule] = []
    detectors: list[DetectorRule] = []
    normalization: Normalization = Normalization()
    eviction: Eviction = Eviction()
    reuse: Reuse = Reuse()
    retention: Retention = Retention()
    protected_kinds: list[SegmentKind] = ["system"]

    @model_validator(mode="after")
    def _unique(self) -> Spec:
        _no_duplicates([t.name for t in self.tools], "tool name")
        _no_duplicates([d.id for d in self.detectors], "detector id")
        return self


class PolicyDocument(_Strict):
    api_version: Literal["fak.dev/v1"] = Field(alias="apiVersion")
    kind: Literal["Policy"]
    metadata: Metadata
    spec: Spec = Spec()

