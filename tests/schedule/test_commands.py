"""The scheduling language, command by command, on both targets.

Every kernel case is checked twice: against numpy/scipy (the expected value
never comes from ucf) and against the same statement compiled without a
schedule, since a schedule must change the algorithm and never the result.
Operands are small integer-valued arrays with fixed seeds, so results are
exact; the comparisons still use ``np.allclose``.

The statements and schedules follow the TACO scheduling papers: SpMV, SpMM,
SDDMM, TTV, MTTKRP, Gustavson SpGEMM, a scalar reduction, bounded loops with
tails, tiled element-wise products, unrolling, random legal schedules
(hypothesis), and illegal schedules that must name what is wrong.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ucf
from tests.helpers import arrival_operands, nonzero_coords, rand_dense, rand_sparse, stored_coords
from ucf.ir import nodes as ir
from ucf.schedule import parse_schedule

ROOT = Path(__file__).resolve().parents[2]

SPMV = "y(i) = A(i,j) * x(j)"
SPMM = "C(i,k) = A(i,j) * B(j,k)"
SDDMM = "A(i,k) = B(i,k) * C(i,j) * D(j,k)"
TTV = "A(i,j) = B(i,j,k) * c(k)"
MTTKRP = "A(i,j) = B(i,k,l) * C(k,j) * D(l,j)"
DOT = "c = a(i) * b(i)"
PAR_I = "parallelize(i, CPUThread, NoRaces)"


# --------------------------------------------------------------------------- helpers


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


# --------------------------------------------------------------------------- 1. SpMV

SPMV_SCHEDULES = {
    "split-reorder-parallel": (
        "split(i,i0,i1,16); reorder(i0,i1,j); parallelize(i0,CPUThread,NoRaces)"
    ),
    "fuse-pos-atomics": (
        "fuse(i,j,k); pos(k,kpos,A); split(kpos,kpos0,kpos1,16); "
        "parallelize(kpos0,CPUThread,Atomics)"
    ),
    "fuse-pos-atomics-fluent": ucf.Schedule()
    .fuse("i", "j", "k")
    .pos("k", "kpos", "A")
    .split("kpos", "kpos0", "kpos1", 16)
    .parallelize("kpos0", "CPUThread", "Atomics"),
}


@pytest.mark.parametrize("schedule", list(SPMV_SCHEDULES.values()), ids=list(SPMV_SCHEDULES))
def test_spmv(schedule, target):
    rng = np.random.default_rng(101)
    A = rand_sparse(rng, (57, 43), 0.15, empty_rows=3)
    x = rand_dense(rng, (43,))
    check(SPMV, {"A": "csr"}, schedule, target, {"A": A, "x": x}, A @ x)


# --------------------------------------------------------------------------- 2. SpMM


def test_spmm(target):
    rng = np.random.default_rng(102)
    A = rand_sparse(rng, (53, 41), 0.15, empty_rows=3)
    B = rand_dense(rng, (41, 128))
    schedule = (
        "split(i,i0,i1,16); pos(j,jpos,A); split(jpos,jpos0,jpos1,8); "
        "reorder(i0,i1,jpos0,k,jpos1); parallelize(i0,CPUThread,NoRaces); "
        "parallelize(k,CPUVector,IgnoreRaces)"
    )
    check(SPMM, {"A": "csr"}, schedule, target, {"A": A, "B": B}, A @ B)


# --------------------------------------------------------------------------- 3. SDDMM


def test_sddmm(target):
    rng = np.random.default_rng(103)
    B = rand_sparse(rng, (47, 61), 0.12, empty_rows=3)
    C = rand_dense(rng, (47, 13))
    D = rand_dense(rng, (13, 61))
    schedule = (
        "split(i,i0,i1,16); pos(k,kpos,B); split(kpos,kpos0,kpos1,8); "
        "reorder(i0,i1,kpos0,j,kpos1); parallelize(i0,CPUThread,NoRaces); "
        "parallelize(kpos1,CPUVector,ParallelReduction)"
    )
    check(SDDMM, {"B": "csr"}, schedule, target, {"B": B, "C": C, "D": D}, B * (C @ D))


# --------------------------------------------------------------------------- 4. TTV


def _ttv_operands(seed: int):
    rng = np.random.default_rng(seed)
    B = rand_sparse(rng, (41, 23, 9), 0.1, empty_rows=3)
    B[:, 4, :] = 0  # an empty (i, 4, :) slice in every row
    c = rand_dense(rng, (9,))
    return B, c


def test_ttv_fused_position_chunks(target):
    B, c = _ttv_operands(104)
    schedule = (
        "fuse(i,j,f); pos(f,fpos,B); split(fpos,chunk,fpos2,16); "
        "reorder(chunk,fpos2,k); parallelize(chunk,CPUThread,NoRaces)"
    )
    check(TTV, {"B": "csf"}, schedule, target, {"B": B, "c": c}, np.einsum("ijk,k->ij", B, c))


def test_ttv_sparse_output_parallel(target):
    B, c = _ttv_operands(105)
    formats = {"A": "csr", "B": "csf"}
    got, ref, _ = check(TTV, formats, PAR_I, target, {"B": B, "c": c}, np.einsum("ijk,k->ij", B, c))
    implied = nonzero_coords(np.any(B != 0, axis=2))
    assert stored_coords(got) == implied
    assert stored_coords(ref) == implied
    assert_sorted_csr(got.to_scipy())


# --------------------------------------------------------------------------- 5. MTTKRP

MTTKRP_SCHEDULES = {
    "workspace-BC": (
        "split(i,i1,i2,16); reorder(i1,i2,k,l,j); precompute(B(i,k,l)*C(k,j),j,j,w); "
        "parallelize(i1,CPUThread,NoRaces)"
    ),
    "workspace-BD-sums-l": (
        "split(i,i1,i2,16); reorder(i1,i2,k,l,j); precompute(B(i,k,l)*D(l,j),j,j,w); "
        "parallelize(i1,CPUThread,NoRaces)"
    ),
}


@pytest.mark.parametrize("schedule", list(MTTKRP_SCHEDULES.values()), ids=list(MTTKRP_SCHEDULES))
def test_mttkrp_precompute(schedule, target):
    rng = np.random.default_rng(106)
    B = rand_sparse(rng, (43, 11, 9), 0.12, empty_rows=3)
    C = rand_dense(rng, (11, 7))
    D = rand_dense(rng, (9, 7))
    expected = np.einsum("ikl,kj,lj->ij", B, C, D)
    check(MTTKRP, {"B": "csf"}, schedule, target, {"B": B, "C": C, "D": D}, expected)


# --------------------------------------------------------------------------- 6. SpGEMM

GUSTAVSON = "precompute(A(i,j)*B(j,k),k,k,w)"


# The unscheduled kernel writes C in order (i, k, j) and repacks B to follow it.
@pytest.mark.filterwarnings("ignore::ucf.ConversionWarning")
@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel"])
@pytest.mark.parametrize("fa,fb", list(itertools.product(["csr", "dcsr"], repeat=2)))
def test_gustavson_spgemm(fa, fb, parallel, target):
    rng = np.random.default_rng(107)
    A = rand_sparse(rng, (45, 38), 0.08, empty_rows=4)
    B = rand_sparse(rng, (38, 52), 0.08, empty_rows=4)
    A[:, 5] = 0  # an empty column of A (B's row 5 then never contributes)
    B[:, 7] = 0  # an empty column of B, hence of C
    schedule = GUSTAVSON + ("; " + PAR_I if parallel else "")
    formats = {"A": fa, "B": fb, "C": "csr"}
    got, ref, _ = check(SPMM, formats, schedule, target, {"A": A, "B": B}, A @ B)

    structural = (A != 0).astype(np.int64) @ (B != 0).astype(np.int64) > 0
    implied = nonzero_coords(structural)
    assert not structural[:, 7].any() and not structural.any(axis=1).all()
    assert stored_coords(got) == implied
    assert stored_coords(ref) == implied
    S = got.to_scipy()
    assert S.shape == (45, 52)
    assert_sorted_csr(S)
    assert np.allclose(S.toarray(), A @ B)


def _long_rows(rng, rows: int, cols: int, lengths: list[int]) -> sp.csr_matrix:
    """Rows with the given numbers of entries at random distinct columns."""
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    indices = np.concatenate([rng.choice(cols, n, replace=False) for n in lengths])
    data = rng.integers(1, 5, indptr[-1]).astype(np.float64)
    return sp.csr_matrix((data, indices, indptr), shape=(rows, cols))


# Rows of C longer than 32 entries take the radix sort: extents with 6 to 17 key bits give
# one, two and three digit passes (an odd count ends with a copy back), and the full row
# (every column present) is the longest list the workspace can hold.
@pytest.mark.parametrize("cols", [40, 256, 257, 5000, 70000])
def test_gustavson_long_rows_are_sorted(cols, target):
    rng = np.random.default_rng(cols)
    lengths = [0, 1, 33, min(cols, 300), cols, min(cols, 700), 5]
    a = np.eye(len(lengths)) * 3.0
    a[2, 3] = 2.0  # two rows of B merge into row 2 of C
    A = sp.csr_matrix(a)
    B = _long_rows(rng, len(lengths), cols, lengths)
    for parallel in (False, True):
        schedule = GUSTAVSON + ("; " + PAR_I if parallel else "")
        k = ucf.compile(
            SPMM, formats={"A": "csr", "B": "csr", "C": "csr"}, schedule=schedule, target=target
        )
        S = k(A=A, B=B).to_scipy()
        assert_sorted_csr(S)
        assert np.array_equal(S.toarray(), (A @ B).toarray())


def test_gustavson_sorts_rows_whatever_order_they_arrive_in(target):
    """Each row of C reaches the workspace in an order that takes one path of the sort
    (``conftest.arrival_operands``); it comes out sorted."""
    A, B = arrival_operands(np.random.default_rng(11), 5000)
    k = ucf.compile(
        SPMM, formats={"A": "csr", "B": "csr", "C": "csr"}, schedule=GUSTAVSON, target=target
    )
    S = k(A=A, B=B).to_scipy()
    assert_sorted_csr(S)
    assert np.array_equal(S.toarray(), (A @ B).toarray())


def test_listed_workspace_survives_the_epoch_wrap(monkeypatch, tmp_path):
    """Each row starts a new epoch; at the wrap the flags are cleared and numbering restarts.

    A wrap every 3 rows (instead of every 2**31) is a fresh plan, hence its own cache.
    """
    from ucf.lower import workspaces

    monkeypatch.setattr(workspaces, "EPOCH_WRAP", 3)
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(5)
    A = sp.random(40, 30, density=0.2, format="csr", random_state=rng)
    B = sp.random(30, 50, density=0.2, format="csr", random_state=rng)
    for target in ("llvm", "c"):
        k = ucf.compile(
            SPMM, formats={"A": "csr", "B": "csr", "C": "csr"}, schedule=GUSTAVSON, target=target
        )
        assert any(c.value == 3 for c in _consts(k.llir[-1].body))
        S = k(A=A, B=B).to_scipy()
        assert_sorted_csr(S)
        assert np.allclose(S.toarray(), (A @ B).toarray())
        assert stored_coords(k(A=A, B=B)) == nonzero_coords(((A != 0) @ (B != 0)).toarray())


def _consts(stmts):
    """Every constant in the statements' expressions."""
    for s in _walk(stmts):
        for v in vars(s).values():
            yield from _expr_consts(v)


