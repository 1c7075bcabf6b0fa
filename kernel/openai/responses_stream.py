"""The Responses door's event stream (the notes of ``fak.kernel.openai.responses``,
"Streaming"): a chat stream's typed chunks (``fak.kernel.openai.chunks``) read one model step
at a time and told as the Responses events (``response.created``, the output items and their
parts opened, their deltas, their ``done`` events, then ``response.completed`` or
``response.incomplete``), each with its ``sequence_number``; the final response is kept as a
non-streamed one is (``responses_store.finish``), and a stream dropped before it is abandoned."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fak import wire as w
from fak import wire_responses as wr
from fak.kernel.openai.chunks import ChoiceDelta
from fak.kernel.openai.responses_output import item_id, status_of, usage_of
from fak.kernel.openai.responses_request import Plan
from fak.kernel.openai.responses_store import abandon, finish
from fak.kernel.session.caller import Caller

if TYPE_CHECKING:
    from fak.kernel.facade import Kernel
    from fak.kernel.openai.chat import ChatStream


@dataclass
class _Item:
    """An output item being streamed: a message (its text part, then a refusal part, each
    opened when it first has content) or a function call (its arguments)."""

    index: int
    kind: str  # message | function_call
    item_id: str
    call_id: str = ""
    name: str = ""
    text: str = ""  # the message's text, or the call's arguments
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    refusal: str | None = None
    parts: list[str] = field(default_factory=list)  # the message's parts, in order: text, refusal

    def content(self) -> list[wr.OutputText | wr.OutputRefusal]:
        return [wr.OutputText(text=self.text, logprobs=self.logprobs or None) if kind == "text"
                else wr.OutputRefusal(refusal=self.refusal or "") for kind in self.parts]


class ResponseStream:
    """A streamed response as Responses events (JSON-ready dicts with ``type`` and
    ``sequence_number``), one chat step per ``next_events`` call, None after the last.
    ``close`` however the stream ended (a dropped stream is abandoned: see the notes)."""

    def __init__(self, k: Kernel, c: Caller, p: Plan, stream: ChatStream) -> None:
        self.kernel, self.caller, self.plan, self.stream = k, c, p, stream
        self._seq = 0
        self._started = False
        self._done = False
        self._closed = False
        self._items: list[_Item] = []
        self._open: _Item | None = None
        self._calls: dict[int, _Item] = {}
        self._finish: str | None = None
        self._usage: w.Usage | None = None
        self._fak: dict[str, Any] | None = None
        self.response: wr.ResponseObject | None = None

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def next_events(self) -> list[dict[str, Any]] | None:
        if self._done:
            return None
        out: list[dict[str, Any]] = []
        if not self._started:
            self._started = True
            skeleton = self.plan.response("in_progress", []).model_dump(mode="json")
            out += [self._event("response.created", response=skeleton),
                    self._event("response.in_progress", response=skeleton)]
        chunks = self.stream.next_chunks()
        for chunk in chunks or []:
            if chunk.fak is not None:
                self._fak = chunk.fak.model_dump()
            self._usage = chunk.usage or self._usage
            for choice in chunk.choices:
                if choice.index == 0:  # one choice: fak's Responses door never asks for n
                    out += self._delta(choice)
        if chunks is None:  # the chat stream's last chunks (finish, usage) came in the call before
            out += self._end()
        return out

    def _message(self) -> tuple[_Item, list[dict[str, Any]]]:
        """The open message item, opened now if the open item is none or a call."""
        if self._open is not None and self._open.kind == "message":
            return self._open, []
        out = self._close_open()
        item = _Item(len(self._items), "message", item_id(self.plan, "msg", len(self._items)))
        return item, out + self._add(item)

    def _part(self, item: _Item, kind: str) -> list[dict[str, Any]]:
        """Open the message's ``kind`` part (text or refusal) if it is not open yet."""
        if kind in item.parts:
            return []
        item.parts.append(kind)
        part = wr.OutputText(text="") if kind == "text" else wr.OutputRefusal(refusal="")
        return [self._event("response.content_part.added", item_id=item.item_id, output_index=item.index,
                            content_index=item.parts.index(kind), part=part.model_dump(mode="json"))]

    def _delta(self, choice: ChoiceDelta) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        delta = choice.delta
        if content := delta.content:
            item, opened = self._message()
            out += opened + self._part(item, "text")
            item.text += content
            out.append(self._event("response.output_text.delta", item_id=item.item_id, output_index=item.index,
                                   content_index=item.parts.index("text"), delta=content, logprobs=[]))
        if refusal := delta.refusal:
            item, opened = self._message()
            out += opened + self._part(item, "refusal")
            item.refusal = (item.refusal or "") + refusal
            out.append(self._event("response.refusal.delta", item_id=item.item_id, output_index=item.index,
                                   content_index=item.parts.index("refusal"), delta=refusal))
        logprobs = [t.model_dump() for t in choice.logprobs.content or []] if choice.logprobs is not None else []
        if logprobs and (target := self._last_message()) is not None:
            target.logprobs += logprobs  # the chat stream sends a choice's logprobs with its finish chunk
        for call in delta.tool_calls:
            index = call.index
            if index not in self._calls:
                out += self._close_open()
                item = _Item(len(self._items), "function_call", item_id(self.plan, "fc", index),
                             call_id=call.id or item_id(self.plan, "call", index), name=call.name)
                self._calls[index] = item
                out += self._add(item)
            item = self._calls[index]
            if args := call.arguments:
                item.text += args
                out.append(self._event("response.function_call_arguments.delta", item_id=item.item_id,
                                       output_index=item.index, delta=args))
        if choice.finish_reason is not None:
            self._finish = choice.finish_reason
        return out

    def _last_message(self) -> _Item | None:
        return next((i for i in reversed(self._items) if i.kind == "message"), None)

    def _add(self, item: _Item) -> list[dict[str, Any]]:
        self._items.append(item)
        self._open = item
        return [self._event("response.output_item.added", output_index=item.index,
                            item=self._model(item, "in_progress").model_dump(mode="json"))]

    def _model(self, item: _Item, status: str) -> wr.OutputMessage | wr.FunctionCallItem:
        if item.kind == "message":
            return wr.OutputMessage(id=item.item_id, status=status, content=item.content())
        return wr.FunctionCallItem(id=item.item_id, call_id=item.call_id, name=item.name, arguments=item.text,
                                   status=status)

    def _status(self, item: _Item) -> str:
        return "incomplete" if self._finish == "length" and item.kind == "message" else "completed"

    def _close_open(self) -> list[dict[str, Any]]:
        """The done events of the open item (the message's parts in order, or the call's arguments)."""
        item, self._open = self._open, None
        if item is None:
            return []
        out = []
        if item.kind == "message":
            for index, (kind, part) in enumerate(zip(item.parts, item.content(), strict=True)):
                if kind == "text":
                    out.append(self._event("response.output_text.done", item_id=item.item_id,
                                           output_index=item.index, content_index=index, text=item.text,
                                           logprobs=item.logprobs))
                else:
                    out.append(self._event("response.refusal.done", item_id=item.item_id, output_index=item.index,
                                           content_index=index, refusal=item.refusal or ""))
                out.append(self._event("response.content_part.done", item_id=item.item_id, output_index=item.index,
                                       content_index=index, part=part.model_dump(mode="json")))
        else:
            out.append(self._event("response.function_call_arguments.done", item_id=item.item_id,
                                   output_index=item.index, name=item.name, arguments=item.text))
        out.append(self._event("response.output_item.done", output_index=item.index,
                               item=self._model(item, self._status(item)).model_dump(mode="json")))
        return out

    def _end(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if not self._items:  # no text, refusal or call: an empty message, as the non-streamed output has
            item, out = self._message()
            out += self._part(item, "text")
        out += self._close_open()
        status = status_of(self._finish)
        output = [self._model(i, self._status(i)) for i in self._items]
        response = self.plan.response(status, output, usage_of(self._usage), self._fak)
        finish(self.kernel, self.caller, self.plan, response, self.stream.provenance)
        self.response = response
        self._done = True
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return out + [self._event(kind, response=response.model_dump(mode="json"))]

    def close(self) -> None:
        """Give the chat stream up (an unfinished turn is rolled back); a response that did not
        complete is abandoned. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.stream.close()
        finally:
            if self.response is None:
                abandon(self.kernel, self.caller, self.plan, None)
