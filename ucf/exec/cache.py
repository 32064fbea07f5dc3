"""The on-disk cache of compiled kernels.

Entries are written to a temporary file in the cache directory and renamed
into place, so two processes compiling the same kernel at once each produce
a complete file and the last rename wins; readers never see a partial one.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    env = os.environ.get("UCF_CACHE_DIR")
    if env:
        path = Path(env)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = Path(base) / "ucf"
    path.mkdir(parents=True, exist_ok=True)
    return path


def key(*parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load(name: str) -> Any | None:
    """The cached object, or None when absent or unreadable (then we recompile)."""
    path = cache_dir() / name
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        return None


def store(name: str, obj: Any) -> None:
    try:
        atomic_write(cache_dir() / name, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    except OSError:
        pass  # a read-only or full cache must never break compilation
