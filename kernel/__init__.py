"""fak.kernel — see ../shared/DESIGN.md."""
