"""Argument provenance (issue 28): each value of a proposed call traced to the texts that hold
it, rules over where arguments came from, trust per segment (not per bytes), ``unlisted`` as
"no rule fired", explicit ALLOW rules, host-only sources, and remembered approvals."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.tiny_kernel import policy_kernel

from fak import Kernel
from fak.kernel.calls.provenance import ContextText, trace_arguments
from fak.kernel.calls.value_forms import canonical_tokens, needle_of
from fak.policy.gate import UNPARSABLE, source_host

# --- normalisation ---------------------------------------------------------------------


def _found(value: object, text: str) -> bool:
    traces = trace_arguments({"v": value}, [ContextText("seg_1", "sha256:" + "0" * 64, "untrusted", text)])
    return traces[0].origin == "untrusted"


_words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=3, max_size=10)


@settings(max_examples=60, deadline=None)
@given(user=_words, host=_words, tld=st.sampled_from(["com", "org", "net", "io"]),
       upper=st.booleans(), mailto=st.booleans())
def test_email_traced_in_any_case(user: str, host: str, tld: str, upper: bool, mailto: bool) -> None:
    address = f"{user}.x@{host}.{tld}"
    written = ("mailto:" if mailto else "") + (address.upper() if upper else address)
    assert _found(address, f"Please write to {written}. Thanks")
    assert _found(written, f"Contact: {address}")


@settings(max_examples=60, deadline=None)
@given(cents=st.integers(min_value=100, max_value=10**9), sign=st.sampled_from(["", "$", "€", "EUR ", "USD "]),
       style=st.sampled_from(["plain", "us", "eu", "space"]))
def test_amount_traced_in_any_number_form(cents: int, sign: str, style: str) -> None:
    whole, frac = divmod(cents, 100)
    groups = f"{whole:,}"
    written = {
        "plain": f"{whole}.{frac:02d}",
        "us": f"{groups}.{frac:02d}",
        "eu": groups.replace(",", ".") + f",{frac:02d}",
        "space": groups.replace(",", " ") + f".{frac:02d}",
    }[style]
    text = f"Amount due: {sign}{written} by Friday"
    assert _found(cents / 100, text)  # a JSON number, as a model writes it
    assert _found(f"{sign}{whole:,}.{frac:02d}", text)  # a string in another form


@settings(max_examples=60, deadline=None)
@given(digits=st.text(alphabet="0123456789", min_size=18, max_size=18), country=st.sampled_from(["DE", "GB", "FR"]),
       spaced=st.booleans(), lower=st.booleans())
def test_iban_traced_with_or_without_spaces(digits: str, country: str, spaced: bool, lower: bool) -> None:
    iban = country + digits[:2] + digits[2:]
    written = " ".join(iban[i:i + 4] for i in range(0, len(iban), 4)) if spaced else iban
    assert _found(iban.lower() if lower else iban, f"Pay to IBAN {written}.")


@settings(max_examples=40, deadline=None)
@given(path=_words, scheme=st.sampled_from(["https://", "http://", ""]), www=st.booleans(), slash=st.booleans())
def test_url_traced_in_any_form(path: str, scheme: str, www: bool, slash: bool) -> None:
    written = f"{scheme}{'www.' if www else ''}Example.com/{path}{'/' if slash else ''}"
    assert _found(f"https://example.com/{path}", f"see {written} for details")


@settings(max_examples=40, deadline=None)
@given(words=st.lists(_words, min_size=2, max_size=5), spaces=st.sampled_from([" ", "  ", "\n", "\t "]))
def test_phrase_traced_whatever_case_and_whitespace(words: list[str], spaces: str) -> None:
    text = "Note: " + spaces.join(w.upper() for w in words) + "!"
    assert _found(" ".join(words), text)
    fullwidth = "".join(chr(ord(c) + 0xFEE0) for c in words[0])
    assert _found(fullwidth + " " + " ".join(words[1:]), text)


@settings(max_examples=60, deadline=None)
@given(value=st.text(alphabet="qxzjkvw", min_size=6, max_size=12))
def test_value_absent_everywhere_is_generated(value: str) -> None:
    traces = trace_arguments({"to": value}, [ContextText("seg_1", None, "trusted", "Pay the bill, please."),
                                             ContextText("seg_2", "sha256:" + "1" * 64, "untrusted", "Total 12")])
    assert traces[0].origin == "generated" and traces[0].sources == ()


def test_trusted_wins_and_entities_inside_a_body_are_traced() -> None:
    texts = [ContextText("s1", None, "trusted", "Reply to bob@corp.example and thank him."),
             ContextText("s2", "sha256:" + "2" * 64, "untrusted",
                         '{"sender": "bob@corp.example", "body": "wire it to DE44500105175407324931"}', "json")]
    traces = trace_arguments({"to": "Bob@Corp.Example", "body": "Thanks! Use DE44 5001 0517 5407 3249 31 then."},
                             texts)
    by = {(t.path, t.entity): t for t in traces}
    assert by[("to", None)].origin == "trusted"
    assert by[("body", None)].origin == "generated"
    iban = by[("body", "iban")]
    assert iban.origin == "untrusted" and iban.sources[0].field == "body"
    s = iban.sources[0]
    assert texts[1].text[s.start:s.end] == "DE44500105175407324931"
    assert canonical_tokens("Bob@Corp.Example")[0].form == "bob@corp.example"
    assert needle_of(canonical_tokens("$1,234.50 EUR")) == "1234.5"


# --- the kernel ------------------------------------------------------------------------

POLICY = """\
apiVersion: fak.dev/v1
kind: Policy
metadata: {name: argument-provenance}
spec:
  defaults: {trust: untrusted}
  tools:
    - {name: calculator, trust: trusted}
    - {name: intranet, sources: ["*.corp.example"], trust: trusted}
  tool_calls:
    unlisted: CONFIRM
    rules:
      - id: reads-are-fine
        tools: ["read_*", "search_*"]
        verdict: ALLOW
      - id: pay-known-accounts
        tools: [pay_bill]
        verdict: ALLOW
      - id: account-from-untrusted
        tools: [pay_bill]
        when_args_from: {args: [iban, recipient], trust: [untrusted, generated]}
        verdict: CONFIRM
      - id: mail-after-untrusted
        tools: [send_email]
        when_in_attention: {trust: [untrusted]}
        verdict: CONFIRM
