"""fak.sdk — see ../shared/DESIGN.md."""
