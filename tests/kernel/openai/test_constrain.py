"""Constrained decoding (fak.kernel.openai.constrain) with the real tokenizers and the real
generate loop: the tiny random model writes junk unless constrained, so every turn here
that parses and validates does so because of the mask; the mask changes sampling only
(a constrained turn replays and evicts bit-exactly); a schema llguidance cannot enforce is
InvalidInput."""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace

import jsonschema
import numpy as np
import pytest
from support.constrain import ADD, TOOLS, WEATHER, forcing

from fak import Kernel, Settings
from fak.errors import InvalidInput
from fak.kernel.calls.tool_text import ToolSpec
from fak.kernel.model.generate import SamplingParams, generate
from fak.kernel.openai.constrain import (
    Constrainer,
    ConstraintViolation,
    SchemaGraph,
    auto_grammar,
    dead_end,
    json_grammar,
    tool_calls_grammar,
)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
BLOCK = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
SAMPLINGS = [dict(temperature=0.0), dict(temperature=1.0, seed=1), dict(temperature=1.0, seed=2),
             dict(temperature=1.0, seed=3, top_p=0.9)]


def _calls(text: str) -> list[dict]:
    """The calls of a text that must be nothing but tool-call blocks separated by newlines."""
    bodies = BLOCK.findall(text)
    assert "\n".join(f"<tool_call>\n{b}\n</tool_call>" for b in bodies) == text, text
    calls = [json.loads(b) for b in bodies]
    for call, body in zip(calls, bodies, strict=True):
        assert list(call) == ["name", "arguments"] and body.startswith('{"name": ')
    return calls


def _validate(calls: list[dict], tools: list[ToolSpec]) -> None:
    schemas = {t.name: t.parameters for t in tools}
    assert calls
    for call in calls:
        jsonschema.validate(call["arguments"], schemas[call["name"]])


def _session(kernel: Kernel):
    s = kernel.session("acme")
    s.append("system", "You are a helpful assistant with tools.")
    s.append("user", "What is the weather in Paris, and what is 2+3?")
    return s


def _turn(s, constrainer: Constrainer, grammar, max_tokens: int = 400, **sampling) -> str:
    hook = constrainer.hook(grammar)
    ids = list(s.generate(hooks=(hook,), max_tokens=max_tokens, **sampling))
    assert ids[-1] in constrainer.stop_token_ids, "the turn ended on max_tokens, not on the grammar's end"
    assert hook.accepting and hook.finished
    return s.tokenizer.decode_turn(ids)


def test_constrainer_is_built_once_per_tokenizer(tiny_lm) -> None:
    tok = tiny_lm.tokenizer
    a = Constrainer.for_tokenizer(tok)
    assert Constrainer.for_tokenizer(tok) is a
    assert a.stop_token_ids == frozenset(tok.stop_token_ids) and a.vocab_size == tok.vocab_size


def test_unconstrained_tiny_model_writes_junk(kernel) -> None:
    """The control: without the mask the same turns parse as nothing."""
    s = _session(kernel)
    text = s.tokenizer.decode_turn(list(s.generate(max_tokens=60)))
    assert not BLOCK.search(text)
    with pytest.raises(ValueError):
        json.loads(text)


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=str)
def test_required_and_named_tool_calls_validate(kernel, sampling) -> None:
    c = Constrainer.for_tokenizer(kernel.tokenizer)
    s = _session(kernel)
    text = _turn(s, c, tool_calls_grammar(TOOLS, parallel=False), **sampling)
    calls = _calls(text)
    assert len(calls) == 1
    _validate(calls, TOOLS)
    s = _session(kernel)
    text = _turn(s, c, tool_calls_grammar([ADD], parallel=False), **sampling)
    calls = _calls(text)
    assert [x["name"] for x in calls] == ["add"]
    _validate(calls, [ADD])


class _AfterGrammar:
    """A test hook after the grammar's: wherever both the newline and the stop token are
    allowed (after a block), the newline gets the stop token's logit + 1, so that a sampled
    turn goes on to another call about three times in four (this random model otherwise
    always stops after one)."""

    def __init__(self, newline: int, stop: int) -> None:
        self.newline, self.stop = newline, stop

    def adjust(self, step: int, row: np.ndarray) -> np.ndarray:
        if np.isfinite(row[self.newline]) and np.isfinite(row[self.stop]):
            row[self.newline] = row[self.stop] + 1.0
        return row

    def chosen(self, step: int, token: int) -> None:
        pass


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=str)
def test_parallel_tool_calls_validate(kernel, sampling) -> None:
    c = Constrainer.for_tokenizer(kernel.tokenizer)
    s = _session(kernel)
    text = _turn(s, c, tool_calls_grammar(TOOLS, parallel=True), **sampling)
    _validate(_calls(text), TOOLS)


