"""(being written) refs routes."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
