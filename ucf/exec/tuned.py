"""The best schedule found so far per kernel and input size, for ``schedule="tuned"``.

``ucf.tune`` records what it found here; a kernel compiled with
``schedule="tuned"`` looks its schedule up when it is called, since only the
operands say which shape class applies. The store is one small JSON file in
the kernel cache directory, written atomically under a file lock (the
cache's own helpers), so processes tuning side by side never lose each
other's records. A damaged file reads as empty: tuning is advice, never a
reason to fail.

A record's key is the statement without whitespace, every tensor's format in
canonical form (so ``csr`` and ``UC`` are the same key, and dense tensors
given or not are the same key), the value and index dtypes, the target and
the shape class. :func:`make_key` builds it.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ucf.toolchain import cache

FILE = "tuned.json"
#: Extents up to this are kept exact in a shape class (``bound`` may fix them: up to 64
#: any dense loop, up to 256 a register-tiled row, ``ucf.tuning.space``).
EXACT_EXTENT = 256


def _bucket(n: int) -> int:
    """``n`` rounded to the nearest power of two (0 stays 0)."""
    return 0 if n <= 0 else 2 ** round(math.log2(n))


def shape_class(extents: Mapping[str, int], nnz: Mapping[str, int]) -> str:
    """The input size a tuned schedule is stored for: extents up to 256 exact (a schedule
    may ``bound`` them), larger ones and every operand's nonzero count rounded to the
    nearest power of two, as in ``"i=1024,j=8;A~4096"``."""
    dims = ",".join(
        f"{v}={n if n <= EXACT_EXTENT else _bucket(n)}" for v, n in sorted(extents.items())
    )
    counts = ",".join(f"{t}~{_bucket(n)}" for t, n in sorted(nnz.items()))
    return f"{dims};{counts}"


def make_key(
    statement: str,
    formats: Mapping[str, Any],
    dtype: Any,
    index_dtype: Any,
    target: str,
    shape: str,
) -> dict[str, Any]:
    """The record key of a kernel for inputs of shape class ``shape``."""
    spelled = tuple(sorted((k, str(v)) for k, v in formats.items()))
    return {
        "statement": "".join(statement.split()),
        "formats": list(_canonical(statement, spelled)),
        "dtype": str(np.dtype(dtype)),
        "index_dtype": str(np.dtype(index_dtype)),
        "target": target,
        "shape_class": shape,
    }


@functools.lru_cache(maxsize=256)
def _canonical(statement: str, formats: tuple[tuple[str, str], ...]) -> tuple:
    """Every tensor's format in canonical form, sorted by name; remembered, since a
    kernel compiled with ``schedule="tuned"`` asks on every call."""
    from ucf.format.format import parse_format
    from ucf.lang.ast import accesses
    from ucf.lang.parser import parse_statement

    given = dict(formats)
    stmt = parse_statement(statement)
    orders = {a.tensor: len(a.indices) for a in [stmt.lhs, *accesses(stmt.rhs)]}
    return tuple(
        sorted(
            (name, str(parse_format(given.get(name, "dense"), order=order, tensor=name)))
            for name, order in orders.items()
        )
    )


def _name(key: Mapping[str, Any]) -> str:
    """The stored name of ``key``, which is brought to canonical form first (formats as
    given by a user, ``{"A": "csr"}``, name the same record as ``make_key``'s)."""
    canonical = make_key(
        key["statement"],
        dict(key.get("formats") or {}),
        key["dtype"],
        key["index_dtype"],
        key["target"],
        key["shape_class"],
    )
    return json.dumps(canonical, sort_keys=True)


#: The store as last read, with the file's (path, mtime, size) it was read at.
_READ: dict[str, Any] = {}


def _load() -> dict[str, dict[str, Any]]:
    """The store's records; read again only when the file changed."""
    path = cache.cache_dir() / FILE
    try:
        st = path.stat()
        stamp = (str(path), st.st_mtime_ns, st.st_size)
        if _READ.get("stamp") != stamp:
            data = json.loads(path.read_text())
            _READ.update(stamp=stamp, data=data if isinstance(data, dict) else {})
    except (OSError, ValueError):
        return {}
    return dict(_READ["data"])


def record(key: Mapping[str, Any], schedule: str, seconds: float) -> None:
    """Store ``schedule`` (measured at ``seconds`` a call) as the tuned plan for ``key``,
    replacing what was stored: the latest tuning run has seen the most trials."""
    with cache.lock(FILE):
        data = _load()
        data[_name(key)] = {"schedule": schedule, "seconds": float(seconds)}
        try:
            cache.atomic_write(
                cache.cache_dir() / FILE, json.dumps(data, indent=1, sort_keys=True).encode()
            )
        except OSError:
            pass  # a read-only or full cache loses the record, never the caller's result


def lookup(key: Mapping[str, Any]) -> str | None:
    """The tuned schedule stored for ``key``, or None."""
    entry = _load().get(_name(key))
    if isinstance(entry, dict) and isinstance(entry.get("schedule"), str):
        return entry["schedule"]
    return None