def _expr_consts(e):
    if isinstance(e, ir.Const):
        yield e
    elif isinstance(e, ir.Expr):
        for v in vars(e).values():
            yield from _expr_consts(v)


# --------------------------------------------------------------------------- 7. scalar reduction


@pytest.mark.parametrize("strategy", ["Atomics", "Temporary", "ParallelReduction"])
@pytest.mark.parametrize("fa", ["dense", "C"])
def test_parallel_scalar_reduction(fa, strategy, target):
    rng = np.random.default_rng(108)
    a = rand_sparse(rng, (67,), 0.3, empty_rows=0)
    b = rand_dense(rng, (67,))
    formats = {} if fa == "dense" else {"a": fa}
    schedule = f"split(i,i0,i1,8); parallelize(i0,CPUThread,{strategy})"
    got, _, _ = check(DOT, formats, schedule, target, {"a": a, "b": b}, np.dot(a, b))
    assert np.asarray(got).shape == ()


# --------------------------------------------------------------------------- 8. bound with tails

EW1 = "a(i) = b(i) * c(i)"


def _bounded(n: int) -> str:
    return f"bound(i,ib,{n},MaxExact); split(ib,i0,i1,4); precompute(b(i)*c(i),i1,i1,w)"


@pytest.mark.parametrize("n", [16, 17])
def test_bound_split_precompute(n, target):
    rng = np.random.default_rng(109 + n)
    b = rand_dense(rng, (n,))
    c = rand_dense(rng, (n,))
    check(EW1, {}, _bounded(n), target, {"b": b, "c": c}, b * c)


