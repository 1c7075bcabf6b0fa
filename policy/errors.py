"""Policy errors. Every message names the file, line and column so an operator
can fix a policy without guessing which of several files is wrong."""

from __future__ import annotations

from dataclasses import dataclass

from fak.errors import FakError


@dataclass(frozen=True)
class Located:
    """One problem at one place in one policy file (line and column are 1-based)."""

    source: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}:{self.column}: {self.message}"


class PolicyError(FakError):
    """A policy that cannot be loaded; ``problems`` holds every located error."""

    code = "policy_invalid"
    status = 400

    def __init__(self, problems: list[Located]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))
