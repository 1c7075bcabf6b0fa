"""Agent frameworks, unchanged, against a real fak server on loopback (tiny random model):
LangChain's ``ChatOpenAI.bind_tools``, LangGraph's ``create_react_agent`` (a tool run to the
end, and a call fak holds for a person mapped onto LangGraph's interrupt), and pydantic-ai's
typed output. The tiny model writes well-formed calls only under constrained decoding, so
every call here is forced (``tool_choice`` required, or pydantic-ai's output tool); what is
checked is what the framework did with fak's answers: the tool ran with arguments that
validate, the run finished, and fak's verdict reached the caller."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, Literal

import httpx
import jsonschema
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field
from support.tiny_kernel import served

POLICY = """\
apiVersion: fak.dev/v1
kind: Policy
metadata: {name: witnesses}
spec:
  defaults: {trust: untrusted}
  tools:
    - {name: get_weather, trust: trusted}
  tool_calls:
    rules:
      - {id: mail, tools: [send_email], verdict: CONFIRM}
"""
FEW: dict[str, Any] = {"temperature": 0, "max_tokens": 200}
# create_react_agent is what LangGraph's users run (its successor lives in `langchain`, not installed)
pytestmark = pytest.mark.filterwarnings("ignore::langgraph.warnings.LangGraphDeprecatedSinceV10")


@pytest.fixture
def server(tmp_path, tiny_dir, tiny_lm) -> Iterator[SimpleNamespace]:
    with served(tmp_path, tiny_dir, tiny_lm, POLICY) as live:
        yield live


def chat_model(server: SimpleNamespace, **options: Any) -> ChatOpenAI:
    """LangChain's OpenAI chat model on fak's door, proxies from the environment ignored."""
    return ChatOpenAI(base_url=server.url + "/v1", api_key=server.key, model="m", max_retries=0, timeout=120,
                      http_client=httpx.Client(trust_env=False), http_async_client=httpx.AsyncClient(trust_env=False),
                      **FEW, **options)


class Weather(BaseModel):
    city: str = Field(max_length=12)
    unit: Literal["C", "F"]


def weather_tool(ran: list[dict[str, Any]]) -> Any:
    @tool(args_schema=Weather)
    def get_weather(city: str, unit: str) -> str:
        """Weather for a city."""
        ran.append({"city": city, "unit": unit})
        return f"Sunny in {city}, 20 {unit}."

    return get_weather


def test_langchain_bind_tools_call_validates_and_the_verdict_reaches_the_caller(server) -> None:
    ran: list[dict[str, Any]] = []
    get_weather = weather_tool(ran)
    # strict: LangChain's default schema has no additionalProperties: false, so the grammar lets the
    # random model add keys until max_tokens (finish_reason "length", the call left in the content)
    llm = chat_model(server, include_response_headers=True).bind_tools([get_weather], tool_choice="required",
                                                                        strict=True)
    ai = llm.invoke([SystemMessage("You are an assistant."), HumanMessage("Weather in Paris?")])
    assert isinstance(ai, AIMessage) and ai.response_metadata["finish_reason"] == "tool_calls"
    [call] = ai.tool_calls
    assert call["name"] == "get_weather" and call["id"] and call["id"].startswith("call_")
    jsonschema.validate(call["args"], Weather.model_json_schema())
    # the body's `fak` field is dropped by LangChain (not in response_metadata nor additional_kwargs);
    # the header carries the verdict, and include_response_headers puts it in response_metadata
    assert "fak" not in ai.response_metadata and "fak" not in ai.additional_kwargs
    assert ai.response_metadata["headers"]["fak-tool-calls"] == f"{call['id']}=ALLOW"
    msg = get_weather.invoke(call)  # as an executor runs it: a ToolMessage answering the call
    assert isinstance(msg, ToolMessage) and msg.tool_call_id == call["id"]
    assert ran == [call["args"]]
    # the audit log holds the same decision
    decisions = [e.event for e in server.kernel.audit.entries("acme") if e.event.type == "tool_call_decision"]
    assert [(d.tool, d.verdict) for d in decisions] == [("get_weather", "ALLOW")]


class Verdict(BaseModel):
    """A bounded output type: a random model finishes it well within max_tokens."""

    label: Literal["ok", "bad"]
    score: int = Field(ge=0, le=9)
    note: str = Field(max_length=8)


@pytest.mark.parametrize("mode", ["tool", "native"])
def test_pydantic_ai_returns_a_validated_output_type(server, mode: str) -> None:
    """pydantic-ai's default output mode is a tool (``final_result``) it forces with
    ``tool_choice: required``; ``NativeOutput`` asks for ``response_format`` ``json_schema``.
    Either way fak's grammar makes the tiny model's answer validate."""
    try:
        import httpx2  # pydantic-ai 2 takes httpx2's client (httpx's is deprecated there)
    except ImportError:
        httpx2 = httpx  # type: ignore[no-redef]
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    seen: list[httpx2.Response] = []

    async def keep(response: httpx2.Response) -> None:
        seen.append(response)

    http = httpx2.AsyncClient(trust_env=False, timeout=120, event_hooks={"response": [keep]})
    model = OpenAIChatModel("m", provider=OpenAIProvider(base_url=server.url + "/v1", api_key=server.key,
                                                         http_client=http))
    output: Any = Verdict if mode == "tool" else NativeOutput(Verdict)
    agent = Agent(model, output_type=output, model_settings={"max_tokens": 300, "temperature": 0})
    result = agent.run_sync("Judge this: the sky is green.")
    assert isinstance(result.output, Verdict)
    Verdict.model_validate(result.output.model_dump())
    [response] = [r for r in seen if r.request.url.path == "/v1/chat/completions"]  # one request: valid at once
    body = json.loads(response.request.content)
    if mode == "tool":
        assert body["tool_choice"] == "required" and [t["function"]["name"] for t in body["tools"]] == ["final_result"]
        [(call_id, verdict)] = [p.split("=") for p in response.headers["fak-tool-calls"].split(", ")]
        assert call_id.startswith("call_") and verdict == "ALLOW"  # fak judged the output call
        assert response.json()["fak"]["tool_calls"][0]["verdict"] == "ALLOW"
    else:
        assert body["response_format"]["type"] == "json_schema" and "tools" not in body
        assert "fak-tool-calls" not in response.headers and response.json()["fak"]["tool_calls"] == []



def forcing(llm: ChatOpenAI, tools: list[Any]) -> Any:
    """LangGraph's dynamic model: a call is forced until a tool has answered (the tiny model
    calls tools only under constrained decoding), then the model answers freely."""

    def select(state: Any, runtime: Any) -> Any:
        answered = any(isinstance(m, ToolMessage) for m in state["messages"])
        return llm.bind_tools(tools, strict=True) if answered else llm.bind_tools(tools, tool_choice="required",
                                                                                    strict=True)

    return select


def test_langgraph_react_agent_runs_a_tool_and_finishes(server) -> None:
    from langgraph.prebuilt import create_react_agent

    ran: list[dict[str, Any]] = []
    tools = [weather_tool(ran)]
    agent = create_react_agent(forcing(chat_model(server), tools), tools)
    state = agent.invoke({"messages": [SystemMessage("You are an assistant."), HumanMessage("Weather in Paris?")]})
    msgs = state["messages"]
    [ai_call] = [m for m in msgs if isinstance(m, AIMessage) and m.tool_calls]
    [call] = ai_call.tool_calls
    [answer] = [m for m in msgs if isinstance(m, ToolMessage)]
    assert answer.tool_call_id == call["id"] and answer.content.startswith("Sunny in")
    assert ran == [call["args"]]
    jsonschema.validate(call["args"], Weather.model_json_schema())
    assert isinstance(msgs[-1], AIMessage) and not msgs[-1].tool_calls  # the agent ended with an answer
    decisions = [e.event for e in server.kernel.audit.entries("acme") if e.event.type == "tool_call_decision"]
    assert [(d.tool, d.verdict) for d in decisions] == [("get_weather", "ALLOW")]


class Mail(BaseModel):
    to: str = Field(max_length=20)


def test_langgraph_interrupt_decides_a_call_fak_held(server) -> None:
    """send_email is CONFIRM: fak holds the call and (asked to) returns it with a held id; the
    wrapped tool interrupts the graph; resuming with True approves at fak and runs the tool,
    resuming with False rejects at fak and the tool never runs."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.prebuilt import create_react_agent
    from langgraph.types import Command

    from fak.sdk import Client
    from fak.sdk.langgraph import FAK_HELD_CALLS, fak_held_tools

    sent: list[str] = []

    @tool(args_schema=Mail)
    def send_email(to: str) -> str:
        """Send the report by email."""
        sent.append(to)
        return f"sent to {to}"

    fak = Client(server.url, api_key=server.live.key("acme", "approver"), trust_env=False)  # the person
    tools = fak_held_tools([send_email], fak)
    agent = create_react_agent(forcing(chat_model(server, extra_body=FAK_HELD_CALLS), tools), tools,
                               checkpointer=InMemorySaver())
    ask = {"messages": [SystemMessage("You are an assistant."), HumanMessage("Mail the report.")]}
    outcomes = {}
    for thread, approved in (("yes", True), ("no", False)):
        cfg: Any = {"configurable": {"thread_id": thread}}
        ran_before = len(sent)
        paused = agent.invoke(ask, cfg)
        [pending] = paused["__interrupt__"]
        call_id = pending.value["tool_call_id"]
        assert call_id.startswith("call_held_") and pending.value["name"] == "send_email"
        jsonschema.validate(pending.value["args"], Mail.model_json_schema())
        assert len(sent) == ran_before  # nothing ran before the person answered
        done = agent.invoke(Command(resume=approved), cfg)
        [answer] = [m for m in done["messages"] if isinstance(m, ToolMessage)]
        assert answer.tool_call_id == call_id
        assert isinstance(done["messages"][-1], AIMessage) and not done["messages"][-1].tool_calls
        outcomes[thread] = (call_id, pending.value["args"], answer)
    yes_id, yes_args, yes_answer = outcomes["yes"]
    no_id, _, no_answer = outcomes["no"]
    assert sent == [yes_args["to"]]  # the approved call ran, once; the rejected one never did
    assert yes_answer.content == f"sent to {yes_args['to']}" and no_answer.status == "error"
    approvals = {e.event.call_id: e.event.approved for e in server.kernel.audit.entries("acme")
                 if e.event.type == "tool_call_approval"}
    assert approvals == {yes_id: True, no_id: False}  # the person's decisions are in fak's audit log
    decisions = [e.event for e in server.kernel.audit.entries("acme") if e.event.type == "tool_call_decision"]
    assert [(d.tool, d.verdict) for d in decisions] == [("send_email", "CONFIRM")] * 2


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_structured_output_validates(server, method: str) -> None:
    """``with_structured_output``: a ``response_format`` json_schema (LangChain's default) or a
    named function call; fak's grammar makes the tiny model's answer an instance either way."""
    out = chat_model(server).with_structured_output(Verdict, method=method, strict=True).invoke(
        [HumanMessage("Judge this: the sky is green.")])
    assert isinstance(out, Verdict)


