"""The README's command and settings tables, written from the real parsers and ``Settings``
so that they cannot drift from the code (``tests/repo/test_cli_reference.py`` fails when the
README's copy differs; ``make docs`` or ``python -m fak.cli_reference --write README.md``
writes them again).

Each table lives between two markers in the README (``<!-- fak:commands -->`` …
``<!-- /fak:commands -->``); everything outside them is hand-written."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

# the options every command spells alike, said once above the table instead of in every row
SHARED = {"--config": "settings", "--database-url": "database"}
# defaults that depend on the machine the table is written on: what they are, in words
MACHINE_DEFAULTS = {
    "data_dir": "`~/.local/share/fak`",
    "cache_dir": "`$XDG_CACHE_HOME/fak`, else `~/.cache/fak`",
}
DOC_LINK = re.compile(r"\bdocs/([a-z0-9-]+\.md)")


# --- commands ------------------------------------------------------------------------------
def commands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    """Every runnable command: its words (``cas put``), its parser and its one-line help."""
    yield from _walk(parser, "", "")


def _walk(parser: argparse.ArgumentParser, words: str, help: str) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001
    if not subs:
        yield words.strip(), parser, help
        return
    helps = {a.dest: (str(a.help or ""), str(a.metavar or a.dest)) for a in subs[0]._choices_actions}  # noqa: SLF001
    seen: set[int] = set()
    for name, child in subs[0].choices.items():
        if id(child) in seen:  # an alias is the same parser
            continue
        seen.add(id(child))
        text, shown = helps.get(name, ("", name))
        alias = shown[len(name):].strip(" ()")
        yield from _walk(child, f"{words} {name}", text + (f" (alias `{alias}`)" if alias else ""))


def _option(action: argparse.Action, placeholder: bool = False) -> str:
    """``--flag VALUE``; a choice's values listed (``{a,b}``), or with ``placeholder`` named
    (``--role ROLE``: the form a command line in the docs takes)."""
    flag = max(action.option_strings, key=len)
    if action.nargs == 0:
        return flag
    if action.metavar is not None:
        value = str(action.metavar)
    elif action.choices is not None and not placeholder:
        value = "{" + ",".join(str(c) for c in action.choices) + "}"
    else:
        value = action.dest.upper()
    return f"{flag} {value}"


def _positional(action: argparse.Action) -> str:
    name = str(action.metavar or action.dest.upper())
    return {"?": f"[{name}]", "+": f"{name}…", "*": f"[{name}…]"}.get(str(action.nargs), name)


def command_row(words: str, parser: argparse.ArgumentParser, help: str) -> str:
    shown = [a for a in parser._actions  # noqa: SLF001
             if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]  # noqa: SLF001
    usage = [f"fak {words}"]
    usage += [_positional(a) for a in shown if not a.option_strings]
    required = [a for a in shown if a.option_strings and a.required]
    usage += [_option(a, placeholder=True) for a in required]
    optional = [_option(a) for a in shown if a.option_strings and not a.required
                and max(a.option_strings, key=len) not in SHARED]
    named = [f"`{a.dest.upper()}` one of " + ", ".join(f"`{c}`" for c in a.choices)
             for a in required if a.choices is not None and a.metavar is None]
    opts = "; ".join([*named, " ".join(f"`{o}`" for o in optional)] if optional else named)
    return f"| `{' '.join(usage)}` | {opts} | {_cell(help)} |"


def commands_table(parser: argparse.ArgumentParser) -> str:
    rows = list(commands(parser))
    without = [w for w, p, _ in rows if "--config" not in _flags(p)]
    database = [w for w, p, _ in rows if "--database-url" in _flags(p)]
    lines = [
        "Every command takes `--config FILE` (a settings file; `FAK_*` variables override it) except "
        + ", ".join(f"`{w}`" for w in without) + ", which read no settings. The commands that open the "
        "database without a server (" + ", ".join(f"`{w}`" for w in _grouped(database, [w for w, _, _ in rows]))
        + ") take `--database-url URL` too.",
        "",
        "| command | options | what it does |",
        "|---|---|---|",
    ]
    lines += [command_row(w, p, h) for w, p, h in rows]
    return "\n".join(lines)


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}  # noqa: SLF001


def _grouped(words: list[str], every: list[str]) -> list[str]:
    """``cas put``, ``cas get`` … as ``cas …`` when every action of the group is among ``words``."""
    groups: dict[str, list[str]] = {}
    for w in words:
        groups.setdefault(w.partition(" ")[0], []).append(w)
    out: list[str] = []
    for head, members in groups.items():
        whole = len(members) > 1 and len(members) == sum(1 for w in every if w.partition(" ")[0] == head)
        out += [f"{head} …"] if whole else members
    return out


# --- settings ------------------------------------------------------------------------------
def _default(name: str, field: FieldInfo) -> str:
    if name in MACHINE_DEFAULTS:
        return MACHINE_DEFAULTS[name]
    value: Any = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int) and name.endswith("_bytes"):
        for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if value >= size and value % size == 0:
                return f"{value // size} {unit}"
    if value in ([], {}, ()):
        return "none"
    return f"`{value}`"


def settings_table() -> str:
    from fak.settings import Settings

    lines = ["| variable | default | what |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        if not field.description:
            raise ValueError(f"setting {name} has no description: fak/settings.py must say what it is")
        lines.append(f"| `FAK_{name.upper()}` | {_default(name, field)} | {_cell(field.description)} |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    """A table cell: pipes escaped, the docs a text names linked."""
    return DOC_LINK.sub(r"[docs/\1](docs/\1)", text.replace("|", "\\|"))


# --- the README's copy -----------------------------------------------------------------------
def tables() -> dict[str, str]:
    from fak.cli import build_parser

    return {"commands": commands_table(build_parser()), "settings": settings_table()}


def rewrite(text: str, generated: dict[str, str]) -> str:
    """``text`` with each marked table replaced by its generated copy."""
    for name, table in generated.items():
        start, end = f"<!-- fak:{name} -->", f"<!-- /fak:{name} -->"
        if start not in text or end not in text:
            raise ValueError(f"the README has no {start} … {end} markers")
        before, rest = text.split(start, 1)
        _, after = rest.split(end, 1)
        text = f"{before}{start}\n{table}\n{end}{after}"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fak.cli_reference", description=__doc__)
    parser.add_argument("--write", metavar="FILE", default="README.md", help="the file whose tables to write "
                        "(default README.md)")
    path = Path(parser.parse_args(argv).write)
    before = path.read_text(encoding="utf-8")
    after = rewrite(before, tables())
    if after != before:
        path.write_text(after, encoding="utf-8")
    print(f"{path}: {'written' if after != before else 'already current'}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
