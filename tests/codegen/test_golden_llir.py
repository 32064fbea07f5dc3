"""Golden LLIR for a few canonical kernels, next to (never instead of) numpy checks.

A diff here means the generated loops changed: look at it, and if the change
is intended, rewrite the files with ``UCF_UPDATE_GOLDEN=1 pytest
tests/codegen/test_golden_llir.py``. Each case also runs its kernel against numpy, so
an updated golden file still has to compute the right thing.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import ucf
from tests.helpers import rand_sparse
from ucf.ir.printer import format_functions

GOLDEN = Path(__file__).parent / "golden"

# name: (statement, formats, schedule, operand shapes, numpy reference)
CASES = {
    "spmv_csr": (
        "y(i) = A(i,j) * x(j)",
        {"A": "csr"},
        None,
        {"A": (9, 7), "x": (7,)},
        lambda A, x: A @ x,
    ),
    "spadd_csr": (
        "C(i,j) = A(i,j) + B(i,j)",
        {"A": "csr", "B": "csr", "C": "csr"},
        None,
        {"A": (9, 7), "B": (9, 7)},
        lambda A, B: A + B,
    ),
    "dot_compressed": (
        "a = b(i) * c(i)",
        {"b": "C", "c": "C"},
        None,
        {"b": (11,), "c": (11,)},
        lambda b, c: b @ c,
    ),
    "spmm_split": (
        "C(i,k) = A(i,j) * B(j,k)",
        {"A": "csr"},
        "split(i, i0, i1, 16); parallelize(i0, CPUThread, NoRaces)",
        {"A": (40, 7), "B": (7, 5)},
        lambda A, B: A @ B,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_llir(name):
    expr, formats, schedule, shapes, reference = CASES[name]
    k = ucf.compile(expr, formats=formats, schedule=schedule)
    text = format_functions(k.llir)
    path = GOLDEN / f"{name}.llir"
    if os.environ.get("UCF_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"LLIR of {name} changed; see the module docstring"

    rng = np.random.default_rng(7)
    ops = {
        t: rand_sparse(rng, shape, 0.4) if t in formats else rng.random(shape)
        for t, shape in shapes.items()
    }
    got = k(**{t: ucf.from_numpy(a, format=formats.get(t, "dense")) for t, a in ops.items()})
    np.testing.assert_allclose(np.asarray(got.to_numpy()), reference(**ops), rtol=1e-12)
