"""fak.policy — see ../shared/DESIGN.md."""
