"""The chunks of a streamed chat answer, typed: ``ChatStream`` (``fak.kernel.openai.chat``)
produces one ``ChatChunk`` per ``chat.completion.chunk`` object; the chat route serialises
each as it is (``ChatChunk.as_dict``: the JSON an OpenAI client reads, byte for byte what the
door always sent) and the Responses stream (``fak.kernel.openai.responses_stream``) reads the
same objects' fields. A delta holds only what its step has: the role chunk opens a choice
(``role`` and an empty ``content``), then content pieces, a refusal, the choice's tool calls
(one delta once fak has decided them), and a last chunk with the finish reason (the kept
choice's carries the ``fak`` extension); the usage chunk, if asked, has no choices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from fak import wire as w


@dataclass(frozen=True)
class ToolCallDelta:
    """One returned call of a choice, whole (fak sends a call once it is decided, never in pieces)."""

    index: int  # among the choice's calls
    id: str
    name: str
    arguments: str  # JSON text

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Delta:
    """What a step adds to a choice's message (a field left None, or no calls, is not sent)."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    refusal: str | None = None
    tool_calls: tuple[ToolCallDelta, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.role is not None:
            out["role"] = self.role
        if self.content is not None:
            out["content"] = self.content
        if self.refusal is not None:
            out["refusal"] = self.refusal
        if self.tool_calls:
            out["tool_calls"] = [c.as_dict() for c in self.tool_calls]
        return out


@dataclass(frozen=True)
class ChoiceDelta:
    """One choice's step: its delta, and on its last chunk the finish reason and its logprobs."""

    index: int
    delta: Delta
    finish_reason: str | None = None
    logprobs: w.ChoiceLogprobs | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "delta": self.delta.as_dict(),
                "logprobs": self.logprobs.model_dump() if self.logprobs is not None else None,
                "finish_reason": self.finish_reason}


@dataclass(frozen=True)
class ChatChunk:
    """One ``chat.completion.chunk``: a choice's step, or (no choices) the usage chunk. ``fak``:
    the turn's extension, on the kept choice's last chunk."""

    id: str
    created: int
    model: str
    choices: tuple[ChoiceDelta, ...]
    usage: w.Usage | None = None
    fak: w.FakInfo | None = None

    def as_dict(self) -> dict[str, Any]:
        """The chunk as the chat route sends it (``json.dumps`` of this, in this key order)."""
        out: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                               "model": self.model, "system_fingerprint": None,
                               "choices": [c.as_dict() for c in self.choices]}
        if self.usage is not None:
            out["usage"] = self.usage.model_dump()
        if self.fak is not None:
            out["fak"] = self.fak.model_dump()
        return out
