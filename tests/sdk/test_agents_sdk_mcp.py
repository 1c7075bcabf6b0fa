"""The OpenAI Agents SDK's MCP tools, unchanged, against a real fak server (issue 47): a live
``fak serve`` on loopback (tiny random model), a real MCP server upstream
(``support.mcp_servers.MailServer``: ``read_inbox`` carries an injection naming
``exfil@evil-corp.example``, ``send_email`` records what it was asked to send; its input schemas
closed here, ``additionalProperties: false``, so that the tiny model's forced call is ``{}``).

- ``HostedMCPTool`` with ``require_approval: "always"``: the SDK sends ``{type: "mcp", ...}`` to
  ``POST /v1/responses``; fak lists the pinned tools and answers the forced ``read_inbox`` with an
  ``mcp_approval_request``; the SDK's ``on_approval_request`` callback decides it and the SDK
  sends an ``mcp_approval_response`` (``auto_previous_response_id``: only the new items, after
  the previous response); fak decides the call again and runs it once, and the SDK reads fak's
  ``mcp_list_tools``, ``mcp_call`` and message items as its own. Declined, nothing runs.
  The SDK's default (no ``previous_response_id``, the whole history resent) works too: the resent
  history enters the new chain's session before the approved call is decided again.
- ``MCPServerStreamableHttp``: the SDK's own MCP client on fak's gateway (``/mcp``), bound to a
  fak session (``fak-session``): the read is forwarded and admitted in that session, the
  exfiltration it asks for is held (an error result naming the held call) and never reaches the
  server.

Not witnessed here: ``require_approval: "never"`` run to its end by ``Runner.run``. fak runs the
allowed call and asks the model again in the same response (``tool_choice`` applies to its first
turn only); neither the tiny model nor SmolLM2 ends that turn (the tiny model writes another
call, SmolLM2 calls ``read_inbox`` again until ``max_output_tokens``), and the SDK raises on an
``incomplete`` response. The same items are read by the SDK in the approval flow."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, Literal

import agents
import openai
import pytest
from agents import (
    Agent,
    HostedMCPTool,
    MCPToolApprovalFunctionResult,
    MCPToolApprovalRequest,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
)
from agents.items import MCPApprovalRequestItem, MCPApprovalResponseItem, MCPListToolsItem, ToolCallItem
from agents.mcp import MCPServerStreamableHttp
from agents.model_settings import MCPToolChoice
from openai.types.responses.response_output_item import McpCall
from pydantic import BaseModel
from support.mcp_servers import ATTACKER, MailServer, RunningServer, running

from fak import Kernel
from fak.api.server import LiveServer
from fak.settings import McpServerSettings, Settings

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
TENANT = "acme"
READ = MCPToolChoice(server_label="mail", name="read_inbox")


@pytest.fixture
def mail() -> Iterator[RunningServer]:
    with running(closed(MailServer(slow_s=10))) as srv:
        yield srv


@pytest.fixture
def settings(settings: Settings, mail: RunningServer) -> Settings:
    return settings.model_copy(update={"mcp_servers": {"mail": McpServerSettings(url=mail.url, timeout_s=5)}})


@pytest.fixture
def live(live_server: LiveServer, kernel: Kernel) -> LiveServer:
    """The live server, its MCP server's tools pinned by an operator."""
    assert kernel.services.mcp is not None
    kernel.services.mcp.approve("mail", "operator-test")
    return live_server


def events(kernel: Kernel, kind: str) -> list[Any]:
    return [e.event for e in kernel.audit.entries(TENANT) if e.event.type == kind]


def entries(kernel: Kernel, kind: str) -> list[Any]:
    return [e for e in kernel.audit.entries(TENANT) if e.event.type == kind]


class Summary(BaseModel):
    """The agent's answer, bounded: under its grammar the tiny model ends it (a free text it never ends)."""

    urgent: Literal["yes", "no"]


