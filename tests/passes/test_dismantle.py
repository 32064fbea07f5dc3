"""dismantle(v) over operands given in static=: SparTA's specialization (§3.4, Fig. 7).

The kernel is unrolled over the static pattern: only live blocks or nonzeros are
computed, with no reads of the index arrays; results are checked against numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.conftest import TARGETS
from ucf.ir import nodes as ir
from ucf.ir.walk import nodes, statements
from ucf.passes import dismantle

SPMV = "y(i) = A(i,j) * x(j)"
SPMM = "C(i,k) = A(i,j) * B(j,k)"
FIG7 = "O(m,n) = T(m,k) * W(k,n)"
FIG7_ORDER = "reorder(m_blk, k_blk, n_blk, m_in, k_in, n_in); dismantle(n_blk)"


def _loads(kernel) -> set[str]:
    return {n.array.name for f in kernel.llir for n in nodes(f.body) if isinstance(n, ir.Load)}


def _evaluate(e: ir.Expr, env: dict[str, int]) -> int:
    if isinstance(e, ir.Const):
        return int(e.value)
    if isinstance(e, ir.Var):
        return env[e.name]
    assert isinstance(e, ir.Bin) and e.op in "+*", e
    a, b = _evaluate(e.left, env), _evaluate(e.right, env)
    return a + b if e.op == "+" else a * b


def _fig7(t_blocks, w_blocks, seed=0):
    """SparTA Fig. 7(a): 4x4 T and W in 2x2 blocks, the given blocks live (T0..T3 row-major)."""
    rng = np.random.default_rng(seed)
    mats = []
    for live in (t_blocks, w_blocks):
        m = np.zeros((4, 4))
        for b in live:
            r, c = divmod(b, 2)
            m[2 * r : 2 * r + 2, 2 * c : 2 * c + 2] = rng.uniform(1, 2, (2, 2))
        mats.append(m)
    return mats


def _fig7_kernel(T, W, target="llvm"):
    fmts = {"T": "bcsr(2,2)", "W": "bcsr(2,2)"}
    static = {
        "T": ucf.from_numpy(T, format="bcsr(2,2)"),
        "W": ucf.from_numpy(W, format="bcsr(2,2)"),
    }
    return ucf.compile(FIG7, fmts, FIG7_ORDER, target=target, static=static), static


def _block_products(kernel) -> list[tuple[int, int]]:
    """The output block (m_blk, n_blk) each block product of the kernel adds into."""
    stores = [s for s in statements(kernel.llir[-1].body) if isinstance(s, ir.Store)]
    out = []
    for s in stores:
        # The place in the block at 0, and 2 blocks of n: the flat index of O's split
        # shape is ((m_blk * 2 + m_in) * 2 + n_blk) * 2 + n_in.
        env = {n.name: 0 for n in nodes(s.index) if isinstance(n, ir.Var)} | {"O_dim2": 2}
        flat = _evaluate(s.index, env)
        out.append((flat // 8, (flat // 2) % 2))
    return sorted(out)


def test_fig7_keeps_exactly_the_live_block_products(monkeypatch):
    # Register tiles store one block product in several pieces; the products counted
    # here are what dismantle keeps, so the tiles are off.
    monkeypatch.setenv("UCF_REGISTER_BLOCKING", "0")
    # Fig. 7(a): T1 (block row 0, block column 1) and W2, W3 (block row 1) are live, so of
    # the eight 2x2 products of (b) only O0 += T1*W2 and O1 += T1*W3 remain.
    T, W = _fig7([1], [2, 3])
    k, static = _fig7_kernel(T, W)
    assert _block_products(k) == [(0, 0), (0, 1)]
    assert not _loads(k) & {"T1_pos", "T1_crd", "W1_pos", "W1_crd"}
    np.testing.assert_allclose(k(**static).to_numpy(), T @ W)
    # Every block live: the eight products of Fig. 7(b), one per (m1, n1, k1).
    T, W = _fig7(range(4), range(4), seed=1)
    k, static = _fig7_kernel(T, W)
    assert _block_products(k) == sorted([(m, n) for m in range(2) for n in range(2)] * 2)
    np.testing.assert_allclose(k(**static).to_numpy(), T @ W)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt, var", [("csr", "j"), ("bcsr(2,3)", "j_blk")])
def test_spmv_spmm_against_numpy(target, fmt, var):
    rng = np.random.default_rng(3)
    dense = sp.random(8, 9, density=0.3, random_state=4).toarray()
    A = ucf.from_numpy(dense, format=fmt)
    x, B = rng.standard_normal(9), rng.standard_normal((9, 5))
    order = "reorder(i_blk, j_blk, i_in, j_in); " if var == "j_blk" else ""
    fmts = {"A": fmt}
    k = ucf.compile(SPMV, fmts, order + f"dismantle({var})", target=target, static={"A": A})
    np.testing.assert_allclose(k(A=A, x=x).to_numpy(), dense @ x)
    assert not _loads(k) & {"A1_pos", "A1_crd"}
    k = ucf.compile(SPMM, fmts, f"dismantle({var})", target=target, static={"A": A})
    np.testing.assert_allclose(k(A=A, B=B).to_numpy(), dense @ B)
    assert not _loads(k) & {"A1_pos", "A1_crd"}
    assert any(isinstance(s, ir.For) and s.label == "k" for s in statements(k.llir[-1].body))


@pytest.mark.parametrize("target", TARGETS)
def test_embedded_values(target):
    A = sp.random(7, 6, density=0.4, random_state=5, format="csr", dtype=np.float32)
    x = np.random.default_rng(6).standard_normal(6).astype(np.float32)
    schedule = ucf.Schedule().dismantle("j", values=True)
    assert str(schedule) == "dismantle(j, values)"
    k = ucf.compile(SPMV, {"A": "csr"}, schedule, target=target, dtype="float32", static={"A": A})
    assert "A_vals" not in _loads(k)
    np.testing.assert_allclose(k(A=A, x=x).to_numpy(), A @ x, rtol=1e-6)
    changed = A.copy()
    changed.data = changed.data + 1
    with pytest.raises(ucf.OperandError, match="operand A .*values differ"):
        k(A=changed, x=x)


def test_the_static_object_changed_in_place_is_refused():
    """The kernel keeps a copy of what it was specialized to: the very object given at
    compile time, changed in place since, is compared like any other (and never replayed)."""
    A = sp.random(7, 6, density=0.4, random_state=12, format="csr")
    x = np.ones(6)
    k = ucf.compile(SPMV, {"A": "csr"}, "dismantle(j, values)", static={"A": A})
    for _ in range(3):  # calls that could be replayed
        np.testing.assert_allclose(k(A=A, x=x).to_numpy(), A @ x)
    A.data[0] += 1.0
    with pytest.raises(ucf.OperandError, match="operand A .*values differ"):
        k(A=A, x=x)
    p = ucf.compile(SPMV, {"A": "csr"}, "dismantle(j)", static={"A": A})
    np.testing.assert_allclose(p(A=A, x=x).to_numpy(), A @ x)
    A.data[-1] += 2.0  # new values under the same pattern are read
    np.testing.assert_allclose(p(A=A, x=x).to_numpy(), A @ x)
    A.indices[A.indptr[1] - 1], A.indices[A.indptr[1] - 2] = 5, 4  # a row's last two moved
    with pytest.raises(ucf.OperandError, match="operand A has another pattern"):
        p(A=A, x=x)


@pytest.mark.parametrize("held", ["csr@qint8:0", "csr@bfloat16"])
def test_a_static_operand_may_hold_quantized_or_narrow_values(held):
    rng = np.random.default_rng(16)
    A = rng.random((6, 5)) * (rng.random((6, 5)) < 0.5)
    x = rng.random(5).astype(np.float32)
    W = ucf.quantize(A, format=held) if "q" in held else ucf.from_numpy(A, format=held)
    k = ucf.compile(SPMV, {"A": held}, "dismantle(j)", dtype="float32", static={"A": W})
    np.testing.assert_allclose(k(A=W, x=x).to_numpy(), W.to_numpy() @ x, rtol=1e-5)


def test_embedded_nan_values_match_themselves():
    A = sp.random(6, 5, density=0.5, random_state=17, format="csr")
    A.data[0] = np.nan
    x = np.ones(5)
    k = ucf.compile(SPMV, {"A": "csr"}, "dismantle(j, values)", static={"A": A})
    np.testing.assert_allclose(k(A=A, x=x).to_numpy(), A @ x)  # NaN where A @ x has it


def test_same_pattern_new_values_reuse_the_kernel():
    A = sp.random(7, 6, density=0.4, random_state=7, format="csr")
    other = A.copy()
    other.data = np.random.default_rng(8).standard_normal(other.nnz)
    x = np.random.default_rng(9).standard_normal(6)
    k1 = ucf.compile(SPMV, {"A": "csr"}, "dismantle(j)", static={"A": A})
    k2 = ucf.compile(SPMV, {"A": "csr"}, "dismantle(j)", static={"A": other})
    assert k2._built.compiled is k1._built.compiled  # same pattern: the same cached kernel
    np.testing.assert_allclose(k1(A=other, x=x).to_numpy(), other @ x)
    e1 = ucf.compile(SPMV, {"A": "csr"}, "dismantle(j, values)", static={"A": A})
    e2 = ucf.compile(SPMV, {"A": "csr"}, "dismantle(j, values)", static={"A": other})
    assert e2._built.compiled is not e1._built.compiled  # embedded values key the kernel
    np.testing.assert_allclose(e2(A=other, x=x).to_numpy(), other @ x)


def test_other_pattern_refused():
    A = sp.random(7, 6, density=0.4, random_state=10, format="csr")
    B = sp.random(7, 6, density=0.4, random_state=11, format="csr")
    x = np.ones(6)
    k = ucf.compile(SPMV, {"A": "csr"}, "dismantle(j)", static={"A": A})
    with pytest.raises(ucf.OperandError, match="operand A has another pattern.*level 1"):
        k(A=B, x=x)
    with pytest.raises(ucf.OperandError, match="operand A has another pattern.*shape"):
        k(A=sp.random(8, 6, density=0.4, random_state=10, format="csr"), x=x)
    np.testing.assert_allclose(k(A=A.toarray(), x=x).to_numpy(), A @ x)  # same pattern, dense


@pytest.mark.parametrize(
    "schedule, static, match",
    [
        ("dismantle(k)", "A", "dismantle\\(k\\): k iterates k, which no static operand"),
        ("reorder(i, k, j); dismantle(j)", "A", "loop k encloses j"),
        ("dismantle(z)", "A", "unknown index variable 'z'"),
        ("dismantle(j, consts)", "A", "the second argument is 'values'"),
        ("dismantle(j)", None, "no operand is static"),
        ("dismantle(i); dismantle(j)", "A", "already dismantles i"),
        ("parallelize(i, CPUThread, NoRaces); dismantle(j)", "A", "dismantle\\(j\\) unrolls i"),
    ],
)
def test_bad_dismantle_refused(schedule, static, match):
    A = ucf.from_numpy(sp.random(5, 4, density=0.5, random_state=12).toarray(), format="csr")
    with pytest.raises(ucf.ScheduleError, match=match):
        ucf.compile(SPMM, {"A": "csr"}, schedule, static={static: A} if static else None)


def test_static_names_an_operand():
    with pytest.raises(ucf.OperandError, match="static= names y"):
        ucf.compile(SPMV, {"A": "csr"}, "dismantle(j)", static={"y": np.ones(3)})


def test_code_size_bound(monkeypatch):
    monkeypatch.setattr(dismantle, "MAX_UNROLLED", 20)
    A = sp.random(10, 10, density=0.3, random_state=13, format="csr")
    with pytest.raises(ucf.ScheduleError, match="more than 20 copies"):
        ucf.compile(SPMV, {"A": "csr"}, "dismantle(j)", static={"A": A})
    k = ucf.compile(SPMV, {"A": "csr"}, "dismantle(i)", static={"A": A})  # 10 rows: fits
    np.testing.assert_allclose(k(A=A, x=np.ones(10)).to_numpy(), A @ np.ones(10))


def test_plan_dismantles_its_static_parts(monkeypatch):
    rng = np.random.default_rng(14)
    blocks = np.kron(rng.random((3, 4)) < 0.4, np.ones((4, 4), dtype=bool))
    mask = blocks | (rng.random((12, 16)) < 0.05)
    p = ucf.program(
        "y(t,h) = X(t,d) * W(d,h)", shapes={"X": (5, 12)}, attrs={"W": ucf.TeSA.from_mask(mask)}
    )
    plan = p.transform(ucf.Policy(blocks={(1, 1): 1.0, (4, 4): 6.0}))
    w, x = rng.standard_normal((12, 16)), rng.standard_normal((5, 12))
    expected = x @ np.where(mask, w, 0)
    monkeypatch.setattr(dismantle, "MAX_UNROLLED", 1)  # too large: compiled as usual
    run = plan.compile(dtype="float64", static={"W": w}, dismantle=True)
    assert all("not dismantled" in n and "MAX_UNROLLED" in n for n in run.notes), run.notes
    np.testing.assert_allclose(run(X=x)["y"], expected, rtol=1e-12)
    monkeypatch.undo()
    run = plan.compile(dtype="float64", static={"W": w}, dismantle=True)
    assert len(run.notes) == 2 and all("dismantled over W_" in n for n in run.notes)
    np.testing.assert_allclose(run(X=x)["y"], expected, rtol=1e-12)


@pytest.mark.parametrize("target", TARGETS)
def test_sparse_output_assembles_over_the_pattern(target):
    A = sp.random(6, 7, density=0.3, random_state=15, format="csr")
    B = np.random.default_rng(16).standard_normal((6, 7))
    fmts = {"A": "csr", "C": "csr"}
    k = ucf.compile(
        "C(i,j) = A(i,j) * B(i,j)", fmts, "dismantle(j)", target=target, static={"A": A}
    )
    assert not _loads(k) & {"A1_pos", "A1_crd"}  # neither pass reads A's index
    np.testing.assert_allclose(k(A=A, B=B).to_numpy(), A.toarray() * B)


@pytest.mark.parametrize("target", TARGETS)
def test_a_plain_static_operand_beside_a_blocked_one_is_repacked_when_compiling(target):
    """W (csr) is indexed by k, which T's blocks split: it is re-packed into those blocks
    when compiling, as every call re-packs it, and the kernel is dismantled over that
    split pattern (W's index arrays, split, fold into constants)."""
    rng = np.random.default_rng(4)
    T = np.kron(rng.random((3, 2)) < 0.6, np.ones((2, 3))) * rng.random((6, 6))
    W = sp.random(6, 5, density=0.4, format="csr", random_state=5)
    fmts = {"T": "bcsr(2,3)", "W": "csr"}
    Tt = ucf.from_numpy(T, format="bcsr(2,3)")
    plain = ucf.compile(FIG7, fmts, target=target, static={"W": W})
    with pytest.warns(ucf.ConversionWarning, match="re-packed"):
        np.testing.assert_allclose(plain(T=Tt, W=W).to_numpy(), T @ W.toarray())
    both = {"T": Tt, "W": W}  # T's loops around k_blk unroll too
    k = ucf.compile(FIG7, fmts, "dismantle(n)", target=target, static=both)
    assert not {"W2_pos", "W2_crd", "T1_pos", "T1_crd"} & _loads(k)  # the index arrays fold
    with pytest.warns(ucf.ConversionWarning, match="re-packed"):
        np.testing.assert_allclose(k(T=Tt, W=W).to_numpy(), T @ W.toarray())
    other = sp.random(6, 5, density=0.4, format="csr", random_state=6)
    with pytest.raises(ucf.OperandError, match="W"):
        k(T=Tt, W=other)
