"""Tool classes: what a tool does to the world and which of its arguments route data or money,
read from its JSON schema, its call's arguments or its name (``tool_calls.from_schemas``,
docs/policy.md).

Why: the rules of ``examples/policies/agent.yaml`` name tools exactly (``send_email``,
``send_money``), so an agent whose tools are ``send_message``, ``pay_invoice`` or
``post_webpage`` gets no floor unless its operator writes a policy. ``classify`` reads a tool
as a person reading its schema would (a ``to`` field of a ``send`` tool is a recipient, an
``iban`` of a ``pay`` tool an account), and ``inferred_rules`` applies agent.yaml's rules to
those arguments, for that one tool. An unknown tool is a side effect (closed): one that acts
on the world is never silent. The operator corrects a classification with
``tool_calls.classes`` (``overrides``); every decision is one line of ``ToolClass.reasons``,
shown by ``fak policy explain-tools`` and kept in the decision's audit event.

The word lists below are the whole of the judgement; they are data, so a change is reviewed
as one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Literal

from fak.errors import InvalidInput
from fak.kernel.calls import tool_text
from fak.kernel.calls.tool_text import ToolSpec
from fak.policy.schema import (
    ArgOrigin,
    ArgsMatch,
    AttentionMatch,
    Endorsement,
    ToolCallRule,
    ToolClassEntry,
)
from fak.types import ClassBasis as Basis
from fak.types import RoutingKind as Kind
from fak.types import ToolEffect as Effect

__all__ = ["Effect", "Kind", "ToolClass", "classify", "inferred_rules", "number_paths", "spec_of", "words"]


# --- the tool's effect: the verb of its name (the first verb word), else of its description ---
# A name that reads the world: the call itself changes nothing (a URL it fetches may still carry
# data out in its query string: the url rule below).
READ_VERBS = frozenset({
    "get", "list", "search", "read", "fetch", "find", "lookup", "look", "query", "view", "show", "describe",
    "check", "count", "retrieve", "browse", "inspect", "preview", "peek", "summarize", "summarise",
    "explain", "calculate", "compute", "convert", "translate", "validate", "verify", "diff", "stat",
    "cat", "ls", "grep", "resolve", "parse", "scan", "scrape", "crawl", "visit", "navigate", "is", "has",
    "exists", "whois", "estimate", "compare", "analyze", "analyse", "recommend", "suggest", "poll",
})
# A name that acts: sends, pays, writes, runs, books. ``download`` writes a file.
SIDE_EFFECT_VERBS = frozenset({
    "send", "post", "create", "update", "delete", "remove", "write", "append", "pay", "transfer", "book",
    "reserve", "run", "execute", "exec", "share", "invite", "add", "move", "upload", "submit", "schedule",
    "reply", "forward", "cancel", "reschedule", "set", "change", "reset", "download", "put", "patch",
    "insert", "edit", "modify", "replace", "rename", "copy", "save", "store", "publish", "deploy", "push",
    "commit", "merge", "approve", "grant", "revoke", "assign", "close", "archive", "mark", "buy",
    "purchase", "checkout", "refund", "charge", "withdraw", "deposit", "dial", "notify", "tweet", "react",
    "follow", "unfollow", "subscribe", "unsubscribe", "block", "unblock", "ban", "kick", "mute", "kill", "stop",
    "start", "restart", "install", "uninstall", "enable", "disable", "drop", "truncate", "import", "export",
    "sign", "accept", "decline", "reject", "confirm", "join", "leave", "register", "login", "logout",
    "trigger", "dispatch", "emit", "broadcast", "fill", "click", "make", "perform", "process",
})
# Left out of both on purpose: words that are nouns as often as verbs (``message``, ``email``,
# ``text``, ``comment``, ``call``, ``order``, ``open``, ``select``, ``type``), so that a
# resource-first name (``gmail_message_get``) is read by its real verb; a name with no verb at
# all is a side effect anyway.

# Words of a description whose leading verb may say what the tool does ("Returns the weather ...").
# Not the short words a sentence is made of ("This is ...").
DESCRIPTION_READ_VERBS = (READ_VERBS - {"is", "has", "exists", "ls", "cat", "stat", "grep", "diff", "peek"}) | {"return"}
DESCRIPTION_WORDS = 8  # only the description's first words: later ones describe arguments, not the tool
# Words that join two verbs of one name ("search_and_delete"): a side-effect verb after one acts.
JOINERS = frozenset({"and", "then", "or"})
# The secret a person owns: a side-effect tool that names one always needs that person.
CREDENTIAL_WORDS = frozenset({"password", "passwd", "passphrase", "credential", "secret", "token", "apikey",
                              "mfa", "totp", "otp"})
CREDENTIAL_PAIRS = frozenset({("api", "key"), ("access", "key"), ("ssh", "key"), ("private", "key"),
                              ("secret", "key"), ("recovery", "code")})

# --- what the tool is about (its name and description): changes what an argument routes ---
PAYMENT_WORDS = frozenset({"pay", "payment", "payout", "transfer", "money", "invoice", "bill", "wire",
                           "transaction", "refund", "remit", "remittance", "payee", "beneficiary", "iban",
                           "bank", "banking", "sepa", "withdraw", "deposit", "venmo", "paypal", "zelle"})
RUN_WORDS = frozenset({"run", "execute", "exec", "shell", "bash", "sh", "zsh", "terminal", "eval", "cmd", "command",
                       "python", "powershell", "subprocess", "spawn", "script", "console", "repl"})
FILE_WORDS = frozenset({"file", "files", "filesystem", "fs", "dir", "directory", "folder", "disk", "storage",
                        "bucket", "object", "blob", "upload", "download", "copy", "move", "write", "save", "path"})
MAIL_WORDS = frozenset({"mail", "email", "gmail", "outlook", "inbox", "message", "invite", "invitation", "share",
                        "contact", "newsletter", "calendar", "event"})
FORM_WORDS = frozenset({"form", "http", "post", "request", "webhook", "submit", "api"})

# --- which arguments route: by property name (the whole name, else its last word, else another
# strong word of it), by JSON-schema ``format``, by the property's description ---
NAME_KINDS: dict[str, Kind] = {
    "to": "recipient", "cc": "recipient", "bcc": "recipient", "reply_to": "recipient",
    "chat_id": "channel", "phone_number": "phone", "account_number": "account", "routing_number": "account",
    "sort_code": "account", "card_number": "account", "credit_card": "account", "wallet_address": "account",
    "file_path": "path", "file_name": "path",
}
# Trailing words that only say how a thing is named: ``user_id`` is read as ``user``.
SUFFIXES = frozenset({"id", "ids", "name", "names", "number", "numbers", "list", "handle"})
WORD_KINDS: dict[str, Kind] = {
    "recipient": "recipient", "email": "recipient", "participant": "recipient", "attendee": "recipient",
    "invitee": "recipient", "guest": "recipient", "grantee": "recipient", "mailto": "recipient",
    "channel": "channel", "user": "channel", "username": "channel", "handle": "channel", "member": "channel",
    "conversation": "channel", "chat": "channel",
    "phone": "phone", "mobile": "phone", "tel": "phone", "telephone": "phone", "msisdn": "phone", "whatsapp": "phone",
    "url": "url", "uri": "url", "link": "url", "href": "url", "endpoint": "url", "webhook": "url", "callback": "url",
    "domain": "url", "host": "url", "hostname": "url", "website": "url",
    "iban": "account", "account": "account", "bic": "account", "swift": "account", "payee": "account",
    "beneficiary": "account", "wallet": "account",
    "amount": "amount", "price": "amount", "total": "amount", "sum": "amount", "cost": "amount", "fee": "amount",
    "path": "path", "file": "path", "filename": "path", "filepath": "path", "dir": "path", "directory": "path",
    "folder": "path",
    "command": "command", "cmd": "command", "script": "command", "shell": "command",
}
# Words that route only as the head (last word) of a name: ``to`` of ``reply_to``, not of
# ``time_to_live``; ``user`` of ``target_user``, not of ``user_agent``.
STRONG_WORDS = frozenset({"recipient", "email", "iban", "phone", "msisdn", "url", "uri", "webhook", "account",
                          "payee", "beneficiary", "channel", "path", "command", "cmd", "amount", "bic", "swift"})
# Names whose kind depends on the tool: a destination of a file tool is a path, of a payment an
# account (a payout's bank account), elsewhere a place (a flight's city) and no routing.
DESTINATION_WORDS = frozenset({"destination", "target", "dest"})
CONTEXT_KINDS: dict[str, tuple[tuple[str, Kind], ...]] = {
    # the word: (context, kind) pairs, first matching context wins
    "destination": (("payment", "account"), ("file", "path"), ("form", "url")),
    "target": (("payment", "account"), ("file", "path")),
    "dest": (("payment", "account"), ("file", "path")),
    "address": (("payment", "account"), ("mail", "recipient")),
    "action": (("form", "url"),),
    "value": (("payment", "amount"),),
    "card": (("payment", "account"),),
    "code": (("run", "command"),),
    "args": (("run", "command"),),
    "arguments": (("run", "command"),),
    "argv": (("run", "command"),),
    "input": (("run", "command"),),
    "program": (("run", "command"),),
}
# On a payment tool whoever receives is an account (agent.yaml's payee args: recipient, to, phone).
PAYMENT_RECEIVER: frozenset[Kind] = frozenset({"recipient", "phone", "channel"})
FORMAT_KINDS: dict[str, Kind] = {
    "email": "recipient", "idn-email": "recipient", "uri": "url", "url": "url", "iri": "url",
    "uri-reference": "url", "iri-reference": "url", "uri-template": "url", "hostname": "url",
    "idn-hostname": "url", "ipv4": "url", "ipv6": "url", "phone": "phone", "tel": "phone", "iban": "account",
}
# Words of a property's description that name what it holds (when its name says nothing).
DESCRIPTION_KINDS: dict[str, Kind] = {
    "email": "recipient", "recipient": "recipient", "iban": "account", "url": "url", "webhook": "url",
    "phone": "phone", "msisdn": "phone",
}
# Free text that carries data out (a body, a subject): traced for the entities it relays.
CONTENT_WORDS = frozenset({"body", "text", "message", "content", "html", "subject", "note", "description",
                           "comment", "caption", "markdown", "summary", "msg", "reply", "blocks", "post"})

# --- the inferred rules' excuses (mirrors examples/policies/agent.yaml) ---
# Replying to the parties of the message at hand is no new recipient: fields of a result of
# declared structure that name one.
PARTY_FIELDS = ["*sender", "*from", "*reply_to", "*author", "*organizer", "to", "*.to", "to.*", "*.to.*", "cc",
                "*.cc", "cc.*", "*.cc.*", "*participants.*", "*attendees.*"]
# ... but only in results of the tools whose records name parties (mail, calendar, chat), not a
# web page that returns {"from": ...}: names containing these words (any case).
PARTY_TOOL_WORDS = ("mail", "inbox", "message", "event", "calendar", "sms", "chat", "conversation")
# A party word this tool's own name holds is narrowed to read tools: these verbs before it.
PARTY_READ_VERBS = ("get", "list", "search", "read", "fetch", "find", "query", "view")
# The organisation's records (internal) vouch for a value only in the fields that name one. An
# item of a list of names is ``members.3`` (up to the 100th; a later one needs a person), never a
# field of a record in that list (``channels.0.topic``: whoever sets the topic writes it).
NAMING_FIELDS = ["*email", "*emails.[0-9]", "*emails.[0-9][0-9]", "*phone*", "*recipient", "*iban", "*account",
                 "*path", "*name", "*user", "*username", "*users.[0-9]", "*users.[0-9][0-9]", "*members.[0-9]",
                 "*members.[0-9][0-9]", "*channels.[0-9]", "*channels.[0-9][0-9]", "*sender", "*from", "*reply_to",
                 "to", "*.to", "to.*", "*.to.*", "cc.*", "*.cc.*", "*participants.*", "*attendees.*"]
PAYEE_FIELDS = ["*recipient", "*iban", "*account", "*payee", "*beneficiary", "*sender"]
# Steering (agent.yaml's *-endorsed-by-untrusted rules): the arguments of a side effect that pick
# or say something rather than route it: the content arguments, and these (a catalog choice, a
# title). A value untrusted text names in an instruction ("book Hotel X instead") needs a person.
CHOICE_ARGS = ["*name", "title", "summary", "subject", "hotel*", "restaurant*", "company", "flight*", "car*",
               "product*", "item*", "option", "sku", "*_id", "location"]

MAX_DEPTH = 8  # nesting of a schema or of arguments read for routing (deeper: not read)
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


@dataclass(frozen=True)
class ToolClass:
    """One tool as the inferred rules see it: its ``effect``, the arguments that route (path
    glob and kind), the free-text ``content`` arguments, what it was read from (``basis``;
    ``policy``: an operator's class applied) and why (``reasons``, one line per decision);
    ``choices``: the other string arguments (a hotel, a provider, a title: what steering picks)."""

    tool: str
    effect: Effect
    routing: tuple[tuple[str, Kind], ...]
    content: tuple[str, ...]
    basis: Basis
    reasons: tuple[str, ...]
    choices: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """JSON-able, for the decision event and ``fak policy explain-tools --json``."""
        return {"tool": self.tool, "effect": self.effect, "routing": dict(self.routing),
                "content": list(self.content), "choices": list(self.choices), "basis": self.basis,
                "reasons": list(self.reasons)}


def words(name: str) -> list[str]:
    """The lower-case words of a name as frameworks write them: ``send_message``,
    ``postMessage``, ``GMAIL_SEND_EMAIL``, ``gmail.send``, ``mcp__filesystem__write_file``."""
    return [w.lower() for w in _WORD.findall(name)]


def _singular(word: str, table: Mapping[str, Any] | frozenset[str]) -> str | None:
    """``word`` or its singular (``recipients``, ``addresses``, ``entries``) if ``table`` has it."""
    for form in (word, word[:-3] + "y" if word.endswith("ies") else "", word[:-2] if word.endswith("es") else "",
                 word[:-1] if word.endswith("s") else ""):
        if form and form in table:
            return form
    return None


def spec_of(tool: Mapping[str, Any]) -> ToolSpec:
    """A tool definition as clients send them: an OpenAI tool (``{"type": "function",
    "function": {...}}``), a bare function or Responses tool (``name``, ``description``,
    ``parameters``), an MCP tool (``inputSchema``) or an Anthropic one (``input_schema``)."""
    if not isinstance(tool, Mapping):
        raise InvalidInput(f"a tool is a JSON object, not {type(tool).__name__}")
    kind = tool.get("type", "function")
    fn = tool.get("function")
    if isinstance(fn, Mapping) and kind == "function":
        return tool_text.spec_of(dict(fn), "tool.function")
    if kind != "function" or fn is not None or not isinstance(tool.get("name"), str):
        raise InvalidInput(f"not a function tool (want an OpenAI tool, a function with name and parameters, or an "
                           f"MCP tool with name and inputSchema): keys {sorted(map(str, tool))[:8]}, "
                           f"type {str(kind)[:40]!r}")
    schema = next((tool[k] for k in ("parameters", "inputSchema", "input_schema") if k in tool), None)
    return tool_text.spec_of({"name": tool["name"], "description": tool.get("description"), "parameters": schema},
                             "tool")


@dataclass(frozen=True)
class _About:
    """What a tool is about, from its name and description: sets what some arguments route."""

    contexts: frozenset[str]

    @classmethod
    def of(cls, name_words: Sequence[str], description: str) -> _About:
        seen = set(name_words) | {w.lower() for w in re.findall(r"[A-Za-z]+", description)}
        found = {ctx for ctx, table in (("payment", PAYMENT_WORDS), ("run", RUN_WORDS), ("file", FILE_WORDS),
                                        ("mail", MAIL_WORDS), ("form", FORM_WORDS))
                 if any(_singular(w, table) for w in seen)}
        return cls(frozenset(found))


def _effect(name_words: Sequence[str], description: str) -> tuple[Effect, str]:
    """The first verb of the name decides; a side-effect verb after "and" acts too; a name with
    no verb is read by its description's leading verb; nothing known: a side effect (closed)."""
    for i, word in enumerate(name_words):
        if word in SIDE_EFFECT_VERBS:
            return "side_effect", f"effect side_effect: the name's verb {word!r}"
        if word in READ_VERBS:
            joined = [w for j, w in enumerate(name_words[i + 1:], i + 1)
                      if w in SIDE_EFFECT_VERBS and any(x in JOINERS for x in name_words[i + 1:j])]
            if joined:
                return "side_effect", f"effect side_effect: the name's verb {joined[0]!r} after {word!r}"
            return "read", f"effect read: the name's verb {word!r}"
    for word in (w.lower() for w in re.findall(r"[A-Za-z]+", description)[:DESCRIPTION_WORDS]):
        if _singular(word, SIDE_EFFECT_VERBS):
            return "side_effect", f"effect side_effect: the description's verb {word!r}"
        if _singular(word, DESCRIPTION_READ_VERBS):
            return "read", f"effect read: the description's verb {word!r}"
    return "side_effect", "effect side_effect: no known verb in the name or description (an unknown tool acts)"


def _credential(name_words: Sequence[str]) -> bool:
    pairs = set(zip(name_words, name_words[1:], strict=False))
    return any(_singular(w, CREDENTIAL_WORDS) for w in name_words) or bool(pairs & CREDENTIAL_PAIRS)


def _kind_of_name(name: str, about: _About) -> tuple[Kind, str] | None:
    """What an argument routes by its name alone (``to``, ``recipient_email``, ``payment_iban``,
    ``user_id``): the whole name, else its head (last) word, else a strong word before it."""
    parts = words(name)
    while len(parts) > 1 and parts[-1] in SUFFIXES:
        parts = parts[:-1]  # ``user_id``, ``channel_name``: what is named is the word before
    if not parts:
        return None
    kind: Kind | None = NAME_KINDS.get("_".join(parts))
    why = "name"
    if kind is None and _singular(parts[-1], CONTENT_WORDS):
        return None  # ``email_subject``, ``file_content``: text, not a destination
    if kind is None and (ctx_word := _singular(parts[-1], CONTEXT_KINDS)):
        hit = next(((c, k) for c, k in CONTEXT_KINDS[ctx_word] if c in about.contexts), None)
        if hit is not None:
            kind, why = hit[1], f"name on a {hit[0]} tool"
        parts = parts[:-1]  # elsewhere it names nothing: ``email_address`` is read by ``email``
        if kind is None and not parts:
            return None
    if kind is None:
        for i, word in enumerate(reversed(parts)):
            table_word = _singular(word, WORD_KINDS)
            if table_word and (i == 0 or table_word in STRONG_WORDS):
                kind = WORD_KINDS[table_word]
                break
    if kind is None:
        return None
    if "payment" in about.contexts and kind in PAYMENT_RECEIVER:
        return "account", f"{why} on a payment tool: who is paid"
    return kind, why


def _members(schema: Mapping[str, Any], *keys: str) -> list[Mapping[str, Any]]:
    """The object members of a schema's ``anyOf``/``oneOf``/``allOf`` (a malformed one: none)."""
    found: list[Mapping[str, Any]] = []
    for key in keys:
        value = schema.get(key)
        if isinstance(value, list):
            found += [m for m in value if isinstance(m, Mapping)]
    return found


def _formats(schema: Mapping[str, Any]) -> list[str]:
    """The ``format`` of a property, of its array items and of its ``anyOf``/``oneOf`` members."""
    subs = [schema, *_members(schema, "anyOf", "oneOf")]
    subs += [items for sub in subs if isinstance(items := sub.get("items"), Mapping)]
    return [sub["format"].lower() for sub in subs if isinstance(sub.get("format"), str)]


def _types(schema: Mapping[str, Any]) -> set[str]:
    """The JSON types a property may have (its own and its members'), ``null`` aside."""
    found: set[str] = set()
    for sub in (schema, *_members(schema, "anyOf", "oneOf")):
        declared = sub.get("type")
        found |= {t for t in (declared if isinstance(declared, list) else [declared]) if isinstance(t, str)}
    return found - {"null"}


def _kind_of_property(name: str, schema: Mapping[str, Any], about: _About) -> tuple[Kind, str] | None:
    """A schema property's kind: its ``format`` first (the schema says so), then its name, then
    the words of its description. A boolean routes nothing (it carries no provenance)."""
    if _types(schema) == {"boolean"}:
        return None
    for fmt in _formats(schema):
        if fmt in FORMAT_KINDS:
            kind = FORMAT_KINDS[fmt]
            if "payment" in about.contexts and kind in PAYMENT_RECEIVER:
                return "account", f"format {fmt} on a payment tool"
            return kind, f"format {fmt}"
    found = _kind_of_name(name, about)
    if found is not None:
        return found
    description = schema.get("description")
    if isinstance(description, str):
        description = re.sub(r"\be-mail", "email", description, flags=re.IGNORECASE)
        for word in (w.lower() for w in re.findall(r"[A-Za-z]+", description)):
            key = _singular(word, DESCRIPTION_KINDS)
            if key:
                kind = DESCRIPTION_KINDS[key]
                if "payment" in about.contexts and kind in PAYMENT_RECEIVER:
                    kind = "account"
                return kind, f"description word {word!r}"
    return None


def _is_content(name: str) -> bool:
    parts = words(name)
    return bool(parts) and _singular(parts[-1], CONTENT_WORDS) is not None


class _Routes:
    """Routing and content paths found so far, in order, without repeats."""

    def __init__(self) -> None:
        self.routing: dict[str, Kind] = {}
        self.content: list[str] = []
        self.choices: list[str] = []
        self.reasons: list[str] = []
        self.declared: set[str] = set()  # a schema's top-level properties

    def route(self, path: str, kind: Kind, why: str) -> None:
        if path not in self.routing:
            self.routing[path] = kind
            self.reasons.append(f"{path}: {kind} ({why})")

    def text(self, path: str) -> None:
        if path not in self.content:
            self.content.append(path)

    def choice(self, path: str) -> None:
        if path not in self.choices:
            self.choices.append(path)


def _from_schema(parameters: Mapping[str, Any], about: _About) -> _Routes | None:
    """Routes of a JSON schema's properties, into nested objects (``payment.iban``) and arrays
    (``attendees.*.email``; an array of strings is its own path: ``to`` covers ``to.0``), local
    ``$ref``s resolved. None: the schema declares no property at all."""
    routes = _Routes()
    declared = False

    def resolve(schema: Any, depth: int) -> Mapping[str, Any]:
        while isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str) and depth < MAX_DEPTH:
            ref: str = schema["$ref"]
            target: Any = parameters
            if not ref.startswith("#/"):
                return {}
            for key in ref[2:].split("/"):
                target = target.get(key.replace("~1", "/").replace("~0", "~")) if isinstance(target, Mapping) else None
            schema, depth = target, depth + 1
        return schema if isinstance(schema, Mapping) else {}

    def properties(schema: Mapping[str, Any], depth: int) -> dict[str, Mapping[str, Any]]:
        found: dict[str, Mapping[str, Any]] = {}
        if depth < MAX_DEPTH:
            for member in _members(schema, "allOf", "anyOf", "oneOf"):
                found.update(properties(resolve(member, depth), depth + 1))
        props = schema.get("properties")
        if isinstance(props, Mapping):
            found.update({str(k): resolve(v, depth) for k, v in props.items()})
        return found

    def walk(schema: Mapping[str, Any], prefix: str, depth: int) -> bool:
        nonlocal declared
        added = False
        for name, sub in properties(schema, depth).items():
            declared = declared or not prefix
            if not prefix:
                routes.declared.add(name)
            path = f"{prefix}.{name}" if prefix else name
            before = len(routes.routing)
            if depth < MAX_DEPTH:
                walk(sub, path, depth + 1)
                items = resolve(sub.get("items"), depth)
                if items:
                    walk(items, f"{path}.*", depth + 1)
            inner = len(routes.routing) > before
            kind = _kind_of_property(name, sub, about)
            if kind is not None and not inner:
                routes.route(path, kind[0], kind[1])
            elif kind is None and not inner and _is_content(name) and _types(sub) <= {"string", "array", "object"}:
                routes.text(path)
            elif kind is None and not inner and "string" in _types(sub):
                routes.choice(path)
            added = added or inner or kind is not None
        return added

    walk(resolve(parameters, 0), "", 0)
    return routes if declared else None