def test_several_parallel_calls_each_validate(kernel) -> None:
    c = Constrainer.for_tokenizer(kernel.tokenizer)
    newline, stop = kernel.tokenizer.encode("\n")[0], min(c.stop_token_ids)
    counts = []
    for seed in range(1, 5):
        s = _session(kernel)
        hook = c.hook(tool_calls_grammar(TOOLS, parallel=True))
        ids = list(s.generate(hooks=(hook, _AfterGrammar(newline, stop)), max_tokens=2500, temperature=1.0,
                              seed=seed))
        assert ids[-1] == stop and hook.finished
        calls = _calls(s.tokenizer.decode_turn(ids))
        _validate(calls, TOOLS)
        counts.append(len(calls))
    assert max(counts) >= 2, counts


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=str)
def test_json_schema_output_validates(kernel, sampling) -> None:
    c = Constrainer.for_tokenizer(kernel.tokenizer)
    s = _session(kernel)
    text = _turn(s, c, json_grammar(PERSON), **sampling)
    value = json.loads(text)
    jsonschema.validate(value, PERSON)
    assert text.startswith('{"name": "')  # compact: no whitespace the model could loop on


def test_json_object_output_is_an_object(kernel) -> None:
    """``json_object`` (no schema): the mask keeps a greedy turn a JSON object; a random model
    may run out of tokens inside a string, so the check is on the prefix when it does."""
    c = Constrainer.for_tokenizer(kernel.tokenizer)
    s = _session(kernel)
    hook = c.hook(json_grammar(None))
    ids = list(s.generate(hooks=(hook,), max_tokens=300))
    text = s.tokenizer.decode_turn(ids)
    assert text.startswith("{")
    if hook.accepting:
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=str)
def test_auto_mode_free_text_then_a_strict_call(kernel, sampling) -> None:
    c = Constrainer.for_tokenizer(kernel.tokenizer)
    tools = [WEATHER, ADD]  # strict, bounded: a random model finishes them (any-object arguments need not end)
    grammar = auto_grammar(tools, parallel=False)
    # free text: whatever the model writes, as long as it never opens a block
    s = _session(kernel)
    hook = c.hook(grammar)
    ids = list(s.generate(hooks=(hook,), max_tokens=40, **sampling))
    assert "<tool_call>" not in s.tokenizer.decode_turn(ids) and hook.accepting
    # once the model writes "<tool_call>", the block is a call of a listed tool, then the turn ends
    s = _session(kernel)
    prefix = "Let me check.\n<tool_call>\n"
    hook = c.hook(grammar)
    ids = list(s.generate(hooks=(forcing(s.tokenizer, prefix), hook), max_tokens=400, **sampling))
    assert ids[-1] in c.stop_token_ids and hook.accepting
    text = s.tokenizer.decode_turn(ids)
    assert text.startswith(prefix)
    calls = _calls(text[len("Let me check.\n"):])
    assert len(calls) == 1
    _validate(calls, tools)


def _feeds(constrainer: Constrainer, grammar, text: str) -> bool:
    """Whether ``grammar`` lets a turn write ``text`` then stop (through the hook, token by token)."""
    tok_ids = [int(t) for t in constrainer_tokens(constrainer, text)]
    hook = constrainer.hook(grammar)
    row = np.zeros(constrainer.vocab_size, dtype=np.float32)
    for step, token in enumerate(tok_ids + [min(constrainer.stop_token_ids)]):
        if not np.isfinite(hook.adjust(step, row.copy())[token]):
            return False
        hook.chosen(step, token)
    return hook.finished


def constrainer_tokens(constrainer: Constrainer, text: str) -> list[int]:
    return constrainer.ll.tokenize_str(text)