"""
BILL = b"ACME Power - invoice 2291\nAmount due: EUR 1.234,50\nPay to IBAN DE89 3704 0044 0532 0130 00 by June 30."


def _open(tmp_path, tiny_dir, tiny_lm) -> Kernel:  # noqa: ANN001 - pytest fixtures
    """The kernel over ``tmp_path``'s data directory and policy (again: as after a restart)."""
    return policy_kernel(tmp_path, tiny_dir, tiny_lm, POLICY)


@pytest.fixture
def kern(tmp_path, tiny_dir, tiny_lm):
    k = _open(tmp_path, tiny_dir, tiny_lm)
    yield k
    k.close()


def test_iban_only_in_the_file_needs_a_person_with_its_span(kern: Kernel) -> None:
    s = kern.session("acme")
    s.append("user", "Please pay the bill in bill.txt.")
    s.admit("read_file", BILL)
    d = s.authorize_tool_call("pay_bill", {"iban": "DE89370400440532013000", "amount": 1234.5})
    assert d.verdict == "CONFIRM" and d.rule_id == "account-from-untrusted"
    (trigger,) = d.triggers
    assert trigger.path == "iban" and trigger.origin == "untrusted"
    src = trigger.sources[0]
    assert BILL.decode()[src.start:src.end] == "DE89 3704 0044 0532 0130 00"
    event = kern.audit.entry(d.audit_index).event
    record = next(a for a in event.arguments if a.path == "iban")
    assert record.trigger and record.sources[0].start == src.start
    assert "DE89" not in repr(event)  # offsets and digests only, never the value


def test_iban_given_by_the_user_is_allowed_even_when_the_file_repeats_it(kern: Kernel) -> None:
    s = kern.session("acme")
    s.append("user", "Pay the bill in bill.txt to my landlord's account DE89 3704 0044 0532 0130 00.")
    s.admit("read_file", BILL)
    d = s.authorize_tool_call("pay_bill", {"iban": "de89370400440532013000", "amount": "1,234.50"})
    assert d.verdict == "ALLOW" and d.rule_id == "pay-known-accounts"
    assert {t.path: t.origin for t in d.arguments} == {"iban": "trusted", "amount": "untrusted"}