def _from_arguments(args: Mapping[str, Any], about: _About) -> _Routes:
    """Routes of a call's own argument names (no schema), into nested objects and lists of
    objects as for a schema. Names only, never values: the class of a tool must not change
    with what a call (or an attacker steering it) writes."""
    routes = _Routes()

    def walk(value: Mapping[str, Any], prefix: str, depth: int) -> None:
        for key, sub in value.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            nested = [x for x in (sub if isinstance(sub, list) else [sub])[:64] if isinstance(x, Mapping)]
            before = len(routes.routing)
            if depth < MAX_DEPTH:
                for item in nested:
                    walk(item, f"{path}.*" if isinstance(sub, list) else path, depth + 1)
            if len(routes.routing) > before:
                continue
            kind = None if isinstance(sub, bool) else _kind_of_name(str(key), about)
            if kind is not None:
                routes.route(path, kind[0], f"argument {kind[1]}")
            elif isinstance(sub, str) and _is_content(str(key)):
                routes.text(path)
            elif isinstance(sub, str):
                routes.choice(path)

    walk(args, "", 0)
    return routes


def _parsed(args: Any) -> Any:
    if isinstance(args, str | bytes):
        try:
            return json.loads(args)
        except (ValueError, RecursionError):
            return None
    return args


def classify(tool: str, spec: ToolSpec | None = None, args: Any = None,
             overrides: Sequence[ToolClassEntry] = ()) -> ToolClass:
    """Read a tool's class from its schema (``spec``; arguments the call writes beyond it by their
    names), else from a call's arguments (``args``: a mapping or its JSON text), else from its
    name alone; then the first of ``overrides`` whose ``tools`` globs match the name replaces
    what it sets."""
    name_words = words(tool)
    description = spec.description if spec is not None else ""
    about = _About.of(name_words, description)
    effect, why = _effect(name_words, description)
    reasons = [why]
    basis: Basis = "name"
    routes: _Routes | None = _from_schema(spec.parameters, about) if spec is not None else None
    parsed = _parsed(args)
    if routes is not None:
        basis = "schema"
        if isinstance(parsed, Mapping):
            _add_undeclared(routes, {k: v for k, v in parsed.items() if str(k) not in routes.declared}, about)
    else:
        if isinstance(parsed, Mapping) and parsed:
            routes, basis = _from_arguments(parsed, about), "arguments"
        elif spec is not None:
            routes, basis = _Routes(), "schema"  # a schema without properties: nothing routes
            reasons.append("the schema declares no argument")
        else:
            routes = _Routes()
            reasons.append("no schema and no arguments: the name alone")
    if effect == "side_effect" and _credential(name_words):
        reasons.append("a credential: every change needs the person who owns it")
    reasons += routes.reasons
    if routes.content:
        reasons.append(f"content: {', '.join(routes.content)}")
    routing = tuple(routes.routing.items())
    content = tuple(routes.content)
    entry = next((e for e in overrides if any(fnmatchcase(tool, g) for g in e.tools)), None)
    if entry is not None:
        set_here = [f for f in ("effect", "routing", "content") if getattr(entry, f) is not None]
        effect = entry.effect or effect
        routing = tuple(entry.routing.items()) if entry.routing is not None else routing
        content = tuple(entry.content) if entry.content is not None else content
        basis = "policy"
        reasons.append(f"policy class {entry.tools}: sets {', '.join(set_here) or 'nothing'}")
    return ToolClass(tool, effect, routing, content, basis, tuple(reasons), tuple(routes.choices))


