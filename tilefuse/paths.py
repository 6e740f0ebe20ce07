"""Where tilefuse keeps files between runs (generated kernels, measured kernel times)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$TILEFUSE_CACHE_DIR``, else ``~/.cache/tilefuse``.

    Read on every call, not at import, so that setting the variable (or a test's monkeypatch)
    takes effect for everything created afterwards.
    """
    return Path(os.environ.get("TILEFUSE_CACHE_DIR", "~/.cache/tilefuse")).expanduser()
