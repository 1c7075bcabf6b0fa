"""Tokenizer and chat template, from the same GGUF file as the weights (or an
HF folder's ``tokenizer.json`` + ``tokenizer_config.json``).

A GGUF ``gpt2``-model vocabulary becomes a byte-level BPE ``tokenizers``
tokenizer; control tokens become special tokens so ``<|im_start|>`` encodes as
one id. The pre-tokenizer follows ``tokenizer.ggml.pre`` (``smollm`` splits
digits individually, as the original SmolLM2 ``tokenizer.json`` does). A Gemma 3
file's SentencePiece vocabulary (``llama`` model, no merges) becomes the BPE with byte
fallback that transformers builds from the same file (``_gemma_tokenizer``), and, where
the file carries no chat template (the 270M base model's), Gemma 3's turns with fak's
tool block (``GEMMA3_TEMPLATE``).
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import blake3
import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from fak.kernel.model.config import ModelError, TemplateRefused

CONTROL = 3
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    if pre == "smollm":
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    if pre in ("llama-bpe", "llama3"):
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    return pre_tokenizers.ByteLevel(add_prefix_space=False)


def tokenizer_files_from_gguf(reader: Any, folder: Path) -> None:  # reader: gguf.GGUFReader
    """Write ``tokenizer.json`` and ``fak-tokenizer.json`` (template, special ids) into ``folder``."""

    def field(key: str, default: Any = None) -> Any:
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    kind = field("tokenizer.ggml.model")
    gemma = field("general.architecture") == "gemma3"
    if kind == "llama" and gemma:
        tk = _gemma_tokenizer(field)
    elif kind != "gpt2":
        raise ModelError(f"GGUF tokenizer model {kind!r} is not supported (byte-level BPE 'gpt2', and Gemma 3's 'llama')")
    else:
        tokens: list[str] = field("tokenizer.ggml.tokens")
        types: list[int] = field("tokenizer.ggml.token_type") or [1] * len(tokens)
        merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
        vocab = {tok: i for i, tok in enumerate(tokens)}
        tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        tk.pre_tokenizer = _pre_tokenizer(field("tokenizer.ggml.pre", "default"))
        tk.decoder = decoders.ByteLevel()
        tk.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types, strict=True) if ty == CONTROL]
        )
    tk.save(str(folder / "tokenizer.json"))
    template = field("tokenizer.chat_template")
    meta = {
        "chat_template": template if template or not gemma else GEMMA3_TEMPLATE,
        "bos_token_id": field("tokenizer.ggml.bos_token_id"),
        "eos_token_id": field("tokenizer.ggml.eos_token_id"),
        "add_bos_token": bool(field("tokenizer.ggml.add_bos_token", False)),
    }
    (folder / "fak-tokenizer.json").write_text(json.dumps(meta, indent=1))


USER_DEFINED = 4


def _gemma_tokenizer(field: Any) -> Tokenizer:
    """Gemma 3's SentencePiece vocabulary as transformers builds it from the same GGUF file
    (``integrations/gguf``'s ``gemma_tokenizer`` and ``GemmaTokenizer``): a BPE with byte
    fallback over the tokens, spaces written ``▁`` (a token of spaces only is stored with real
    spaces and respelled), its merges recovered from the vocabulary with the file's token order as
    their rank (the file lists none; Gemma's scores do not follow its merge order); control
    tokens special, user-defined ones (``\n\n``, ``<table>``) whole added tokens."""
    tokens: list[str] = field("tokenizer.ggml.tokens")
    types: list[int] = field("tokenizer.ggml.token_type") or [1] * len(tokens)
    spelled = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {t: i for i, t in enumerate(spelled)}
    rank = {t: -i for i, t in enumerate(spelled)}
    merges: list[tuple[str, str, int]] = []
    for merged, score in rank.items():  # transformers' generate_merges, ranked by the file's order
        local = [(merged[:k], merged[k:], score) for k in range(1, len(merged))
                 if merged[:k] in vocab and merged[k:] in vocab]
        merges.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    unk = tokens[field("tokenizer.ggml.unknown_token_id", 3)]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[(a, b) for a, b, _ in merges], fuse_unk=True, unk_token=unk,
                              byte_fallback=True))
    tk.normalizer = normalizers.Replace(" ", "\u2581")
    tk.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tk.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types, strict=True) if ty == CONTROL]
    )
    tk.add_tokens([AddedToken(t, special=False, normalized=False)
                   for t, ty in zip(tokens, types, strict=True) if ty == USER_DEFINED and t in vocab])
    return tk


# Gemma 3's turns (``<start_of_turn>user`` / ``<start_of_turn>model``), for a Gemma 3 file without a
# template of its own. Gemma 3 has neither a system nor a tool role: as Google's template puts the
# system text in a user turn, here each message is a turn of its own (a system message and a tool
# result are user turns; every message is an append to the conversation, which a session needs).
# Tools follow Google's function-calling guide for Gemma 3: their definitions in the first turn,
# each call written in a ```tool_code block (here a JSON object, fak's ``GemmaFormat``), each
# result returned in a ```tool_output block of a user turn.
GEMMA3_TOOLS = (
    "You have access to the functions below. To call one or more of them, write each call as a JSON "
    'object with its "name" and its "arguments" in a ```tool_code block of its own, for example:\n'
    '```tool_code\n{"name": "function_name", "arguments": {"argument": "value"}}\n```\n'
    "Each result comes back in a ```tool_output block.\n\n"
)
GEMMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{ '<start_of_turn>model\n' }}"
    "{%- if message['content'] -%}{{ message['content'] | trim }}{%- endif -%}"
    "{%- for call in message['tool_calls'] or [] -%}"
    "{%- if message['content'] or not loop.first -%}{{ '\n' }}{%- endif -%}"
    "{{ '```tool_code\n{\"name\": ' + (call['function']['name'] | tojson) + ', \"arguments\": '"
    " + (call['function']['arguments'] | tojson) + '}\n```' }}"
    "{%- endfor -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- elif message['role'] == 'tool' -%}"
    "{{ '<start_of_turn>user\n```tool_output\n' + message['content'] + '\n```<end_of_turn>\n' }}"
    "{%- else -%}"
    "{{ '<start_of_turn>user\n' }}"
    "{%- if loop.first and tools -%}"
    "{{ '" + GEMMA3_TOOLS.replace("\n", "\\n").replace("'", "\\'") + "' }}"
    "{%- for tool in tools -%}{{ tool | tojson }}{{ '\n' }}{%- endfor -%}{{ '\n' }}"
    "{%- endif -%}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


class ChatTokenizer:
    """Encode/decode text and render chat messages with the model's own template."""

    def __init__(self, tk: Tokenizer, meta: dict[str, Any]) -> None:
        self.tk = tk
        self.bos_token_id: int | None = meta.get("bos_token_id")
        self.eos_token_id: int | None = meta.get("eos_token_id")
        self.add_bos = bool(meta.get("add_bos_token"))
        template = meta.get("chat_template")
        self.template_source: str | None = template
        self._template = _environment().from_string(template) if template else None
        # what the model's template can name: its BOS and EOS as text (Llama's and Mistral's write them)
        self._names = {k: tk.id_to_token(i) for k, i in (("bos_token", self.bos_token_id),
                                                          ("eos_token", self.eos_token_id)) if i is not None}
        # the template renders a request's tools itself (its source reads ``tools``); which call
        # syntax it teaches is the agent kernel's to say (``fak.kernel.calls.formats.format_for``)
        self.renders_tools = bool(template) and "tools" in (template or "")
        self.stop_token_ids: set[int] = {i for i in (self.eos_token_id,) if i is not None}
        for name in ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>"):
            tid = tk.token_to_id(name)
            if tid is not None:
                self.stop_token_ids.add(tid)
        self.digest = _tokenizer_digest(tk)
        # a twin that encodes special-token strings as plain text (for untrusted content)
        self._plain = Tokenizer.from_str(tk.to_str())
        self._plain.encode_special_tokens = True
        self._turn_suffix: list[int] | None = None
        self._special_re: re.Pattern[str] | None = None

    @classmethod
    def from_folder(cls, folder: Path) -> ChatTokenizer:
        tj = folder / "tokenizer.json"
        if not tj.is_file():
            raise ModelError(f"{folder}: no tokenizer.json")
        meta_file = folder / "fak-tokenizer.json"
        if meta_file.is_file():
            meta = json.loads(meta_file.read_text())
        else:  # an HF checkpoint folder
            tc = folder / "tokenizer_config.json"
            conf = json.loads(tc.read_text()) if tc.is_file() else {}
            cfg = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
            eos = cfg.get("eos_token_id")
            meta = {
                "chat_template": conf.get("chat_template"),
                "bos_token_id": cfg.get("bos_token_id"),
                "eos_token_id": eos[0] if isinstance(eos, list) else eos,
                "add_bos_token": conf.get("add_bos_token", False),
            }
        return cls(Tokenizer.from_file(str(tj)), meta)

    @property
    def tools_role(self) -> str | None:
        """The chat role the door's tools block is rendered as: a system turn where the model's
        template writes the tools text (``tools_text``: instructions, as the template shows
        them); None (the tool role) for fak's own Hermes block."""
        return "system" if self.renders_tools else None

    @property
    def vocab_size(self) -> int:
        return self.tk.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token strings in it become their ids."""
        return self.tk.encode(text, add_special_tokens=False).ids

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of ``text`` with special-token strings taken literally: content
        cannot forge a ``<|im_start|>system`` header."""
        return self._plain.encode(text, add_special_tokens=False).ids

    def encode_message(self, history: list[dict[str, str]], message: dict[str, str],
                       tools: list[dict[str, Any]] | None = None) -> list[int]:
        """``_encode_message``; where the template merges a message into the turn of the one
        before it of the same role (Qwen's templates put consecutive tool results, a parallel
        call's, in one ``user`` turn), not an append, the message becomes a turn of its own: what
        the template renders for it right after the messages before that run of its role. The
        session then holds one turn per result (each its own segment, evictable alone) where
        ``apply_chat_template`` writes one for all; the same history gives the same tokens."""
        try:
            return self._encode_message(history, message, tools)
        except NotIncremental:
            if message.get("role") != "tool":
                raise
            run = 0
            while run < len(history) and history[-1 - run].get("role") == message.get("role"):
                run += 1
            if run == 0:
                raise
            return self._encode_message(history[:-run], message, tools)

    def _encode_message(self, history: list[dict[str, str]], message: dict[str, str],
                        tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Tokens the chat template adds for ``message`` after ``history``: the
        template's own markup is encoded with special tokens, the content without. A template that
        renders tools (a model with a tool format of its own) is segmented as ``encode_conversation``
        does it, so its filters (``tojson``, ``trim``) apply to the content as they do there; where
        such a template rewrites earlier turns once a message follows them (Qwen3 drops earlier
        thoughts, Mistral moves the system message to the last user turn), the message's tokens
        are what the whole rendering ends with after its last difference from the history's: the
        session keeps earlier turns as they were appended. ``tools``: the request's tools, for a
        message appended knowing them (``_tools_markup``: Llama 3's system header then says
        ``Environment: ipython``)."""
        before = self.render(history) if history else ""
        if self.renders_tools:
            whole = self.encode_conversation([*history, message])
            prefix = whole.text.startswith(before)
            cut = len(before) if prefix else _appended_at(before, whole.text)
            if cut is None or any(k == "content" and a < cut < b for k, a, b in whole.spans) or (
                    not prefix and message.get("content")
                    and not any(k == "content" and a >= cut for k, a, _ in whole.spans)):
                raise NotIncremental("the chat template does not render this message as an append to the conversation")
            if tools:
                text, spans = self._tools_markup(history, message, tools, whole, cut)
                return self._ids(text, spans, cut)
            return self._ids(whole.text, whole.spans, cut)
        marked = self.render(history + [{**message, "content": _SENTINEL}])
        if not marked.startswith(before) or marked.count(_SENTINEL) != 1:
            raise NotIncremental("the chat template does not render this message as an append to the conversation")
        head, tail = marked[len(before) :].split(_SENTINEL)
        return self.encode(head) + self.encode_plain(message["content"]) + self.encode(tail)

    def _tools_markup(self, history: list[dict[str, str]], message: dict[str, str], tools: list[dict[str, Any]],
                      whole: Rendered, cut: int) -> tuple[str, list[tuple[SpanKind, int, int]]]:
        """``whole`` (the conversation up to ``message``, rendered without tools) with the markup
        the template writes inside ``message``'s own turn only when given ``tools`` (Llama 3's
        ``Environment: ipython`` line in its system header), so the turn is what the template
        renders for it with them. The tools text itself is left out (the door admits it as a
        segment of its own), and so is every change around it; the text and spans are
        ``whole``'s when the template writes nothing else for tools there, rewrites the turn's
        text rather than inserting, or inserts inside a client string."""
        shown = self.tools_text(tools)
        probe = {"role": "user", "content": "\ue010u\ue011"}  # a later user turn (Llama's tools need one)
        try:
            bare, given = self.render([*history, message, probe]), self.render([*history, message, probe], tools=tools)
        except ModelError:
            return whole.text, whole.spans
        end = len(whole.text)
        if shown is None or not bare.startswith(whole.text):  # the probe rewrote the turn (Mistral): not spliceable
            return whole.text, whole.spans
        inserts: list[tuple[int, str]] = []
        for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, bare, given, autojunk=False).get_opcodes():
            if op == "equal" or i2 <= cut or i1 >= end or shown in given[j1:j2]:
                continue  # outside the turn, or the tools text (with what surrounds it)
            if op != "insert" or i1 <= cut or any(k == "content" and a < i1 < b for k, a, b in whole.spans):
                return whole.text, whole.spans
            inserts.append((i1, given[j1:j2]))
        text, at = whole.text, 0
        for i, piece in inserts:
            text = text[: i + at] + piece + text[i + at :]
            at += len(piece)
        if not inserts or not given[cut:].startswith(text[cut:]):
            return whole.text, whole.spans

        def moved(x: int) -> int:
            return x + sum(len(piece) for i, piece in inserts if i < x)

        # the client strings move by what was inserted before them; everything else is markup
        spans: list[tuple[SpanKind, int, int]] = []
        pos = 0
        for a, b in sorted((moved(a), moved(b)) for k, a, b in whole.spans if k == "content"):
            spans += [("markup", pos, a)] if a > pos else []
            spans.append(("content", a, b))
            pos = b
        return text, spans + ([("markup", pos, len(text))] if len(text) > pos else [])

    def encode_regions(self, history: list[dict[str, str]], role: str, pieces: list[str]) -> tuple[list[int], list[int]]:
        """A message whose content is ``pieces`` joined, encoded piece by piece, and the
        token offsets where each piece begins: what a prompt assembler that knows its
        regions (documents, tool schemas) hands to PIC, so identical pieces get identical
        tokens and chunk cuts wherever they land."""
        head = self.encode_message(history, {"role": role, "content": _SENTINEL})
        marker = self.encode_plain(_SENTINEL)
        at = next((i for i in range(len(head) - len(marker) + 1) if head[i : i + len(marker)] == marker), None)
        if at is None:
            raise TemplateRefused("cannot locate a message's content in its template")
        ids, regions = head[:at], []
        for piece in pieces:
            regions.append(len(ids))
            ids += self.encode_plain(piece)
        return ids + head[at + len(marker) :], regions

    def generation_prompt(self, history: list[dict[str, str]]) -> list[int]:
        """Tokens that open an assistant turn after ``history``."""
        before = self.render(history) if history else ""
        full = self.render(history, add_generation_prompt=True)
        if not full.startswith(before):
            raise ModelError("the chat template's generation prompt is not an extension of the history")
        return self.encode(full[len(before) :])

    def close_turn(self, last: int) -> list[int]:
        """Tokens that end an assistant turn whose last sampled token is ``last``."""
        if self._turn_suffix is None:
            marked = self.render([{"role": "user", "content": "u"}, {"role": "assistant", "content": _SENTINEL}])
            self._turn_suffix = self.encode(marked.split(_SENTINEL, 1)[1])
        suffix = self._turn_suffix
        if suffix and last == suffix[0]:
            return [last] + suffix[1:]
        return [last] + suffix

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        return self.tk.decode(list(ids), skip_special_tokens=skip_special)

    def decode_turn(self, ids: Iterable[int]) -> str:
        """The text of generated ids: stop tokens and special tokens left out."""
        return self.decode([t for t in ids if t not in self.stop_token_ids], skip_special=True)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False,
               tools: list[dict[str, Any]] | None = None) -> str:
        """The template's text for ``messages`` (and ``tools``, for a template that renders
        them), with what ``transformers``' ``apply_chat_template`` gives a template."""
        if self._template is None:
            raise ModelError("this model has no chat template")
        extra: dict[str, Any] = {"tools": tools} if tools is not None else {}
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         **self._names, **extra)
        except _Refusal as exc:
            raise TemplateRefused(f"the model's chat template refuses these messages: {exc}") from exc
        except jinja2.TemplateError as exc:
            raise ModelError(f"chat template failed: {exc}") from exc

    def encode_conversation(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                            add_generation_prompt: bool = False) -> Rendered:
        """A whole conversation (with tool calls, tool results and ``tools``) rendered by the
        model's template, and its tokens: a special token counts only where the template's own
        markup writes it; every client string (contents, arguments, tool results, tool
        descriptions and schemas) is encoded with special-token strings taken literally. The
        text between trusted special tokens is encoded in one piece, so for content without
        special-token strings the ids are ``apply_chat_template``'s."""
        text = self.render(messages, add_generation_prompt, tools)
        pieces: list[str] = []
        kept: list[str] = []
        marked_messages = _mark(messages, pieces, kept, schema=False)
        marked_tools = _mark(tools, pieces, kept, schema=True) if tools is not None else None
        specials = self._special_strings()
        if any(t in k or _borders(k, t) for k in kept for t in specials):
            raise TemplateRefused("a role, id, type or key holds (or begins or ends with part of) a special-token string")
        marked = self.render(marked_messages, add_generation_prompt, marked_tools)
        spans = _align(text, marked, pieces)
        if spans is None:
            raise TemplateRefused("the chat template's markup depends on the content here: it cannot be segmented")
        return Rendered(text, self._ids(text, spans), spans)

    def _ids(self, text: str, spans: list[tuple[SpanKind, int, int]], start: int = 0) -> list[int]:
        """Token ids of ``text[start:]``: a special token where the markup writes one, every
        stretch between them encoded in one piece with special-token strings taken literally."""
        specials = self._special_strings()
        if self._special_re is None:
            self._special_re = re.compile("|".join(re.escape(t) for t in specials)) if specials else re.compile("(?!)")
        ids: list[int] = []
        pos = start
        for kind, a, b in spans:
            if kind != "markup" or b <= start:
                continue
            for hit in self._special_re.finditer(text, max(a, start), b):  # longest first, as the tokenizer matches
                ids += self.encode_plain(text[pos:hit.start()]) + [specials[hit.group()]]
                pos = hit.end()
        return ids + self.encode_plain(text[pos:])

    def tools_text(self, tools: list[dict[str, Any]]) -> str | None:
        """The text the model's template writes to show ``tools`` (Qwen's ``# Tools`` section,
        Llama's "Given the following functions" block, Mistral's ``[AVAILABLE_TOOLS]``): what
        a probe conversation gains when rendered with them, its longest insertion. None when
        the template writes no such text (or fails): the caller falls back to fak's own block."""
        probe = [{"role": "system", "content": "\ue010s\ue011"}, {"role": "user", "content": "\ue010u\ue011"}]
        try:
            bare, shown = self.render(probe), self.render(probe, tools=tools)
        except ModelError:
            return None
        ops = difflib.SequenceMatcher(None, bare, shown, autojunk=False).get_opcodes()
        inserted = [shown[j1:j2] for op, _, _, j1, j2 in ops if op in ("insert", "replace")]
        text = max(inserted, key=len, default="").strip("\n")
        names = [t.get("function", {}).get("name", "") for t in tools]
        if not text or "\ue010" in text or not all(n in text for n in names):
            return None
        return text

    def _special_strings(self) -> dict[str, int]:
        """The special tokens' strings and ids, longest first (as the tokenizer matches them)."""
        found = {t.content: i for i, t in self.tk.get_added_tokens_decoder().items() if t.special}
        return dict(sorted(found.items(), key=lambda kv: -len(kv[0])))

    def stream_text(self, ids: Iterator[int]) -> Iterator[str]:
        """Incremental detokenisation: yields text pieces, holding back incomplete UTF-8."""
        buf: list[int] = []
        emitted = ""
        for tid in ids:
            buf.append(tid)
            text = self.decode(buf, skip_special=True)
            if text.endswith("\ufffd"):
                continue
            if len(text) > len(emitted):
                yield text[len(emitted) :]
            emitted = text
        tail = self.decode(buf, skip_special=True)
        if len(tail) > len(emitted):
            yield tail[len(emitted) :]