def test_grammars_accept_and_refuse_exact_texts(tiny_lm) -> None:
    c = Constrainer.for_tokenizer(tiny_lm.tokenizer)
    one = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    two = one + '\n<tool_call>\n{"name": "add", "arguments": {"a": -3, "b": 4, "exact": true}}\n</tool_call>'
    required, parallel = tool_calls_grammar(TOOLS, parallel=False), tool_calls_grammar(TOOLS, parallel=True)
    assert _feeds(c, required, one) and not _feeds(c, required, two)
    assert _feeds(c, parallel, one) and _feeds(c, parallel, two)
    assert not _feeds(c, required, "Sure. " + one)  # required: the call comes first
    assert not _feeds(c, required, one.replace("Paris", "a city far too long"))  # maxLength
    assert not _feeds(c, required, one.replace('"get_weather"', '"get_wether"'))
    assert not _feeds(c, required, one.replace('{"city"', '{ "city"'))  # compact JSON only
    assert not _feeds(c, tool_calls_grammar([ADD], parallel=False), one)  # named: only that tool
    auto = auto_grammar(TOOLS, parallel=False)
    assert _feeds(c, auto, "No tool needed: it is sunny.") and _feeds(c, auto, "")
    assert _feeds(c, auto, "Checking.\n" + one) and not _feeds(c, auto, "Checking.\n" + two)
    assert _feeds(c, auto_grammar(TOOLS, parallel=True), "Checking.\n" + two)
    assert not _feeds(c, auto, "<tool_call>\nnot json\n</tool_call>")
    assert not _feeds(c, auto, one + "\nand some text after")
    loose = ToolSpec("note", "", {"type": "object", "properties": {"x": {"type": "string"}}}, strict=False)
    note = '<tool_call>\n{"name": "note", "arguments": {"x": 1, "y": [true]}}\n</tool_call>'
    assert _feeds(c, auto_grammar([WEATHER, loose], parallel=False), note)  # non-strict: any object
    assert not _feeds(c, auto_grammar([WEATHER, replace(loose, strict=True)], parallel=False), note)
    assert _feeds(c, json_grammar(None), '{"any": [1, {"b": null}]}') and not _feeds(c, json_grammar(None), "[1]")


def test_a_forbidden_token_is_a_clear_error(tiny_lm) -> None:
    c = Constrainer.for_tokenizer(tiny_lm.tokenizer)
    hook = c.hook(json_grammar(PERSON))
    hook.adjust(0, np.zeros(c.vocab_size, dtype=np.float32))
    with pytest.raises(ConstraintViolation, match="breaks the grammar"):
        hook.chosen(0, c.ll.tokenize_str("x")[0])


def test_masked_logits_are_the_model_logits_elsewhere(tiny_lm) -> None:
    c = Constrainer.for_tokenizer(tiny_lm.tokenizer)
    hook = c.hook(json_grammar(PERSON))
    row = np.random.default_rng(0).normal(size=c.vocab_size + 6).astype(np.float32)  # a padded LM head
    out = hook.adjust(0, row.copy())
    allowed = np.isfinite(out)
    assert allowed.sum() == 1 and out[c.ll.tokenize_str("{")[0]] == row[c.ll.tokenize_str("{")[0]]
    assert np.array_equal(out[allowed], row[allowed]) and not allowed[c.vocab_size:].any()


def test_constrained_turn_replays_and_evicts_bit_exactly(kernel) -> None:
    c = Constrainer.for_tokenizer(kernel.tokenizer)
    s = _session(kernel)
    before, ledger = s.fingerprint(), s.ledger()
    text = _turn(s, c, tool_calls_grammar(TOOLS, parallel=True), temperature=1.0, seed=7)
    _validate(_calls(text), TOOLS)
    turn = s.ledger()[-1]
    assert turn["kind"] == "assistant" and s.ledger()[:-1] == ledger
    assert s.fingerprint() == s.replay_fingerprint() != before  # the KV is that of the turn's tokens
    s.evict(turn["id"])
    assert s.fingerprint() == before == s.replay_fingerprint()  # == never had the turn
    # the session goes on: another constrained turn after the eviction replays exactly too
    s.append("user", "again")
    text2 = _turn(s, c, json_grammar(PERSON), temperature=0.0)
    jsonschema.validate(json.loads(text2), PERSON)
    assert s.fingerprint() == s.replay_fingerprint()