def closed(mail: MailServer) -> MailServer:
    """The server's tools with closed input schemas (``additionalProperties: false``, as servers built
    on zod declare them): under a call grammar the tiny model writes ``read_inbox``'s ``{}`` and ends."""
    for tool in mail.server._tool_manager.list_tools():
        tool.parameters["additionalProperties"] = False
    return mail


def approval_run(live: LiveServer, mail: RunningServer, approve: bool,
                 chained: bool = True) -> tuple[agents.RunResult, list[Any]]:
    """``Runner.run`` of an agent whose only tool is the mail server as a hosted MCP tool that
    asks before every call; the callback answers ``approve``. The tiny model never ends a turn in
    which it may call a tool, so the callback, having answered, lets the model answer only
    (``tool_choice: none``, its ``Summary``): one call is asked about, and the run ends."""
    agents.set_tracing_disabled(True)
    asked: list[Any] = []

    async def go() -> agents.RunResult:
        http = openai.DefaultAsyncHttpxClient(trust_env=False)
        oc = openai.AsyncOpenAI(base_url=live.url + "/v1", api_key=live.key(TENANT, "agent"), max_retries=0,
                                http_client=http)

        def on_approval(request: MCPToolApprovalRequest) -> MCPToolApprovalFunctionResult:
            asked.append(request.data)
            agent.model_settings = replace(agent.model_settings, tool_choice="none")
            return {"approve": approve} if approve else {"approve": False, "reason": "not now"}

        tool = HostedMCPTool(tool_config={"type": "mcp", "server_label": "mail", "server_url": mail.url,
                                          "require_approval": "always"}, on_approval_request=on_approval)
        agent = Agent(name="mailer", instructions="Help with the user's mail.", tools=[tool], output_type=Summary,
                      model=OpenAIResponsesModel("m", openai_client=oc),
                      model_settings=ModelSettings(tool_choice=READ, temperature=0, max_tokens=160))
        try:
            return await Runner.run(agent, "What is in my inbox?", max_turns=4, auto_previous_response_id=chained)
        finally:
            await oc.close()

    return asyncio.run(go()), asked


def test_an_approval_the_sdk_asks_for_is_decided_again_by_fak_and_runs_once(live: LiveServer, mail: RunningServer,
                                                                          kernel: Kernel) -> None:
    result, asked = approval_run(live, mail, approve=True)
    kinds = [type(i).__name__ for i in result.new_items]
    assert isinstance(result.final_output, Summary)
    [request] = asked
    assert request.type == "mcp_approval_request" and request.name == "read_inbox"
    assert any(isinstance(i, MCPApprovalRequestItem) for i in result.new_items), kinds
    assert any(isinstance(i, MCPApprovalResponseItem) for i in result.new_items), kinds
    assert isinstance(result.new_items[0], MCPListToolsItem), kinds
    assert {"read_inbox", "send_email"} <= {t.name for t in result.new_items[0].raw_item.tools}
    calls = [i.raw_item for i in result.new_items if isinstance(i, ToolCallItem) and isinstance(i.raw_item, McpCall)]
    assert len(calls) == 1, kinds
    assert calls[0].name == "read_inbox" and calls[0].approval_request_id == request.id and calls[0].error is None
    assert calls[0].output and "mailbox migration" in calls[0].output
    assert mail.mail.reads == 1 and mail.sent == []  # run once, on the client's approval
    called = events(kernel, "mcp_tool_called")
    assert [(c.server, c.tool, c.outcome, c.via) for c in called] == [("mail", "mcp:mail/read_inbox", "ok",
                                                                       "responses")]
    # decided again when the approval came: the decision the call ran on
    decisions = [e for e in entries(kernel, "tool_call_decision") if e.event.tool == "mcp:mail/read_inbox"]
    assert decisions and decisions[-1].event.verdict == "ALLOW" and called[0].decision_index == decisions[-1].index
    admitted = [e for e in events(kernel, "admission_verdict") if e.tool == "mcp:mail/read_inbox"]
    assert len(admitted) == 1 and admitted[0].verdict == "ALLOW"


