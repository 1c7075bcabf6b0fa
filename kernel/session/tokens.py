"""Tokens into and out of a session, as both doors use them: the REST layer's generation
(``fak.kernel.operations``: ``generate``, the streamed ``Turn``) and the OpenAI door's
answers (``fak.kernel.openai``). ``check_context`` refuses a text too long before it is
prefilled; ``timed_tokens`` stamps a generation's tokens and publishes ``TokensTimed``;
``Stepper`` drives an iterator one step at a time from worker threads; ``TextDecoder``
detokenises incrementally without splitting a character."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from fak.kernel.events import EventBus, TokensTimed
from fak.kernel.session.kernel_session import ContextFull

if TYPE_CHECKING:
    from fak.kernel.model.tokenizer import ChatTokenizer

T = TypeVar("T")


class Context(Protocol):
    """What ``check_context`` reads of a kernel (``Kernel`` and ``Services`` both have it)."""

    @property
    def context_limit(self) -> int: ...

    @property
    def tokenizer(self) -> ChatTokenizer: ...


def check_context(k: Context, texts: list[str], what: str) -> None:
    """Refuse, before anything is stored or prefilled, texts whose own tokens already pass
    the context (``409 context_full``). The kernel checks the exact length after its
    prefill; without this a 1 MiB message would be prefilled in full (minutes of CPU)
    only to be refused. A text of n UTF-8 bytes has at most n tokens, so short texts are
    not tokenised here."""
    limit = k.context_limit
    if sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) <= limit:
        return
    tokens = sum(len(k.tokenizer.encode(t)) for t in texts)
    if tokens > limit:
        raise ContextFull(f"{what} is {tokens} tokens long; the context holds {limit}")


class Stepper(Generic[T]):
    """An iterator (of tokens, of a stream's chunks) driven from worker threads one step at a
    time; ``close`` waits for a running step, then closes it (the session rolls the partial
    turn back)."""

    def __init__(self, tokens: Iterator[T]) -> None:
        self._it = tokens
        self._lock = threading.Lock()
        self.done = False

    def step(self) -> T | None:
        with self._lock:
            if self.done:
                return None
            try:
                return next(self._it)
            except StopIteration:
                self.done = True
                return None

    def close(self) -> None:
        with self._lock:
            self.done = True
            self._it.close()  # type: ignore[attr-defined]


def timed_tokens(tokens: Iterator[int], events: EventBus, tenant: str) -> Generator[int, None, None]:
    """``tokens`` as they come, stamped (one clock read a token); when they end, however they
    end (exhausted, closed early: ``close`` closes ``tokens`` too), ``TokensTimed`` is published
    if there was any."""
    first = last = 0.0
    count = 0
    try:
        for token in tokens:
            last = time.perf_counter()
            if not count:
                first = last
            count += 1
            yield token
    finally:
        tokens.close()  # type: ignore[attr-defined]  # a generator: closing early rolls the turn back
        if count:
            events.publish(TokensTimed(tenant, count, first, last))


class TextDecoder:
    """Incremental detokenisation that holds back an incomplete UTF-8 character. Each step
    decodes only the tokens since the last complete piece, after a few tokens of context (a
    tokenizer may render a token differently at the start of a text), so a long answer costs
    the same per token as a short one."""

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self.tok = tokenizer
        self.ids: list[int] = []
        self._pieces: list[str] = []  # what ``push`` returned (joined only when asked: ``emitted``)
        self._prefix = 0  # ids[prefix:read]: context decoded again before the new tokens
        self._read = 0  # ids before read are in ``emitted``

    @property
    def emitted(self) -> str:
        """The text so far (the pieces ``push`` returned)."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    def push(self, token: int) -> str:
        if token in self.tok.stop_token_ids:
            return ""
        self.ids.append(token)
        before = self.tok.decode(self.ids[self._prefix:self._read], skip_special=True)
        text = self.tok.decode(self.ids[self._prefix:], skip_special=True)
        if text.endswith("\ufffd") or len(text) <= len(before):
            return ""
        piece = text[len(before):]
        self._pieces.append(piece)
        self._prefix, self._read = self._read, len(self.ids)
        return piece