def test_bound_rejects_a_larger_extent(target):
    rng = np.random.default_rng(110)
    k = ucf.compile(EW1, schedule=_bounded(16), target=target)
    b16, c16 = rand_dense(rng, (16,)), rand_dense(rng, (16,))
    assert np.allclose(dense(k(b=b16, c=c16)), b16 * c16)
    b17, c17 = rand_dense(rng, (17,)), rand_dense(rng, (17,))
    with pytest.raises(ucf.UcfError):
        k(b=b17, c=c17)


# The sparse output's assemble pass stops at its last compressed level, so the loop over
# the dense trailing level k exists only in the compute pass; commands on it (and on the
# loops they derive) apply there and are skipped in the assemble pass.
@pytest.mark.parametrize(
    "schedule",
    [
        "bound(k,kb,8,MaxExact)",
        "bound(k,kb,8,MaxExact); unroll(kb,8)",
        "split(k,k0,k1,3)",
        "split(k,k0,k1,4); parallelize(k1,CPUVector,IgnoreRaces)",
        "parallelize(k,CPUVector,NoRaces)",
        "split(i,i0,i1,2); parallelize(i0,CPUThread,NoRaces); bound(k,kb,8,MaxExact)",
    ],
)
def test_commands_below_the_last_appended_level(schedule, target):
    rng = np.random.default_rng(111)
    B = rand_sparse(rng, (7, 6), 0.4, empty_rows=2)
    C = rand_dense(rng, (6, 8))
    expected = np.einsum("ij,jk->ijk", B, C)
    got, _, k = check(
        "A(i,j,k) = B(i,j) * C(j,k)",
        {"A": "UCU", "B": "UC"},
        schedule,
        target,
        {"B": B, "C": C},
        expected,
    )
    assert stored_coords(got) == {(i, j, kk) for i, j in nonzero_coords(B) for kk in range(8)}


