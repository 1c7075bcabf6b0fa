"""Synthetic agent traces with the five shift patterns of the position-independent
caching literature, on realistic text:

* documents: the docstrings of Python standard-library modules and their public
  functions and classes (what a retriever over technical docs returns); they ship
  with the interpreter, so nothing is downloaded and a Python version fixes them;
* tool schemas: OpenAI-style function definitions written for this benchmark;
* tool outputs: JSON results (search hits, file listings, SQL rows) made from the
  documents' sentences with a seeded generator.

A trace is a list of requests; a request is the full prompt an agent sends (its
messages, each split into the pieces the assembler knows: a header, a document, a
schema), served in a fresh session as a stateless API call would be.

    agent_meta     a per-request metadata header of varying length before a long shared body
    sysvar         one system variable (the time, a user) changes deep in the system prompt
    compact        a growing conversation whose oldest turns are dropped (history compaction)
    rerank         retrieved documents selected and reordered per question
    tool_variants  the tool list's order and subset change per request
"""

from __future__ import annotations

import importlib
import inspect
import json
import random
import re
from dataclasses import dataclass, field

PATTERNS = ("agent_meta", "sysvar", "compact", "rerank", "tool_variants")

_MODULES = (
    "json", "subprocess", "argparse", "logging", "csv", "heapq", "textwrap", "shutil", "statistics",
    "sqlite3", "zipfile", "base64", "hashlib", "urllib.parse", "http.client", "email.message",
    "smtplib", "ftplib", "socket", "ssl", "threading", "asyncio", "itertools", "re", "difflib",
    "typing", "contextlib", "tempfile", "uuid", "functools",
)


@dataclass
class Message:
    role: str
    pieces: list[str]  # the regions of its content, in order

    @property
    def text(self) -> str:
        return "".join(self.pieces)


@dataclass
class Request:
    messages: list[Message]
    tags: dict[str, str] = field(default_factory=dict)


# --- text sources ------------------------------------------------------------------------
def documents(max_chars: int = 1100) -> list[tuple[str, str]]:
    """(title, text) per standard-library module: its docstring and its members', cut at a
    paragraph boundary near ``max_chars``."""
    out = []
    for name in _MODULES:
        mod = importlib.import_module(name)
        parts = [inspect.getdoc(mod) or ""]
        for attr in sorted(dir(mod)):
            obj = getattr(mod, attr)
            if attr.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if getattr(obj, "__module__", None) != mod.__name__:
                continue
            doc = inspect.getdoc(obj)
            if doc:
                parts.append(f"{attr}: {doc}")
        text = ""
        for para in "\n\n".join(p for p in parts if p).split("\n\n"):
            if len(text) + len(para) > max_chars and len(text) > max_chars // 2:
                break
            text += para + "\n\n"
        out.append((f"Python {name} module documentation", text.strip()))
    return out


