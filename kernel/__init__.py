"""fak.kernel — see docs/design.md."""
