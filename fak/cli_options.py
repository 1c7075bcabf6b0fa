"""The options every ``fak`` command spells the same way: ``--config`` wherever a command reads
settings, ``--database-url`` wherever it opens the database without a server. Each layer's
``cli`` module adds them from here, so their names and help cannot drift apart."""

from __future__ import annotations

import argparse

CONFIG_HELP = "settings file, TOML or YAML (default: $FAK_CONFIG); FAK_* variables override it"
MODEL_HELP = "GGUF file or HF folder (default: the settings' model_path, else SmolLM2-135M)"
POLICY_HELP = "policy file or directory (default: the settings' policy_path, else the packaged policy)"
DATABASE_URL_HELP = "SQLAlchemy database URL (overrides database_url / FAK_DATABASE_URL; default: the data dir's fak.db)"


def add_config(parser: argparse.ArgumentParser) -> None:
    """``--config FILE``: the settings this command reads (``fak.settings.config_file_in_force``
    makes it the file of every settings read while the command runs)."""
    parser.add_argument("--config", metavar="FILE", help=CONFIG_HELP)


def add_database_url(parser: argparse.ArgumentParser) -> None:
    """``--database-url URL`` (read as ``args.url``); ``--url``, its former name, still works."""
    parser.add_argument("--database-url", dest="url", metavar="URL", help=DATABASE_URL_HELP)
    parser.add_argument("--url", dest="url", help=argparse.SUPPRESS)
