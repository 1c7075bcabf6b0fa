"""Argument provenance: which text in the context each value of a proposed tool call came from.

Whole-context taint asks a person whenever anything untrusted is in attention, which is
nearly always (read the mail, then reply). What matters is narrower: did the *recipient*, the
*account*, the *URL* come from content an attacker could write? Every leaf value of a call's
arguments is traced, in canonical form (``kernel/calls/value_forms.py``), to the texts of the context
that contain it:

- found in trusted context (a system or user turn, a ref whose producer the policy trusts,
  the tool schema): origin ``trusted``, whatever else also contains it;
- otherwise found in refs: the most trusted level among them (``internal``, ``untrusted``);
- found nowhere: ``generated`` (the model composed it; the call's attention provenance, and
  the attention evidence, say what it read while doing so).

A string value of several tokens that is not trusted as a whole is also searched for the
routing entities inside it (e-mail addresses, URLs, IBANs, phone numbers): a reply body the
model wrote is ``generated``, but an IBAN inside it that only a web page contains is traced
to that page. Each finding names the text (segment and ref), the character span and, for a
result whose structure was *declared*, the field path of the value there (``emails.2.sender``).

Field paths are evidence a policy may excuse a value by (``except_fields``: the sender of the
mail being answered), so whoever writes a result's text must not choose them. A result has
them only when its structure is declared, never because its text looks structured: a JSON or
YAML media type at admission, or the tool's ``output`` in the policy (``json``, ``yaml``;
``mail``: an RFC 5322 message, whose header fields are fields and whose body, all an outside
sender writes, is text). A plain-text result has none, however much it looks like YAML.
"""

from __future__ import annotations

import functools
import json
import re
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Literal

import yaml

from fak.kernel.calls.value_forms import ENTITY_KINDS, IndexedText, Match, canonical_tokens, needle_of

Origin = Literal["trusted", "internal", "untrusted", "generated"]
Shape = Literal["text", "json", "yaml", "mail"]  # a result's declared structure
_RANK: dict[str, int] = {"untrusted": 0, "internal": 1, "trusted": 2}
MAX_LEAVES = 256  # a call with more leaf values is traced on its first ones; the rest count as generated
MAX_STRUCTURED = 1 << 18  # larger results are searched as text only (no field paths)
MIN_WORD = 3  # a lone word shorter than this is in every text: not traced
PROSE_TOKENS = 8  # a string field of this many canonical tokens or more is prose (a note, a body)


@dataclass(frozen=True)
class ContextText:
    """One text of the context a call is made in: a system/user turn (``ref`` None) or a
    tool segment's text, with the trust the policy gives its producer."""

    segment: str
    ref: str | None
    trust: str
    text: str
    shape: Shape = "text"  # its declared structure: only a declared one has field paths
    tools: tuple[str, ...] = ()  # the tools that produced it (a turn: none)
    fields: tuple[tuple[str, str], ...] = ()  # (field-path glob, trust): the policy's trust per field
    free_text: str | None = None  # trust of prose inside an internal result (None: untrusted)


@dataclass(frozen=True)
class ValueSource:
    """Where a value occurs: a context text, the characters ``[start, end)`` there, the tools
    that produced the text and, in a result of declared structure, the field path of the value
    that holds it, and whether the value is that field's whole value or lies ``inside`` its
    text. ``trust`` is the source's: the text's, or the policy's for that field, or for prose
    in an internal record (``PROSE_TOKENS``) untrusted unless the policy says otherwise."""

    segment: str
    ref: str | None
    trust: str
    start: int
    end: int
    field: str | None = None
    tools: tuple[str, ...] = ()
    inside: bool = False


@dataclass(frozen=True)
class ArgumentTrace:
    """The provenance of one leaf value (``path``: ``to``, ``recipients.0``), or, with
    ``entity`` set, of a routing entity inside a longer string value at ``path``."""

    path: str
    origin: Origin
    sources: tuple[ValueSource, ...]
    entity: str | None = None
    kind: str | None = None  # the canonical kind of a value that is one token (``email``, ``number``)


