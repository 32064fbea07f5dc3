"""The statements and helpers the schedule tests share: a kernel run with and without a
schedule against a numpy reference, and checks that a refusal names its culprit.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

import ucf
from ucf.schedule import parse_schedule

ROOT = Path(__file__).resolve().parents[2]

SPMV = "y(i) = A(i,j) * x(j)"

SPMM = "C(i,k) = A(i,j) * B(j,k)"

SDDMM = "A(i,k) = B(i,k) * C(i,j) * D(j,k)"

TTV = "A(i,j) = B(i,j,k) * c(k)"

MTTKRP = "A(i,j) = B(i,k,l) * C(k,j) * D(l,j)"

DOT = "c = a(i) * b(i)"

PAR_I = "parallelize(i, CPUThread, NoRaces)"


def pack(arrays: dict[str, np.ndarray], formats: dict[str, str]) -> dict[str, object]:
    """Operands as ucf.Tensors in their formats (dense ones stay numpy arrays)."""
    return {
        n: ucf.from_numpy(a, format=formats[n]) if n in formats else a for n, a in arrays.items()
    }


def dense(result) -> np.ndarray:
    return result.to_numpy() if isinstance(result, ucf.Tensor) else np.asarray(result)


def check(expr, formats, schedule, target, arrays, expected):
    """Run ``expr`` with and without ``schedule``; both must equal ``expected``.

    Returns the scheduled result, the unscheduled result and the scheduled kernel.
    """
    k = ucf.compile(expr, formats=formats, schedule=schedule, target=target)
    base = ucf.compile(expr, formats=formats, target=target)
    ops = pack(arrays, formats)
    got = k(**ops)
    ref = base(**ops)
    g = dense(got)
    assert g.shape == np.shape(expected)
    assert np.allclose(g, expected), f"schedule {schedule!s} differs from numpy"
    assert np.allclose(g, dense(ref)), f"schedule {schedule!s} differs from the unscheduled kernel"
    return got, ref, k


def assert_sorted_csr(S) -> None:
    """Column indices strictly increase within every row of a scipy CSR array."""
    assert S.has_sorted_indices
    for r in range(S.shape[0]):
        seg = S.indices[S.indptr[r] : S.indptr[r + 1]]
        assert np.all(np.diff(seg) > 0), f"row {r} has unsorted or repeated columns {seg}"


def without_echo(message: str, schedule: str) -> str:
    """The message with the offending command text removed.

    Messages may quote the command; the variable must be named by the
    explanation itself, not only by the echo of what the user typed.
    """
    for cmd in parse_schedule(schedule):
        message = message.replace(str(cmd), " ")
    for part in re.split(r"[;\n]", schedule):
        if part.strip():
            message = message.replace(part.strip(), " ")
    return message


def names(message: str, name: str) -> bool:
    """``name`` occurs in ``message`` as a whole word."""
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", message) is not None


def walk_nodes(stmts):
    for s in stmts:
        yield s
        for attr in ("body", "then", "orelse", "prologue", "epilogue"):
            yield from walk_nodes(getattr(s, attr, []) or [])
