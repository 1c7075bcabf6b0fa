"""The call grammars in each model family's own syntax (``CallSyntax``, issue 32): Llama 3's
bare ``{"name": ..., "parameters": ...}`` objects joined by ``"; "``, and Mistral's
``[TOOL_CALLS][...]`` array with 9-character ids (the special token where the vocabulary has
it, its text where it does not). A tiny random model writes junk unless constrained, so every
turn here that the family's own reader (``parse_calls``) reads back as calls validating
against the strict schemas does so because of the mask. Call evidence finds those calls
among the turn's tokens, and through the door a Llama-3-templated model answers
``tool_choice: required`` with a call in its own syntax."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from safetensors.torch import save_file
from support.constrain import ADD, TOOLS, WEATHER, forcing
from support.tiny_kernel import TINY_HF
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from tokenizers.pre_tokenizers import ByteLevel

from fak import Kernel, Settings
from fak.kernel.calls.formats import CallOut, Llama3JsonFormat, MistralFormat, ToolFormat, format_for
from fak.kernel.calls.generated import generated_calls
from fak.kernel.calls.tool_text import ToolSpec
from fak.kernel.model.config import ModelConfig
from fak.kernel.model.loader import load_model
from fak.kernel.model.weights import random_weights, state_dict_from_weights
from fak.kernel.openai.constrain import (
    Constrainer,
    auto_grammar,
    json_or_calls_grammar,
    tool_calls_grammar,
)
from fak.kernel.openai.sampling import token_bytes

TEMPLATES = Path(__file__).parents[2] / "data" / "chat_templates"
# Llama 3's special tokens, and Mistral's call marker, after the 256 byte tokens
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
            "<|eom_id|>", "<|python_tag|>", "[TOOL_CALLS]"]
SAMPLINGS = [dict(temperature=0.0), dict(temperature=1.0, seed=1), dict(temperature=1.0, seed=2)]
NAMES = [t.name for t in TOOLS]


@pytest.fixture(scope="module")
def family_lm(tmp_path_factory):
    """A tiny random model whose byte-level vocabulary has Llama 3's special tokens and
    ``[TOOL_CALLS]`` as special tokens, with Llama 3.2's real chat template."""
    folder = tmp_path_factory.mktemp("tiny-llama3")
    config = {**TINY_HF, "vocab_size": 256 + len(SPECIALS), "bos_token_id": 256, "eos_token_id": 260}
    (folder / "config.json").write_text(json.dumps(config))
    cfg = ModelConfig.from_hf(config)
    sd = state_dict_from_weights(cfg, random_weights(cfg, seed=3))
    save_file({k: v.contiguous() for k, v in sd.items()}, str(folder / "model.safetensors"))
    tk = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(SPECIALS)
    assert tk.token_to_id("<|eot_id|>") == 260 and tk.token_to_id("[TOOL_CALLS]") == 263
    tk.save(str(folder / "tokenizer.json"))
    template = (TEMPLATES / "meta-llama-Llama-3.2-3B-Instruct.jinja").read_text()
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "add_bos_token": False}))
    return folder, load_model(folder)


@pytest.fixture(scope="module")
def family_kernel(family_lm, tmp_path_factory):
    folder, lm = family_lm
    k = Kernel.open(Settings(data_dir=tmp_path_factory.mktemp("data"), model_path=folder, chunk_size=16),
                    model=lm, progress=None)
    yield k
    k.close()


def _session(k: Kernel, name: str):
    s = k.session("acme")
    s.append("system", "You are a helpful assistant with tools.")
    s.append("user", "What is the weather in Paris, and what is 2+3?")
    return s


class _MoreCalls:
    """After the grammar's hook: where the separator's first token and an end (the stop token
    or the closing ``]``) are both allowed (just after a call), the separator is made certain
    (their best logit + 50) ``limit`` times, then shut out: a parallel turn writes ``limit + 1`` calls."""

    def __init__(self, separator: int, ends: list[int], limit: int = 2) -> None:
        self.separator, self.ends, self.left = separator, ends, limit

    def adjust(self, step: int, row: np.ndarray) -> np.ndarray:
        ends = [row[e] for e in self.ends if np.isfinite(row[e])]
        if ends and np.isfinite(row[self.separator]):
            row[self.separator] = max(ends) + 50.0 if self.left else -np.inf
            self.left = max(self.left - 1, 0)
        return row

    def chosen(self, step: int, token: int) -> None:
        pass


