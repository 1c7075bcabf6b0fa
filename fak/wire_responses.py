"""The wire models of the OpenAI Responses door (``POST /v1/responses``, ``GET`` and ``DELETE
/v1/responses/{id}``): OpenAI's format, not fak's, so a request allows fields fak does not
know (``fak.kernel.openai.responses`` refuses or reports them). The response models follow
the ``openai`` package's ``Response`` type closely enough that the official client and the
Agents SDK parse them. Import-light like ``fak.wire``: pydantic and ``fak.wire`` only."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from fak.wire import CHAT_MAX_MESSAGES, CHAT_MAX_TOKENS, FakInfo, Lenient

RESPONSE_ID = r"^resp_[A-Za-z0-9]{1,60}$"


class ResponseCreateRequest(Lenient):
    model: str = Field(max_length=256, description="any name; responses name the kernel's model")
    input: str | list[dict[str, Any]] = Field(
        description="a user message, or input items: messages, function_call, function_call_output")
    instructions: str | None = Field(None, description="a system message first (a new chain only)")
    previous_response_id: str | None = Field(None, max_length=64,
                                             description="continue that response's chain (its session)")
    store: bool | None = Field(None, description="default true: the response is kept and can be continued")
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=CHAT_MAX_TOKENS)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    tools: list[dict[str, Any]] | None = Field(None, max_length=256, description="function tools, and mcp tools of "
                                               "servers the deployment declares (docs/mcp.md)")
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = Field(None, description="text.format: text, json_object or json_schema")
    reasoning: dict[str, Any] | None = Field(None, description="accepted, ignored (the model does not reason)")
    include: list[str] | None = Field(None, max_length=64)
    truncation: Literal["auto", "disabled"] | None = None
    metadata: dict[str, str] | None = Field(None, max_length=16)
    user: str | None = Field(None, max_length=256, description="accepted, echoed, ignored")
    top_logprobs: int | None = Field(None, ge=0, le=20)
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1, description="extension: the sampling seed")

    def items(self) -> list[dict[str, Any]]:
        """``input`` as items (a string is one user message)."""
        if isinstance(self.input, str):
            return [{"type": "message", "role": "user", "content": self.input}]
        return self.input


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[dict[str, Any]] | None = None


class OutputRefusal(BaseModel):
    type: Literal["refusal"] = "refusal"
    refusal: str


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText | OutputRefusal]


class FunctionCallItem(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


class McpListedTool(BaseModel):
    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    annotations: dict[str, Any] | None = None


class McpListToolsItem(BaseModel):
    """The tools an MCP server offers the model in this response (pinned and allowed only)."""

    type: Literal["mcp_list_tools"] = "mcp_list_tools"
    id: str
    server_label: str
    tools: list[McpListedTool]
    error: str | None = None


class McpCallItem(BaseModel):
    """An MCP tool call fak ran (``output``) or that failed (``error``: OpenAI's
    ``mcp_protocol_error`` / ``mcp_tool_execution_error`` shapes)."""

    type: Literal["mcp_call"] = "mcp_call"
    id: str
    server_label: str
    name: str
    arguments: str
    output: str | None = None
    error: dict[str, Any] | None = None
    status: Literal["in_progress", "completed", "incomplete", "calling", "failed"] = "completed"
    approval_request_id: str | None = None


class McpApprovalRequestItem(BaseModel):
    """An MCP call that runs only once approved (``mcp_approval_response`` in a follow-up)."""

    type: Literal["mcp_approval_request"] = "mcp_approval_request"
    id: str
    server_label: str
    name: str
    arguments: str


OutputItem = OutputMessage | FunctionCallItem | McpListToolsItem | McpCallItem | McpApprovalRequestItem


class InputTokensDetails(BaseModel):
    cached_tokens: int
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens", "content_filter"] | None


class ResponseError(BaseModel):
    code: str
    message: str


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: Literal["completed", "incomplete", "in_progress", "failed"]
    model: str
    output: list[Annotated[OutputItem, Field(discriminator="type")]]
    usage: ResponseUsage | None
    previous_response_id: str | None
    instructions: str | None
    tools: list[dict[str, Any]]
    tool_choice: str | dict[str, Any]
    parallel_tool_calls: bool
    text: dict[str, Any]
    reasoning: dict[str, Any] | None = None
    temperature: float | None
    top_p: float | None
    max_output_tokens: int | None
    truncation: Literal["auto", "disabled"] = "disabled"
    incomplete_details: IncompleteDetails | None = None
    error: ResponseError | None = None
    metadata: dict[str, str]
    user: str | None = None
    store: bool
    background: bool = False
    fak: FakInfo | None = Field(None, description="extension: the chat turn's session, admissions, ignored fields")


class ResponseDeleted(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: bool = True


MAX_INPUT_ITEMS = CHAT_MAX_MESSAGES