def test_langgraph_interrupt_async_with_an_async_client(server) -> None:
    """The same hold through ``ainvoke`` and ``fak.sdk.AsyncClient``: approved, the tool runs."""
    import asyncio

    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.prebuilt import create_react_agent
    from langgraph.types import Command

    from fak.sdk import AsyncClient
    from fak.sdk.langgraph import FAK_HELD_CALLS, fak_held_tools

    sent: list[str] = []

    @tool(args_schema=Mail)
    async def send_email(to: str) -> str:
        """Send the report by email."""
        sent.append(to)
        return f"sent to {to}"

    async def run() -> tuple[Any, Any]:
        fak = AsyncClient(server.url, api_key=server.live.key("acme", "approver"), trust_env=False)
        tools = fak_held_tools([send_email], fak)
        agent = create_react_agent(forcing(chat_model(server, extra_body=FAK_HELD_CALLS), tools), tools,
                                   checkpointer=InMemorySaver())
        cfg: Any = {"configurable": {"thread_id": "a"}}
        paused = await agent.ainvoke({"messages": [HumanMessage("Mail the report.")]}, cfg)
        assert sent == []
        return paused, await agent.ainvoke(Command(resume=True), cfg)

    paused, done = asyncio.run(run())
    [pending] = paused["__interrupt__"]
    assert sent == [pending.value["args"]["to"]]
    assert isinstance(done["messages"][-1], AIMessage) and not done["messages"][-1].tool_calls
    approvals = [e.event for e in server.kernel.audit.entries("acme") if e.event.type == "tool_call_approval"]
    assert [(a.call_id, a.approved) for a in approvals] == [(pending.value["tool_call_id"], True)]


