"""Every ``fak …`` command the docs show parses with the real ``fak`` parser (``fak.cli.build_parser``,
the one ``fak`` itself runs; nothing is executed), so a newcomer copying a line from README.md or
docs/*.md never meets "unrecognized arguments".

Extraction rules:

- Fenced code blocks whose info string is ``sh``, ``shell``, ``bash``, ``zsh``, ``console`` or empty
  (a backtick fence whose info string holds a backtick is not a fence: CommonMark). In them, a
  ``$ `` prompt is dropped, a line ending in ``\\`` continues on the next, ``#`` comments are
  dropped (shell rules, ``shlex``), and the line is cut into commands at ``|``, ``||``, ``&&``,
  ``;`` and ``&``; redirections (``>``, ``>>``, ``<``, ``2>``, ``&>``) and their targets, and
  descriptor copies (``2>&1``), are dropped. A command is one whose first word, after ``NAME=value``
  assignments, is ``fak``; a ``$(fak …)`` inside another command's word is a command too. These are
  full command lines: they must parse as they stand, required arguments included.
- Inline code spans outside fenced blocks that start with ``fak `` (or are ``fak``). A span names
  a command and its flags in prose (``fak keys create --expires 30d``), so it may leave out
  required arguments and positionals (the parser it meets has none required); it may not name a
  command, flag or choice that does not exist, nor give a positional that does not exist.
- Placeholders are substituted by a sample value: ``<tenant>``, and upper-case words such as
  ``T``, ``N``, ``FILE``, ``HOST:PORT`` or ``TOOLS.json``. An option's placeholder gets the first
  of the option's choices, or the first of ``1``, ``30d``, ``x`` its type accepts; a positional's
  gets ``1``. Optional groups ``[…]`` are kept (brackets dropped: the full form must parse);
  ``[flags]`` / ``[options]`` and ``…`` / ``...`` are dropped. Alternatives ``a|b|c`` in a word,
  and ``put/get/head`` (lower-case words joined by ``/``) in a span, are each tried.
- ``NOT_COMMANDS`` lists the few lines and spans that begin with ``fak `` and are not commands.

A line that does not parse fails the test naming the file, its line, the command and argparse's
message.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

from fak.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
SHELL_INFO = {"", "sh", "shell", "bash", "zsh", "console"}
FENCE_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)[^`]*$")
SPAN = re.compile(r"(?<!`)`(fak(?: [^`]*)?)`(?!`)")
PLACEHOLDER = re.compile(r"^(<[^<>]+>|[A-Z][A-Z0-9_]*(?:[.:][A-Za-z0-9_]+)*)$")
ALTERNATIVES = re.compile(r"^[a-z][a-z-]*(?:/[a-z][a-z-]*)+$")
SEPARATORS = {"|", "||", "&&", ";", "&"}
REDIRECTS = re.compile(r"^(\d?(>>?|<)|&>>?)$")
# a redirection the lexer would cut into words: a descriptor copy (``2>&1``, ``>&2``: no target word) and
# the descriptor number written against its operator (the ``2`` of ``2> err.log``)
FD_COPY = re.compile(r"(?<![\w-])\d*[<>]&\d+")
FD_NUMBER = re.compile(r"(?<![\w-])\d+(?=>>?|<)")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
DROPPED = {"…", "...", "[flags]", "[options]", "[...]", "[…]"}
# the first line of the audit log's signed tenant statement (docs/audit.md, docs/api.md): a string, not a command
NOT_COMMANDS = {"fak tenant-audit-export statement/v2"}


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _fenced_and_prose(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(line number, line) of the shell fences' lines (continuations joined) and of the prose."""
    shell: list[tuple[int, str]] = []
    prose: list[tuple[int, str]] = []
    fence: str | None = None
    keep = False
    pending: tuple[int, str] | None = None
    for n, line in enumerate(text.splitlines(), 1):
        if fence is None:
            m = FENCE_OPEN.match(line)
            if m:
                fence, keep = m.group(1), m.group(2).lower() in SHELL_INFO
            else:
                prose.append((n, line))
            continue
        if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
            fence = None
            continue
        if not keep:
            continue
        start, body = pending if pending else (n, "")
        body += line
        if body.endswith("\\"):
            pending = (start, body[:-1] + " ")
            continue
        pending = None
        shell.append((start, body))
    return shell, prose


