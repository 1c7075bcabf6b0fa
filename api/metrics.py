"""(being written) Prometheus metrics: ``install(app)`` adds the middleware and ``/metrics``."""

from __future__ import annotations

from fastapi import FastAPI


def install(app: FastAPI) -> None:
    return None