def _turn(s, c: Constrainer, grammar, *before, max_tokens: int = 600, **sampling) -> list[int]:
    """A turn under ``grammar`` (``before``: hooks applied first) that ends on the grammar's end."""
    hook = c.hook(grammar)
    ids = list(s.generate(hooks=(*before, hook), max_tokens=max_tokens, **sampling))
    assert ids[-1] in c.stop_token_ids, "the turn ended on max_tokens, not on the grammar's end"
    assert hook.accepting and hook.finished
    return ids


def _read(fmt: ToolFormat, s, ids: list[int], tools: list[ToolSpec]) -> list:
    """The calls the family's reader finds in a turn that must be nothing but calls; each
    validates against its tool's strict schema."""
    content, calls = fmt.parse_calls(s.tokenizer.decode_turn(ids), [t.name for t in tools])
    assert content == "" and calls, (content, s.tokenizer.decode(ids))
    schemas = {t.name: t.parameters for t in tools}
    for call in calls:
        jsonschema.validate(call.arguments, schemas[call.name])
    return calls


CASES = {  # family: (format, uses the special [TOOL_CALLS] token)
    "llama3": (Llama3JsonFormat(), False),
    "mistral-token": (MistralFormat(), True),
    "mistral-text": (MistralFormat(), False),
}


def _setup(case: str, family_kernel: Kernel, kernel: Kernel):
    """(kernel, format, syntax) of a case: the text form of Mistral's marker on the tiny
    ChatML tokenizer, which has no ``[TOOL_CALLS]``."""
    fmt, special = CASES[case]
    k = family_kernel if special or case == "llama3" else kernel
    syntax = fmt.call_syntax(k.tokenizer)
    assert (syntax.marker is not None) == special
    return k, fmt, syntax


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_required_named_and_parallel_calls_read_back(case, sampling, family_kernel, kernel) -> None:
    k, fmt, syntax = _setup(case, family_kernel, kernel)
    c = Constrainer.for_tokenizer(k.tokenizer)
    s = _session(k, f"{case}-req")
    ids = _turn(s, c, tool_calls_grammar(TOOLS, parallel=False, syntax=syntax), **sampling)
    assert len(_read(fmt, s, ids, TOOLS)) == 1
    if syntax.marker is not None:
        assert ids[0] == syntax.marker  # the special token, not its text
    else:
        assert s.tokenizer.decode_turn(ids).startswith(syntax.opening)
    s = _session(k, f"{case}-named")
    ids = _turn(s, c, tool_calls_grammar([ADD], parallel=False, syntax=syntax), **sampling)
    assert [x.name for x in _read(fmt, s, ids, [ADD])] == ["add"]
    s = _session(k, f"{case}-par")
    sep = k.tokenizer.encode(syntax.separator)[0]
    ends = sorted(c.stop_token_ids) + ([k.tokenizer.encode(syntax.closing)[0]] if syntax.closing else [])
    ids = _parallel(s, c, syntax, sep, ends, sampling)
    calls = _read(fmt, s, ids, TOOLS)
    assert len(calls) == 3  # the booster's two separators: three calls
    # the family's own rendering of the calls is what the model wrote (ids aside)
    text = s.tokenizer.decode(ids[:-1]) if syntax.marker is not None else s.tokenizer.decode_turn(ids)
    ids_written = [x.id for x in calls]
    assert text == fmt.render_calls([CallOut(x.name, x.arguments, i) for x, i in zip(calls, ids_written, strict=True)])


def _parallel(s, c: Constrainer, syntax, sep: int, ends: list[int], sampling: dict) -> list[int]:
    hook = c.hook(tool_calls_grammar(TOOLS, parallel=True, syntax=syntax))
    ids = list(s.generate(hooks=(hook, _MoreCalls(sep, ends)), max_tokens=1500, **sampling))
    assert ids[-1] in c.stop_token_ids and hook.finished
    return ids


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_auto_free_text_or_a_strict_call(case, sampling, family_kernel, kernel) -> None:
    k, fmt, syntax = _setup(case, family_kernel, kernel)
    c = Constrainer.for_tokenizer(k.tokenizer)
    grammar = auto_grammar(TOOLS, parallel=False, syntax=syntax)
    s = _session(k, f"{case}-free")
    hook = c.hook(grammar)
    ids = list(s.generate(hooks=(hook,), max_tokens=40, **sampling))
    assert hook.accepting
    text = s.tokenizer.decode_turn(ids)
    assert fmt.parse_calls(text, NAMES) == (text, [])  # free text the reader takes for no call
    # a model that begins a call must finish it as a call of a listed tool, then end the turn
    s = _session(k, f"{case}-call")
    if syntax.marker is not None:
        force = _ForceToken(syntax.marker)
    else:
        force = forcing(s.tokenizer, syntax.opening + '{"name": "')
    ids = _turn(s, c, grammar, force, **sampling)
    assert len(_read(fmt, s, ids, TOOLS)) == 1


