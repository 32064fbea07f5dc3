"""The size of the code where merges' case chains nest (fills fuzz seed 120 case 279).

A loop that merges operands builds one case per set of them that matched, each a copy
of the loops below it; nested merges multiply the copies. A sum of four operands, two
of them read with a repeated variable (located and guarded at every level of a blocked
format), built 1,800 copies: 18k lines of C, gcc 3 minutes. Past
``CoiterationMixin.CASES`` copies the lowering starts again with every merge as one
body with match flags, where an operand whose flag is false (a guarded one included)
reads as its fill. Results against numpy over dense arrays whose absent entries hold
the fill; the family's rows also with ``CASES = 0``, every merge one body.
"""

from __future__ import annotations

import numpy as np
import pytest

import ucf
from tests.asan import run_under_asan
from tests.fuzz_common import RandomDraw
from tests.helpers import TARGETS, needs_cc, product_params
from tests.statement_fuzz import check, draw_case
from ucf.lower.coiterate import CoiterationMixin

pytestmark = pytest.mark.filterwarnings("ignore::ucf.ConversionWarning")  # C's order
INF = np.inf
#: The fuzz case: ``l`` is summed where it is not an output variable.
CASE = "X(i,k) = sum(j, -(A(l,k,j) + ((C(k,l,l) + B(j,i,l)) + C(k,i,i))))"
CASE_FORMATS = {"A": "CCUC:2/1,0,1,2%1", "B": "CCCU:0/1,1,2,0%1", "C": "CUCC:0,2/2,1,2%2"}
EXTENTS = {"i": 5, "j": 4, "k": 3, "l": 5}
#: The family: the first n terms, under sum, max or min over j, the formats blocked
#: nowhere, in C alone, or as in the fuzz case (A and B take a fill when unblocked).
TERMS = ["A(l,k,j)", "C(k,l,l)", "B(j,i,l)", "C(k,i,i)"]
BLOCKED = [
    {"A": "CCC:2,0,1", "B": "CCC", "C": "CCC:0,2,1"},
    {"A": "CCC:2,0,1", "B": "CCC", "C": "CCCC:0,2/2,1,2%2"},
    CASE_FORMATS,
]


def arrays(seed: int, fills: dict[str, float]) -> dict[str, np.ndarray]:
    """Small signed integers (exact sums), about half stored; absent entries hold the
    operand's fill, and C stores its whole diagonal (where it is read)."""
    rng = np.random.default_rng(seed)
    e = EXTENTS
    shapes = {
        "A": (e["l"], e["k"], e["j"]),
        "B": (e["j"], e["i"], e["l"]),
        "C": (e["k"],) + 2 * (max(e["i"], e["l"]),),
    }
    out = {}
    for name, shape in shapes.items():
        a = rng.integers(-4, 5, shape).astype(np.float64)
        live = rng.random(shape) < 0.5
        if name == "C":
            live |= np.eye(shape[1], dtype=bool)[None]
        out[name] = np.where(live, a, fills.get(name, 0.0))
    return out


def reference(terms: list[str], reduction: str, ops: dict[str, np.ndarray], sign=1) -> np.ndarray:
    """``sum(l, reduction(j, sign * (terms)))`` over axes (i, k, l, j), in float64."""
    e = EXTENTS
    ax = {v: np.arange(e[v]).reshape([-1 if u == v else 1 for u in "iklj"]) for v in "iklj"}
    total = np.zeros([e[v] for v in "iklj"])
    for t in terms:
        name, idx = t[0], t[2:-1].split(",")
        total = total + ops[name][tuple(ax[v] for v in idx)]
    return getattr(np, reduction)(sign * total, axis=3).sum(axis=2)


def shifted_sums(a: np.ndarray, w: int, term) -> np.ndarray:
    """``X(i,k) = sum(j, term(A(i,j+k)))`` for k below ``w``, in numpy: A read past its
    columns as 0 (its padding), the guarded operand's absent value."""
    m = a.shape[1]
    padded = np.pad(a, ((0, 0), (0, w)))
    return np.stack([term(padded[:, s : s + m]).sum(axis=1) for s in range(w)], axis=1)


def run(expr: str, formats: dict, target: str, ops: dict) -> ucf.Kernel:
    k = ucf.compile(expr, formats=formats, target=target, emulate=target == "cuda")
    stored = {n: ucf.from_numpy(a, format=formats[n]) for n, a in ops.items() if n in formats}
    return k, k(shapes=dict(EXTENTS), **stored).to_numpy()


