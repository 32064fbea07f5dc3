"""Differential fuzzing: random statements and formats against numpy.

The generator, its numpy reference and the check live in ``statement_fuzz.py``
(shared with the long run, ``bench/fuzz.py --fuzzer statements``); hypothesis draws
through it here, so a failure shrinks. Statements read tensors under several index
lists and with repeated variables, beside blocked (unequal blocks, per tensor),
fixed-width and ``nm(n,m)`` operands; some make an operand dynamic or run as a TeSA
plan (``fuzz_plans.py``); some reduce with ``max``/``min`` or read absent entries as
a fill (``tests/lang/test_fuzz_fills.py`` draws those in every case).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ucf
from tests import statement_fuzz
from tests.asan import ASAN_FLAGS
from tests.fuzz_common import HypothesisDraw, RandomDraw
from tests.helpers import EXPLORE, needs_cc
from tests.statement_fuzz import Case, check, draw_case, einsum_reference, reference
from ucf.schedule import cpu_model, parallel_loops, stats

ROOT = Path(__file__).resolve().parents[1]


def cases(targets=("llvm",), **options):
    @st.composite
    def strategy(draw):
        return draw_case(HypothesisDraw(draw), targets, **options)

    return strategy()


def _case(expr, tree, out_vars, arrays):
    tensors, extents = {}, {}
    for leaf in statement_fuzz.leaves(tree):
        tensors.setdefault(leaf[1], list(leaf[2]))
        for v, n in zip(leaf[2], arrays[leaf[1]].shape, strict=True):
            extents[v] = n
    return Case(expr, tree, tensors, out_vars, extents, {}, None, 0, 0.0)


def test_reference_sums_each_term_over_its_own_variables():
    rng = np.random.default_rng(0)
    X = rng.integers(1, 5, (2, 3, 4)).astype(float)
    v = rng.integers(1, 5, 4).astype(float)
    W = rng.integers(1, 5, (2, 3)).astype(float)
    product = ("*", ("acc", "X", ("i", "j", "k")), ("acc", "v", ("k",)))
    tree = ("+", product, ("acc", "W", ("i", "j")))
    arrays = {"X": X, "v": v, "W": W}
    case = _case("M(i,j) = X(i,j,k) * v(k) + W(i,j)", tree, ["i", "j"], arrays)
    np.testing.assert_array_equal(reference(case, arrays), np.einsum("ijk,k->ij", X, v) + W)


def test_reference_sums_a_product_of_a_sum_as_a_whole():
    rng = np.random.default_rng(1)
    B = rng.integers(1, 5, (2, 3)).astype(float)
    c = rng.integers(1, 5, 2).astype(float)
    x = rng.integers(1, 5, 3).astype(float)
    tree = ("*", ("+", ("acc", "B", ("i", "j")), ("acc", "c", ("i",))), ("acc", "x", ("j",)))
    arrays = {"B": B, "c": c, "x": x}
    case = _case("y(i) = (B(i,j) + c(i)) * x(j)", tree, ["i"], arrays)
    np.testing.assert_array_equal(reference(case, arrays), B @ x + c * x.sum())


def test_reference_reads_a_tensor_twice_and_its_diagonal():
    """The shapes the fuzzer draws since issue 32: D(i,j) and D(j,i), x(i) and x(j),
    A(i,i); both references against numpy's own."""
    rng = np.random.default_rng(2)
    D = rng.integers(1, 5, (3, 3)).astype(float)
    x = rng.integers(1, 5, 3).astype(float)
    tree = (
        "+",
        ("*", ("acc", "D", ("i", "j")), ("acc", "D", ("j", "i"))),
        ("*", ("acc", "D", ("i", "i")), ("*", ("acc", "x", ("i",)), ("acc", "x", ("j",)))),
    )
    arrays = {"D": D, "x": x}
    case = _case("C(i,j) = D(i,j) * D(j,i) + D(i,i) * x(i) * x(j)", tree, ["i", "j"], arrays)
    want = D * D.T + np.diag(D)[:, None] * np.outer(x, x)
    np.testing.assert_array_equal(reference(case, arrays), want)
    np.testing.assert_array_equal(einsum_reference(case, arrays), want)