def _commands_in_shell(line: str) -> Iterator[list[str]]:
    stripped = line.lstrip()
    if stripped.startswith("$ "):
        stripped = stripped[2:]
    if not re.search(r"(^|[\s;|&(])fak\b", stripped):
        return
    stripped = FD_NUMBER.sub("", FD_COPY.sub("", stripped))
    lexer = shlex.shlex(stripped, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words = list(lexer)
    command: list[str] = []
    skip_next = False
    for word in [*words, ";"]:
        if skip_next:
            skip_next = False
            continue
        if REDIRECTS.match(word):
            skip_next = True
            continue
        for inner in re.findall(r"\$\((fak [^)]*)\)", word):
            yield from _commands_in_shell(inner)
        if word in SEPARATORS:
            while command and ASSIGNMENT.match(command[0]):
                command.pop(0)
            if command and command[0] == "fak":
                yield command[1:]
            command = []
            continue
        command.append(word)


def _expand(words: list[str], span: bool) -> Iterator[list[str]]:
    """The command's forms: optional groups kept, fillers dropped, each alternative tried."""
    choices: list[list[str]] = []
    for word in words:
        if word in DROPPED:
            continue
        word = word.removesuffix("…").removesuffix("...")
        word = word.lstrip("[").rstrip("]") if word not in ("[", "]") else ""
        if not word:
            continue
        if "|" in word:
            choices.append(word.split("|"))
        elif span and ALTERNATIVES.match(word):
            choices.append(word.split("/"))
        else:
            choices.append([word])
    for form in itertools.product(*choices):
        yield list(form)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _sample(action: argparse.Action) -> str:
    if action.choices is not None:
        return str(next(iter(action.choices)))
    for candidate in ("1", "30d", "x"):
        try:
            if callable(action.type):
                action.type(candidate)
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            continue
        return candidate
    return "x"


def _substituted(root: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``argv`` with each placeholder replaced by a value the parser takes where it stands."""
    parser, out, wants = root, [], None
    for word in argv:
        if wants is not None:
            out.append(_sample(wants) if PLACEHOLDER.match(word) else word)
            wants = None
            continue
        if word.startswith("-") and word != "-":
            action = parser._option_string_actions.get(word.split("=", 1)[0])
            if action is not None and action.nargs != 0 and "=" not in word:
                wants = action
            out.append(word)
            continue
        sub = _subcommands(parser)
        if word in sub:
            parser = sub[word]
        out.append("1" if PLACEHOLDER.match(word) else word)
    return out


def _lenient(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The parser (changed in place) with no argument required, for spans that only name a command."""
    for action in parser._actions:
        action.required = False
        if action.option_strings == [] and action.nargs is None and not isinstance(action, argparse._SubParsersAction):
            action.nargs = "?"
    for sub in _subcommands(parser).values():
        _lenient(sub)
    return parser


def _parse_error(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exc.code}"
    return None


def _doc_commands() -> Iterator[tuple[str, int, str, list[str], bool]]:
    """(file, line, the command as written, its words after ``fak``, whether it is a span)."""
    for doc in _docs():
        name = str(doc.relative_to(ROOT))
        shell, prose = _fenced_and_prose(doc.read_text(encoding="utf-8"))
        for n, line in shell:
            for words in _commands_in_shell(line):
                if " ".join(["fak", *words]) not in NOT_COMMANDS:
                    yield name, n, "fak " + " ".join(words), words, False
        for n, line in prose:
            for span in SPAN.findall(line):
                if span.strip() in NOT_COMMANDS:
                    continue
                yield name, n, span, span.split()[1:], True


def test_extraction_finds_the_commands() -> None:
    found = {(name, cmd) for name, _, cmd, _, _ in _doc_commands()}
    assert ("README.md", "fak serve --port 8077") in found  # a fenced line, comment and `&` dropped
    assert ("docs/audit.md", "fak audit pubkey") in found  # from "$(fak audit pubkey)"
    shell = [words for line in ("fak serve --port 8077 > log 2>&1 &", "fak info 2> err.log", "fak info &> log",
                                "fak info >&2")
             for words in _commands_in_shell(line)]
    assert shell == [["serve", "--port", "8077"], ["info"], ["info"], ["info"]]  # redirections dropped
    assert any(name == "docs/console.md" and cmd.startswith("fak keys create") for name, cmd in found)
    assert len(found) > 100


def test_rules_reject_what_the_parser_rejects() -> None:
    strict, lenient = build_parser(), _lenient(build_parser())
    assert _parse_error(strict, _substituted(strict, ["keys", "create", "<tenant>", "auditor"]))
    assert _parse_error(lenient, _substituted(lenient, ["keys", "create", "<tenant>", "auditor"]))
    assert _parse_error(strict, ["keys", "create", "--expires", "30d"])  # required flags missing
    assert _parse_error(lenient, ["keys", "create", "--expires", "30d"]) is None  # a span may leave them out
    assert _parse_error(lenient, ["serve", "--no-such-flag"])
    assert _parse_error(strict, _substituted(strict, ["keys", "create", "--tenant", "T", "--role", "R"])) is None


def test_every_documented_command_parses() -> None:
    strict, lenient = build_parser(), _lenient(build_parser())
    failures = []
    for name, n, written, words, span in _doc_commands():
        parser = lenient if span else strict
        for form in _expand(words, span):
            error = _parse_error(parser, _substituted(parser, form))
            if error:
                failures.append(f"{name}:{n}: `{written}`: {error}")
                break
    assert failures == [], "documented commands the fak parser rejects:\n" + "\n".join(failures)
