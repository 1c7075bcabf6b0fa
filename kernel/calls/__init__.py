"""Tool calls: how a model writes them, their authorization, provenance, records and held calls."""
