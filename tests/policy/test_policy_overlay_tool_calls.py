"""An overlay's ``tool_calls`` fields: each one the overlay sets replaces the base's (an overlay
that set ``on_deny: refuse`` used to be dropped silently: only ``unlisted`` and ``rules`` were
merged), each one it does not set keeps the base's, and ``rules`` merge by id."""

from __future__ import annotations

from pathlib import Path

from fak.policy import load_policy

HEAD = "apiVersion: fak.dev/v1\nkind: Policy\nmetadata: {name: %s}\nspec:\n"


def test_overlay_tool_calls_fields_replace_the_bases(tmp_path: Path) -> None:
    (tmp_path / "00-base.yaml").write_text(HEAD % "base" + (
        "  tool_calls:\n    unlisted: CONFIRM\n    max_retries: 3\n    from_schemas: true\n"
        "    classes:\n      - {tools: [notify], effect: side_effect}\n"
        "    rules:\n      - {id: shell, tools: [terminal], verdict: ALLOW}\n"))
    (tmp_path / "10-site.yaml").write_text(HEAD % "site" + (
        "  tool_calls:\n    on_deny: refuse\n    min_number_digits: 6\n"
        "    classes:\n      - {tools: [lookup], effect: read}\n"
        "    rules:\n      - {id: shell, tools: [terminal], when_in_attention: {trust: [untrusted]}, verdict: DENY}\n"
        "      - {id: mail, tools: [gmail_send], verdict: ALLOW}\n"))
    calls = load_policy(tmp_path).spec.tool_calls
    assert (calls.on_deny, calls.min_number_digits) == ("refuse", 6)  # set by the overlay
    assert (calls.unlisted, calls.max_retries, calls.from_schemas) == ("CONFIRM", 3, True)  # kept from the base
    assert [c.tools for c in calls.classes] == [["lookup"]]  # a list without ids: the overlay's replaces
    assert [(r.id, r.verdict) for r in calls.rules] == [("shell", "DENY"), ("mail", "ALLOW")]
    base_only = load_policy(tmp_path / "00-base.yaml").spec.tool_calls
    assert (base_only.on_deny, base_only.min_number_digits) == ("evict_and_retry", 4)