# --------------------------------------------------------------------------- 9. tiled element-wise

TILE_PERMS = list(itertools.permutations(["i0", "i1", "j0", "j1"]))


@pytest.mark.parametrize("perm", TILE_PERMS, ids=["".join(p) for p in TILE_PERMS])
def test_tiled_elementwise_every_order(perm, target):
    rng = np.random.default_rng(111)
    B = rand_dense(rng, (10, 7))
    C = rand_dense(rng, (10, 7))
    schedule = f"split(i,i0,i1,4); split(j,j0,j1,4); reorder({','.join(perm)})"
    check("A(i,j) = B(i,j) * C(i,j)", {}, schedule, target, {"B": B, "C": C}, B * C)


# --------------------------------------------------------------------------- 10. unroll, divide


def test_unroll_bounded_loop(target):
    rng = np.random.default_rng(112)
    A = rand_dense(rng, (45, 8))
    x = rand_dense(rng, (8,))
    check(SPMV, {}, "bound(j,jb,8,MaxExact); unroll(jb,4)", target, {"A": A, "x": x}, A @ x)


@pytest.mark.parametrize("fa", ["dense", "csr"])
def test_divide_parallel(fa, target):
    rng = np.random.default_rng(113)
    A = rand_sparse(rng, (61, 29), 0.2, empty_rows=3)
    x = rand_dense(rng, (29,))
    formats = {} if fa == "dense" else {"A": fa}
    schedule = "divide(i,i0,i1,3); parallelize(i0,CPUThread,NoRaces)"
    check(SPMV, formats, schedule, target, {"A": A, "x": x}, A @ x)


# --------------------------------------------------------------------------- 11. random schedules