def test_mask_changes_the_draw_not_the_logits(tiny_lm) -> None:
    """The same prompt through ``generate`` with and without the hook: the first token's logits
    are the model's either way, and the hooked turn's tokens are those the mask allowed."""
    model, tok = tiny_lm.model, tiny_lm.tokenizer
    c = Constrainer.for_tokenizer(tok)
    prompt = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    hook = c.hook(json_grammar(PERSON))
    params = SamplingParams(max_tokens=200, stop_token_ids=frozenset(tok.stop_token_ids), hooks=(hook,))
    free = list(generate(model, model.new_cache(), prompt, SamplingParams(max_tokens=5)))
    held = list(generate(model, model.new_cache(), prompt, params))
    assert free[0] != held[0] == c.ll.tokenize_str("{")[0]  # greedy junk vs the only token allowed
    jsonschema.validate(json.loads(tok.decode_turn(held)), PERSON)


@pytest.mark.parametrize(("schema", "problem"), [
    ({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}, "Unimplemented keys"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "[a-z"}}}, "regex"),
    ({"type": "strin"}, "Invalid type"),
    ({"$ref": "https://example.com/schema.json"}, "example.com"),
])
def test_an_unsupported_schema_is_invalid_input(tiny_lm, schema, problem) -> None:
    with pytest.raises(InvalidInput, match=problem) as err:
        json_grammar(schema)
    assert err.value.status == 400 and "response_format" in str(err.value)
    strict = ToolSpec("f", "", schema, strict=True)
    with pytest.raises(InvalidInput, match=r"tools\[f\]\.parameters"):
        tool_calls_grammar([strict], parallel=False)
    with pytest.raises(InvalidInput, match=r"tools\[f\]\.parameters"):
        auto_grammar([strict], parallel=False)
    # a non-strict tool's schema is a hint: never a 400
    loose = ToolSpec("f", "", schema, strict=False)
    c = Constrainer.for_tokenizer(tiny_lm.tokenizer)
    for grammar in (tool_calls_grammar([loose], parallel=False), auto_grammar([loose], parallel=True)):
        assert _feeds(c, grammar, '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>')


NODE = {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
                                        "kids": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["v", "next"], "additionalProperties": False}


@pytest.mark.parametrize(("schema", "dead"), [
    ({"$ref": "#"}, "#"),  # a bare $ref to itself: NoExtensionBias at the first mask
    ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}}, "#/$defs/a"),
    ({"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]}, "#"),  # a value that never closes
    ({"type": "array", "items": {"$ref": "#"}, "minItems": 1}, "#"),
    ({"type": "object", "properties": {"x": {"anyOf": [{"$ref": "#/properties/x"}, {"$ref": "#/properties/x"}]}}},
     "#/properties/x"),
])
def test_a_schema_without_a_finite_value_is_refused_before_decoding(tiny_lm, schema, dead) -> None:
    """llguidance compiles these and fails once decoding reaches the subschema (a 500 mid-turn);
    the static check names it, for a response format and a strict tool alike."""
    assert dead_end(schema) == dead
    with pytest.raises(InvalidInput, match="no finite value") as err:
        json_grammar(schema, what="response_format.json_schema.schema")
    assert err.value.param == "response_format.json_schema.schema" and repr(dead) in str(err.value)
    with pytest.raises(InvalidInput, match=r"tools\[0\]\.function\.parameters: .*no finite value"):
        tool_calls_grammar([ToolSpec("f", "", schema, True, where="tools[0].function.parameters")], parallel=False)
    loose = tool_calls_grammar([ToolSpec("f", "", schema, strict=False)], parallel=False)  # a hint: any object
    assert _feeds(Constrainer.for_tokenizer(tiny_lm.tokenizer), loose, '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>')


@pytest.mark.parametrize("schema", [
    NODE, {"type": "object", "properties": {"x": {"$ref": "#"}}},  {"type": "array", "items": {"$ref": "#"}},
    {"type": "object", "properties": {"a": False, "b": {"type": "string"}}, "additionalProperties": False},
    {"properties": {"x": {"$ref": "#"}}, "required": ["x"]},  # untyped: a string is a value of it
])
def test_a_recursive_schema_with_an_end_compiles_and_decodes(tiny_lm, schema) -> None:
    c = Constrainer.for_tokenizer(tiny_lm.tokenizer)
    assert dead_end(schema) is None
    compiled = c.compile(json_grammar(schema))
    assert c.compile(json_grammar(schema)).matcher is compiled.matcher  # compiled once, then copied per turn
    hook = c.hook(compiled)
    assert hook.allowed().any()


