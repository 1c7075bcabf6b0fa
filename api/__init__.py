"""fak.api — see ../shared/DESIGN.md."""