def leaves(args: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf value of a JSON value with its dotted path (list items by index)."""
    if isinstance(args, dict):
        for key, value in args.items():
            yield from leaves(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(args, list):
        for i, value in enumerate(args):
            yield from leaves(value, f"{prefix}.{i}" if prefix else str(i))
    else:
        yield prefix, args


_JSON_MEDIA = re.compile(r"(application|text)/(json|[-.a-z0-9]+\+json)")
_YAML_MEDIA = re.compile(r"(application|text)/(x-yaml|yaml|[-.a-z0-9]+\+yaml)")


def shape_of_media(media_type: str | None) -> Shape:
    """The structure a media type declares: JSON (``application/json``, ``*+json``), YAML
    (``application/yaml``, ``*+yaml``), a mail message (``message/rfc822``), else text."""
    base = (media_type or "").split(";", 1)[0].strip().lower()
    if _JSON_MEDIA.fullmatch(base):
        return "json"
    if _YAML_MEDIA.fullmatch(base):
        return "yaml"
    return "mail" if base == "message/rfc822" else "text"


class Structure:
    """The field path of every scalar of a result of declared structure, by character offset:
    JSON (which must parse as JSON) and YAML by their nodes, a mail by its header fields
    (``from``, ``reply_to``: the name lower-cased, ``-`` as ``_``; the body has none). Text, or
    a declared structure the text does not have, has no field paths."""

    def __init__(self, text: str, shape: Shape = "text") -> None:
        self._starts: list[int] = []
        self._spans: list[tuple[int, int, str]] = []
        if shape == "text" or len(text) > MAX_STRUCTURED or not text.strip():
            return
        spans = _mail_fields(text) if shape == "mail" else _node_fields(text, shape)
        spans.sort()
        self._spans = spans
        self._starts = [s for s, _, _ in spans]

    @property
    def spans(self) -> list[tuple[int, int, str]]:
        """Every scalar's characters and path, in order."""
        return self._spans

    def field_at(self, start: int, end: int) -> str | None:
        """The path of the scalar holding characters ``[start, end)``, if one does."""
        span = self.span_at(start, end)
        return span[2] if span is not None else None

    def span_at(self, start: int, end: int) -> tuple[int, int, str] | None:
        """The characters and path of the scalar holding characters ``[start, end)``."""
        i = bisect_right(self._starts, start) - 1
        if i >= 0:
            s, e, path = self._spans[i]
            if s <= start and end <= e:
                return s, e, path
        return None


def _node_fields(text: str, shape: Shape) -> list[tuple[int, int, str]]:
    """The scalars of a JSON or YAML text with their paths (none if it is not what it claims)."""
    if shape == "json":
        return _json_fields(text)
    try:  # the composer gives each scalar's character span
        root = yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (yaml.YAMLError, RecursionError, ValueError):
        return []
    if root is None or isinstance(root, yaml.ScalarNode):
        return []
    out: list[tuple[int, int, str]] = []
    _walk(root, "", out, 0)
    return out


_JSON_WS = re.compile(r"[ \t\n\r]*")
_JSON = json.JSONDecoder()


def _skip_ws(text: str, i: int) -> int:
    """The first index at or after ``i`` that is not JSON white space."""
    m = _JSON_WS.match(text, i)
    return m.end() if m else i

MAX_DEPTH = 64  # deeper values are parsed, and have no field paths


def _json_fields(text: str) -> list[tuple[int, int, str]]:
    """The scalars of a JSON text with their paths, read by a JSON parser (a YAML reader refuses
    some JSON, ``"\\/"``); none if the text is not one JSON value."""
    out: list[tuple[int, int, str]] = []
    try:
        end = _json_value(text, _skip_ws(text, 0), "", out, 0)
    except (ValueError, RecursionError, IndexError):
        return []
    whole = _skip_ws(text, end) == len(text)
    return out if whole and not (len(out) == 1 and out[0][2] == "") else []  # a lone scalar has no fields


def _json_value(text: str, i: int, path: str, out: list[tuple[int, int, str]], depth: int) -> int:
    """Read the JSON value at ``i`` (no leading space), noting its scalars; where it ends."""
    opener = text[i:i + 1]
    if opener not in ("{", "[") or depth >= MAX_DEPTH:
        _, end = _JSON.raw_decode(text, i)
        if opener not in ("{", "["):
            out.append((i, end, path))
        return end
    closer = "}" if opener == "{" else "]"
    i = _skip_ws(text, i + 1)
    if text[i:i + 1] == closer:
        return i + 1
    n = 0
    while True:
        if opener == "{":
            key, i = _JSON.raw_decode(text, i)
            if not isinstance(key, str):
                raise ValueError("a JSON object's key is a string")
            i = _skip_ws(text, i)
            if text[i:i + 1] != ":":
                raise ValueError("':' expected")
            name = key
            i = _skip_ws(text, i + 1)
        else:
            name = str(n)
        i = _json_value(text, i, f"{path}.{name}" if path else name, out, depth + 1)
        n += 1
        i = _skip_ws(text, i)
        if text[i:i + 1] == ",":
            i = _skip_ws(text, i + 1)
        elif text[i:i + 1] == closer:
            return i + 1
        else:
            raise ValueError(f"',' or '{closer}' expected")


def _walk(node: yaml.Node, path: str, out: list[tuple[int, int, str]], depth: int) -> None:
    if depth > 64:
        return
    if isinstance(node, yaml.ScalarNode):
        out.append((node.start_mark.index, node.end_mark.index, path))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, f"{path}.{i}" if path else str(i), out, depth + 1)
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else "?"
            _walk(value, f"{path}.{name}" if path else str(name), out, depth + 1)