def test_a_grammar_over_the_size_limit_is_refused_when_built(tiny_lm) -> None:
    """3,000 optional properties: llguidance compiled it and failed after the model's ``{``
    (an Earley row of 12,007 items, over 2,000); now the grammar's size is checked when built."""
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(3000)}}
    with pytest.raises(InvalidInput, match="too large to enforce") as err:
        json_grammar(wide, what="response_format.json_schema.schema")
    assert err.value.param == "response_format.json_schema.schema"
    # 1,000 optional properties (a 4,007-item row after ``{``) now decode: the row limit is twice the size limit
    c = Constrainer.for_tokenizer(tiny_lm.tokenizer)
    many = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(1000)}}
    assert _feeds(c, json_grammar(many), '{"p3": "a", "p999": "b"}')


def test_bad_tool_lists_are_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="at least one tool"):
        tool_calls_grammar([], parallel=False)
    with pytest.raises(InvalidInput, match="same name"):
        tool_calls_grammar([WEATHER, WEATHER], parallel=True)
    with pytest.raises(InvalidInput, match="JSON schema"):
        json_grammar(["not", "a", "schema"])  # type: ignore[arg-type]


@pytest.mark.real_model
def test_smollm2_json_turn_validates(tmp_path, smollm2) -> None:
    c = Constrainer.for_tokenizer(smollm2.tokenizer)
    assert c.vocab_size == 49152
    city = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                             "country": {"type": "string", "maxLength": 40}},
            "required": ["city", "country"], "additionalProperties": False}
    with Kernel.open(Settings(data_dir=tmp_path / "data"), model=smollm2, progress=None) as k:
        s = k.session("acme")
        s.append("system", "You answer in JSON.")
        s.append("user", "Name the capital of France and its country as JSON with keys city and country.")
        hook = c.hook(json_grammar(city))
        t0 = time.perf_counter()
        ids = list(s.generate(hooks=(hook,), max_tokens=60))
        assert time.perf_counter() - t0 < 60
        value = json.loads(s.tokenizer.decode_turn(ids))
        jsonschema.validate(value, city)
        assert s.fingerprint() == s.replay_fingerprint()
        s.append("user", "Now call the weather tool for that city.")
        hook = c.hook(tool_calls_grammar([WEATHER], parallel=False))
        calls = _calls(s.tokenizer.decode_turn(s.generate(hooks=(hook,), max_tokens=60)))
        _validate(calls, [WEATHER])


def _ref_chain(n: int, nested: int = 0) -> dict:
    """``n`` definitions, each ``nested`` arrays deep around a ``$ref`` to the next."""
    defs = {}
    for i in range(n):
        node: dict = {"$ref": f"#/$defs/d{i + 1}"} if i < n - 1 else {"type": "string"}
        for _ in range(nested):
            node = {"type": "array", "items": node}
        defs[f"d{i}"] = node
    return {"$defs": defs, "$ref": "#/$defs/d0"}


@pytest.mark.parametrize(("n", "nested"), [(5000, 0), (300, 10)])
def test_a_schema_too_deep_for_the_compiler_is_refused_before_it_reads_it(n: int, nested: int) -> None:
    """A chain of $refs (flat JSON, so no body-depth limit stops it) made llguidance's compiler
    overflow the thread's stack: the server process died (SIGSEGV) on one request. It is a 400
    before llguidance reads it, strict or as a non-strict tool's hint (any object then), and the
    static checks stay linear (a chain of 5,000 took 15 s when each pass settled one node)."""
    schema = _ref_chain(n, nested)
    started = time.perf_counter()
    with pytest.raises(InvalidInput, match=r"nested [\d,]+ levels deep") as err:
        json_grammar(schema, what="response_format.json_schema.schema")
    assert err.value.param == "response_format.json_schema.schema"
    assert tool_calls_grammar([ToolSpec("f", "", schema, strict=False)], parallel=False).spec  # a hint: any object
    assert SchemaGraph(schema).dead_end() is None
    assert time.perf_counter() - started < 10


def test_depth_counts_a_recursion_once() -> None:
    assert SchemaGraph(NODE).depth() <= 6  # recursive through "#": one component
    assert SchemaGraph(_ref_chain(999)).depth() == 1000  # the root, then 999 definitions
    json_grammar(_ref_chain(999))  # at the limit: compiles