@pytest.mark.parametrize("target", [*TARGETS, pytest.param("cuda", marks=pytest.mark.slow)])
def test_the_fuzz_case_is_one_body_per_merge_and_right(target):
    """The case itself: its kernel says why it took one body per merge, its source stays
    under 3,000 lines (before: 17,985 of C, 90,637 of LLVM IR; now 330 and 1,733), its
    result is numpy's."""
    ops = arrays(279, {})
    k, got = run(CASE, CASE_FORMATS, target, ops)
    assert "each merge takes one body with match flags" in k.cin
    assert k.source.count("\n") < 3000, k.source.count("\n")
    np.testing.assert_array_equal(got, reference(TERMS, "sum", ops, sign=-1))


@pytest.mark.parametrize(
    ("target", "terms", "blocked", "reduction", "fill", "one_body"),
    product_params(
        [2, 3, 4],
        range(len(BLOCKED)),
        ["sum", "max", "min"],
        [0.0, INF, -INF],
        [False, True],
        every_llvm_row=False,
    ),
)
def test_the_family_against_numpy(
    target, terms, blocked, reduction, fill, one_body, monkeypatch, tmp_path
):
    """The family with its chains (where they fit in ``CASES``) and with every merge one
    body (``CASES = 0``): A's fill (where A is unblocked; blocked formats take none) is
    read wherever A is absent, and decides a max or min over j where every A(l,k,j) is
    absent. The reference is NaN nowhere (no fill meets its opposite), so every element
    is compared."""
    if fill and blocked == 2:
        pytest.skip("a blocked format takes no fill")
    if one_body:
        monkeypatch.setattr(CoiterationMixin, "CASES", 0)
        monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))  # the key holds no CASES
    used = TERMS[:terms]
    formats = {n: f for n, f in BLOCKED[blocked].items() if any(t[0] == n for t in used)}
    if fill:
        formats["A"] += f" fill={fill:g}"
    ops = arrays(10 * terms + blocked, {"A": fill})
    expr = f"X(i,k) = sum(l, {reduction}(j, {' + '.join(used)}))"
    k, got = run(expr, formats, target, ops)
    want = reference(used, reduction, ops)
    assert not np.isnan(want).any()
    np.testing.assert_array_equal(got, want)
    if one_body:
        assert "one body with match flags" in k.cin


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("terms", [3, 4])
def test_the_generated_size_is_bounded(target, terms):
    """The blocked rows whose chains grow past ``CASES``: under 3,000 lines of either
    target's source (before: 2,981 and 12,088 lines of C, 14,376 and 65,725 of LLVM IR;
    now 264 and 366, 1,152 and 1,885). A kernel far inside the budget keeps its chains."""
    used = TERMS[:terms]
    formats = {n: f for n, f in CASE_FORMATS.items() if any(t[0] == n for t in used)}
    k = ucf.compile(f"X(i,k) = sum(j, -({' + '.join(used)}))", formats=formats, target=target)
    assert k.source.count("\n") < 3000, k.source.count("\n")
    assert "one body with match flags" in k.cin
    spmv = ucf.compile("y(i) = A(i,j) * x(j) + B(i,i)", formats={"A": "csr", "B": "csr"})
    assert "one body" not in spmv.cin


@pytest.mark.parametrize("target", TARGETS)
def test_one_body_writes_the_chains_pattern(target, monkeypatch, tmp_path):
    """A sparse output under one body per merge stores what the chains store: where
    A's row (dense below its compressed rows) is not stored, A reads as absent across
    the row, so the row holds B's entries only, not a fill at every column; both passes
    (the count and the writes) take one body."""
    monkeypatch.setattr(CoiterationMixin, "CASES", 0)
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(5)
    a = np.where(rng.random((6, 5)) < 0.5, rng.integers(1, 5, (6, 5)), 0.0)
    a[[1, 4]] = 0.0  # rows A does not store
    b = np.where(rng.random((6, 5)) < 0.4, rng.integers(1, 5, (6, 5)), 0.0)
    formats = {"A": "CU", "B": "csr", "X": "csr"}
    k = ucf.compile("X(i,j) = A(i,j) + B(i,j)", formats=formats, target=target)
    assert "one body with match flags" in k.cin
    got = k(A=ucf.from_numpy(a, format="CU"), B=ucf.from_numpy(b, format="csr"))
    np.testing.assert_array_equal(got.to_numpy(), a + b)
    stored = np.zeros(a.shape, bool)
    coords, _ = got.to_coo()
    stored[tuple(np.asarray(coords).T)] = True
    rows = a.any(axis=1)
    np.testing.assert_array_equal(stored, rows[:, None] | (b != 0))