_HEADER = re.compile(r"([!-9;-~]+)[ \t]*:[ \t]*")  # an RFC 5322 field name (printable, no colon)
MAX_HEADER_LINES = 512


def _mail_fields(text: str) -> list[tuple[int, int, str]]:
    """The header fields of a mail message, each value's span (folded lines included), up to
    the blank line that starts the body. A text whose first line is not a header field is not
    a message: no fields."""
    out: list[tuple[int, int, str]] = []
    at = 0
    for n, line in enumerate(text.splitlines(keepends=True)):
        content = line.rstrip("\r\n")
        if not content.strip() or n >= MAX_HEADER_LINES:
            break
        if content[0] in " \t":  # a folded continuation of the field before
            if not out:
                return []
            s, _, name = out[-1]
            out[-1] = (s, at + len(content.rstrip()), name)
        else:
            m = _HEADER.match(content)
            if m is None:
                return out if out else []
            name = m.group(1).lower().replace("-", "_")
            out.append((at + m.end(), at + len(content.rstrip()), name))
        at += len(line)
    return out


@dataclass(frozen=True)
class Indexed:
    """A context text prepared once: its canonical tokens and its structure."""

    tokens: IndexedText
    structure: Structure


@functools.lru_cache(maxsize=512)
def indexed(text: str, shape: Shape = "text", tenant: str = "") -> Indexed:
    """The index of a text of a declared structure (cached by content, per tenant: a ref's text
    is indexed once, not per call, and how fast a decision is tells no tenant what another's
    context held)."""
    return Indexed(IndexedText(text), Structure(text, shape))


