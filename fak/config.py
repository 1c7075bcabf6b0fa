"""Where fak keeps its state, configurable by environment.

``FAK_DATA_DIR``  durable state: database, blobs, keys (default ``~/.local/share/fak``)
``FAK_CACHE_DIR`` rebuildable state: dequantised weights (default ``~/.cache/fak``)
``FAK_DATABASE_URL`` any SQLAlchemy URL (default SQLite file in the data dir)
"""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    path = Path(os.environ.get("FAK_DATA_DIR") or Path.home() / ".local" / "share" / "fak")
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir() -> Path:
    explicit = os.environ.get("FAK_CACHE_DIR")
    xdg = os.environ.get("XDG_CACHE_HOME")
    path = Path(explicit) if explicit else Path(xdg or Path.home() / ".cache") / "fak"
    path.mkdir(parents=True, exist_ok=True)
    return path


def database_url(root: Path | None = None) -> str:
    url = os.environ.get("FAK_DATABASE_URL")
    if url:
        return url
    return f"sqlite:///{(root or data_dir()) / 'fak.db'}"
