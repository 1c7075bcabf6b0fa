"""History matching for persistent chat sessions (``fak.kernel.openai.history.new_suffix``):
a client resending its whole conversation gets only the new suffix appended; a resent tool
result the kernel evicted, quarantined or forgot is matched, never admitted again; an edited
history is a Conflict naming the first differing index; a request of new messages only (the
older protocol) is all new. Real tiny model, real kernel."""

from __future__ import annotations

import pytest
from support.kernel_facade_helpers import CLEAN, LOUNGE, POISON, WEATHER

from fak import Kernel
from fak.errors import Conflict, InvalidInput
from fak.kernel.kv.ledger import SegmentKind, SegmentState
from fak.kernel.openai.history import HistoryItem, new_suffix

SYSTEM = "You are a travel assistant."
ASK = "Is my flight on time?"
CALL = '<tool_call>{"name": "flight_status", "arguments": {"flight": "LH123"}}</tool_call>'
KEYED = b"config: aws_access_key_id = AKIAIOSFODNN7QWERTYZ and nothing else"  # REDACTed by the default policy


def sys_(text: str = SYSTEM) -> HistoryItem:
    return HistoryItem("system", text)


def user(text: str) -> HistoryItem:
    return HistoryItem("user", text)


def assistant(text: str) -> HistoryItem:
    return HistoryItem("assistant", text)


def tool(data: bytes, name: str = "flight_status") -> HistoryItem:
    return HistoryItem("tool", data.decode(), name)


def _conversation(k: Kernel, tenant: str = "acme"):  # noqa: ANN202
    """A session as the door leaves it after one tool round and an answer, and the client's
    copy of that history (the answer as the door returned it)."""
    s = k.session(tenant)
    s.append("system", SYSTEM)
    s.append("user", ASK)
    s.append("assistant", CALL)
    assert s.admit("flight_status", CLEAN).admitted
    answer = k.tokenizer.decode_turn(list(s.generate(max_tokens=6, min_tokens=6, temperature=0)))
    return s, [sys_(), user(ASK), assistant(CALL), tool(CLEAN), assistant(answer)]


def _append(s, items: list[HistoryItem]) -> None:  # noqa: ANN001
    """What the door does with the new suffix."""
    for item in items:
        if item.kind == "tool":
            s.admit(item.tool, item.text.encode())
        else:
            s.append(item.kind, item.text)


def test_a_resent_history_appends_only_its_suffix(kernel) -> None:
    s, history = _conversation(kernel)
    before = s.segments()
    assert new_suffix(s, history) == len(history)  # nothing new: the generated answer included
    request = [*history, user("Thanks. And the gate?")]
    n = new_suffix(s, request)
    assert n == len(history)
    _append(s, request[n:])
    after = s.segments()
    assert after[: len(before)] == before and [x.kind for x in after[len(before):]] == [SegmentKind.USER]
    # the next request resends all of it again, the new user message included
    assert new_suffix(s, [*request, user("Bye.")]) == len(request)


def test_resent_evicted_quarantined_and_forgotten_results_are_matched_not_new(kernel) -> None:
    k = kernel
    s, history = _conversation(k)
    poison = s.admit("web_search", POISON)  # the gate quarantined it: never in the KV
    assert poison.segment.state is SegmentState.QUARANTINED
    lounge = s.admit("lounge", LOUNGE)
    s.evict(lounge.segment.id)
    weather = s.admit("weather", WEATHER)
    k.quarantine("acme", weather.ref, reason="slow_detector")  # a late quarantine
    redacted = s.admit("file_read", KEYED)
    assert redacted.admitted_ref not in (None, redacted.ref)  # the segment carries the redacted form's ref
    booking = s.admit("booking", b"Booking QX7Y2Z for Ada Lovelace.")
    k.forget("acme", booking.ref, wait_replay=True)
    states = {x.id: x.state for x in s.segments()}
    assert (states[lounge.segment.id], states[weather.segment.id], states[booking.segment.id]) == (
        SegmentState.EVICTED, SegmentState.QUARANTINED, SegmentState.FORGOTTEN)

    resent = [*history, tool(POISON, "web_search"), tool(LOUNGE, "lounge"), tool(WEATHER, "weather"),
              tool(KEYED, "file_read"), tool(b"Booking QX7Y2Z for Ada Lovelace.", "booking")]
    assert new_suffix(s, [*resent, user("Next?")]) == len(resent)  # none of them admitted again
    # a client that drops what the kernel took out matches too
    kept = [*history, tool(KEYED, "file_read")]
    assert new_suffix(s, [*kept, user("Next?")]) == len(kept)