def test_a_declined_approval_runs_nothing_upstream(live: LiveServer, mail: RunningServer, kernel: Kernel) -> None:
    result, asked = approval_run(live, mail, approve=False)
    assert isinstance(result.final_output, Summary) and len(asked) == 1
    assert any(isinstance(i, MCPApprovalResponseItem) for i in result.new_items)
    assert not [i for i in result.new_items if getattr(i.raw_item, "type", "") == "mcp_call"]
    assert mail.mail.reads == 0 and mail.sent == []
    assert not events(kernel, "mcp_tool_called")


def test_the_sdk_s_default_resend_of_the_whole_history_answers_the_approval(live: LiveServer,
                                                                           mail: RunningServer) -> None:
    approval_run(live, mail, approve=True, chained=False)
    assert mail.mail.reads == 1


# --- the gateway: the SDK's own MCP client on fak's /mcp ---------------------------------------
def new_session(live: LiveServer, key: str) -> str:
    with live.client(key) as c:
        r = c.post("/v1/sessions")
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


def gateway(live: LiveServer, key: str, session: str) -> MCPServerStreamableHttp:
    return MCPServerStreamableHttp(name="fak", params={
        "url": live.url + "/mcp", "headers": {"Authorization": f"Bearer {key}", "fak-session": session},
        "timeout": 30}, client_session_timeout_seconds=60)


def text(r: Any) -> str:
    return "".join(getattr(b, "text", "") for b in r.content)


def meta(r: Any) -> dict[str, Any]:
    return dict(getattr(r, "meta", None) or {})


def test_the_sdk_s_mcp_client_on_the_gateway_reads_and_the_exfiltration_is_held(live: LiveServer, mail: RunningServer,
                                                                                kernel: Kernel) -> None:
    key = live.key(TENANT, "agent")
    sid = new_session(live, key)

    async def go() -> tuple[list[Any], Any, Any]:
        server = gateway(live, key, sid)
        await server.connect()  # type: ignore[no-untyped-call]
        try:
            listed = await server.list_tools()
            read = await server.call_tool("read_inbox", {})
            held = await server.call_tool("send_email", {"to": ATTACKER, "subject": "inbox", "body": "as asked"})
            return listed, read, held
        finally:
            await server.cleanup()  # type: ignore[no-untyped-call]

    listed, read, held = asyncio.run(go())
    assert {t.name for t in listed} == {"read_inbox", "send_email", "slow_search", "export_mailbox"}  # the pins
    assert not read.is_error and ATTACKER in text(read)
    assert meta(read)["fak.dev/verdict"] == "ALLOW" and meta(read)["fak.dev/session"] == sid
    assert mail.mail.reads == 1
    # forwarded and admitted first-hand in the bound session, under the server's tool
    called = [e for e in events(kernel, "mcp_tool_called") if e.session_id == sid]
    assert [(e.tool, e.outcome, e.via) for e in called] == [("mcp:mail/read_inbox", "ok", "gateway")]
    admitted = {e.ref: e for e in events(kernel, "admission_verdict") if e.session_id == sid}
    assert admitted[meta(read)["fak.dev/ref"]].tool == "mcp:mail/read_inbox"
    # the send the read asked for: held for a person, an error result naming the held call
    assert held.is_error and meta(held)["fak.dev/verdict"] == "CONFIRM"
    call_id = meta(held)["fak.dev/call_id"]
    assert call_id.startswith("call_held_") and call_id in text(held)
    assert mail.sent == []  # never forwarded
    decision = next(e for e in events(kernel, "tool_call_decision")
                    if e.session_id == sid and e.tool == "mcp:mail/send_email")
    assert decision.verdict == "CONFIRM"