def _add_undeclared(routes: _Routes, extra: Mapping[str, Any], about: _About) -> None:
    """Arguments a call writes beyond its schema's properties are classified by their names: a
    model steered into adding ``bcc`` to a tool whose schema has none must not pass unread."""
    if not extra:
        return
    more = _from_arguments(extra, about)
    for path, kind in more.routing.items():
        routes.route(path, kind, "an argument the schema does not declare")
    for path in more.content:
        routes.text(path)
    for path in more.choices:
        routes.choice(path)


def number_paths(cls: ToolClass) -> tuple[str, ...]:
    """Argument path globs whose numbers are traced however few their digits: amounts and every
    routing argument (an account, a file id of 13, a channel number); ``tool_calls.min_number_digits``
    spares only the other small numbers (an event id, a party size)."""
    return tuple(path for path, _ in cls.routing)


def inferred_rules(cls: ToolClass) -> list[ToolCallRule]:
    """The rules of examples/policies/agent.yaml for this one tool's classified arguments (ids
    ``inferred:…``): a routing argument from untrusted content or from nowhere needs a person;
    everything else is allowed (a read, a side effect with nothing to trace). The authorizer
    keeps them per tool and schema."""
    tool = cls.tool
    if cls.effect == "read":
        rules = [ToolCallRule(id="inferred:read", tools=[tool], verdict="ALLOW",
                              description="a read: allowed whatever is in attention")]
        urls = [p for p, k in cls.routing if k == "url"]
        if urls:
            rules.append(_confirm(cls, "url-composed", "a URL found in no text of the context (a query string may "
                                  "carry the user's data)", _match(urls, ["generated"])))
        return rules
    rules = [ToolCallRule(id="inferred:side-effect", tools=[tool], verdict="ALLOW",
                          description="a side effect: allowed unless a rule below holds it")]
    if _credential(words(tool)):
        rules.append(ToolCallRule(id="inferred:credential-change", tools=[tool], verdict="CONFIRM",
                                  description="a credential is never changed without the person who owns it"))

    def of(*kinds: Kind) -> list[str]:
        return [p for p, k in cls.routing if k in kinds]

    rules.append(ToolCallRule(
        id="inferred:endorsed-by-untrusted", tools=[tool], verdict="CONFIRM",
        when_endorsed=Endorsement(args=list(dict.fromkeys([*cls.content, *cls.choices, *CHOICE_ARGS])),
                                  by=["untrusted"]),
        description="a choice or a text that untrusted content told the agent to make"))

    parties, accounts, paths, urls, commands = (of("recipient", "channel", "phone"), of("account"), of("path"),
                                                of("url"), of("command"))
    if parties:
        rules += [
            _confirm(cls, "recipient-not-from-user", "a recipient, channel or number the user did not name",
                     _match(parties, ["untrusted", "generated"], except_fields=PARTY_FIELDS,
                            except_tools=_party_tools(tool))),
            _confirm(cls, "recipient-from-internal-free-text", "a recipient found in a record's free text, not "
                     "in a field that names one", _match(parties, ["internal"], except_fields=NAMING_FIELDS)),
        ]
        if cls.content:
            rules.append(_confirm(
                cls, "untrusted-routing-in-body", "an account, link or number found only in untrusted content, "
                "sent on to a recipient the user did not name", _match(parties, ["internal", "untrusted", "generated"]),
                _match(cls.content, ["untrusted"], entities=True, entities_only=True)))
    if accounts:
        rules += [
            _confirm(cls, "payee-not-from-user", "a payee account the user did not give",
                     _match(accounts, ["untrusted", "generated"])),
            _confirm(cls, "payee-from-record-text", "a payee found in a record's free text, not among the accounts "
                     "paid before", _match(accounts, ["internal"], except_fields=PAYEE_FIELDS)),
        ]
    if paths:
        rules += [
            _confirm(cls, "path-not-from-user", "a file to change named only by untrusted content or by nobody",
                     _match(paths, ["untrusted", "generated"])),
            _confirm(cls, "path-from-internal-free-text", "a path found in a record's free text",
                     _match(paths, ["internal"], except_fields=NAMING_FIELDS)),
        ]
    if urls:
        rules.append(_confirm(cls, "destination-not-from-user", "data sent to an address the user did not give",
                              _match(urls, ["untrusted", "generated"])))
    if commands:
        rules += [
            _confirm(cls, "command-from-untrusted", "a command copied from untrusted text",
                     _match(commands, ["untrusted"]), verdict="DENY"),
            _confirm(cls, "command-value-from-tool-output", "a command, or a URL, address or number in one, that "
                     "only tool output holds", _match(commands, ["internal", "untrusted"], entities=True)),
            _confirm(cls, "command-composed-after-untrusted", "a command the user did not write, composed while "
                     "untrusted text is in attention", _match(commands, ["internal", "generated"]),
                     attention=AttentionMatch(trust=["untrusted"])),
        ]
    return rules