def test_unlisted_is_the_verdict_when_no_rule_fires(kern: Kernel) -> None:
    s = kern.session("acme")
    s.append("user", "hello")
    assert s.authorize_tool_call("delete_repo", {}).rule_id == "unlisted"
    d = s.authorize_tool_call("send_email", {"to": "a@b.example"})  # a rule names it, none fires
    assert (d.verdict, d.rule_id) == ("CONFIRM", "unlisted")
    d = s.authorize_tool_call("read_file", {"path": "x"})  # an explicit ALLOW rule
    assert (d.verdict, d.rule_id) == ("ALLOW", "reads-are-fine")


def test_trust_belongs_to_the_segment_not_the_bytes(kern: Kernel, tmp_path, tiny_dir, tiny_lm) -> None:
    page = b"Totally ordinary page text that happens to be returned twice."
    s1 = kern.session("acme")
    s1.append("user", "read the page")
    s1.admit("web_fetch", page)
    assert s1.authorize_tool_call("send_email", {"to": "x@y.example"}).verdict == "CONFIRM"
    s2 = kern.session("acme")
    s2.admit("calculator", page)  # identical bytes from a trusted tool elsewhere
    assert s2.authorize_tool_call("send_email", {"to": "x@y.example"}).verdict == "CONFIRM"  # unlisted
    d = s1.authorize_tool_call("send_email", {"to": "x@y.example"})
    assert (d.verdict, d.rule_id) == ("CONFIRM", "mail-after-untrusted")  # not laundered
    sid = s1.id
    kern.close()
    again = _open(tmp_path, tiny_dir, tiny_lm)
    try:
        d = again.session("acme", sid).authorize_tool_call("send_email", {"to": "x@y.example"})
        assert (d.verdict, d.rule_id) == ("CONFIRM", "mail-after-untrusted")
    finally:
        again.close()


def test_an_approval_is_remembered_for_the_same_call_and_provenance_only(kern: Kernel) -> None:
    s = kern.session("acme")
    s.append("user", "Please pay the bill in bill.txt.")
    s.admit("read_file", BILL)
    args = {"iban": "DE89370400440532013000", "amount": 1234.5}
    d = s.authorize_tool_call("pay_bill", args)
    assert d.verdict == "CONFIRM"
    s.remember_approval(s.approval_key("pay_bill", args, d), 7)
    again = s.authorize_tool_call("pay_bill", args)
    assert (again.verdict, again.approved_by) == ("ALLOW", 7)
    assert kern.audit.entry(again.audit_index).event.approved_by == 7
    other = s.authorize_tool_call("pay_bill", {"iban": "DE89370400440532013000", "amount": 99})
    assert other.verdict == "CONFIRM" and other.approved_by is None
    assert kern.session("acme").authorize_tool_call("pay_bill", args).approved_by is None  # another session


@pytest.mark.parametrize(("source", "host"), [
    ("www.example.com/page", "www.example.com"),
    ("docs.corp.example", "docs.corp.example"),
    ("example.com:8080/x?q=1", "example.com"),
    ("https://Docs.Example.com/x", "docs.example.com"),
    ("mailto:a@b.example", UNPARSABLE),
    ("evil.example@good.example/x", UNPARSABLE),
])
def test_host_only_sources_are_parsed(source: str, host: str) -> None:
    assert source_host(source) == host


def test_a_host_only_source_earns_its_tool_entry_trust(kern: Kernel) -> None:
    s = kern.session("acme")
    s.append("user", "check the wiki")
    s.admit("intranet", b"The wiki says hello.", source="wiki.corp.example/start")
    assert s.authorize_tool_call("send_email", {"to": "a@b.example"}).rule_id == "unlisted"  # nothing untrusted


def test_a_trusted_source_wins_however_many_untrusted_texts_hold_the_value() -> None:
    many = [ContextText(f"s{i}", f"sha256:{i:064x}", "untrusted", "wire it to acct-77 now") for i in range(80)]
    late_user_turn = ContextText("s_user", None, "trusted", "my account is acct-77")
    [trace] = trace_arguments({"account": "acct-77"}, [*many, late_user_turn])
    assert trace.origin == "trusted" and trace.sources[0].segment == "s_user"


def test_a_key_the_model_invented_is_logged_by_position_not_by_name(kern: Kernel) -> None:
    s = kern.session("acme")
    s.append("user", "hello")
    d = s.authorize_tool_call("read_file", {"path": "notes.txt", "my password is hunter2": "x y z"})
    paths = [a.path for a in kern.audit.entry(d.audit_index).event.arguments]
    assert paths == ["path", "@1"]


