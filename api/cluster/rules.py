"""The routing logic of a replicated deployment (``fak serve --replicas N``), apart from Ray:
which replica a request goes to, and why.

A replica is a whole kernel (its model, sessions, KV and prefix caches) sharing the
governance plane (PostgreSQL) with the others. A session lives on one replica, so every
request that names a session must reach that replica; a request that starts a conversation
is best placed where its prompt's prefix is already cached. This module decides, from what
the request says and what the replicas report; ``fak.api.cluster`` does the Ray side
(handles, forwarding, streaming). Kept free of Ray so every rule is unit-tested alone.

- ``classify``: a request's ``Route`` (session-scoped, a placement, ``/metrics``, anything else);
- ``prompt_messages``: the chat messages a placement scores against the replicas' prefix caches;
- ``AffinityCache``: (credential digest, session) -> replica, bounded, learned from where a
  session was created and from the replicas' 421 ``session_elsewhere`` answers;
- ``choose`` / ``place``: the replica with the most prefix hit tokens, ties by least load then
  name (or by load only, or at random: the benchmark's baselines);
- ``merge_metrics``: the replicas' Prometheus texts as one, each sample labelled ``replica``.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

REPLICA_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")  # the grammar of Settings.replica
SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # fak.wire.SESSION_ID
RESPONSE_ID = re.compile(r"^resp_[A-Za-z0-9]{1,60}$")  # fak.wire_responses.RESPONSE_ID
SESSION_PATH = re.compile(r"^/v1/sessions/([^/]+)(?:/.*)?$")
REPLICA_HEADER = "x-fak-replica"  # names the replica that answered (tests and the benchmark read it)
ELSEWHERE_STATUS = 421  # a replica's answer for a session another replica owns (``replica`` member)
BALANCE_SLACK = 4  # prefix placement: load over the least loaded replica's at which hits stop counting (choose)
AFFINITY_ENTRIES = 65_536  # (credential, session) pairs the router remembers, least recently used first out
TEXT_PARTS = frozenset({"text", "input_text", "output_text"})

Message = dict[str, str]  # {"role": ..., "content": ...}: what Kernel.prefix_hit_tokens scores


class Kind(StrEnum):
    HEALTH = "health"  # /healthz: the router answers
    METRICS = "metrics"  # /metrics: every replica's, merged
    SESSION = "session"  # names an existing session: its owner, wherever the affinity cache or a 421 says
    PLACE = "place"  # may start a conversation: its owner if it has one, else placed by the replicas' scores
    ANY = "any"  # anything else: any replica (least busy, then round robin)
    EACH = "each"  # a held tool call's decision: replicas in turn until one answers other than 404 (any does: the state database holds the calls)


class Placement(StrEnum):
    """How a new conversation's replica is picked (``fak serve --placement``)."""

    PREFIX = "prefix"  # the most prefix-cache hit tokens, ties by least load then name
    LOAD = "load"  # least load, then name (the benchmark's baseline)
    RANDOM = "random"  # uniformly at random (the other baseline)


@dataclass(frozen=True)
class Route:
    kind: Kind
    session_id: str | None = None  # the session the request names (SESSION; PLACE when it names one)
    response_id: str | None = None  # a Responses request's previous_response_id (its chain's session)
    messages: tuple[Message, ...] = ()  # the prompt to score (PLACE)


@dataclass(frozen=True)
class Score:
    """One replica's answer to ``score``: whether the key is valid, which replica owns the
    named session (None: no such session), the prompt's prefix-cache hit tokens, its load."""

    authorized: bool
    owner: str | None = None
    hit_tokens: int = 0
    load: int = 0


def parse_json(body: bytes) -> object | None:
    """The body as JSON, or None (not JSON: the replica answers the client's error itself)."""
    if not body:
        return None
    try:
        parsed: object = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        return None
    return parsed


def _session_id(value: object) -> str | None:
    return value if isinstance(value, str) and SESSION_ID.match(value) else None


HELD_CALL_PATH = re.compile(r"^/v1/tool-calls/[^/]+/(approve|reject)$")


def classify(method: str, path: str, body: object | None) -> Route:
    """The route of a request; ``body`` is its parsed JSON (``parse_json``) or None. Why the
    body matters: the chat door names its session (``fak_session``) and the Responses door
    its chain (``previous_response_id``) in the body, not the path."""
    method = method.upper()
    if path == "/healthz":
        return Route(Kind.HEALTH)
    if path == "/metrics":
        return Route(Kind.METRICS)
    fields = body if isinstance(body, dict) else {}
    if m := SESSION_PATH.match(path):
        sid = _session_id(m.group(1))
        if sid is None:  # not a session id: the replica answers 404/422 itself
            return Route(Kind.ANY)
        messages = prompt_messages(method, path, body) if method == "POST" else ()
        return Route(Kind.SESSION, session_id=sid, messages=messages)
    if method != "POST":
        return Route(Kind.ANY)
    if HELD_CALL_PATH.match(path):  # any replica decides (the state database holds held calls); 404s are tried on
        return Route(Kind.EACH)
    if path == "/v1/sessions":
        return Route(Kind.PLACE, session_id=_session_id(fields.get("id")))
    if path == "/v1/chat/completions":
        return Route(Kind.PLACE, session_id=_session_id(fields.get("fak_session")),
                     messages=prompt_messages(method, path, body))
    if path == "/v1/responses":
        prev = fields.get("previous_response_id")
        response_id = prev if isinstance(prev, str) and RESPONSE_ID.match(prev) else None
        return Route(Kind.PLACE, response_id=response_id, messages=prompt_messages(method, path, body))
    return Route(Kind.ANY)