#: name -> (statement, default loop order, operand -> its index variables, output variables)
RANDOM_STATEMENTS = {
    "elementwise": ("C(i,j) = A(i,j) * B(i,j)", "ij", {"A": "ij", "B": "ij"}, "ij"),
    "spmv": (SPMV, "ij", {"A": "ij", "x": "j"}, "i"),
    "spmm": (SPMM, "ijk", {"A": "ij", "B": "jk"}, "ik"),
    "add": ("C(i,j) = A(i,j) + B(i,j)", "ij", {"A": "ij", "B": "ij"}, "ij"),
}


def _numpy_reference(name: str, ops: dict[str, np.ndarray]) -> np.ndarray:
    if name == "elementwise":
        return ops["A"] * ops["B"]
    if name == "spmv":
        return ops["A"] @ ops["x"]
    if name == "spmm":
        return ops["A"] @ ops["B"]
    return ops["A"] + ops["B"]


@st.composite
def random_case(draw):
    """A statement, A's format, extents, operand seed and a legal schedule.

    Legal by construction: splits (factor 1..5, fresh names) of any current
    loop, reorders only when every operand is dense, and at most one
    ``parallelize(.., CPUThread, NoRaces)`` of the first loop that derives
    from an output variable (its iterations write disjoint output entries,
    and the output is dense).
    """
    name = draw(st.sampled_from(sorted(RANDOM_STATEMENTS)))
    expr, order, operands, outvars = RANDOM_STATEMENTS[name]
    fa = draw(st.sampled_from(["dense", "csr"]))
    extents = {v: draw(st.integers(1, 9)) for v in order}
    seed = draw(st.integers(0, 2**32 - 1))
    loops = list(order)
    origin = {v: v for v in order}
    commands: list[str] = []
    fresh = itertools.count()
    for _ in range(draw(st.integers(0, 4))):
        kinds = ["split", "reorder"] if fa == "dense" else ["split"]
        if draw(st.sampled_from(kinds)) == "split":
            v = draw(st.sampled_from(loops))
            factor = draw(st.integers(1, 5))
            outer, inner = f"{origin[v]}{next(fresh)}", f"{origin[v]}{next(fresh)}"
            at = loops.index(v)
            loops[at : at + 1] = [outer, inner]
            origin[outer] = origin[inner] = origin[v]
            commands.append(f"split({v}, {outer}, {inner}, {factor})")
        else:
            loops = list(draw(st.permutations(loops)))
            commands.append(f"reorder({', '.join(loops)})")
    if draw(st.booleans()):
        par = next(v for v in loops if origin[v] in outvars)
        commands.append(f"parallelize({par}, CPUThread, NoRaces)")
    return name, expr, operands, fa, extents, seed, "; ".join(commands)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=random_case())
def test_random_legal_schedules(target, case):
    name, expr, operands, fa, extents, seed, schedule = case
    rng = np.random.default_rng(seed)
    arrays = {}
    for t, vs in operands.items():
        shape = tuple(extents[v] for v in vs)
        arrays[t] = rand_sparse(rng, shape, 0.4) if t == "A" else rand_dense(rng, shape)
    formats = {} if fa == "dense" else {"A": fa}
    check(expr, formats, schedule or None, target, arrays, _numpy_reference(name, arrays))


# --------------------------------------------------------------------------- 12. illegal schedules

ILLEGAL = [
    # (statement, formats, schedule, names the message must contain)
    pytest.param(SPMV, {}, "pos(i, ipos, A)", ["i"], id="pos-dense-operand"),
    pytest.param(SPMV, {"A": "csr"}, "pos(i, ipos, A)", ["i"], id="pos-uncompressed-level"),
    pytest.param(SPMV, {"A": "csr"}, "pos(i, ipos, x)", ["x", "i"], id="pos-tensor-without-var"),
    pytest.param(SPMV, {"A": "csr"}, "unroll(i, 4)", ["i"], id="unroll-without-bound"),
    pytest.param(
        "C(i,j) = A(i,j) + B(i,j)",
        {"A": "dcsr", "B": "dcsr"},
        PAR_I,
        ["i"],
        id="parallelize-while-loop",
    ),
    pytest.param(SPMV, {"A": "csr"}, "reorder(j, i)", ["A"], id="reorder-against-storage"),
    pytest.param(
        SPMV, {"A": "csr"}, "parallelize(j, CPUThread, NoRaces)", ["j"], id="parallelize-reduction"
    ),
]