class _ForceToken:
    def __init__(self, token: int) -> None:
        self.token = token

    def adjust(self, step: int, row: np.ndarray) -> np.ndarray:
        if step == 0:
            row[self.token] = 1e9
        return row

    def chosen(self, step: int, token: int) -> None:
        pass


def _feeds(c: Constrainer, grammar, text: str, first: int | None = None) -> bool:
    """Whether ``grammar`` lets a turn write (the token ``first`` then) ``text`` then stop;
    ``text`` in text tokens (a special token's string spelled by them)."""
    ids = [first] if first is not None else []
    ids += [t for ch in text for t in c.ll.tokenize_str(ch)] + [min(c.stop_token_ids)]
    hook = c.hook(grammar)
    row = np.zeros(c.vocab_size, dtype=np.float32)
    for step, token in enumerate(ids):
        if not np.isfinite(hook.adjust(step, row.copy())[token]):
            return False
        hook.chosen(step, token)
    return hook.finished


ONE = CallOut("get_weather", {"city": "Paris"}, "Ab3dE6gH9")
TWO = CallOut("add", {"a": -3, "b": 4, "exact": True}, "zz9zz9zz9")


def test_llama3_grammars_accept_and_refuse_exact_texts(tiny_lm) -> None:
    c = Constrainer.for_tokenizer(tiny_lm.tokenizer)
    fmt = Llama3JsonFormat()
    syntax = fmt.call_syntax(tiny_lm.tokenizer)
    one, two = fmt.render_calls([ONE]), fmt.render_calls([ONE, TWO])
    assert two == one + '; {"name": "add", "parameters": {"a": -3, "b": 4, "exact": true}}'
    required = tool_calls_grammar(TOOLS, parallel=False, syntax=syntax)
    parallel = tool_calls_grammar(TOOLS, parallel=True, syntax=syntax)
    assert _feeds(c, required, one) and not _feeds(c, required, two) and _feeds(c, parallel, two)
    assert not _feeds(c, required, "Sure. " + one) and not _feeds(c, required, one.replace("Paris", "a city too long"))
    assert not _feeds(c, required, one.replace('"parameters"', '"arguments"'))
    assert not _feeds(c, tool_calls_grammar([ADD], parallel=False, syntax=syntax), one)
    auto = auto_grammar(TOOLS, parallel=False, syntax=syntax)
    assert _feeds(c, auto, "It is sunny.") and _feeds(c, auto, "") and _feeds(c, auto, one)
    assert _feeds(c, auto, "The set {1, 2}.")  # braces later in the text are text
    assert not _feeds(c, auto, '{"name": "get_weather", "parameters": {"city": 7}}')  # strict
    assert not _feeds(c, auto, '{"x": 1}') and not _feeds(c, auto, "<|python_tag|>" + one)
    assert not _feeds(c, auto, "Sure.\n<tool_call>\n{}\n</tool_call>")  # the Hermes fallback the reader takes
    for space in [chr(i) for i in range(0x3001) if chr(i).isspace()]:  # what the reader's strip() skips
        assert not _feeds(c, auto, space + one), hex(ord(space))
    # response_format with tools: a JSON answer, or the calls (both begin with "{")
    person = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"],
              "additionalProperties": False}
    answer = json_or_calls_grammar(person, TOOLS, parallel=False, syntax=syntax)
    assert _feeds(c, answer, '{"age": 3}') and _feeds(c, answer, one) and not _feeds(c, answer, '{"agе": "x"}')
    assert _feeds(c, json_or_calls_grammar(None, TOOLS, parallel=True, syntax=syntax), '{"name": "x"}')


