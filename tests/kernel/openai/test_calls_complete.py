"""Calls always complete: under ``tool_choice`` ``required``, a named function or a strict tool,
the call grammar closes a call within the turn's budget (``max_tokens``, or the room the context
leaves), so the answer holds a complete call whose arguments parse, ``finish_reason``
``tool_calls`` and the call's verdict ``closed_to_fit``; a call that could not complete (no
grammar) never reaches ``content`` as markup, in any family's syntax; a budget too small for
any call is a 400 naming ``max_tokens`` and the minimum, before anything runs.

The tiny random model behind the real door (``fak.kernel.openai.chat``, in process). With the
quote token's logit biased away (``logit_bias``, a request parameter) it can never end a string
by itself: it writes an unbounded string argument, as a weak model does, and only the grammar's
closing ends it."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest
from support.constrain import forcing

from fak import Kernel, Settings
from fak import wire as w
from fak.errors import InvalidInput
from fak.kernel.calls.formats import CallOut, GemmaFormat, HermesFormat, Llama3JsonFormat, MistralFormat
from fak.kernel.openai import chat
from fak.kernel.openai.answer import without_unfinished_call
from fak.kernel.session.caller import Caller, Right

AGENT = Caller("acme", "key:agent1", frozenset({Right.READ, Right.AGENT}))
NOTE_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
               "additionalProperties": False}
NOTE = {"type": "function", "function": {"name": "note", "parameters": NOTE_SCHEMA}}
STRICT = {"type": "function", "function": {"name": "note", "parameters": NOTE_SCHEMA, "strict": True}}
TAG = {"type": "function", "function": {"name": "tag", "parameters": {
    "type": "object", "properties": {"label": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["label", "n"]}}}
USER = [{"role": "system", "content": "You take notes."}, {"role": "user", "content": "Write a long note."}]
# the shortest call the grammar can write, as the tiny byte-level tokenizer spells it, and its stop token
SHORTEST = '<tool_call>\n{"name": "note", "arguments": {"text": ""}}\n</tool_call>'


def _quote(k: Kernel) -> dict[str, float]:
    """A logit bias that keeps the model from ever writing a quote: strings only end by the closing."""
    [quote] = k.tokenizer.encode_plain('"')
    return {str(quote): -100}


def _ask(k: Kernel, tools: list[dict], choice: object, max_tokens: int, **extra: object) -> w.ChatCompletion:
    body = {"model": "m", "messages": USER, "tools": tools, "tool_choice": choice, "max_tokens": max_tokens,
            "temperature": 1, "seed": max_tokens} | extra
    return chat.complete(k, AGENT, w.ChatCompletionRequest.model_validate(body))


def _closed_call(r: w.ChatCompletion, name: str = "note") -> dict:
    """The one call of a closed answer: complete, parseable, marked closed to fit; no markup anywhere."""
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert not choice.message.content, choice.message.content  # never the call's markup
    [call] = choice.message.tool_calls or []
    assert call.function.name == name
    args = json.loads(call.function.arguments)
    [verdict] = r.fak.tool_calls
    assert verdict.closed_to_fit and verdict.returned and verdict.id == call.id
    return args


@pytest.mark.parametrize("max_tokens", [len(SHORTEST) + 1, len(SHORTEST) + 5, 120, 300])
def test_required_call_closes_within_max_tokens(kernel, max_tokens: int) -> None:
    r = _ask(kernel, [NOTE], "required", max_tokens, logit_bias=_quote(kernel))
    args = _closed_call(r)
    jsonschema.validate(args, NOTE_SCHEMA)
    assert r.usage.completion_tokens == max_tokens  # every token spent: the string was cut to fit, not given up
    # the string argument is as long as the budget allows: the call's markup and the stop token aside
    assert len(json.dumps(args["text"], ensure_ascii=False).encode()) >= max_tokens - len(SHORTEST) - 1


def test_named_call_closes_within_max_tokens(kernel) -> None:
    named = {"type": "function", "function": {"name": "tag"}}
    for seed in (1, 2, 3):
        r = _ask(kernel, [NOTE, TAG], named, 140, logit_bias=_quote(kernel), seed=seed)
        args = _closed_call(r, "tag")
        # its required integer comes after the unbounded string: the closing writes the shortest one
        assert isinstance(args["label"], str) and isinstance(args["n"], int)
        assert r.usage.completion_tokens <= 140


def _opening(monkeypatch, kernel: Kernel, prefix: str) -> None:
    """Every answer begins with ``prefix`` (a caller's own sampling hook, ``AnswerPlan.hooks``):
    what a model that chose to call a tool writes first."""
    plan_answer = chat.plan_answer

    def opening(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        return dataclasses.replace(plan_answer(*args, **kwargs), hooks=(forcing(kernel.tokenizer, prefix),))

    monkeypatch.setattr(chat, "plan_answer", opening)


def test_strict_calls_close_under_required_and_under_auto(kernel, monkeypatch) -> None:
    r = _ask(kernel, [STRICT], "required", 150, logit_bias=_quote(kernel))
    jsonschema.validate(_closed_call(r), NOTE_SCHEMA)
    assert r.usage.completion_tokens == 150
    # auto with a strict tool: free text, then a call the model opens itself (a forced prefix here,
    # as a caller's own sampling hook) closes within the budget too
    _opening(monkeypatch, kernel, "Noted. <tool_call>\n")
    r = _ask(kernel, [STRICT], "auto", 120, logit_bias=_quote(kernel))
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Noted."
    [call] = choice.message.tool_calls or []
    jsonschema.validate(json.loads(call.function.arguments), NOTE_SCHEMA)
    assert r.fak.tool_calls[0].closed_to_fit and r.usage.completion_tokens == 120


def test_the_context_left_is_the_budget_too(settings, tiny_lm) -> None:
    """``max_tokens`` far above the room the context leaves: the grammar closes within the room."""
    with Kernel.open(settings, model=tiny_lm, progress=None) as k:
        prompt = _ask(k, [NOTE], "required", 100).usage.prompt_tokens
    small = Settings(**{**settings.model_dump(), "max_context_tokens": prompt + 16 + 90})
    with Kernel.open(small, model=tiny_lm, progress=None) as k:
        r = _ask(k, [NOTE], "required", 1000, logit_bias=_quote(k))
        jsonschema.validate(_closed_call(r), NOTE_SCHEMA)
        # the room the context leaves (the limit less what the session holds before the turn's opener,
        # less the answer's overhead) is spent, and the turn fits in the context
        assert 90 <= r.usage.completion_tokens < 1000 and r.usage.total_tokens <= prompt + 16 + 90


def test_a_budget_too_small_for_any_call_is_a_400_naming_the_minimum(kernel) -> None:
    least = len(SHORTEST) + 1  # byte-level tokens, and the stop token
    for max_tokens in (2, least - 1):
        with pytest.raises(InvalidInput) as err:
            _ask(kernel, [NOTE], "required", max_tokens)
        assert err.value.status == 400 and err.value.param == "max_tokens"
        assert f"max_tokens: {max_tokens} tokens" in str(err.value) and f"takes {least} tokens" in str(err.value)
    # the minimum itself is enough: the shortest call, complete
    r = _ask(kernel, [NOTE], "required", least, logit_bias=_quote(kernel))
    assert _closed_call(r) == {"text": ""} and r.usage.completion_tokens == least
    # auto may answer in text: no minimum
    assert _ask(kernel, [NOTE], "auto", 2).choices[0].finish_reason == "length"


def test_an_unfinished_call_never_reaches_content(kernel, monkeypatch) -> None:
    """No grammar (auto, a non-strict tool): the model opens a call it cannot finish (the prefix
    forced, quotes banned): the content is the text before it, ``finish_reason`` length, in the
    plain answer and in the stream alike."""
    _opening(monkeypatch, kernel, 'Sure. <tool_call>\n{"name": "note", "arguments": {"text": "')
    body = {"model": "m", "messages": USER, "tools": [NOTE], "max_tokens": 90, "temperature": 1, "seed": 5,
            "logit_bias": _quote(kernel)}
    r = chat.complete(kernel, AGENT, w.ChatCompletionRequest.model_validate(body))
    chunks = _streamed(kernel, body)
    choice = r.choices[0]
    assert (choice.finish_reason, choice.message.content, choice.message.tool_calls) == ("length", "Sure. ", None)
    assert r.usage.completion_tokens == 90 and r.fak.tool_calls == []
    sent = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert sent == "Sure. " and finish == ["length"]
    assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)


def test_the_stream_closes_the_call_as_the_plain_answer_does(kernel) -> None:
    body = {"model": "m", "messages": USER, "tools": [NOTE], "tool_choice": "required", "max_tokens": 110,
            "temperature": 1, "seed": 7, "logit_bias": _quote(kernel)}
    plain = chat.complete(kernel, AGENT, w.ChatCompletionRequest.model_validate(body))
    args = _closed_call(plain)
    chunks = _streamed(kernel, body)
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or ())]
    assert [json.loads(d.arguments) for d in deltas] == [args]
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["tool_calls"]
    [info] = [c.fak for c in chunks if c.fak is not None]
    assert info.tool_calls[0].closed_to_fit


def _streamed(k: Kernel, body: dict) -> list:
    stream = chat.open_stream(k, AGENT, w.ChatCompletionRequest.model_validate(body | {"stream": True}))
    chunks = []
    try:
        while (step := stream.next_chunks()) is not None:
            chunks += step
    finally:
        stream.close()
    return chunks


@pytest.mark.parametrize("fmt", [HermesFormat(), Llama3JsonFormat(), MistralFormat(), GemmaFormat()],
                         ids=lambda f: f.name)
def test_every_family_cuts_an_unfinished_call_at_its_opening(fmt) -> None:
    """A turn cut anywhere inside a call, in each family's own syntax: the content keeps the text
    before the call (for the families whose calls are the whole turn, none) and no byte of the
    call; the whole call is read as a call."""
    call = fmt.render_calls([CallOut("note", {"text": "a long note"}, "abcdefghi")])
    before = "" if isinstance(fmt, (Llama3JsonFormat, MistralFormat)) else "Sure. "
    text = before + call
    for cut in range(len(before) + 1, len(text)):
        content, calls = fmt.parse_calls(text[:cut], {"note"})
        assert calls == [] and without_unfinished_call(fmt, content) == before, (cut, text[:cut])
    content, [whole] = fmt.parse_calls(text, {"note"})
    assert whole.arguments == {"text": "a long note"} and without_unfinished_call(fmt, content) == content
    if isinstance(fmt, MistralFormat):  # the marker a special token, decoded away: the array alone
        bare = call.removeprefix(fmt.MARKER)
        for cut in range(1, len(bare)):
            assert without_unfinished_call(fmt, fmt.parse_calls(bare[:cut], {"note"})[0]) == ""


@pytest.mark.real_model
def test_smollm2_writing_a_long_argument_closes_it_within_max_tokens(tmp_path, smollm2) -> None:
    """The real SmolLM2-135M asked for a long note, under ``required`` with a budget far below
    what it would write: the call closes within ``max_tokens``, its arguments parse."""
    with Kernel.open(Settings(data_dir=tmp_path / "data"), model=smollm2, progress=None) as k:
        with pytest.raises(InvalidInput) as err:
            _ask(k, [NOTE], "required", 2)
        least = int(str(err.value).split("takes ")[1].split()[0])
        assert 15 <= least <= 40 and err.value.param == "max_tokens"
        messages = [{"role": "user", "content": "Take a note of a long essay about the history of Paris, with "
                                                "every century from the Romans to today."}]
        for max_tokens in (least, least + 12, 48):
            body = {"model": "m", "messages": messages, "tools": [NOTE], "tool_choice": "required",
                    "max_tokens": max_tokens, "temperature": 0}
            r = chat.complete(k, AGENT, w.ChatCompletionRequest.model_validate(body))
            choice = r.choices[0]
            assert choice.finish_reason == "tool_calls" and not choice.message.content, choice
            [call] = choice.message.tool_calls or []
            args = json.loads(call.function.arguments)
            jsonschema.validate(args, NOTE_SCHEMA)
            assert r.usage.completion_tokens <= max_tokens
            if max_tokens == least:  # the closing from the first token: the shortest call
                assert r.fak.tool_calls[0].closed_to_fit and args == {"text": ""}