def _text(content: object) -> str | None:
    """A message's content as text: a string, or a list of text parts joined (other parts,
    images and the like, are left out; they do not render as prefix text)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(p["text"] for p in content
                       if isinstance(p, dict) and p.get("type", "text") in TEXT_PARTS and isinstance(p.get("text"), str))
    return None


def _message(role: object, content: object) -> Message | None:
    text = _text(content)
    return {"role": role, "content": text} if isinstance(role, str) and text is not None else None


def prompt_messages(method: str, path: str, body: object | None) -> tuple[Message, ...]:
    """The prompt a request puts in front of the model, as role + text messages, for scoring
    against the replicas' prefix caches. The leading messages are what matters (a cache hit is
    a shared prefix), so a Responses input stops at its first item that is not a message.
    Malformed bodies give no messages (the replica answers the client's error)."""
    if method.upper() != "POST" or not isinstance(body, dict):
        return ()
    out: list[Message] = []
    if path == "/v1/chat/completions":
        raw = body.get("messages")
        for item in raw if isinstance(raw, list) else ():
            m = _message(item.get("role"), item.get("content")) if isinstance(item, dict) else None
            if m is None:
                break
            out.append(m)
    elif path == "/v1/responses":
        instructions = body.get("instructions")
        if isinstance(instructions, str) and not isinstance(body.get("previous_response_id"), str):
            out.append({"role": "system", "content": instructions})
        raw = body.get("input")
        items = [{"type": "message", "role": "user", "content": raw}] if isinstance(raw, str) else raw
        for item in items if isinstance(items, list) else ():
            if not isinstance(item, dict) or item.get("type", "message") != "message":
                break
            m = _message(item.get("role"), item.get("content"))
            if m is None:
                break
            out.append(m)
    elif SESSION_PATH.match(path) and path.endswith("/messages"):
        m = _message(body.get("role"), body.get("content"))
        if m is not None:
            out.append(m)
    return tuple(out)


def credential(headers: Iterable[tuple[str, str]]) -> str | None:
    """The API key a request presents, as the app reads it (``Authorization: Bearer``, else
    ``X-API-Key``)."""
    auth = key = None
    for name, value in headers:
        lower = name.lower()
        if lower == "authorization" and auth is None:
            auth = value
        elif lower == "x-api-key" and key is None:
            key = value
    if auth is not None and auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return key or None


def credential_digest(key: str | None) -> str:
    """The affinity cache's key for a credential: its SHA-256, so the router's memory holds no
    key. Sessions are per tenant and a tenant's keys share them; keying by credential only
    costs a cache miss (then a 421) when another key of the tenant names the session."""
    return hashlib.sha256((key or "").encode()).hexdigest()


def response_handle(response_id: str) -> str:
    """The affinity cache's name for a Responses chain continued from ``response_id`` (a
    session id never holds ':', so it never collides with one)."""
    return "response:" + response_id


class AffinityCache:
    """(credential digest, session or response handle) -> the replica holding it; bounded
    (least recently used out first). A hint, never the truth: a stale entry costs one 421,
    whose ``replica`` member replaces it."""

    def __init__(self, capacity: int = AFFINITY_ENTRIES) -> None:
        if capacity < 1:
            raise ValueError("capacity: at least 1")
        self._capacity = capacity
        self._entries: OrderedDict[tuple[str, str], str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, digest: str, handle: str) -> str | None:
        name = self._entries.get((digest, handle))
        if name is not None:
            self._entries.move_to_end((digest, handle))
        return name

    def put(self, digest: str, handle: str, replica: str) -> None:
        self._entries[(digest, handle)] = replica
        self._entries.move_to_end((digest, handle))
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def discard(self, digest: str, handle: str) -> None:
        self._entries.pop((digest, handle), None)

    def drop_replica(self, replica: str) -> int:
        """Forget every entry naming ``replica`` (it died: its sessions are placed anew)."""
        stale = [k for k, v in self._entries.items() if v == replica]
        for k in stale:
            del self._entries[k]
        return len(stale)


def elsewhere(body: bytes) -> str | None:
    """The owning replica a 421 ``session_elsewhere`` problem names, or None."""
    parsed = parse_json(body)
    name = parsed.get("replica") if isinstance(parsed, dict) else None
    return name if isinstance(name, str) and REPLICA_NAME.match(name) else None


def choose(scores: Mapping[str, Score], slack: int | None = None, prompt_key: str = "") -> str:
    """The replica with the most prefix hit tokens; ties (zero hits included) by least load,
    then by rendezvous hashing of ``prompt_key`` (the prompt's leading text: a new prefix goes
    to the same replica from any router, and different prefixes spread instead of all going to
    the first name), then by name, so the same scores always give the same replica.

    ``slack``: only replicas whose load is within ``slack`` of the least loaded compete on
    hits. Why: hits alone pile every conversation on the replica that warmed the popular
    prefixes first (measured: nine concurrent chats over three prefixes all on one replica of
    three); past the slack, a busy replica's cache is worth less than an idle one's cores, and
    the prefix gets warmed there too. None: hits alone decide."""
    if not scores:
        raise ValueError("no replica to choose from")
    pool = scores
    if slack is not None:
        least = min(s.load for s in scores.values())
        pool = {n: s for n, s in scores.items() if s.load <= least + slack}
    return min(pool, key=lambda n: (-pool[n].hit_tokens, pool[n].load, _rendezvous(prompt_key, n), n))


def _rendezvous(key: str, replica: str) -> bytes:
    """Highest-random-weight order of ``replica`` for ``key`` (smaller sorts first); all equal
    for an empty key."""
    if not key:
        return b""
    return hashlib.blake2b(f"{key}\x00{replica}".encode(), digest_size=8).digest()


def prompt_key(messages: Sequence[Message], chars: int = 512) -> str:
    """The leading text of a prompt that rendezvous hashing places by (its first messages)."""
    return "\x1e".join(f"{m.get('role', '')}:{m.get('content', '')}" for m in messages)[:chars]


def least_loaded(loads: Mapping[str, int]) -> str:
    if not loads:
        raise ValueError("no replica to choose from")
    return min(loads, key=lambda n: (loads[n], n))


def place(scores: Mapping[str, Score], mode: Placement, rng: random.Random | None = None,
          slack: int | None = None, key: str = "") -> str:
    """Where a placement request goes, from the replicas that answered ``score``: the owner
    one of them names (the session exists), else by ``mode`` (``slack``: see ``choose``)."""
    if not scores:
        raise ValueError("no replica to choose from")
    for s in scores.values():
        if s.owner is not None and s.owner in scores:
            return s.owner
    if mode is Placement.RANDOM:
        return (rng or random).choice(sorted(scores))
    if mode is Placement.LOAD:
        return least_loaded({n: s.load for n, s in scores.items()})
    return choose(scores, slack, key)


# --- /metrics across replicas ------------------------------------------------------------
_NAME_END = re.compile(r"[^a-zA-Z0-9_:]")
_HAS_REPLICA = re.compile(r'(?:^|,)\s*replica\s*=\s*"')


def _labelled(line: str, replica: str) -> str:
    """A sample line with ``replica="<name>"`` first among its labels (kept when it has one)."""
    end = _NAME_END.search(line)
    if end is None:
        return line
    i = end.start()
    label = f'replica="{replica}"'
    if line[i] == "{":
        close = line.find("}", i)  # label values escape neither '{' nor '}' specially; a value may hold '}'
        inner = line[i + 1:close] if close != -1 else ""
        if _HAS_REPLICA.search(inner):
            return line
        sep = "," if line[i + 1:i + 2] != "}" else ""
        return f"{line[:i + 1]}{label}{sep}{line[i + 1:]}"
    return f"{line[:i]}{{{label}}}{line[i:]}"


def _family(sample: str) -> str:
    end = _NAME_END.search(sample)
    return sample[:end.start()] if end is not None else sample


def merge_metrics(texts: Mapping[str, str] | Sequence[tuple[str, str]]) -> str:
    """Each replica's Prometheus text (exposition format 0.0.4) as one text: every sample gets
    a ``replica`` label, each family's ``# HELP`` and ``# TYPE`` appear once, and a family's
    samples from every replica stay together (the format wants a family in one block)."""
    pairs = list(texts.items()) if isinstance(texts, Mapping) else list(texts)
    order: list[str] = []
    meta: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}

    def family(name: str) -> str:
        if name not in meta:
            order.append(name)
            meta[name], samples[name] = [], []
        return name

    for replica, text in pairs:
        current: str | None = None
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("#"):
                parts = line.split(None, 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    current = family(parts[2])
                    if not any(m.split(None, 3)[1] == parts[1] for m in meta[current]):
                        meta[current].append(line)
                continue
            name = _family(line)
            # a sample belongs to the family declared above it (histogram _bucket, counter _total ...)
            target = current if current is not None and name.startswith(current) else family(name)
            samples[target].append(_labelled(line, replica))
    out: list[str] = []
    for name in order:
        out += meta[name]
        out += samples[name]
    return "\n".join(out) + "\n" if out else ""
