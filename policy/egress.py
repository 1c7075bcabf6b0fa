"""The deployment's judge allow-lists, as the policy layer names them: ``fak.egress`` (the
shared ground, since ``Settings`` validates ``judge_egress`` and ``judge_key_envs`` with it),
re-exported so that ``fak.policy.egress`` keeps working."""

from __future__ import annotations

from fak.egress import (
    CLOSED,
    SERVER_PREFIX,
    Destination,
    JudgeEgress,
    check_key_env,
    origin_of,
    parse_destination,
)

__all__ = ["CLOSED", "SERVER_PREFIX", "Destination", "JudgeEgress", "check_key_env", "origin_of", "parse_destination"]