@needs_cc  # the draws take either target
@pytest.mark.parametrize("lang", [True, False], ids=["fills", "statements"])
def test_fuzz_draws_with_every_merge_one_body(lang, monkeypatch, tmp_path):
    """The statement fuzzer's draws (``tests/statement_fuzz``: its numpy reference, its
    refusals) with ``CASES = 0``, so that one body serves every merge, not only the
    rare statements past the budget: 12 draws a run here; 1,600 in the session that
    built it (fills and statements), and 300 with ``CASES = 3``: 0 failed."""
    monkeypatch.setattr(CoiterationMixin, "CASES", 0)
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))
    for n in range(12):
        check(draw_case(RandomDraw(f"one body:{n}"), ["llvm", "c"], lang=lang))


@pytest.mark.parametrize(
    ("target", "a_format", "one_body"), product_params(["CU", "UU", "UC", "dense"], [False, True])
)
def test_a_guarded_operand_reads_as_absent_past_its_extent(
    target, a_format, one_body, monkeypatch, tmp_path
):
    """``A(i,j+k)`` is guarded where j+k passes A's columns, where it reads as 0 (the
    padding numpy's reference holds); under one body its flag must say so, as the chains'
    cases do. A stores every column of its stored rows (a value past the extent would
    read the next row's), and no row 2; a numpy array (dense) reads past its row too."""
    if one_body:
        monkeypatch.setattr(CoiterationMixin, "CASES", 0)
        monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(3)
    n, m, w = 5, 4, 3
    a = rng.integers(1, 5, (n, m)).astype(np.float64)
    a[2] = 0.0
    b = np.where(rng.random((n, m)) < 0.5, rng.integers(-4, 5, (n, m)), 0.0)
    formats = {"B": "csr"} | ({} if a_format == "dense" else {"A": a_format})
    k = ucf.compile("X(i,k) = sum(j, A(i,j+k) + B(i,j))", formats=formats, target=target)
    assert ("one body with match flags" in k.cin) == one_body
    stored = a if a_format == "dense" else ucf.from_numpy(a, format=a_format)
    ops = {"A": stored, "B": ucf.from_numpy(b, format="csr")}
    got = k(shapes={"k": w}, **ops).to_numpy()
    want = shifted_sums(a, w, lambda shifted: shifted + b)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("a_format", ["UU", "CU"])
def test_one_body_reads_in_bounds_under_asan(a_format, asan_cc, monkeypatch, tmp_path):
    """The guarded case above under one body, run under ASan with every operand array
    exactly sized: A's last row read past its columns would be out of bounds."""
    monkeypatch.setattr(CoiterationMixin, "CASES", 0)
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(4)
    n, m, w = 4, 3, 3
    a = rng.integers(1, 5, (n, m)).astype(np.float64)
    b = np.where(rng.random((n, m)) < 0.5, rng.integers(-4, 5, (n, m)), 0.0)
    b[-1] = 1.0  # B enters the body at every column of A's last row
    formats = {"A": a_format, "B": "csr", "X": "UU"}
    k = ucf.compile("X(i,k) = sum(j, A(i,j+k) + B(i,j))", formats=formats, target="c")
    assert "one body with match flags" in k.cin
    ops = {"A": ucf.from_numpy(a, format=a_format), "B": ucf.from_numpy(b, format="csr")}
    out = run_under_asan(asan_cc, tmp_path, k, "UU", (n, w), {"i": n, "j": m, "k": w}, ops)
    want = shifted_sums(a, w, lambda shifted: shifted + b)
    np.testing.assert_array_equal(out.to_numpy(), want)


def _ending_rows(seed: int, names: str, shape=(7, 6)) -> dict[str, np.ndarray]:
    """Small integers, about a third stored, operand number ``n`` empty from row
    ``rows - 1 - n`` on: merged operands end at different rows."""
    rng = np.random.default_rng(seed)
    out = {}
    for n, name in enumerate(names):
        a = np.where(rng.random(shape) < 0.3, rng.integers(1, 5, shape), 0).astype(np.float64)
        a[shape[0] - 1 - n :] = 0.0
        out[name] = a
    return out


