"""Two strict, bounded tools a random model finishes under constraint, and a hook that forces a
prefix: shared by the constrained-decoding tests of every call syntax."""

from __future__ import annotations

import numpy as np

from fak.kernel.calls.tool_text import ToolSpec

WEATHER = ToolSpec("get_weather", "", {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city"],
    "additionalProperties": False,
}, strict=True)
ADD = ToolSpec("add", "", {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": -50, "maximum": 50},
                   "b": {"type": "integer", "minimum": 0, "maximum": 9}, "exact": {"type": "boolean"}},
    "required": ["a", "b", "exact"],
    "additionalProperties": False,
}, strict=True)
TOOLS = [WEATHER, ADD]


def forcing(tokenizer, text: str):
    """A hook that forces the tokens of ``text`` first (what a model that chose to call a
    tool would write), then leaves the draw alone."""
    ids = tokenizer.encode(text)

    class Prefix:
        def adjust(self, step: int, row: np.ndarray) -> np.ndarray:
            if step < len(ids):
                row[ids[step]] = 1e9
            return row

        def chosen(self, step: int, token: int) -> None:
            pass

    return Prefix()
