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
    return hashlib.sha256(repr((code_version(), parts)).encode()).hexdigest()[:32]


_CODE: list[str] = []


def code_version() -> str:
    """A digest of the compiler's own sources, grammars and runtime headers.

    Cached plans are pickles of compiler objects, so any change to the code
    (not just a version bump) must miss the cache rather than load a stale plan.
    """
    if not _CODE:
        from ucf.resources import grammar_file, runtime_dir

        root = Path(__file__).resolve().parent.parent
        files = sorted(root.rglob("*.py"))
        files += sorted(grammar_file("einsum.lark").parent.glob("*.lark"))
        files += sorted(runtime_dir().glob("*.h*"))
        h = hashlib.sha256()
        for f in files:
            h.update(f.read_bytes())
        _CODE.append(h.hexdigest()[:16])
    return _CODE[0]


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