@pytest.mark.parametrize(
    ("target", "formats", "out"),
    product_params(
        [("coo",) * 4, ("CS",) * 4, ("dcsr", "coo", "dcsr", "coo")],
        ["dense", "csr"],
    ),
)
def test_ended_non_unique_operands_read_as_absent(target, formats, out):
    """A sum of four matrices, some stored as COO (a non-unique level above a singleton),
    is past the budget and takes one body per merge. Non-unique iterators merge in a loop
    per lattice point, and in a tail loop the ones already ended are neither matched
    nor unmatched there: one body read them at their last position (rows full of another
    row's values) until they were taken as absent, as the chains take them (found by a
    review; the fuzzer drew no singleton level then). Operands end at different rows."""
    ops = _ending_rows(1, "ABCD")
    fm = dict(zip("ABCD", formats, strict=True)) | ({"X": out} if out != "dense" else {})
    k = ucf.compile("X(i,j) = A(i,j) + B(i,j) + C(i,j) + D(i,j)", formats=fm, target=target)
    assert "one body with match flags" in k.cin
    got = k(**{n: ucf.from_numpy(a, format=fm[n]) for n, a in ops.items()})
    np.testing.assert_array_equal(got.to_numpy(), sum(ops.values()))


@pytest.mark.parametrize(
    ("target", "expr"),
    product_params(
        ["X(i,j) = A(i,j) + B(i,j)", "X(i,j) = A(i,j) * B(i,j) + C(i,j)", "y(i) = A(i,j) - B(i,j)"]
    ),
)
def test_every_merge_one_body_over_coo(target, expr, monkeypatch, tmp_path):
    """The same with ``CASES = 0``, every merge one body, over COO operands and smaller
    statements (a sum, a product beside a sum, a row reduction)."""
    monkeypatch.setattr(CoiterationMixin, "CASES", 0)
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))
    ops = _ending_rows(2, "ABC")
    names = sorted({c for c in expr.split("=", 1)[1] if c in "ABC"})
    k = ucf.compile(expr, formats=dict.fromkeys(names, "coo"), target=target)
    got = k(**{n: ucf.from_numpy(ops[n], format="coo") for n in names}).to_numpy()
    a, b, c = (ops[n] for n in "ABC")
    want = {"X(i,j) = A(i,j) + B(i,j)": a + b, "y(i) = A(i,j) - B(i,j)": (a - b).sum(axis=1)}
    np.testing.assert_array_equal(got, want.get(expr, a * b + c))


@pytest.mark.parametrize(
    ("target", "a_format", "budget"), product_params(["dense", "UU", "CU"], [0, None])
)
def test_a_guard_in_a_merge_reads_the_coordinate_after_it_is_declared(
    target, a_format, budget, monkeypatch, tmp_path
):
    """``A(i,j+k) * B(i,j) + C(i,j)``: A is guarded inside a merge of B and C that is not
    full (the product makes j's loop follow B and C), so the guard reads j, which the
    merge declares as its operands' nearest coordinate; it read j before that (LLIR's
    "reads variable j before declaring it", gcc's "'j' undeclared"), with ``CASES = 0``
    and, at the default budget, with C, D and E merged beside B."""
    terms = (
        "A(i,j+k) * B(i,j) + C(i,j)"
        if budget == 0
        else "A(i,j+k) * B(i,j) + C(i,j) + D(i,j) + E(i,j)"
    )
    if budget == 0:
        monkeypatch.setattr(CoiterationMixin, "CASES", 0)
        monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(3)
    n, m, w = 5, 6, 3
    a = rng.integers(1, 5, (n, m)).astype(np.float64)
    names = [t[0] for t in terms.split(" ") if t[:1] in "BCDE"]
    ops = {x: np.where(rng.random((n, m)) < 0.5, rng.integers(-4, 5, (n, m)), 0.0) for x in names}
    formats = dict.fromkeys(names, "csr") | ({} if a_format == "dense" else {"A": a_format})
    k = ucf.compile(f"X(i,k) = sum(j, {terms})", formats=formats, target=target)
    assert "one body with match flags" in k.cin
    stored = {x: ucf.from_numpy(v, format="csr") for x, v in ops.items()}
    got = k(
        A=a if a_format == "dense" else ucf.from_numpy(a, format=a_format),
        shapes={"k": w},
        **stored,
    )
    rest = sum(v for x, v in ops.items() if x != "B")
    want = shifted_sums(a, w, lambda shifted: shifted * ops["B"] + rest)
    np.testing.assert_array_equal(got.to_numpy(), want)