_SENTINEL = "\x00fak-content\x00"
SpanKind = Literal["markup", "content"]


@dataclass(frozen=True)
class Rendered:
    """A conversation as the template renders it: the text, its token ids, and its spans
    (kind, start, end in the text): the template's markup, or a client string."""

    text: str
    ids: list[int]
    spans: list[tuple[SpanKind, int, int]]


# the strings of a message a template takes as given (it tests them: roles, ids, types); every
# other string, and everything inside a content or the arguments, is the client's
_MESSAGE_KEEP = frozenset({"role", "id", "tool_call_id", "type"})
_MESSAGE_INSIDE = frozenset({"content", "arguments"})
# in tools: a schema's ``type`` and ``required`` (templates test those); the rest (names,
# descriptions, enum values, titles) is the client's
_SCHEMA_KEEP = frozenset({"type", "required"})


def _mark(value: Any, pieces: list[str], kept: list[str], *, schema: bool, key: str | None = None,
          inside: bool = False) -> Any:
    """``value`` with each client string replaced by a numbered marker (the string kept in
    ``pieces``) that every filter a template applies (``tojson``, ``trim``) leaves as it is;
    the strings left as they are (and every key) are listed in ``kept``."""
    if isinstance(value, str):
        if not value:  # an empty string stays empty: templates test emptiness ({% if message.content %})
            return value
        if not inside and key in (_SCHEMA_KEEP if schema else _MESSAGE_KEEP):
            kept.append(value)
            return value
        pieces.append(value)
        return f"\ue000{len(pieces) - 1}\ue001"
    if isinstance(value, dict):
        kept.extend(k for k in value if isinstance(k, str))
        return {k: _mark(v, pieces, kept, schema=schema, key=k, inside=inside or (not schema and k in _MESSAGE_INSIDE))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_mark(v, pieces, kept, schema=schema, key=key, inside=inside) for v in value]
    return value