class ContextIndex:
    """The texts of one context searched as one: every text's canonical tokens joined into one
    string (two spaces between texts: no value matches across them), so a value is looked up
    once for the whole context, not once per text."""

    def __init__(self, texts: Sequence[ContextText], tenant: str = "") -> None:
        # most trusted first: a value's first matches are then from the most trusted texts that
        # hold it, so the origin is right even when the search stops at its limit
        self.texts = tuple(sorted(texts, key=lambda t: -_RANK.get(t.trust, 0)))
        self._indexed = [indexed(t.text, t.shape, tenant) for t in self.texts]
        self._bases: list[int] = []
        at = 0
        for ix in self._indexed:
            self._bases.append(at)
            at += len(ix.tokens.joined)
        self._all = "".join(ix.tokens.joined for ix in self._indexed)
        self._field_trusts: dict[str, frozenset[str]] | None = None

    def find(self, needle: str, per_text: int = 2, limit: int = 16) -> list[ValueSource]:
        """Where the canonical token string ``needle`` occurs: at most ``per_text`` places in
        each text and ``limit`` in all."""
        return [source for _, source in self._occurrences(needle, per_text, limit)]

    def _occurrences(self, needle: str, per_text: int, limit: int) -> Iterator[tuple[int, ValueSource]]:
        """Each place ``needle`` occurs, with the index of its text."""
        probe = " " + needle + " "
        count = needle.count(" ") + 1
        found = 0
        seen: dict[int, int] = {}
        at = self._all.find(probe)
        while at >= 0 and found < limit:
            i = bisect_right(self._bases, at) - 1
            if seen.get(i, 0) < per_text:
                seen[i] = seen.get(i, 0) + 1
                found += 1
                yield i, self._source(i, self._indexed[i].tokens.match_at(at - self._bases[i], count))
            at = self._all.find(probe, at + 1)

    def _source(self, i: int, m: Match) -> ValueSource:
        """The source of a match in text ``i``: its field, whether the value is the field's whole
        value, and the trust of that place (the policy's for the field; prose in an internal
        record is untrusted unless the policy says otherwise)."""
        ctx, ix = self.texts[i], self._indexed[i]
        span = ix.structure.span_at(m.start, m.end)
        if span is None:
            return ValueSource(ctx.segment, ctx.ref, ctx.trust, m.start, m.end, None, ctx.tools)
        first, last = ix.tokens.tokens_within(span[0], span[1])
        inside = (first, last) != (m.first, m.first + m.count)
        return ValueSource(ctx.segment, ctx.ref, _field_trust(ctx, span[2], last - first), m.start, m.end, span[2],
                           ctx.tools, inside)

    def field_trusts(self) -> dict[str, frozenset[str]]:
        """Per ref, the trust levels its fields have other than its text's: the policy's for a
        field, or untrusted prose in an internal record. A record the organisation keeps can
        carry text anyone wrote; what is in attention is then that text too."""
        if self._field_trusts is None:
            out: dict[str, frozenset[str]] = {}
            for ctx, ix in zip(self.texts, self._indexed, strict=True):
                if ctx.ref is None or not ix.structure.spans:
                    continue
                found: set[str] = set()
                for start, end, path in ix.structure.spans:
                    first, last = ix.tokens.tokens_within(start, end)
                    found.add(_field_trust(ctx, path, last - first))
                found.discard(ctx.trust)
                if found:
                    out[ctx.ref] = out.get(ctx.ref, frozenset()) | found
            self._field_trusts = out
        return self._field_trusts

    def endorsers(self, needle: str, by: Sequence[str]) -> list[ValueSource]:
        """The places where text of one of ``by`` names the value ``needle`` in an instruction
        ("book Casa do Rio instead", "create an event titled ..."): inside a text or a field's
        prose, never as a field's whole value (a catalog's own entry names without telling)."""
        out: list[ValueSource] = []
        for i, source in self._occurrences(needle, 8, 64):
            if source.trust in by and (source.field is None or source.inside) \
                    and instruction_near(self.texts[i].text, source.start, source.end):
                out.append(source)
        return out


def _field_trust(ctx: ContextText, path: str, tokens: int) -> str:
    """The trust of a field of ``tokens`` canonical tokens: the policy's for it, else prose in an
    internal record is ``free_text`` (untrusted unless the policy says otherwise), else the text's."""
    trust = next((t for glob, t in ctx.fields if field_matches(path, glob)), None)
    if trust is not None:
        return trust
    return (ctx.free_text or "untrusted") if ctx.trust == "internal" and tokens >= PROSE_TOKENS else ctx.trust


def field_matches(path: str, glob: str) -> bool:
    """A field path matches a glob over the whole path (``emails.2.sender``) or its last key
    (``sender``)."""
    return fnmatchcase(path, glob) or fnmatchcase(path.rsplit(".", 1)[-1], glob)


