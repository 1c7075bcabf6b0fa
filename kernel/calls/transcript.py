"""A context written down: the messages and tool results of an agent's session as JSONL, read
into the ``CallContext`` a tool-call decision reads (``fak policy authorize``: a call judged
offline, with no model, no data directory and no session).

One JSON object a line (blank lines are skipped)::

    {"role": "system", "content": "..."}
    {"role": "user", "content": "..."}
    {"role": "assistant", "content": "..."}
    {"role": "tool", "tool": "web_fetch", "content": "...", "source": "https://...",
     "media_type": "application/json"}

A tool line's ``content`` may also be a JSON value (an object, a list): it is then the JSON text
of that value, and its media type defaults to ``application/json``; a string's defaults to
``text/plain``, as ``KernelSession.admit``'s does. Each tool result goes through the policy's
admission gate as the kernel admits it: ``QUARANTINE`` and ``DENY`` leave it out of the context
(never seen), ``REDACT`` puts the redacted bytes in, and policy-wide audit mode puts every result
in. An admitted result is a tool segment carrying its ref (the public digest of the bytes that
entered: ``blake3:…``; a session's refs are the tenant's keyed digests) and its producer (tool,
source URL), whose trust the policy's ``tools`` entries give. System and user turns are trusted
texts; assistant turns are read but are no source of an argument (the kernel searches the
system, user and tool segments only: the model's own words are what is being judged).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import blake3

from fak.errors import InvalidInput
from fak.kernel.calls.authorize import CallContext, ContextEntry
from fak.policy.gate import gate
from fak.policy.verdict import GateContext, Verdict
from fak.types import VerdictKind

if TYPE_CHECKING:
    from fak.policy import Policy

ROLES = ("system", "user", "assistant", "tool")
MAX_TRANSCRIPT_BYTES = 64 << 20
_KEYS = {"role", "content", "tool", "name", "source", "media_type", "tool_call_id"}


@dataclass(frozen=True)
class TranscriptLine:
    """One line of a transcript: its number (from 1), role and text; for a tool line the tool,
    source URL and media type it was given with, the gate's verdict, the ref of its bytes and
    the ref that entered the context (None: left out; REDACT: the redacted bytes')."""

    number: int
    role: str
    text: str
    tool: str | None = None
    source: str | None = None
    media_type: str | None = None
    verdict: Verdict | None = None
    ref: str | None = None
    admitted_ref: str | None = None

    @property
    def segment(self) -> str:
        """The id of its segment in the context (``line-3``)."""
        return f"line-{self.number}"


@dataclass(frozen=True)
class Transcript:
    """A transcript's lines and the context a decision reads of it."""

    path: str
    lines: tuple[TranscriptLine, ...]
    context: CallContext

    def lines_of_ref(self, ref: str) -> list[int]:
        """The numbers of the lines whose admitted result is ``ref``."""
        return [line.number for line in self.lines if line.admitted_ref == ref]

    def line_of_segment(self, segment: str) -> int | None:
        """The number of the line whose segment is ``segment``."""
        return next((line.number for line in self.lines if line.segment == segment), None)


def read_transcript(path: str, policy: Policy) -> Transcript:
    """The transcript at ``path`` with its tool results admitted by ``policy``'s gate; a clear
    ``InvalidInput`` naming the file and line for a line that is not a message."""
    try:
        with Path(path).open("rb") as file:  # never more than the limit read (a FIFO, /dev/zero, a huge file)
            raw = file.read(MAX_TRANSCRIPT_BYTES + 1)
    except OSError as exc:
        raise InvalidInput(f"{path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_TRANSCRIPT_BYTES:
        raise InvalidInput(f"{path}: larger than {MAX_TRANSCRIPT_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        number = raw[:exc.start].count(b"\n") + 1
        raise InvalidInput(f"{path}:{number}: not UTF-8") from None
    lines: list[TranscriptLine] = []
    # lines end at "\n" only: str.splitlines would also split a JSON string at a U+2028 or U+0085
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            # a \ud800 escape decodes to a lone surrogate: no text (nothing could print it)
            json.dumps(record, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInput(f"{path}:{number}: a string holds a lone surrogate (\\ud800): not text") from None
        except ValueError as exc:
            raise InvalidInput(f"{path}:{number}: not JSON: {exc}") from None
        except RecursionError:
            raise InvalidInput(f"{path}:{number}: not JSON: nested too deeply") from None
        lines.append(_line(path, number, record, policy))
    if not lines:
        raise InvalidInput(f"{path}: no message")
    entries = [_entry(x) for x in lines if x.role in ("system", "user") or x.admitted_ref is not None]
    return Transcript(path, tuple(lines), CallContext.of_entries(entries))


def _ref(data: bytes) -> str:
    """The public digest of ``data`` (``blake3:<hex>``, the CAS's grammar)."""
    return "blake3:" + blake3.blake3(data).hexdigest()


def _entry(line: TranscriptLine) -> ContextEntry:
    if line.admitted_ref is None:
        return ContextEntry(line.segment, None, line.text)
    assert line.tool is not None
    return ContextEntry(line.segment, line.admitted_ref, line.text, (line.tool, line.source), line.media_type)


def _line(path: str, number: int, record: Any, policy: Policy) -> TranscriptLine:
    """One line read and, for a tool result, admitted (or left out) by the gate."""
    where = f"{path}:{number}"
    if not isinstance(record, dict):
        raise InvalidInput(f'{where}: want an object {{"role": ..., "content": ...}}')
    role = record.get("role")
    if role not in ROLES:
        raise InvalidInput(f"{where}: unknown role {role!r:.80}: want one of {', '.join(ROLES)}")
    unknown = sorted(set(record) - _KEYS)
    if unknown:
        raise InvalidInput(f"{where}: unknown field {unknown[0]!r:.80}")
    content = record.get("content")
    if role != "tool":
        if not isinstance(content, str):
            raise InvalidInput(f'{where}: a {role} line wants a string "content"')
        return TranscriptLine(number, role, content)
    tool = record.get("tool", record.get("name"))
    if not isinstance(tool, str) or not tool:
        raise InvalidInput(f'{where}: a tool line wants the tool\'s name: "tool": "web_fetch"')
    source = record.get("source")
    if source is not None and (not isinstance(source, str) or not source.isprintable()):
        raise InvalidInput(f'{where}: "source" is a URL (a printable string)')
    media_type = record.get("media_type")
    if media_type is not None and not isinstance(media_type, str):
        raise InvalidInput(f'{where}: "media_type" is a string')
    if content is None:
        raise InvalidInput(f'{where}: a tool line wants "content" (a string, or a JSON value)')
    if isinstance(content, str):
        body, media_type = content, media_type or "text/plain"
    else:
        body, media_type = json.dumps(content, ensure_ascii=False), media_type or "application/json"
    data = body.encode("utf-8")
    verdict = gate(policy, tool, data, GateContext(media_type=media_type, source=source))
    kind = verdict.kind if verdict.enforced else VerdictKind.ALLOW  # audit mode admits, as the kernel does
    ref = _ref(data)
    admitted: str | None = None
    if kind in (VerdictKind.ALLOW, VerdictKind.REDACT):
        if kind is VerdictKind.REDACT and verdict.redacted_bytes is not None:
            data = verdict.redacted_bytes
            body = data.decode("utf-8", "replace")
        admitted = _ref(data)
    return TranscriptLine(number, role, body, tool, source, media_type, verdict, ref, admitted)