def _party_tools(tool: str) -> list[str]:
    """Globs of the tools whose structured results name real parties (mail, calendar, chat), any
    case; a word this tool's own name holds is narrowed to read verbs before it, so this tool's
    own results (an echo of what it sent) excuse nothing."""
    found: list[str] = []
    for word in PARTY_TOOL_WORDS:
        for form, verb_forms in ((word, (str.lower,)), (word.capitalize(), (str.lower, str.capitalize)),
                                 (word.upper(), (str.upper,))):
            glob = f"*{form}*"
            if not fnmatchcase(tool, glob):
                found.append(glob)
                continue
            found += [g for v in PARTY_READ_VERBS for case in verb_forms
                      if not fnmatchcase(tool, g := f"*{case(v)}*{form}*")]
    return found


def _confirm(cls: ToolClass, rule: str, description: str, *matches: ArgsMatch,
             verdict: Literal["CONFIRM", "DENY"] = "CONFIRM", attention: AttentionMatch | None = None) -> ToolCallRule:
    return ToolCallRule(id=f"inferred:{rule}", tools=[cls.tool], when_args_from=list(matches),
                        when_in_attention=attention, verdict=verdict, description=description)


def _match(args: Sequence[str], trust: Iterable[ArgOrigin], **extra: Any) -> ArgsMatch:
    return ArgsMatch(args=list(args), trust=list(trust), **extra)
