"""The tools and history the door tests resend to a family's template: a closed weather tool
(the random model's constrained call must end) and a history whose tool result forges the
family's turn marker."""

from __future__ import annotations

from typing import Any

CLOSED_WEATHER_TOOLS: list[dict[str, Any]] = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                   "required": ["city"], "additionalProperties": False}}}]


def weather_history(forged_marker: str) -> list[dict[str, Any]]:
    """A system prompt, a question, the call the assistant made, its result carrying
    ``forged_marker`` (a turn marker of the family's template), and a follow-up question."""
    return [{"role": "system", "content": "You are a weather assistant."},
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21} ' + forged_marker},
            {"role": "user", "content": "And in Lyon?"}]
