"""Where the shipped grammars and runtime headers live.

In a wheel they are the packages ``ucf.grammar`` and ``ucf.runtime``; in a
source checkout they are the top-level ``grammar/`` and ``runtime/`` folders.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

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