def test_langchain_responses_api_sees_the_verdict(server) -> None:
    ran: list[dict[str, Any]] = []
    llm = chat_model(server, use_responses_api=True, include_response_headers=True)
    ai = llm.bind_tools([weather_tool(ran)], tool_choice="required", strict=True).invoke([HumanMessage("Weather?")])
    [call] = ai.tool_calls  # the call itself comes through the Responses API
    jsonschema.validate(call["args"], Weather.model_json_schema())
    assert ai.response_metadata["headers"].get("fak-tool-calls") == f"{call['id']}=ALLOW"


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_a_tiny_temperature_is_the_greedy_limit(server) -> None:
    """Found by schemathesis (a RuntimeWarning, no 5xx): any temperature in [0, 2] is valid; as it
    goes to 0 the answer must go to the greedy one, not to token 0 (here the end of the text)."""
    import openai

    c = openai.OpenAI(base_url=server.url + "/v1", api_key=server.key, max_retries=0,
                      http_client=httpx.Client(trust_env=False))
    msgs: Any = [{"role": "user", "content": "hello there"}]
    greedy = c.chat.completions.create(model="m", messages=msgs, max_tokens=5, temperature=0)
    tiny = c.chat.completions.create(model="m", messages=msgs, max_tokens=5, temperature=1e-39, seed=1)
    assert greedy.choices[0].message.content
    assert tiny.choices[0].message.content == greedy.choices[0].message.content