TOOLS: list[dict] = [
    {"name": "search_web", "description": "Search the public web and return the top results with title, URL and snippet.",
     "parameters": {"query": "string: what to search for", "max_results": "integer 1-20, default 5",
                    "freshness": "one of day, week, month, any"}},
    {"name": "read_file", "description": "Read a text file from the user's workspace and return its content.",
     "parameters": {"path": "string: path relative to the workspace root", "encoding": "string, default utf-8",
                    "max_bytes": "integer: stop after this many bytes"}},
    {"name": "write_file", "description": "Create or overwrite a file in the workspace. Fails if the path escapes it.",
     "parameters": {"path": "string", "content": "string", "append": "boolean, default false"}},
    {"name": "list_directory", "description": "List the entries of a workspace directory with sizes and kinds.",
     "parameters": {"path": "string", "recursive": "boolean", "pattern": "glob pattern, default *"}},
    {"name": "send_email", "description": "Send an email from the user's account. Requires confirmation for new recipients.",
     "parameters": {"to": "list of addresses", "subject": "string", "body": "string", "cc": "list of addresses"}},
    {"name": "create_calendar_event", "description": "Add an event to the user's calendar and invite attendees.",
     "parameters": {"title": "string", "start": "ISO 8601 datetime", "end": "ISO 8601 datetime",
                    "attendees": "list of addresses", "location": "string"}},
    {"name": "sql_query", "description": "Run a read-only SQL query against the analytics warehouse.",
     "parameters": {"query": "SQL SELECT statement", "timeout_s": "integer, default 30", "limit": "integer"}},
    {"name": "http_request", "description": "Make an HTTP request to an allow-listed internal service.",
     "parameters": {"method": "GET, POST, PUT or DELETE", "url": "string", "headers": "object", "body": "string"}},
    {"name": "run_python", "description": "Execute a Python snippet in a sandbox with no network and return stdout.",
     "parameters": {"code": "string", "timeout_s": "integer, default 10"}},
    {"name": "get_weather", "description": "Current weather and a three-day forecast for a place.",
     "parameters": {"location": "city name or lat,lon", "units": "metric or imperial"}},
    {"name": "translate", "description": "Translate text between languages, keeping formatting.",
     "parameters": {"text": "string", "source": "language code or auto", "target": "language code"}},
    {"name": "create_ticket", "description": "Open an issue in the team's tracker with labels and an assignee.",
     "parameters": {"title": "string", "body": "string", "labels": "list of strings", "assignee": "username"}},
]

INSTRUCTIONS = (
    "You are an operations assistant for a software team. Use the tools when they help; "
    "never invent tool results. Quote file paths exactly. Ask before sending messages to "
    "people outside the team. Keep answers short and cite the documents you used.\n"
)

QUESTIONS = [
    "How do I parse command-line options with subcommands?",
    "Which function should I use to run a process and capture its output?",
    "Explain how to compare two sequences and show the differences.",
    "What is the safest way to create a temporary directory?",
    "How do I serialise an object to JSON with sorted keys?",
    "Summarise the thread-safety guarantees described here.",
    "How can I send an email over TLS?",
    "What does the documentation say about timeouts?",
    "Give me an example of a context manager from these docs.",
    "Which of these modules deals with compressed archives?",
]


def schema_text(tool: dict) -> str:
    return json.dumps({"type": "function", "function": tool}, indent=1) + "\n"


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if len(s.strip()) > 20]


def tool_output(rng: random.Random, docs: list[tuple[str, str]]) -> tuple[str, str]:
    """(tool name, JSON result) of a plausible call."""
    kind = rng.choice(["search_web", "list_directory", "sql_query"])
    if kind == "search_web":
        hits = []
        for _ in range(rng.randint(3, 5)):
            title, text = rng.choice(docs)
            hits.append({"title": title, "url": f"https://docs.example.org/{title.split()[1]}.html",
                         "snippet": rng.choice(_sentences(text) or [text[:200]])})
        return kind, json.dumps({"results": hits}, indent=1)
    if kind == "list_directory":
        names = ["README.md", "pyproject.toml", "src", "tests", "docs", "Makefile", "setup.cfg", "notes.txt"]
        entries = [{"name": n, "kind": "dir" if "." not in n else "file", "size": rng.randint(100, 90000)}
                   for n in rng.sample(names, rng.randint(4, len(names)))]
        return kind, json.dumps({"path": ".", "entries": entries}, indent=1)
    rows = [{"day": f"2026-10-{d:02d}", "requests": rng.randint(1000, 9000), "errors": rng.randint(0, 90)}
            for d in range(1, rng.randint(6, 14))]
    return kind, json.dumps({"columns": ["day", "requests", "errors"], "rows": rows}, indent=1)