def test_mistral_grammars_accept_and_refuse_exact_texts(tiny_lm, family_lm) -> None:
    fmt = MistralFormat()
    one, two = fmt.render_calls([ONE]), fmt.render_calls([ONE, TWO])
    # the text form, on a vocabulary without [TOOL_CALLS]
    c = Constrainer.for_tokenizer(tiny_lm.tokenizer)
    syntax = fmt.call_syntax(tiny_lm.tokenizer)
    assert syntax.marker is None and syntax.opening == "[TOOL_CALLS]["
    required = tool_calls_grammar(TOOLS, parallel=False, syntax=syntax)
    assert _feeds(c, required, one) and not _feeds(c, required, two)
    assert _feeds(c, tool_calls_grammar(TOOLS, parallel=True, syntax=syntax), two)
    assert not _feeds(c, required, fmt.render_calls([CallOut("get_weather", {"city": "Paris"})]))  # an id is due
    assert not _feeds(c, required, one.replace("Ab3dE6gH9", "Ab3dE6gH"))  # of 9 letters or digits
    auto = auto_grammar(TOOLS, parallel=False, syntax=syntax)
    assert _feeds(c, auto, "It is sunny.") and _feeds(c, auto, "[1] a note") and _feeds(c, auto, one)
    assert not _feeds(c, auto, "Checking. " + one) and not _feeds(c, auto, one[len("[TOOL_CALLS]"):])
    assert not _feeds(c, auto, ' [ {"name": "x"}]')
    # the special token, on a vocabulary that has it: the text form is then refused
    folder, lm = family_lm
    c = Constrainer.for_tokenizer(lm.tokenizer)
    syntax = fmt.call_syntax(lm.tokenizer)
    marker = lm.tokenizer.tk.token_to_id("[TOOL_CALLS]")
    assert syntax.marker == marker and syntax.opening == "["
    required = tool_calls_grammar(TOOLS, parallel=False, syntax=syntax)
    assert _feeds(c, required, one[len("[TOOL_CALLS]"):], first=marker) and not _feeds(c, required, one)
    auto = auto_grammar(TOOLS, parallel=False, syntax=syntax)
    assert _feeds(c, auto, one[len("[TOOL_CALLS]"):], first=marker) and not _feeds(c, auto, one)


@pytest.mark.parametrize("case", list(CASES))
def test_call_evidence_finds_each_familys_calls(case, family_kernel, kernel) -> None:
    """``generated_calls`` locates the calls of a turn in the family's syntax: each argument's
    token range spells its value, and the call's tokens end with its object."""
    k, fmt, syntax = _setup(case, family_kernel, kernel)
    c = Constrainer.for_tokenizer(k.tokenizer)
    s = _session(k, f"{case}-evidence")
    sep = k.tokenizer.encode(syntax.separator)[0]
    ends = sorted(c.stop_token_ids) + ([k.tokenizer.encode(syntax.closing)[0]] if syntax.closing else [])
    ids = _parallel(s, c, syntax, sep, ends, dict(temperature=1.0, seed=5))
    calls = _read(fmt, s, ids, TOOLS)
    piece = token_bytes(k.tokenizer.tk)
    found = generated_calls(ids[:-1], piece, fmt)
    assert [(g.name, g.arguments) for g in found] == [(x.name, x.arguments) for x in calls]
    for g in found:
        assert set(g.args) == set(g.arguments)
        for key, (i, j) in g.args.items():
            assert json.loads(b"".join(piece(t) for t in ids[i:j])) == g.arguments[key]
        assert b"".join(piece(t) for t in g.tokens).endswith(b"}")
    assert generated_calls(ids[:-1], piece) == [] or case != "llama3"  # Hermes' finder sees none of them


POLICY = """\
apiVersion: fak.dev/v1
kind: Policy
metadata: {name: formats-test}
spec:
  defaults: {trust: untrusted}
  tools:
    - {name: get_weather, trust: trusted}
"""