def test_a_resent_tool_result_with_other_bytes_is_not_the_same(kernel) -> None:
    s, history = _conversation(kernel)
    edited = list(history)
    edited[3] = tool(CLEAN + b" (updated)")
    with pytest.raises(Conflict, match="message 3 "):
        new_suffix(s, edited)
    # another tenant's session matches the same history through its own keyed refs
    g, _ = _conversation(kernel, "globex")
    assert new_suffix(g, history) == len(history)


def test_a_divergent_history_is_a_conflict_naming_the_first_difference(kernel) -> None:
    s, history = _conversation(kernel)
    before = s.segments()
    edited = list(history)
    edited[1] = user("Is my train on time?")
    with pytest.raises(Conflict, match="message 1 "):
        new_suffix(s, [*edited, user("Thanks.")])
    with pytest.raises(Conflict, match="message 0 "):
        new_suffix(s, [sys_("You are a pirate."), *history[1:]])
    with pytest.raises(Conflict, match="message 4 "):  # the answer edited
        new_suffix(s, [*history[:4], assistant("Something else."), user("Thanks.")])
    with pytest.raises(Conflict, match="ends at message 3"):  # cut short (a regenerate): not a resend
        new_suffix(s, history[:3])
    assert s.segments() == before


def test_new_messages_only_are_all_new(kernel) -> None:
    s, _ = _conversation(kernel)
    assert new_suffix(s, [user("Thanks. And the gate?")]) == 0
    assert new_suffix(s, [tool(WEATHER, "weather"), user("And the weather?")]) == 0
    assert new_suffix(s, [tool(CLEAN), user("Again?")]) == 0  # the same bytes as an earlier result: new
    assert new_suffix(s, []) == 0
    fresh = kernel.session("acme")
    assert new_suffix(fresh, [sys_(), user(ASK)]) == 0  # an empty session holds nothing


def test_a_session_without_system_message_repeating_its_first_message(kernel) -> None:
    s = kernel.session("acme")
    s.append("user", "hi")
    answer = kernel.tokenizer.decode_turn(list(s.generate(max_tokens=4, min_tokens=4, temperature=0)))
    assert new_suffix(s, [user("hi")]) == 0  # "hi" again, as a new message
    assert new_suffix(s, [user("hi"), assistant(answer), tool(CLEAN), user("more")]) == 2  # a resend
    s.append("user", "more")
    assert new_suffix(s, [user("hi"), assistant(answer), user("more")]) == 3
    with pytest.raises(Conflict, match="message 2 "):
        new_suffix(s, [user("hi"), assistant(answer), user("less"), user("again")])
    assert new_suffix(s, [user("hi"), user("again")]) == 0  # one message matched: new messages


def test_segments_the_client_never_sent_are_skipped(kernel) -> None:
    from fak.types import TOOL_DEFINITIONS

    k = kernel
    s = k.session("acme")
    s.append("system", SYSTEM)
    tools = s.admit(TOOL_DEFINITIONS, b'{"tools": [{"name": "flight_status"}]}')  # the chat core's tools block
    assert tools.admitted
    s.append("user", ASK)
    other = '{"note": "kernel context"}'
    ref = k.store.put(other.encode(), "application/json", "acme").digest
    with s.transaction() as tx:  # a text segment carrying a ref: no client sent it either
        tx.change().append(SegmentKind.SYSTEM, other, ref=ref)
        tx.commit()
    s.append("user", "More.")
    assert new_suffix(s, [sys_(), user(ASK), user("More."), user("Next.")]) == 3
    assert new_suffix(s, [user("Next.")]) == 0
    with pytest.raises(Conflict, match="message 1 "):
        new_suffix(s, [sys_(), user("Changed."), user("More.")])


def test_a_history_item_is_checked() -> None:
    with pytest.raises(InvalidInput):
        HistoryItem("developer", "x")  # type: ignore[arg-type]