def _appended_at(before: str, after: str) -> int | None:
    """Where the text ``after`` appends to ``before`` begins, when ``after`` is ``before`` with
    earlier stretches rewritten and text appended: the start of the diff's closing insertion."""
    p = len(os.path.commonprefix([before, after]))
    ops = difflib.SequenceMatcher(None, before[p:], after[p:], autojunk=False).get_opcodes()
    if not ops or ops[-1][0] != "insert" or ops[-1][2] != len(before) - p:  # a rewritten end: not appended
        return None
    return p + ops[-1][3]


def _forms(piece: str) -> list[str]:
    """How a template may have written a client string: as it is, JSON-escaped (``tojson``),
    trimmed (``trim``, Llama's), or with its leading newlines cut (Qwen3's)."""
    escaped = json.dumps(piece, ensure_ascii=False)[1:-1]
    return list(dict.fromkeys([piece, escaped, piece.strip(), piece.lstrip("\n"), escaped.strip()]))


def _align(text: str, marked: str, pieces: list[str]) -> list[tuple[SpanKind, int, int]] | None:
    """The spans of ``text`` given the same render with markers (``marked``): the markup between
    markers must be ``text``'s, and each marker's place one of its string's ``_forms``
    (a search that backtracks when a form leaves the rest unmatched)."""
    parts: list[tuple[str, int | None]] = []
    pos = 0
    while (a := marked.find("\ue000", pos)) >= 0:
        b = marked.find("\ue001", a)
        if b < 0 or not marked[a + 1 : b].isdigit():
            return None
        parts += [(marked[pos:a], None), ("", int(marked[a + 1 : b]))]
        pos = b + 1
    parts.append((marked[pos:], None))
    # stack of (part index, position in text, spans so far, forms left to try at this part)
    stack: list[tuple[int, int, list[tuple[SpanKind, int, int]]]] = [(0, 0, [])]
    while stack:
        k, at, spans = stack.pop()
        if k == len(parts):
            if at == len(text):
                return spans
            continue
        literal, index = parts[k]
        if index is None:
            if text.startswith(literal, at):
                stack.append((k + 1, at + len(literal), spans + ([("markup", at, at + len(literal))] if literal else [])))
            continue
        for form in reversed(_forms(pieces[index])):  # the first form is tried first
            if text.startswith(form, at):
                stack.append((k + 1, at + len(form), spans + ([("content", at, at + len(form))] if form else [])))
    return None