def test_llama3_door_required_answers_a_call_in_its_own_syntax(tmp_path, family_lm) -> None:
    """Through the OpenAI door (official client), a Llama-3.2-templated model under
    ``tool_choice: required`` writes ``{"name": ..., "parameters": ...}`` (nothing else), which
    is read back as the call; nothing is reported ignored."""
    import openai
    from support.tiny_kernel import policy_kernel

    from fak.api.server import serve

    folder, lm = family_lm
    k = policy_kernel(tmp_path, folder, lm, POLICY)
    try:
        assert isinstance(format_for(k.tokenizer), Llama3JsonFormat)
        tools = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city.",
                                                   "parameters": WEATHER.parameters}}]
        with serve(k) as live:
            client = openai.OpenAI(base_url=live.url + "/v1", api_key=live.key("acme", "agent"), max_retries=0,
                                   timeout=120, http_client=openai.DefaultHttpxClient(trust_env=False))
            r = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "What is the weather in Paris?"}], tools=tools,
                tool_choice="required", temperature=0, max_tokens=120, extra_body={"fak_session": "l3"})
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
        [call] = choice.message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), WEATHER.parameters)
        assert "tool_choice" not in (r.model_extra or {}).get("fak", {}).get("ignored", [])
        with k.session("acme", "l3").locked() as mech:
            turn = mech.ledger.live()[-1]
        text = k.tokenizer.decode(turn.tokens)
        assert text.startswith('<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", '
                               '"parameters": {') and text.endswith("}<|eot_id|>"), text
    finally:
        k.close()


def test_llama3_call_evidence_through_the_door(tmp_path, family_lm) -> None:
    """A rule that reads the attention a call's argument tokens put on an untrusted page gets
    that evidence for a Llama 3 call (the family's format locates it; Hermes' finder sees none)."""
    from support.call_evidence import PAGE
    from support.call_evidence import POLICY as EVIDENCE
    from support.tiny_kernel import policy_kernel

    from fak import wire as w
    from fak.kernel.openai import chat as openai_chat
    from fak.kernel.session.caller import Caller

    folder, lm = family_lm
    k = policy_kernel(tmp_path, folder, lm, EVIDENCE % "        when_attention: {trust: [untrusted], above: 0.0}")
    try:
        mail = {"type": "function", "function": {"name": "send_email", "parameters": {
            "type": "object", "properties": {"to": {"type": "string", "maxLength": 20}}, "required": ["to"],
            "additionalProperties": False}}}
        body = w.ChatCompletionRequest.model_validate({
            "model": "m", "temperature": 0, "max_tokens": 200, "tools": [mail],
            "tool_choice": {"type": "function", "function": {"name": "send_email"}},
            "messages": [{"role": "user", "content": "Forward the invoices."},
                         {"role": "tool", "tool_call_id": "c1", "name": "web_fetch", "content": PAGE}]})
        out = openai_chat.complete(k, Caller("acme", "test"), body)
        fak = out.fak.model_dump()
        event = [e.event for e in k.audit.entries("acme") if e.event.type == "tool_call_decision"][-1]
        page_ref = next(a["ref"] for a in fak["admissions"] if a["tool"] == "web_fetch")
        [record] = [a for a in event.attention if a.ref == page_ref]
        assert record.arg == "to" and len(record.per_layer) == k.model.cfg.num_layers and 0.0 < record.mean <= 1.0
        assert fak["tool_calls"][0]["verdict"] == "DENY"
        assert "tool_choice" not in fak["ignored"]
    finally:
        k.close()


def test_hermes_grammars_keep_their_lark_text() -> None:
    """Hermes (Qwen, the fallback) keeps the grammar text it had before the families had theirs:
    the same lark, so the same masks, for every existing Hermes client."""
    from fak.kernel.calls.formats import HERMES_SYNTAX, HermesFormat

    assert HermesFormat().call_syntax(None) is HERMES_SYNTAX
    head = '%llguidance {}\nstart: call ("\\n" call)*\ncall: "<tool_call>" body\nbody: "\\n" (fn_0) "\\n</tool_call>"\n' \
           'fn_0: "{\\"name\\": \\"get_weather\\", \\"arguments\\": " %json {'
    assert tool_calls_grammar([WEATHER], parallel=True).spec.startswith(head)
    auto = auto_grammar([WEATHER], parallel=True).spec
    assert auto.startswith('%llguidance {}\nstart: FREE | head body ("\\n" "<tool_call>" body)*\n'
                           "FREE: /(?s:.*)/ & ~/(?s:.*)\\x3ctool_call\\x3e(?s:.*)/\n"
                           "head[lazy]: /(?s:.*)\\x3ctool_call\\x3e/\nbody: ")
    assert json_or_calls_grammar(None, [WEATHER], parallel=False).spec.startswith(
        '%llguidance {}\nstart: %json {"type": "object", ')
