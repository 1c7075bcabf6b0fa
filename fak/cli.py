"""The ``fak`` command. Each layer contributes its subcommands through a
``register(subparsers)`` function in its own ``cli`` module; heavy imports
(torch, the database) happen inside the handlers, so ``fak policy check``
does not pay for loading a model."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from fak.errors import FakError

# Modules that may contribute subcommands; a layer that does not exist yet is skipped.
LAYER_CLIS = ("fak.kernel.model.cli", "fak.kernel.cli", "fak.cas.cli", "fak.policy.cli", "fak.audit.cli",
              "fak.audit.witness_cli", "fak.api.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fak", description="agent-runtime security kernel")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in LAYER_CLIS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args) or 0)
    except FakError as exc:
        print(f"fak: error: {exc}", file=sys.stderr)
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