# Words that make a sentence an instruction to whoever reads it: a verb of choosing or acting,
# an obligation, or the reader named. Read around a value an untrusted text names
# (``endorsers``); a review that praises an entry in its own words ("lovely staff at Casa do
# Rio") names it without telling anyone to pick it.
_INSTRUCTION = re.compile(
    r"\b(?:book|reserve|choose|pick|select|buy|purchase|go\s+with|switch\s+to|opt\s+for|"
    r"create|schedule|title[ds]?|set|send|pay|transfer|post|write|put|add|"
    r"must|should|need\s+to|have\s+to|make\s+sure|instead|only|always|"
    r"assistant|agent|ai|bot|model)\b", re.IGNORECASE)
_SENTENCE_END = re.compile(r"[.!?\n]")
INSTRUCTION_WINDOW = 160  # characters either side of the value, within its sentence


def instruction_near(text: str, start: int, end: int) -> bool:
    """Does the sentence around ``text[start:end]`` (at most ``INSTRUCTION_WINDOW`` characters
    either side) read as an instruction (``_INSTRUCTION``)?"""
    lo = max(0, start - INSTRUCTION_WINDOW)
    before = text[lo:start]
    cut = [m.end() for m in _SENTENCE_END.finditer(before)]
    before = before[cut[-1]:] if cut else before
    after = text[end:end + INSTRUCTION_WINDOW]
    stop = _SENTENCE_END.search(after)
    after = after[:stop.start()] if stop else after
    return bool(_INSTRUCTION.search(before) or _INSTRUCTION.search(after))


def _within(inner: ValueSource, outer: ValueSource) -> bool:
    return inner.segment == outer.segment and outer.start <= inner.start and inner.end <= outer.end


def _digits(number: str) -> int:
    return sum(c.isdigit() for c in number)


def _origin(sources: Sequence[ValueSource]) -> Origin:
    if not sources:
        return "generated"
    best = max(_RANK.get(s.trust, 0) for s in sources)
    return ("untrusted", "internal", "trusted")[best]


def _ordered(sources: list[ValueSource]) -> tuple[ValueSource, ...]:
    return tuple(sorted(sources, key=lambda s: -_RANK.get(s.trust, 0)))


def trace_arguments(args: Any, texts: Sequence[ContextText] | ContextIndex, *, min_number_digits: int = 1,
                    counts_number: Callable[[str], bool] | None = None) -> list[ArgumentTrace]:
    """The provenance of every leaf value of ``args`` (booleans and nulls carry none). A value
    that is one number of fewer than ``min_number_digits`` digits carries none either (an id of
    7 is in every timestamp), unless ``counts_number(path)`` says the argument is an amount or
    routes (an account, a file id)."""
    index = texts if isinstance(texts, ContextIndex) else ContextIndex(texts)
    out: list[ArgumentTrace] = []
    for n, (path, value) in enumerate(leaves(args)):
        if value is None or isinstance(value, bool):
            continue
        if n >= MAX_LEAVES:
            out.append(ArgumentTrace(path, "generated", ()))
            continue
        text = value if isinstance(value, str) else str(value)
        tokens = canonical_tokens(text)
        if not tokens:
            continue
        kind = tokens[0].kind if len(tokens) == 1 else None
        if kind == "word" and len(tokens[0].form) < MIN_WORD:
            out.append(ArgumentTrace(path, "generated", (), kind=kind))
            continue
        if kind == "number" and _digits(tokens[0].form) < min_number_digits \
                and not (counts_number is not None and counts_number(path)):
            continue
        sources = index.find(needle_of(tokens))
        origin = _origin(sources)
        out.append(ArgumentTrace(path, origin, _ordered(sources), kind=kind))
        if origin == "trusted" or len(tokens) == 1:
            continue
        seen: set[str] = set()
        for token in tokens:
            if token.kind not in ENTITY_KINDS or token.form in seen:
                continue
            seen.add(token.form)
            found = index.find(token.form)
            # where the whole value occurs, the entity inside it is that same occurrence (a file
            # name inside the path a listing gave): not a second source of its own
            inner = [src for src in found if not any(_within(src, whole) for whole in sources)]
            if found and not inner:
                continue
            out.append(ArgumentTrace(path, _origin(inner), _ordered(inner), entity=token.kind))
    return out