@pytest.mark.parametrize("expr,formats,schedule,must_name", ILLEGAL)
def test_illegal_schedule_names_the_culprit(expr, formats, schedule, must_name):
    with pytest.raises(ucf.ScheduleError) as e:
        ucf.compile(expr, formats=formats, schedule=schedule)
    message = str(e.value)
    assert "not supported" not in message, message
    explanation = without_echo(message, schedule)
    for n in must_name:
        assert names(explanation, n), f"{n!r} not named in: {message}"


@pytest.mark.parametrize(
    "schedule,suggestion",
    [
        ("splitt(i,i0,i1,4)", "did you mean 'split'"),
        ("parallelize(ii,CPUThread,NoRaces)", "did you mean 'i'"),
    ],
)
def test_misspellings_get_suggestions(schedule, suggestion):
    with pytest.raises(ucf.ScheduleError, match=re.escape(suggestion)):
        ucf.compile(SPMV, formats={"A": "csr"}, schedule=schedule)


def test_cli_illegal_schedule_exits_1(tmp_path):
    with pytest.raises(ucf.ScheduleError) as e:
        ucf.compile(SPMV, formats={"A": "csr"}, schedule="reorder(j,i)")
    env = dict(os.environ)
    env["UCF_CACHE_DIR"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    code = "import sys; from ucf.cli import main; sys.exit(main())"
    argv = ["compile", SPMV, "-f", "A:csr", "-s", "reorder(j,i)"]
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("ucf: error: ")
    assert "Traceback" not in proc.stderr
    assert str(e.value) in proc.stderr
    assert names(proc.stderr, "A")


# --------------------------------------------------------------------------- 13. default schedule


def test_default_schedule_parallelizes_the_outer_output_loop(target):
    rng = np.random.default_rng(114)
    A = rand_sparse(rng, (59, 37), 0.15, empty_rows=3)
    x = rand_dense(rng, (37,))
    k = ucf.compile(SPMV, formats={"A": "csr"}, target=target)
    claims = [line for line in k.cin.splitlines() if "parallel" in line]
    assert any(names(line, "i") for line in claims), k.cin
    assert np.allclose(dense(k(A=ucf.from_numpy(A, format="csr"), x=x)), A @ x)


@pytest.mark.parametrize("fa", ["dense", "C"])
def test_default_schedule_keeps_outer_reduction_serial(fa, target):
    rng = np.random.default_rng(115)
    a = rand_sparse(rng, (53,), 0.4, empty_rows=0)
    b = rand_dense(rng, (53,))
    formats = {} if fa == "dense" else {"a": fa}
    k = ucf.compile(DOT, formats=formats, target=target)
    assert "runs in parallel" not in k.cin, k.cin
    got = k(**pack({"a": a, "b": b}, formats))
    assert np.asarray(got).shape == ()
    assert np.allclose(np.asarray(got), np.dot(a, b))


# --------------------------------------------------------------------------- 14. GPU units


@pytest.mark.parametrize(
    "schedule",
    [
        "split(i,i0,i1,16); parallelize(i0, GPUBlock, NoRaces)",
        "split(i,i0,i1,16); parallelize(i0, GPUBlock, NoRaces); "
        "parallelize(i1, GPUThread, NoRaces)",
    ],
    ids=["block", "block-thread"],
)
def test_gpu_units_need_the_cuda_target(schedule, target):
    with pytest.raises(ucf.UcfError) as e:
        ucf.compile(SPMV, formats={"A": "csr"}, schedule=schedule, target=target)
    assert not isinstance(e.value, ucf.ParseError)
    message = str(e.value)
    assert "not supported" not in message, message
    explanation = without_echo(message, schedule)
    assert "GPU" in explanation and "cuda" in explanation, message


def test_gpu_group_command_parses():
    text = "pos(j,jpos,A); split(jpos,jpos0,jpos1,8); parallelize(jpos1, GPUGroup, 8, Segment)"
    cmds = parse_schedule(text)
    assert [c.name for c in cmds] == ["pos", "split", "parallelize"]
    assert cmds[-1].args == ("jpos1", "GPUGroup", "8", "Segment")
    fluent = ucf.Schedule().parallelize("jpos1", "GPUGroup", 8, "Segment")
    assert [c.args for c in parse_schedule(str(fluent))] == [cmds[-1].args]


# ----------------------------------------------- 15. loops across a fused pos; TACO's GPU SpMM

#: TACO's scheduleSpMMGPU (test/tests-scheduling-eval.cpp, 8 nonzeros per warp and 256
#: threads per block) without its GPU parallelize commands: a bound on the outer loop of
#: a split, and column loops moved outside the nonzeros of a fused pos loop.
TACO_SPMM_GPU_LOOPS = (
    "reorder(i,j,k); fuse(i,j,f); pos(f,fpos,A); split(fpos,block,fpos1,64); "
    "split(fpos1,warp,nnz,8); split(k,dense_val_unbounded,thread,32); "
    "reorder(block,warp,thread,dense_val_unbounded,nnz); "
    "bound(dense_val_unbounded,dense_val,4,MaxExact)"
)


def _spmm_rows(rng, cols: int = 38) -> np.ndarray:
    """Empty rows, a dense row and short rows: the cases a row catch-up can get wrong."""
    A = rand_sparse(rng, (45, cols), 0.15, empty_rows=4)
    A[7] = rand_dense(rng, (cols,))
    return A


@pytest.mark.parametrize("columns", [97, 128])
def test_taco_gpu_spmm_loops(columns, target):
    rng = np.random.default_rng(115 + columns)
    A = _spmm_rows(rng)
    B = rand_dense(rng, (38, columns))
    check(SPMM, {"A": "csr"}, TACO_SPMM_GPU_LOOPS, target, {"A": A, "B": B}, A @ B)


@pytest.mark.parametrize(
    "schedule",
    [
        "fuse(i,j,f); pos(f,fpos,A); reorder(k,fpos)",
        "fuse(i,j,f); pos(f,fpos,A); split(fpos,b,nz,8); reorder(b,k,nz)",
        "fuse(i,j,f); pos(f,fpos,A); split(fpos,b,nz,8); reorder(b,k,nz); "
        "parallelize(b,CPUThread,Atomics)",
        "fuse(i,j,f); pos(f,fpos,A); split(fpos,b,nz,8); split(k,k0,k1,4); reorder(b,k1,nz,k0)",
    ],
)
def test_loops_move_outside_a_fused_pos_loop(schedule, target):
    """Each run of the moved loop restarts the nonzeros with its own copy of the row."""
    rng = np.random.default_rng(116)
    A = _spmm_rows(rng)
    B = rand_dense(rng, (38, 9))
    check(SPMM, {"A": "csr"}, schedule, target, {"A": A, "B": B}, A @ B)


@pytest.mark.parametrize(
    "schedule,good,bad,formula",
    [
        (TACO_SPMM_GPU_LOOPS, [97, 128], [96, 129], "ceil(k / 32)"),
        (
            "split(k,k0,k1,4); split(k0,k00,k01,2); bound(k00,kb,3,MaxExact); unroll(kb,3)",
            [17, 24],
            [16, 25],
            "ceil(k / 8)",
        ),
    ],
    ids=["taco", "split-of-split"],
)
def test_bound_on_a_split_checks_each_call(schedule, good, bad, formula, target):
    rng = np.random.default_rng(117)
    A = _spmm_rows(rng)
    k = ucf.compile(SPMM, formats={"A": "csr"}, schedule=schedule, target=target)
    for n in good:
        B = rand_dense(rng, (38, n))
        assert np.allclose(dense(k(A=A, B=B)), A @ B), n
    for n in bad:
        with pytest.raises(ucf.ShapeError) as e:
            k(A=A, B=rand_dense(rng, (38, n)))
        assert formula in str(e.value) and f"extent {n} of k" in str(e.value)


def test_bound_on_a_split_of_a_narrowed_window(target):
    """Where an affine index narrows the split loop, the bounded loop's extra runs are empty."""
    P = np.arange(1.0, 13.0)
    G = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    expected = np.array(
        [sum(P[x + r - 2] * G[r] for r in range(5) if 0 <= x + r - 2 < 12) for x in range(12)]
    )
    schedule = "reorder(x,k); split(k,k0,k1,2); bound(k0,kb,3,MaxExact)"
    check("O(x) = P(x+k-2) * G(k)", {}, schedule, target, {"P": P, "G": G}, expected)


@pytest.mark.parametrize(
    "schedule,culprit,why",
    [
        ("split(k,k0,k1,8); bound(k1,kb,8,MaxExact)", "k1", "already known"),
        ("divide(k,k0,k1,4); bound(k0,kb,4,MaxExact)", "k0", "already known"),
        ("bound(k,kb,8,MaxExact); bound(kb,kc,8,MaxExact)", "kb", "already known"),
        ("divide(k,k0,k1,4); bound(k1,kb,4,MaxExact)", "k1", "shorter"),
        ("pos(j,jpos,A); bound(jpos,jb,4,MaxExact)", "jpos", "nonzeros"),
        (
            "fuse(i,j,f); pos(f,fpos,A); split(fpos,b,nz,8); bound(b,bb,4,MaxExact)",
            "b",
            "nonzeros",
        ),
        ("reorder(i,k,j); fuse(i,k,f); bound(f,fb,8,MaxExact)", "f", "one extent"),
    ],
)
def test_bound_refuses_loops_without_one_trip_count(schedule, culprit, why):
    with pytest.raises(ucf.ScheduleError) as e:
        ucf.compile(SPMM, formats={"A": "csr"}, schedule=schedule)
    message = str(e.value)
    assert why in message
    assert names(without_echo(message, schedule), culprit), message


# ---------------------------------------------------------------- regressions
def test_dense_fuse_matches_numpy(target):
    rng = np.random.default_rng(3)
    B, C = rng.random((7, 5)), rng.random((7, 5))
    k = ucf.compile(
        "A(i,j) = B(i,j) * C(i,j)",
        schedule="fuse(i,j,f); split(f,f0,f1,4); parallelize(f0,CPUThread,NoRaces)",
        target=target,
    )
    assert np.allclose(k(B=B, C=C).to_numpy(), B * C)


def test_gustavson_keeps_csr_operands_and_sorts_a_row_workspace():
    k = ucf.compile(
        "C(i,k) = A(i,j) * B(j,k)",
        formats={"A": "csr", "B": "csr", "C": "csr"},
        schedule="precompute(A(i,j)*B(j,k),k,k,w)",
    )
    assert "converted" not in k.cin
    assert "loop order i, j, k" in k.cin
    calls = [s for s in _walk(k.llir[-1].body) if isinstance(s, ir.Call)]
    assert [c.name for c in calls] == ["ucf_sort_i64"]


def _walk(stmts):
    for s in stmts:
        yield s
        for attr in ("body", "then", "orelse", "prologue", "epilogue"):
            yield from _walk(getattr(s, attr, []) or [])


def test_parallel_loop_inside_a_precompute_keeps_the_shared_workspace(target):
    A = sp.random(30, 20, density=0.3, format="csr", random_state=2)
    x = np.random.default_rng(2).random(20)
    k = ucf.compile(
        "y(i) = A(i,j) * x(j)",
        formats={"A": "csr"},
        schedule="precompute(A(i,j)*x(j),i,iw,w); parallelize(iw,CPUThread,NoRaces)",
        target=target,
    )
    assert np.allclose(k(A=A, x=x).to_numpy(), A @ x)


def test_empty_schedule_is_serial_and_default_is_parallel():
    expr, fmts = "y(i) = A(i,j) * x(j)", {"A": "csr"}
    assert "in parallel" not in ucf.compile(expr, formats=fmts, schedule="").cin
    assert "loop i runs in parallel" in ucf.compile(expr, formats=fmts).cin


def test_vector_atomics_is_refused_with_the_alternatives():
    with pytest.raises(ucf.ScheduleError, match="CPUVector takes NoRaces"):
        ucf.compile(
            "y(i) = A(i,j) * x(j)",
            formats={"A": "csr"},
            schedule="parallelize(j,CPUVector,Atomics)",
        )


def test_fuse_of_a_sparse_loop_suggests_pos():
    with pytest.raises(ucf.ScheduleError, match=r"add pos\(f, fpos, T\)"):
        ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, schedule="fuse(i,j,f)")
