"""fak.audit — see ../shared/DESIGN.md."""
