"""The OpenAI chat door's parameters: each one honoured, or refused with a 400 naming it
(``UnsupportedParameter``), never silently ignored; fields that are not OpenAI's are named in
``fak.ignored``. ``chat_parameters`` turns a request into ``ChatParameters`` before anything
runs (docs/openai.md, Parameters)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from fak import wire as w
from fak.errors import InvalidInput
from fak.kernel.calls.tool_text import ToolChoice, ToolSpec, tool_choice, tool_specs

DEFAULT_MAX_TOKENS = 256
IGNORED = ("store", "service_tier")  # accepted, without effect on the answer (fak has one tier, keeps no store)
REFUSED = {  # OpenAI parameters fak cannot honour: a 400 naming the parameter, never silently ignored
    "audio": "the model writes text only",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "fak runs no web search (give the agent a search tool instead)",
    "reasoning_effort": "the model has no reasoning mode",
    "verbosity": "the model has no verbosity setting",
}



class UnsupportedParameter(InvalidInput):
    """A chat-completions parameter fak does not implement (audio, web search, ...)."""

    code = "unsupported_parameter"


# --- parameters ----------------------------------------------------------------------
@dataclass(frozen=True)
class ResponseFormat:
    """``response_format`` json_object (any JSON object: ``schema`` None) or json_schema."""

    kind: Literal["json_object", "json_schema"]
    schema: dict[str, Any] | None = None
    name: str = "response"


@dataclass(frozen=True)
class ChatParameters:
    """What the kernel honours of a request and the names of the parameters it sent that
    were accepted without effect (the response's ``fak.ignored``)."""

    max_tokens: int
    min_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    ignored: tuple[str, ...]
    n: int = 1
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    logit_bias: dict[str, float] = field(default_factory=dict)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    response_format: ResponseFormat | None = None
    tools: tuple[ToolSpec, ...] = ()
    choice: ToolChoice = ToolChoice("none")
    parallel: bool = True
    held_calls: Literal["withhold", "return"] = "withhold"
    user: str | None = None
    metadata: dict[str, str] | None = None

    def sampling(self) -> dict[str, Any]:
        """The keyword arguments of ``KernelSession.generate``."""
        return {"max_tokens": self.max_tokens, "min_tokens": self.min_tokens, "temperature": self.temperature,
                "top_p": self.top_p, "seed": self.seed}


def chat_parameters(body: w.ChatCompletionRequest) -> ChatParameters:
    """Refuse what fak does not implement (``UnsupportedParameter``, naming it), map the rest."""
    extra = body.model_extra or {}
    for name in REFUSED:
        if extra.get(name) is not None:
            raise UnsupportedParameter(f"{name}: {REFUSED[name]}", param=name)
    if body.modalities is not None and set(body.modalities) - {"text"}:
        raise UnsupportedParameter("modalities: the model writes text only", param="modalities")
    if body.top_logprobs and not body.logprobs:
        raise InvalidInput("top_logprobs needs logprobs: true", param="top_logprobs")
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if len(stop) > 4 or not all(isinstance(x, str) and x for x in stop):
        raise InvalidInput("stop: up to 4 non-empty strings", param="stop")
    max_tokens = body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS
    temperature = 1.0 if body.temperature is None else body.temperature
    top_p = 1.0 if body.top_p is None else body.top_p
    if top_p == 0:  # the nucleus shrinks to the most probable token
        temperature, top_p = 0.0, 1.0
    tools = tool_specs(body.tools) if body.tools is not None else tool_specs(
        [{"type": "function", "function": f} for f in body.functions or []], "functions")
    if body.tools is not None and body.functions is not None:
        raise InvalidInput("tools and functions: send one of them (functions is the older form)", param="functions")
    legacy = body.function_call
    if isinstance(legacy, dict):
        legacy = {"type": "function", "function": legacy}
    choice = tool_choice(body.tool_choice if body.tool_choice is not None else legacy, tools)
    ignored = sorted({name for name in body.model_fields_set if name in IGNORED and getattr(body, name) is not None}
                     | {name[:64] for name, value in extra.items() if value is not None})
    return ChatParameters(max_tokens=max_tokens, min_tokens=min(body.min_tokens or 0, max_tokens),
                          temperature=temperature, top_p=top_p,
                          seed=None if body.seed is None else body.seed % 2**64, ignored=tuple(ignored),
                          n=body.n or 1, stop=tuple(stop), logprobs=bool(body.logprobs),
                          top_logprobs=body.top_logprobs or 0, logit_bias=dict(body.logit_bias or {}),
                          presence_penalty=body.presence_penalty or 0.0,
                          frequency_penalty=body.frequency_penalty or 0.0,
                          response_format=response_format(body.response_format), tools=tuple(tools), choice=choice,
                          parallel=body.parallel_tool_calls is not False, held_calls=body.fak_held_calls or "withhold",
                          user=body.user, metadata=body.metadata)


def response_format(value: dict[str, Any] | None) -> ResponseFormat | None:
    """``{'type': 'text'}``, ``{'type': 'json_object'}`` or ``{'type': 'json_schema', 'json_schema':
    {'name', 'schema', 'strict'}}``; both JSON forms are decoded under a grammar."""
    if value is None:
        return None
    kind = value.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat("json_object")
    if kind != "json_schema":
        raise UnsupportedParameter(f"response_format: type {str(kind)[:40]!r} is not supported "
                                   "(text, json_object, json_schema)", param="response_format")
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise InvalidInput("response_format.json_schema: {'name': ..., 'schema': {...}, 'strict': true}",
                           param="response_format")
    name = spec.get("name")
    return ResponseFormat("json_schema", spec.get("schema") or {"type": "object"},
                          name if isinstance(name, str) else "response")
