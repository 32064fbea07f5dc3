"""Where the shipped grammars and runtime headers live, and the cache directory.

In a wheel they are the packages ``ucf.grammar`` and ``ucf.runtime``; in a
source checkout they are the top-level ``grammar/`` and ``runtime/`` folders.
The cache directory is here, below every layer, because the parser keeps its
tables there as well as the kernel cache (``ucf.toolchain.cache``) its entries.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import warnings
from pathlib import Path

import platformdirs

from ucf.errors import CacheWarning

_REPO = Path(__file__).resolve().parent.parent


def _package_dir(package: str, fallback: str) -> Path:
    """A source checkout reads its own folders (an editable install of another
    checkout, a git worktree's main one say, would map the packages there)."""
    if (_REPO / "pyproject.toml").is_file() and (_REPO / fallback).is_dir():
        return _REPO / fallback
    spec = importlib.util.find_spec(package)
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return _REPO / fallback


def grammar_file(name: str) -> Path:
    return _package_dir("ucf.grammar", "grammar") / name


def runtime_dir() -> Path:
    return _package_dir("ucf.runtime", "runtime")


def cache_dir() -> Path:
    """``UCF_CACHE_DIR``, else the platform's user cache directory (platformdirs).

    A directory that cannot be created (a file in the way, no permission) is
    warned about once, and this process caches in a private temporary
    directory instead: compiling must not depend on the cache."""
    env = os.environ.get("UCF_CACHE_DIR")
    path = Path(env) if env else Path(platformdirs.user_cache_dir("ucf", appauthor=False))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        if path not in _FALLBACK:
            warnings.warn(
                f"ucf kernel cache: cannot use {path} ({e.strerror}); kernels compiled by "
                "this process are cached in a temporary directory",
                CacheWarning,
                stacklevel=2,
            )
            _FALLBACK[path] = Path(tempfile.mkdtemp(prefix="ucf-cache-"))
        return _FALLBACK[path]
    return path


_FALLBACK: dict[Path, Path] = {}
