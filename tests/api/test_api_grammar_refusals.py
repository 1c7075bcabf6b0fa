"""Schemas that llguidance compiles but cannot decode under are refused when the request is
validated, never once decoding started (issue 41, item 6a): a ``$ref`` that refers only to
itself (the first mask failed with ``NoExtensionBias``: a 500 after the messages were
appended), an object with 3,000 optional properties (an Earley row of 12,007 items after
its ``{``, over llguidance's 2,000: a 500 likewise) and a chain of 3,000 ``$ref``s (the
compiler overflowed its thread's stack: the server process died). Each is a 400 ``invalid_request_error``
naming the parameter and the problem, for ``response_format``, a strict tool's ``parameters``
and the Responses API's ``text.format``; nothing is appended, audited or stored, and the next
request works. A real uvicorn server on 127.0.0.1, the official ``openai`` client, tiny model."""

from __future__ import annotations

import openai
import pytest

from fak.api.server import serve

SELF = {"$defs": {"node": {"$ref": "#/$defs/node"}}, "$ref": "#/$defs/node"}
WIDE = {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(3000)}}
# flat JSON, 3,000 definitions each a $ref to the next: llguidance's compiler overflowed the
# stack of the thread that read it, and the server process died (SIGSEGV)
CHAIN = {"$defs": {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(3000)} | {"d3000": {"type": "string"}},
         "$ref": "#/$defs/d0"}
SCHEMAS = [pytest.param(SELF, "no finite value", id="self-ref"), pytest.param(WIDE, "too large", id="3000-optional"),
           pytest.param(CHAIN, "levels deep", id="3000-ref-chain")]
USER = [{"role": "user", "content": "Hello"}]
FEW = {"temperature": 0, "max_tokens": 2}


@pytest.fixture
def live(kernel):
    with serve(kernel) as server:
        yield server


def _client(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key=live.key("acme", "agent"), max_retries=0, timeout=120,
                         http_client=openai.DefaultHttpxClient(trust_env=False))


def _state(live, sid: str) -> tuple[list[str], int]:
    """The session's segments and the tenant's audit entries: what a refused request must not change."""
    segments = [x.id for x in live.kernel.session("acme", sid).segments()]
    return segments, sum(1 for _ in live.kernel.audit.entries("acme"))


def _refused(err: pytest.ExceptionInfo[openai.BadRequestError], param: str, problem: str) -> None:
    e = err.value
    assert e.status_code == 400 and e.type == "invalid_request_error" and e.param == param, (e.param, str(e))
    assert f"{param}: " in str(e) and problem in str(e), str(e)


@pytest.mark.parametrize(("schema", "problem"), SCHEMAS)
def test_chat_refuses_a_schema_it_cannot_decode_before_anything_runs(live, schema, problem):
    c = _client(live)
    sid = {"fak_session": "grammar"}
    c.chat.completions.create(model="m", messages=USER, extra_body=sid, **FEW)
    before = _state(live, "grammar")
    more = [{"role": "user", "content": "Again, as JSON"}]
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model="m", messages=more, response_format=fmt, extra_body=sid, **FEW)
    _refused(err, "response_format.json_schema.schema", problem)
    with pytest.raises(openai.BadRequestError) as err:  # streamed: the 400 comes before any event
        c.chat.completions.create(model="m", messages=more, response_format=fmt, extra_body=sid, stream=True, **FEW)
    _refused(err, "response_format.json_schema.schema", problem)
    tool = {"type": "function", "function": {"name": "lookup", "parameters": schema, "strict": True}}
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model="m", messages=more, tools=[tool], tool_choice="required", extra_body=sid,
                                  **FEW)
    _refused(err, "tools[0].function.parameters", problem)
    assert _state(live, "grammar") == before  # nothing appended, nothing audited
    after = c.chat.completions.create(model="m", messages=more, extra_body=sid, **FEW)
    assert after.choices[0].finish_reason in ("stop", "length")
    assert len(_state(live, "grammar")[0]) > len(before[0])


@pytest.mark.parametrize(("schema", "problem"), SCHEMAS)
def test_responses_refuse_a_schema_they_cannot_decode_before_anything_runs(live, schema, problem):
    c = _client(live)
    first = c.responses.create(model="m", input="Hello", temperature=0, max_output_tokens=2)
    sid = first.model_extra["fak"]["session_id"]
    before = _state(live, sid)
    sessions = live.kernel.sessions("acme")
    fmt = {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}}
    with pytest.raises(openai.BadRequestError) as err:
        c.responses.create(model="m", input="More", text=fmt, previous_response_id=first.id, max_output_tokens=2)
    _refused(err, "text.format.schema", problem)
    with pytest.raises(openai.BadRequestError) as err:  # a new chain: no session is created for it
        c.responses.create(model="m", input="More", text=fmt, max_output_tokens=2, stream=True)
    _refused(err, "text.format.schema", problem)
    tool = {"type": "function", "name": "lookup", "parameters": schema, "strict": True}
    with pytest.raises(openai.BadRequestError) as err:
        c.responses.create(model="m", input="More", tools=[tool], tool_choice="required",
                           previous_response_id=first.id, max_output_tokens=2)
    _refused(err, "tools[0].parameters", problem)
    assert _state(live, sid) == before and live.kernel.sessions("acme") == sessions  # no chain's session made
    nxt = c.responses.create(model="m", input="More", previous_response_id=first.id, temperature=0,
                             max_output_tokens=2)  # the chain was not claimed by the refused ones
    assert nxt.status in ("completed", "incomplete") and nxt.previous_response_id == first.id
