"""The ``fak`` command. Each layer contributes its subcommands through a
``register(subparsers)`` function in its own ``cli`` module; heavy imports
(torch, the database) happen inside the handlers, so ``fak policy check``
does not pay for loading a model."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from contextlib import AbstractContextManager, nullcontext

from fak.errors import FakError

# Modules that may contribute subcommands; a layer that does not exist yet is skipped. The policy
# layer's come before the kernel's, which adds ``fak policy explain-tools`` to them.
LAYER_CLIS = ("fak.kernel.model.cli", "fak.policy.cli", "fak.kernel.cli", "fak.cas.cli", "fak.audit.cli",
              "fak.audit.witness_cli", "fak.api.cli", "fak.api.mcp_cli")

# What the `server` extra installs (pyproject.toml), by import name: a command that misses one
# of these runs in a client-only install (`pip install fak`) and says how to get them.
SERVER_MODULES = frozenset({"torch", "numpy", "safetensors", "gguf", "tokenizers", "jinja2", "blake3",
                            "pydantic_settings", "yaml", "sqlalchemy", "alembic", "fastapi", "starlette",
                            "uvicorn", "prometheus_client", "rich", "tqdm"})


INSTALL_SERVER = "the base install is the client only: pip install 'fak[server]'"


class Parser(argparse.ArgumentParser):
    """The ``fak`` parser; ``missing`` names a server dependency that kept a layer's commands out."""

    missing: str | None = None
    commands: frozenset[str] = frozenset()


def _server_module(exc: ModuleNotFoundError) -> bool:
    return (exc.name or "").split(".")[0] in SERVER_MODULES


def build_parser() -> Parser:
    parser = Parser(prog="fak", description="agent-runtime security kernel")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in LAYER_CLIS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            if not _server_module(exc):
                raise
            parser.missing = parser.missing or exc.name
            continue
        module.register(sub)
    _capital_placeholders(parser)
    parser.commands = frozenset(sub.choices)
    if parser.missing:
        parser.epilog = f"The kernel and server commands need their dependencies; {INSTALL_SERVER}."
    return parser


def _config_file(path: str | None) -> AbstractContextManager[object]:
    """The command's ``--config`` in force while it runs (the settings module only when one is
    given: a client-only install has none)."""
    if path is None:
        return nullcontext()
    from fak.settings import config_file_in_force

    return config_file_in_force(path)


def _capital_placeholders(parser: argparse.ArgumentParser) -> None:
    """Every command's positionals shown as the docs write them, ``fak forget REF`` (argparse
    would print the destination's lower-case name), across every layer's subcommands."""
    for action in parser._actions:  # noqa: SLF001 - argparse keeps its actions there, no accessor
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for child in set(action.choices.values()):
                _capital_placeholders(child)
        elif not action.option_strings and action.metavar is None:
            action.metavar = action.dest.upper()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if parser.missing and argv and not argv[0].startswith("-") and argv[0] not in parser.commands:
        print(f"fak: error: `fak {argv[0]}` needs the kernel and server dependencies (no module named "
              f"{parser.missing!r}); {INSTALL_SERVER}", file=sys.stderr)
        return 1
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        with _config_file(getattr(args, "config", None)):
            return int(handler(args) or 0)
    except FakError as exc:
        print(f"fak: error: {exc}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:
        if not _server_module(exc):
            raise
        print(f"fak: error: `fak {args.command}` needs the kernel and server dependencies (no module named "
              f"{exc.name!r}); {INSTALL_SERVER}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (``fak gate --jsonl … | head``): stop quietly, as Unix tools do;
        # stdout is pointed at /dev/null so the interpreter's final flush does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
