"""The policy document: a Kubernetes-style envelope around a typed spec.

Every model forbids unknown fields, so a typo is an error rather than a rule
silently ignored. Field names in YAML are the Python names below (snake_case),
except the envelope's ``apiVersion``.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from fak.types import TENANT_PATTERN, RoutingKind, ToolEffect
from fak.types import VerdictKind as VerdictKind  # defined in the shared ground, re-exported here

Trust = Literal["untrusted", "internal", "trusted"]
SegmentKind = Literal["system", "user", "assistant", "tool"]
DetectorName = Literal["injection", "secrets", "obfuscation", "encoding", "oversize", "repetition", "regex"]
RuleAction = Literal["enforce", "audit"]

# Families each detector can report; a rule may narrow itself to some of them.
DETECTOR_FAMILIES: dict[str, tuple[str, ...]] = {
    "injection": ("override", "role_header", "tool_forgery", "exfiltration", "destructive_command"),
    "secrets": ("cloud_key", "vcs_token", "chat_token", "jwt", "private_key", "api_key", "generic_secret"),
    "obfuscation": ("invisible", "bidi"),
    "encoding": ("invalid_utf8",),
    "oversize": ("oversize",),
    "repetition": ("repetition",),
    "regex": ("custom",),
}

# Detectors whose findings are instructions: cutting the matched span would leave the rest of
# the instruction in the text, so REDACT is refused for them (QUARANTINE or DENY the result).
NO_REDACT = frozenset({"injection", "obfuscation"})

_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
_RULE_ID = r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$"
_MEDIA = r"^[a-z*]+/[-+.a-z0-9*]+$"


def _no_duplicates(names: Sequence[Hashable], what: str) -> None:
    seen: set[Hashable] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"duplicate {what} {name!r}")
        seen.add(name)


_HOST_GLOB = r"^[-a-z0-9*?.\[\]!]+$"


def _check_sources(value: list[str] | None) -> list[str] | None:
    """Domain globs (``*.example.com``), matched against the lower-cased host of the source URL."""
    if value is None:
        return None
    if not value:
        raise ValueError("'sources' is empty: leave it out to match any source, or name domains")
    for item in value:
        if not re.match(_HOST_GLOB, item):
            raise ValueError(f"bad source domain {item!r}: want a host name or glob such as '*.example.com' "
                             "(lower case, no scheme, port or path)")
    return value


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


def _check_mismatch(value: VerdictKind | None) -> VerdictKind | None:
    if value is VerdictKind.REDACT:
        raise ValueError("REDACT has nothing to cut in a result of the wrong media type: use ALLOW (scan it), "
                         "QUARANTINE or DENY")
    return value


def _check_regex(value: str | None) -> str | None:
    if value is not None:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"bad regex: {exc}") from None
    return value


# Field types whose check is shared by every model that has such a field.
MediaTypes = Annotated[list[str], AfterValidator(_check_media)]
MismatchVerdict = Annotated[VerdictKind, AfterValidator(_check_mismatch)]
Sources = Annotated[list[str], AfterValidator(_check_sources)]
Regex = Annotated[str, AfterValidator(_check_regex)]


class Defaults(_Strict):
    """What applies to a tool that no ``tools`` entry names."""

    trust: Trust = "untrusted"
    max_bytes: int = Field(default=1 << 20, gt=0)
    media_types: MediaTypes = ["text/*", "application/json", "application/xml", "application/yaml"]
    verdict: VerdictKind = VerdictKind.ALLOW
    # Verdict for a result whose media type is not in ``media_types``: ALLOW scans it as usual,
    # QUARANTINE or DENY decide without reading it. REDACT would have nothing to cut.
    media_type_mismatch: MismatchVerdict = VerdictKind.DENY


ToolOutput = Literal["json", "yaml", "mail"]


class ToolRule(_Strict):
    """Per-tool settings; ``name`` is an exact tool name or a shell-style glob. With
    ``sources`` the entry applies only to results whose source URL's host matches one of
    them (a result without a parsable source matches none). ``output``: the structure the
    tool's results have (``json``, ``yaml``; ``mail``: an RFC 5322 message, its header fields
    structured, its body text). Tool-call rules read field paths only in results whose
    structure is declared: by a JSON, YAML or ``message/rfc822`` media type at admission, else
    here; a result of neither is text, however structured it looks."""

    name: str = Field(min_length=1)
    sources: Sources | None = None
    trust: Trust | None = None
    max_bytes: int | None = Field(default=None, gt=0)
    media_types: MediaTypes | None = None
    media_type_mismatch: MismatchVerdict | None = None
    verdict: VerdictKind | None = None
    expires: Expiry | None = None  # lifetime of every ref this tool produces
    output: ToolOutput | None = None
    # Trust per field of a result of declared structure: field-path globs (``*.description``,
    # ``emails.*.body``) to a trust level, first match wins; a field none names has the tool's.
    fields: dict[str, Trust] | None = None
    # The trust of prose (a string field of PROSE_TOKENS canonical tokens or more) inside a result of this
    # tool whose trust is ``internal``: by default ``untrusted`` (a record's note, description
    # or subject line is written by whoever wrote it); ``fields`` overrides it per field.
    free_text: Trust | None = None

    @property
    def key(self) -> tuple[str, tuple[str, ...]]:
        """What identifies the entry (duplicates, overlays): its name and its sources."""
        return self.name, tuple(self.sources or ())



class DetectorRule(_Strict):
    """One detector, where it applies, and the verdict it triggers at or above ``threshold``.
    ``action: audit``: the rule's matches are reported (flagged) and the verdict it would
    have given is listed in ``Verdict.audited``, but it changes no verdict."""

    id: str = Field(pattern=_RULE_ID, max_length=128)
    detector: DetectorName
    verdict: VerdictKind
    action: RuleAction = "enforce"
    threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    families: list[str] | None = None
    tools: list[str] = ["*"]
    trust: list[Trust] = ["untrusted", "internal", "trusted"]
    sources: Sources | None = None
    pattern: Regex | None = None
    ignore_case: bool = False
    min_bytes: int = Field(default=4096, ge=0)
    expires: Expiry | None = None  # when this rule fires on an admitted ref, the ref's lifetime
    description: str = ""

    @field_validator("verdict")
    @classmethod
    def _redact(cls, value: VerdictKind, info: ValidationInfo) -> VerdictKind:
        detector = info.data.get("detector")
        if value is VerdictKind.REDACT and detector in NO_REDACT:
            raise ValueError(f"REDACT is not allowed for the {detector} detector: it would cut only the matched "
                             "words and leave the rest of the instruction standing in the text; use QUARANTINE or DENY")
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


class Expiry(_Strict):
    """A lifetime for an admitted ref: seconds after admission, or model turns (generated or
    appended assistant messages) in the session after admission; whichever comes first."""

    seconds: int | None = Field(default=None, gt=0)
    turns: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _some(self) -> Expiry:
        if self.seconds is None and self.turns is None:
            raise ValueError("an expiry needs 'seconds' or 'turns'")
        return self


ToolCallVerdict = Literal["ALLOW", "CONFIRM", "DENY"]


class AttentionMatch(_Strict):
    """Which refs in the attention provenance of the current context a tool-call rule is about:
    refs produced by a tool of one of ``trust`` whose name matches one of ``tools``."""

    trust: list[Trust] = Field(default=["untrusted"], min_length=1)
    tools: list[str] = Field(default=["*"], min_length=1)


ArgOrigin = Literal["trusted", "internal", "untrusted", "generated"]


def _args_any(value: object) -> object:
    """``args: any`` (or ``"*"``) is every argument."""
    return ["*"] if value in ("any", "*") else value


class ArgsMatch(_Strict):
    """Which arguments of a call a tool-call rule is about, by where their values came from
    (argument provenance, docs/policy.md): the arguments at ``args`` (paths or globs:
    ``to``, ``recipients``, ``payment.iban``, ``*``; the word ``any`` is every argument)
    whose origin is one of ``trust`` (``trusted``: found in a system or user turn, a trusted
    ref or the tool schema; ``internal``/``untrusted``: found only in refs of that trust;
    ``generated``: found nowhere). ``entities``: also count the e-mail addresses, URLs,
    IBANs and phone numbers inside a longer string (a body that carries an account number).
    ``except_fields``: a value whose every non-trusted source lies in a field of a result of
    declared structure matching one of these globs does not count (``*.sender``: replying to
    the sender of the mail being answered is not a new recipient); ``except_tools``: only in
    results of these tools (names or globs: the mail tools whose records name real parties,
    not a web page that returns JSON)."""

    args: Annotated[list[str], BeforeValidator(_args_any)] = Field(default=["*"], min_length=1)
    trust: list[ArgOrigin] = Field(default=["untrusted"], min_length=1)
    entities: bool = True
    # Only the routing entities (e-mail, URL, IBAN, phone) count: inside a longer string, or a
    # value that is one such entity; the provenance of a string as a whole (a reply that keeps
    # the subject it answers) does not.
    entities_only: bool = False
    except_fields: list[str] = []
    except_tools: list[str] = Field(default=["*"], min_length=1)
    # except_fields excuses a value that *is* a field (the whole value of a leaf); true also
    # excuses one found inside a field's text (a free-text field: rarely what you want).
    except_inside_fields: bool = False

    @model_validator(mode="after")
    def _entities_only_needs_entities(self) -> ArgsMatch:
        if self.entities_only and not self.entities:
            raise ValueError("'entities_only' counts only entities: it cannot be set with entities: false")
        return self


class Endorsement(_Strict):
    """Fire when a value of ``args`` is also named by text of one of ``by`` in an
    instruction-like context ("book Casa do Rio", "create an event titled ..."): the value
    may come from a catalog the agent read (a hotel's name field), but untrusted text told the
    agent to pick it. The naming refs are the offending refs."""

    args: Annotated[list[str], BeforeValidator(_args_any)] = Field(default=["*"], min_length=1)
    by: list[Trust] = Field(default=["untrusted"], min_length=1)


class AttentionEvidence(_Strict):
    """Fire only when the argument tokens of a call fak generated put more than ``above`` of
    their attention (averaged over layers, heads and tokens) on refs of one of ``trust``.
    Evidence, not causation (docs/policy.md); a call fak did not generate has no attention
    evidence and the condition holds (the rule fires on its other conditions)."""

    trust: list[Trust] = Field(default=["untrusted"], min_length=1)
    above: float = Field(ge=0.0, le=1.0)


class ToolCallRule(_Strict):
    """A decision for calls of ``tools`` (names or globs) under conditions that must all hold:
    ``when_in_attention`` (a matching ref is in attention: the offending refs),
    ``when_args_from`` (an argument's value came from such a source; a list: each must
    match), ``when_attention`` (the model's attention evidence). Without conditions the rule
    fires on every call (e.g. always CONFIRM a payment; ALLOW a read-only tool). The most
    severe firing rule decides; ``unlisted`` decides when none fires. ``counterfactual``: when
    the rule fires on a call fak generated, evict the offending refs exactly, teacher-force the
    same call and compare each argument's log-probability; a call at most
    ``counterfactual_margin`` nats less likely without them was not caused by them and the
    rule does not fire."""

    id: str = Field(pattern=_RULE_ID, max_length=128)
    tools: list[str] = Field(min_length=1)
    when_in_attention: AttentionMatch | None = None
    when_args_from: list[ArgsMatch] | None = None
    when_args_absent: list[str] | None = Field(default=None, min_length=1)  # none of these paths has a value
    when_endorsed: Endorsement | None = None
    when_attention: AttentionEvidence | None = None
    verdict: ToolCallVerdict
    action: Literal["enforce", "audit"] = "enforce"
    counterfactual: bool = False
    counterfactual_margin: float = Field(default=1.0, ge=0.0, le=100.0)
    description: str = ""

    @field_validator("when_args_from", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, dict) else value

    @model_validator(mode="after")
    def _evidence_needs_refs(self) -> ToolCallRule:
        if self.counterfactual and self.when_in_attention is None and self.when_args_from is None \
                and self.when_endorsed is None:
            raise ValueError("'counterfactual' needs offending refs to evict: add when_in_attention, when_args_from "
                             "or when_endorsed")
        if self.verdict == "ALLOW" and self.counterfactual:
            raise ValueError("'counterfactual' acquits a call: it has no use on an ALLOW rule")
        return self


class ToolClassEntry(_Strict):
    """The operator's word on tools the schema-inferred rules classify (``from_schemas``):
    ``effect`` (``read`` or ``side_effect``), ``routing`` (argument path or glob to what it
    routes: ``recipient``, ``channel``, ``phone``, ``url``, ``account``, ``amount``, ``path``,
    ``command``; replaces the inferred map) and ``content`` (the free-text arguments that carry
    data out: ``body``, ``text``). A field left out keeps the inferred one."""

    tools: list[str] = Field(min_length=1)
    effect: ToolEffect | None = None
    routing: dict[str, RoutingKind] | None = None
    content: list[str] | None = None


class ToolCalls(_Strict):
    """Tool-call authorization (docs/policy.md): rules per callable tool; ``unlisted`` is the
    verdict for a call no rule fires on (whether or not a rule names the tool). ``on_deny``: what the OpenAI-compatible doors do
    when the model itself writes a DENYed call (docs/openai.md): ``evict_and_retry`` evicts
    the offending refs exactly (and the turns they caused) and asks the model again, at most
    ``max_retries`` times; ``refuse`` answers with a refusal instead. Either way the call
    never reaches the client. ``remember_approvals``: a person's approval of a held call also
    allows the same call (tool, arguments, triggering sources) again in that session."""

    unlisted: ToolCallVerdict = "ALLOW"
    rules: list[ToolCallRule] = []
    on_deny: Literal["evict_and_retry", "refuse"] = "evict_and_retry"
    max_retries: int = Field(default=2, ge=0, le=8)
    remember_approvals: bool = True
    # A number with fewer digits than this carries no provenance (an id of 7 is in every
    # timestamp), unless its argument is an amount or routes (an account, a file id; schema or name).
    min_number_digits: int = Field(default=4, ge=1, le=32)
    # A tool no rule names is classified from its JSON schema and description (read or side
    # effect, routing arguments) and the rules of examples/policies/agent.yaml are applied to
    # its arguments (kernel/calls/tool_classes.py); ``classes`` overrides the classification.
    from_schemas: bool = False
    classes: list[ToolClassEntry] = []


def _check_tenants(value: object) -> object:
    """A judge's tenant scope: ``all``, or a non-empty list of tenant names."""
    if value is None or value == "all":
        return value
    if not isinstance(value, list):
        raise ValueError(f"'tenants' is a list of tenant names or the word all, not {value!r:.80}")
    if not value:
        raise ValueError("'tenants' names no tenant: the judge would see nothing (remove the judge, name "
                         "tenants, or write tenants: all)")
    for name in value:
        if name == "all":
            raise ValueError("'all' in a list would be a tenant named all: write tenants: all (not a list) "
                             "for every tenant")
        if not isinstance(name, str) or not re.fullmatch(TENANT_PATTERN, name):
            raise ValueError(f"{name!r:.80} is not a tenant name (1-64 letters, digits and . _ @ -)")
    return value


class LateDetectorRule(_Strict):
    """An asynchronous detector: runs after admission (it delays no prefill) and quarantines
    the ref when it fires. ``classifier``: a local Hugging Face sequence-classification model
    folder (``path``), firing when the probability of ``label`` reaches ``threshold``.
    ``judge``: an LLM behind an OpenAI-compatible ``url`` asked whether the text is an
    injection; the key, if any, is read from the environment variable ``api_key_env``. A
    judge sends tool results out of the process, so it must say whose: ``tenants`` (a list,
    or ``all``), with no default; where it may send them (``url``) and which variable it may
    send (``api_key_env``) are the deployment's allow-lists (``fak.policy.egress``)."""

    id: str = Field(pattern=_RULE_ID, max_length=128)
    kind: Literal["classifier", "judge"]
    path: str | None = None
    label: str | None = None
    url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    tenants: list[str] | Literal["all"] | None = None  # judge: whose results it may see (required)
    threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    tools: list[str] = ["*"]
    trust: list[Trust] = ["untrusted", "internal"]
    max_bytes: int = Field(default=16384, gt=0)
    timeout_s: float = Field(default=30.0, gt=0)
    description: str = ""

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+", value):
            raise ValueError(f"'url' must be an http:// or https:// base URL (e.g. http://127.0.0.1:8000/v1), "
                             f"not {value!r:.80}")
        return value

    @field_validator("tenants", mode="before")
    @classmethod
    def _tenants(cls, value: object) -> object:
        return _check_tenants(value)

    @field_validator("api_key_env")
    @classmethod
    def _env(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", value):
            raise ValueError(f"'api_key_env' names an environment variable (letters, digits, '_'), not {value!r:.80}; "
                             "the key itself never goes in a policy")
        return value

    def sees(self, tenant: str) -> bool:
        """Whether this detector may be shown ``tenant``'s tool results: a classifier runs in the
        process (nothing leaves it); a judge only for the tenants of its scope."""
        if self.kind != "judge":
            return True
        return self.tenants == "all" or (isinstance(self.tenants, list) and tenant in self.tenants)

    @model_validator(mode="after")
    def _consistent(self) -> LateDetectorRule:
        if self.kind == "classifier" and not self.path:
            raise ValueError("a classifier late detector needs 'path' (a Hugging Face model folder)")
        if self.kind == "judge" and not self.url:
            raise ValueError("a judge late detector needs 'url' (an OpenAI-compatible base URL)")
        other = ("url", "model", "api_key_env", "tenants") if self.kind == "classifier" else ("path", "label")
        wrong = [name for name in other if getattr(self, name) is not None]
        if wrong:
            raise ValueError(f"{', '.join(repr(w) for w in wrong)} do{'es' if len(wrong) == 1 else ''} not apply to "
                             f"a {self.kind} late detector")
        if self.kind == "judge" and self.tenants is None:
            raise ValueError("a judge late detector needs 'tenants': the tenants whose tool results may be sent to "
                             "it (a list such as [acme], or all); there is no default")
        return self


class RuleException(_Strict):
    """An operator's exception for false positives: a finding of one of ``rules`` (ids or
    globs; a bare ``*`` is refused) is exempted when the result comes from one of ``tools``,
    from one of ``sources`` (domain globs of the source URL's host) and, with ``pattern``, when
    the regex matches near the finding (``near`` bytes either side of it) or anywhere in the
    text (``scope: text``). Every condition given must hold. An exception must name where the
    result came from (``tools`` other than ``*``, or ``sources``): a pattern alone is text an
    attacker can write. To switch a rule off everywhere, remove it or set ``action: audit``."""

    id: str = Field(pattern=_RULE_ID, max_length=128)
    rules: list[str] = Field(min_length=1)
    tools: list[str] | None = None
    sources: Sources | None = None
    pattern: Regex | None = None
    ignore_case: bool = False
    scope: Literal["near", "text"] = "near"
    near: int = Field(default=256, ge=0, le=65536)
    description: str = ""

    @field_validator("rules")
    @classmethod
    def _rules(cls, value: list[str]) -> list[str]:
        for item in value:
            if item.strip("*") == "":
                raise ValueError(f"{item!r} would exempt every rule: name the rules this exception is for "
                                 "(ids, or globs such as 'secrets*')")
        return value

    @field_validator("tools")
    @classmethod
    def _tools(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value:
            raise ValueError("'tools' is empty: leave it out to match any tool, or name tools")
        return value

    @model_validator(mode="after")
    def _narrow(self) -> RuleException:
        if (self.tools is None or "*" in self.tools) and self.sources is None:
            raise ValueError("an exception needs 'tools' (not '*') or 'sources': where the result came from is "
                             "the operator's to vouch for; a 'pattern' alone matches text whoever wrote it, an "
                             "attacker included (to switch a rule off everywhere, remove it or give it action: audit)")
        return self


class Eviction(_Strict):
    """How the kernel removes a span quarantined after later tokens were prefilled."""

    mode: Literal["recompute", "rerope"] = "recompute"


class Reuse(_Strict):
    """``prefix``: exact prefix reuse within a tenant (the Kernel reads it per session).
    ``pic_approximate``: position-independent reuse, which is approximate; read by the PIC
    serving path, off by default. There is no cross-tenant sharing switch: a tenant never
    gets another's cache hits."""

    prefix: bool = True
    pic_approximate: bool = False


class Retention(_Strict):
    tool_result_ttl_s: int | None = Field(default=86400, ge=0)
    cache_priority: int = Field(default=35, ge=0, le=100)


class Forget(_Strict):
    """What an admission does with bytes whose ref an admin forgot (``fak.kernel.withdrawal.forget``).
    ``readmit: false`` (the default): bytes whose keyed digest is a forgotten ref (the CAS
    keeps a tombstone of that digest, never the bytes) are refused, QUARANTINE with rule
    ``ref_forgotten``, so a client resending its history does not undo a forget; so are bytes
    whose redacted form was forgotten, and bytes of a forget still in progress. ``true``: such
    bytes are a new admission the gate judges (a forget in progress still refuses them)."""

    readmit: bool = False


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
    tool_calls: ToolCalls = ToolCalls()
    late_detectors: list[LateDetectorRule] = []
    exceptions: list[RuleException] = []
    forget: Forget = Forget()

    @model_validator(mode="after")
    def _unique(self) -> Spec:
        # The loader reports these at each duplicate's own line (policy.py, ``_cross_checks``);
        # this keeps a spec built in code to the same rules.
        _no_duplicates([t.key for t in self.tools], "tool entry (name and sources)")
        _no_duplicates([d.id for d in self.detectors], "detector id")
        _no_duplicates([r.id for r in self.tool_calls.rules], "tool-call rule id")
        _no_duplicates([r.id for r in self.late_detectors], "late detector id")
        _no_duplicates([e.id for e in self.exceptions], "exception id")
        return self


class PolicyDocument(_Strict):
    api_version: Literal["fak.dev/v1"] = Field(alias="apiVersion")
    kind: Literal["Policy"]
    metadata: Metadata
    spec: Spec = Spec()