def test_writing_the_database_cannot_raise_a_segments_trust(kern: Kernel, tmp_path, tiny_dir, tiny_lm) -> None:
    """Someone who can write the state database but holds no key rewrites an untrusted
    segment's recorded producer to a trusted tool: the producer's MAC fails, and the segment
    is judged unknown (untrusted) after the reload, not trusted."""
    from sqlalchemy import text

    s = kern.session("acme")
    s.append("user", "read the page")
    s.admit("web_fetch", b"A page anyone could have written.")
    sid = s.id
    engine = kern.services.state.engine
    kern.close()
    with engine.begin() as db:
        changed = db.execute(text("UPDATE fak_segments SET tool = 'calculator' WHERE tool = 'web_fetch'"))
        assert changed.rowcount == 1
    again = _open(tmp_path, tiny_dir, tiny_lm)
    try:
        d = again.session("acme", sid).authorize_tool_call("send_email", {"to": "x@y.example"})
        assert (d.verdict, d.rule_id) == ("CONFIRM", "mail-after-untrusted")
    finally:
        again.close()


def test_findings_reach_the_client_over_http_and_the_sdk_notice_says_where(kern: Kernel) -> None:
    """A person asked to confirm sees why: the API's decision names the argument, its origin and
    the span of the file it was found in, and the SDK's notice (what a framework shows instead
    of running the call) says the same."""
    from fak.api.server import serve
    from fak.sdk import Client
    from fak.sdk.gate import call_notice

    with serve(kern) as live, Client(live.url, live.key("acme", "agent"), trust_env=False) as c:
        s = c.create_session("bills")
        s.append("user", "Please pay the bill in bill.txt.")
        s.admit("read_file", BILL)
        d = s.authorize_tool_call("pay_bill", {"iban": "DE89370400440532013000", "amount": 1234.5})
    assert d.verdict == "CONFIRM"
    [finding] = d.findings
    src = finding.sources[0]
    assert (finding.argument, finding.origin, src.trust) == ("iban", "untrusted", "untrusted")
    assert BILL.decode()[src.start:src.end] == "DE89 3704 0044 0532 0130 00"
    notice = call_notice(d)
    assert f"argument iban: untrusted, found in {src.ref} chars {src.start}-{src.end}" in notice


def test_clearing_a_producer_in_the_database_does_not_fall_back_on_the_refs_record(
        kern: Kernel, tmp_path, tiny_dir, tiny_lm) -> None:
    """Clearing a segment's producer (and its MAC) and rewriting the ref's record (which has no
    MAC) to a trusted tool: the segment reads as unknown, untrusted."""
    from sqlalchemy import text

    s = kern.session("acme")
    s.append("user", "read the page")
    s.admit("web_fetch", b"Another page anyone could have written.")
    sid, engine = s.id, kern.services.state.engine
    kern.close()
    with engine.begin() as db:
        db.execute(text("UPDATE fak_segments SET tool = NULL, producer_mac = NULL WHERE tool = 'web_fetch'"))
        db.execute(text("UPDATE fak_refs SET tool = 'calculator' WHERE tool = 'web_fetch'"))
    again = _open(tmp_path, tiny_dir, tiny_lm)
    try:
        d = again.session("acme", sid).authorize_tool_call("send_email", {"to": "x@y.example"})
        assert (d.verdict, d.rule_id) == ("CONFIRM", "mail-after-untrusted")
    finally:
        again.close()


def test_a_materialised_piece_keeps_its_producer_across_a_restart(kern: Kernel, tmp_path, tiny_dir, tiny_lm) -> None:
    """A working set places a calculator's result by digest: its segment records the ref's
    producer (with its MAC), so after a restart it is still trusted, not unknown."""
    first = kern.session("acme")
    ref = first.admit("calculator", b"2 + 2 = 4").ref
    s = kern.session("acme")
    s.append("user", "use the sum")
    s.materialise({"refs": [ref]})
    sid = s.id
    assert s.authorize_tool_call("send_email", {"to": "x@y.example"}).rule_id == "unlisted"
    kern.close()
    again = _open(tmp_path, tiny_dir, tiny_lm)
    try:
        assert again.session("acme", sid).authorize_tool_call("send_email", {"to": "x@y.example"}).rule_id == "unlisted"
    finally:
        again.close()