class _Namespace(jinja2.utils.Namespace):
    """``namespace()`` that refuses underscore names (as ``transformers``' does)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja2.utils.Namespace's signature
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        if any(isinstance(n, str) and n.startswith("_") for n in attrs):
            raise jinja2.exceptions.SecurityError("chat templates cannot set underscore names on a namespace")
        jinja2.utils.Namespace.__init__(self, attrs)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """``tojson`` as ``transformers`` gives templates: ``json.dumps`` (no HTML escaping), with its options."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    """Today's date as a template asks for it (Llama 3.2's system header)."""
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    """The sandbox a model's template runs in, with what ``apply_chat_template`` provides
    (``raise_exception``, ``strftime_now``, ``tojson`` with keywords, ``namespace``, loop controls)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    return env


class NotIncremental(TemplateRefused):
    """The template does not render a message as an append to the conversation before it."""


def _borders(kept: str, special: str) -> bool:
    """Whether ``kept`` (a string the template writes as markup) ends with a proper prefix or
    begins with a proper suffix of ``special``: written next to the template's own text, it
    could complete the special token across the boundary."""
    return any(kept.endswith(special[:i]) or kept.startswith(special[i:]) for i in range(1, len(special)))


class _Refusal(jinja2.TemplateError):
    """The template's own ``raise_exception``: it refuses the messages it was given."""


def _raise(message: str) -> None:
    raise _Refusal(message)


def _tokenizer_digest(tk: Tokenizer) -> str:
    return "blake3:" + blake3.blake3(tk.to_str().encode()).hexdigest()