def test_the_draw_reaches_every_new_shape():
    """Over a few hundred draws: tensors read twice, repeated variables, unequal and
    per-tensor blocks, nm(n,m), dynamic tiles over 1, TeSA plans, max/min reductions,
    fills, empty ranges, a sum reading one matrix in two orders, a product of two
    matrices beside two more, and clashes of two fills under a max or min."""
    drawn = [draw_case(RandomDraw(f"reach:{n}"), ("llvm", "c")) for n in range(400)]
    twice = [c for c in drawn if len(statement_fuzz.leaves(c.tree)) > len(c.tensors)]
    repeated = [c for c in drawn if any(len(set(i)) < len(i) for i in c.tensors.values())]
    nm = [c for c in drawn if any(f.startswith("nm(") for f in c.formats.values())]
    blocked = [c for c in drawn if any("/" in f or "(" in f for f in c.formats.values())]
    tiles = [c for c in drawn if c.dynamic and max(c.dynamic["tile"]) > 1]
    plans = [c for c in drawn if c.tesa]
    maxmin = [c for c in drawn if {"max", "min"} & statement_fuzz.reductions(c.tree)]
    fills = [c for c in drawn if "fill=" in " ".join([*c.formats.values(), c.out_format or ""])]
    empty = [c for c in drawn if 0 in c.extents.values()]
    flipped = [c for c in drawn if "A(j,i)" in c.expr.replace(" ", "")]
    merged = [
        c for c in drawn if "D" in c.tensors and "(A(i,j))*(B(i,j))" in c.expr.replace(" ", "")
    ]
    clashes = [c for c in drawn if c.cover and {"max", "min"} & statement_fuzz.reductions(c.tree)]
    shapes = (twice, repeated, nm, blocked, tiles, plans, maxmin, fills, empty, flipped, merged)
    shapes += (clashes,)
    for found in shapes:
        assert len(found) >= 5
    assert {c.target for c in drawn} == {"llvm", "c"}


@settings(max_examples=20)
@given(cases())
def test_fuzz_llvm(case):
    check(case)


@pytest.mark.slow
@settings(EXPLORE, max_examples=400)
@given(cases())
def test_fuzz_llvm_long(case):
    check(case)


@settings(max_examples=25)
@given(cases(plans=False))
def test_fuzz_default_model_parallel_choices(case):
    """The default model's parallel choices (hoisted loops, chunks, ``bound``) on the
    fuzzer's small inputs: its thresholds are lowered so that every case gets them."""
    ucf.set_num_threads(2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parallel_loops, "CHUNK_WORK", 2)
        mp.setattr(parallel_loops, "CHUNKS_PER_THREAD", 1)
        mp.setattr(stats, "SKEWED", 0.0)
        mp.setattr(cpu_model, "REPLAN_WORK", 0)
        check(case)


@needs_cc
@settings(max_examples=15)
@given(cases(("c",)))
def test_fuzz_c(case):
    check(case)


@pytest.mark.slow
@needs_cc
def test_fuzz_c_under_asan(tmp_path):
    """The long run's statement and schedule fuzz on the c target, each kernel built
    with AddressSanitizer and run in workers that preload its runtime: an out-of-bounds
    read or write kills the worker, a "crash" with a repro."""
    cc = shutil.which("cc")
    lib = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True)
    libasan = lib.stdout.strip()
    if lib.returncode or not Path(libasan).is_file():
        pytest.skip("the C compiler has no AddressSanitizer runtime")
    env = dict(os.environ)
    env["LD_PRELOAD"] = libasan
    env["ASAN_OPTIONS"] = "detect_leaks=0"
    env["UCF_CFLAGS"] = " ".join([*ASAN_FLAGS, "-fPIC", "-shared", "-fopenmp", "-ffp-contract=off"])
    for fuzzer, cases in (("statements", 300), ("schedules", 300)):
        run = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "fuzz.py"), "--fuzzer", fuzzer]
            + ["--cases", str(cases), "--targets", "c", "--out", str(tmp_path / fuzzer)]
            + ["--seed", "32", "--budget", "0"],
            capture_output=True,
            text=True,
            env=env,
            timeout=7200,
        )
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]