# --- patterns ----------------------------------------------------------------------------
def agent_meta(n: int, rng: random.Random, docs: list[tuple[str, str]]) -> list[Request]:
    bodies = []
    for _ in range(4):
        tools = rng.sample(TOOLS, 5)
        chosen = rng.sample(docs, 2)
        bodies.append([INSTRUCTIONS] + [schema_text(t) for t in tools] + [f"# {t}\n{x}\n" for t, x in chosen])
    out = []
    for i in range(n):
        extra = [f"x-trace-{j}: {rng.getrandbits(64):016x}\n" for j in range(rng.randint(0, 14))]
        header = (f"request_id: req_{rng.getrandbits(48):012x}\ntimestamp: 2026-11-{1 + i % 28:02d}T"
                  f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z\nuser: u{rng.randint(1, 500)}\n"
                  f"locale: {rng.choice(['en-GB', 'en-US', 'de-DE', 'fr-FR'])}\n" + "".join(extra) + "\n")
        body = bodies[i % len(bodies)]
        out.append(Request([Message("system", [header, *body]),
                            Message("user", [rng.choice(QUESTIONS)])], {"body": str(i % len(bodies))}))
    return out


def sysvar(n: int, rng: random.Random, docs: list[tuple[str, str]]) -> list[Request]:
    tools = [schema_text(t) for t in TOOLS[:7]]
    after = [f"# {t}\n{x}\n" for t, x in rng.sample(docs, 2)]
    out = []
    for i in range(n):
        var = (f"Current time: 2026-11-{1 + i % 28:02d} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} UTC. "
               f"Signed-in user: {rng.choice(['ana', 'bo', 'chidi', 'dmitri', 'eun-ji'])}{rng.randint(1, 99)}.\n")
        out.append(Request([Message("system", [INSTRUCTIONS, *tools, var, *after]),
                            Message("user", [rng.choice(QUESTIONS)])]))
    return out


def compact(n: int, rng: random.Random, docs: list[tuple[str, str]], budget_chars: int = 6000) -> list[Request]:
    system = Message("system", [INSTRUCTIONS] + [schema_text(t) for t in TOOLS[:4]])
    turns: list[Message] = []
    out = []
    summaries = 0
    for _ in range(n):
        tool, result = tool_output(rng, docs)
        turns += [Message("user", [rng.choice(QUESTIONS)]),
                  Message("assistant", [f"I'll call {tool} to find out."]),
                  Message("tool", [result])]
        while sum(len(m.text) for m in turns) > budget_chars:  # compaction: drop the oldest exchange
            turns = turns[3:]
            summaries += 1
        head = [Message("system", [f"Summary of {summaries} earlier exchanges: the user asked about the "
                                   f"Python standard library and the assistant looked things up.\n"])]
        out.append(Request([system, *(head if summaries else []), *turns], {"dropped": str(summaries)}))
    return out


def rerank(n: int, rng: random.Random, docs: list[tuple[str, str]]) -> list[Request]:
    pool = rng.sample(docs, 10)
    out = []
    for _ in range(n):
        picked = rng.sample(pool, 4)
        pieces = ["Answer from these retrieved documents only.\n\n"] + [f"# {t}\n{x}\n\n" for t, x in picked]
        out.append(Request([Message("system", [INSTRUCTIONS]),
                            Message("user", [*pieces, "Question: " + rng.choice(QUESTIONS)])]))
    return out


def tool_variants(n: int, rng: random.Random, docs: list[tuple[str, str]]) -> list[Request]:
    guide = [f"# {t}\n{x}\n" for t, x in rng.sample(docs, 1)]
    out = []
    for _ in range(n):
        tools = rng.sample(TOOLS, rng.randint(9, len(TOOLS)))
        out.append(Request([Message("system", [INSTRUCTIONS, *(schema_text(t) for t in tools), *guide]),
                            Message("user", [rng.choice(QUESTIONS)])]))
    return out


def trace(pattern: str, n: int = 80, seed: int = 0) -> list[Request]:
    if pattern not in PATTERNS:
        raise ValueError(f"pattern must be one of {PATTERNS}, not {pattern!r}")
    rng = random.Random(f"{pattern}/{seed}")
    return globals()[pattern](n, rng, documents())
