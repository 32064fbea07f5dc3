"""What a kernel decides before it runs, kept in the disk cache beside its plans.

A kernel's compute type (``ucf.pipeline.compute_dtype``) and the default model's
schedule for a call's statistics (``ucf.pipeline.proposals``) depend only on the
statement, formats, dtypes and those statistics, yet finding them parses and
concretizes the statement: the front of the pipeline, with its parser and model.
Kept as small entries of the kernel cache, keyed like plans (a change to ucf's own
sources misses them too, ``ucf.toolchain.cache.code_version``), they spare a
process whose kernels are in the cache all of that: it loads plans and calls them,
as a program loads a shared library (issue 34: the first call).
"""

from __future__ import annotations

from typing import Any

from ucf.toolchain import cache


def _name(fields: dict[str, Any]) -> str:
    return f"{cache.key(fields)}.decision"


def load(fields: dict[str, Any]) -> tuple[Any] | None:
    """The decision stored for ``fields`` as a 1-tuple (its value may be None), or None
    when there is none."""
    entry = cache.load(_name(fields), fields)
    return (entry["decision"],) if isinstance(entry, dict) and "decision" in entry else None


def store(fields: dict[str, Any], value: Any) -> None:
    """Keep ``value`` (picklable) as the decision for ``fields``."""
    cache.store(_name(fields), fields, {"decision": value})