#: Cases the long run found (issue 32), kept as they were drawn.
FOUND = [
    # a blocked sparse output: an order that binds all of its levels first, in order
    {
        "expr": "X(l,k,i,j) = -(((A(j,l)) * ((B(l)) + (C(k,i,j)))) * (D(k)))",
        "tree": (
            "neg",
            (
                "*",
                (
                    "*",
                    ("acc", "A", ("j", "l")),
                    ("+", ("acc", "B", ("l",)), ("acc", "C", ("k", "i", "j"))),
                ),
                ("acc", "D", ("k",)),
            ),
        ),
        "tensors": {"A": ["j", "l"], "B": ["l"], "C": ["k", "i", "j"], "D": ["k"]},
        "out_vars": ["l", "k", "i", "j"],
        "extents": {"i": 3, "j": 3, "k": 3, "l": 3},
        "formats": {
            "A": "UCUF2:1/1,0/3,1%1,0%3",
            "B": "U:0",
            "C": "UCUCU:1/2,2/3,0,1%2,2%3",
            "D": "C:0",
        },
        "out_format": "CCCUUU:2,3/3,1/3,0,3%3,1%3",
        "seed": 1817239546,
        "density": 0.7,
    },
    # a blocked diagonal: its offsets after the variables they offset
    {
        "expr": "X = (A(i,i,l)) - (min(B(i,k,j), max(C(i,k,l), D(i,l,j))))",
        "tree": (
            "-",
            ("acc", "A", ("i", "i", "l")),
            (
                "fn",
                "min",
                (
                    ("acc", "B", ("i", "k", "j")),
                    ("fn", "max", (("acc", "C", ("i", "k", "l")), ("acc", "D", ("i", "l", "j")))),
                ),
            ),
        ),
        "tensors": {
            "A": ["i", "i", "l"],
            "B": ["i", "k", "j"],
            "C": ["i", "k", "l"],
            "D": ["i", "l", "j"],
        },
        "out_vars": [],
        "extents": {"i": 2, "j": 3, "k": 2, "l": 2},
        "formats": {
            "A": "UUCF2:2,0/2,1,0%2",
            "B": "CUU:1,2,0",
            "C": "CUCU:0,1,2/1,2%1",
            "D": "UUCU:2/3,0,1,2%3",
        },
        "out_format": None,
        "seed": 1562208429,
        "density": 0.7,
    },
    # a diagonal beside reads of the same tensor no order follows: any order that puts
    # the offset before what it offsets cannot be converted, so none is chosen
    {
        "expr": "X(k) = (((-1) * (A(k))) * (((2) * (B(j,i,k))) - (B(i,j,i)))) * (B(j,j,i))",
        "tree": (
            "*",
            (
                "*",
                ("*", ("lit", -1), ("acc", "A", ("k",))),
                (
                    "-",
                    ("*", ("lit", 2), ("acc", "B", ("j", "i", "k"))),
                    ("acc", "B", ("i", "j", "i")),
                ),
            ),
            ("acc", "B", ("j", "j", "i")),
        ),
        "tensors": {"A": ["k"], "B": ["j", "i", "k"]},
        "out_vars": ["k"],
        "extents": {"i": 3, "j": 3, "k": 3},
        "formats": {"A": "C:0", "B": "UCF3:0,1,2"},
        "out_format": "C:0",
        "seed": 944227005,
        "density": 1.0,
    },
    # a block's place inside its block in every order (blocks of 1, a triple diagonal)
    {
        "expr": "X = (A(k,l,j)) + (min(A(j,j,j), (2) * (A(k,i,j))))",
        "tree": (
            "+",
            ("acc", "A", ("k", "l", "j")),
            (
                "fn",
                "min",
                (("acc", "A", ("j", "j", "j")), ("*", ("lit", 2), ("acc", "A", ("k", "i", "j")))),
            ),
        ),
        "tensors": {"A": ["k", "l", "j"]},
        "out_vars": [],
        "extents": {"i": 1, "j": 1, "k": 1, "l": 1},
        "formats": {"A": "UUCC:1,2/1,0,2%1"},
        "out_format": None,
        "seed": 2900728880,
        "density": 0.7,
    },
    # a TeSA plan split A over a max: X(j) = max(l, A_2x1(j,l)); X(j) += max(l, A_1x1(j,l))
    # added the parts' largest values (0 where -2 was due); a max is not linear in A
    {
        "expr": "X(j) = max(l, A(j,l))",
        "tree": ("max", ("l",), ("acc", "A", ("j", "l"))),
        "tensors": {"A": ["j", "l"]},
        "out_vars": ["j"],
        "extents": {"j": 4, "l": 2},
        "formats": {"A": ""},
        "out_format": None,
        "seed": 0,
        "density": 0.7,
        "target": "llvm",
        "dynamic": None,
        "tesa": {
            "attrs": {"A": {"density": 0.5, "block": 1, "bits": [32]}},
            "policy": {
                "bits": [8, 32],
                "blocks": [[[1, 1], 1.0], [[2, 1], 1.5], [[2, 2], 3.0]],
                "min_sparsity": 0.3,
            },
            "propagate": False,
        },
    },
    # sum(i, j) over three terms, A(k) reading neither: the default gathered each term
    # into a workspace over k with its own loop, and A's lost the loop over j, so A was
    # added once where 3 times was due ([0, -6, -4] for [0, -8, -2]; also with the user's
    # precompute of every term, on 67d0d18)
    {
        "expr": "X(k) = ((A(k)) - ((B(i,k,j)) + (C(j,k,i)))) - (D(j,k,i))",
        "tree": (
            "-",
            (
                "-",
                ("acc", "A", ("k",)),
                ("+", ("acc", "B", ("i", "k", "j")), ("acc", "C", ("j", "k", "i"))),
            ),
            ("acc", "D", ("j", "k", "i")),
        ),
        "tensors": {"A": ["k"], "B": ["i", "k", "j"], "C": ["j", "k", "i"], "D": ["j", "k", "i"]},
        "out_vars": ["k"],
        "extents": {"i": 1, "j": 3, "k": 3},
        "formats": {
            "A": "F3:0",
            "B": "CUUU:1,0,2/2,2%2",
            "C": "UCUUUF1:0/3,1/3,2/3,0%3,1%3,2%3",
            "D": "CCUCC:0/2,2,1/1,0%2,1%1",
        },
        "out_format": None,
        "seed": 0,
        "density": 0.3,
        "target": "llvm",
        "dynamic": None,
        "tesa": None,
    },
]


@pytest.mark.parametrize(
    "found",
    FOUND,
    ids=[
        "blocked-output",
        "blocked-diagonal",
        "offset-order",
        "place-order",
        "tesa-max",
        "term-without-summed-variable",
    ],
)
def test_cases_the_long_run_found(found):
    check(Case(**found))
