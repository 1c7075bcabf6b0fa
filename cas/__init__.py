"""fak.cas — see ../shared/DESIGN.md."""
