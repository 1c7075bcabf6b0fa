"""Error base class: anything raised as a FakError is a user-facing problem
(bad input, missing file, refused operation) and the CLI prints its message
without a traceback."""


class FakError(Exception):
    """A clear, user-facing error. Subclass per layer."""
