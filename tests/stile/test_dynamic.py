"""Dynamic operands (``ucf.compile(..., dynamic=...)``): dense data with a mask known at
call time, computed over its live micro-tiles only, checked against numpy."""

from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests import asan
from tests.asan import run_under_asan
from tests.helpers import tile_mask
from ucf.format.tensor import Tensor
from ucf.stile import tile_index

MATMUL = "C(i,n) = A(i,k) * B(k,n)"
GRANULARITIES = [(1, 1), (1, 8), (32, 1), (1, 64), (32, 64)]
SPARSITIES = [0.0, 0.5, 0.9, 0.99, 1.0]


@pytest.fixture(scope="module")
def matmuls():
    """One compiled matmul per granularity (compiled once, called with many masks)."""
    return {g: ucf.compile(MATMUL, dynamic={"A": g}, dtype=np.float32) for g in GRANULARITIES}


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("shape", [(96, 128, 16), (70, 100, 13)])
def test_matmul_against_numpy(matmuls, granularity, shape):
    """Every sparsity, with the mask given and derived from A's zeros; (70, 100) leaves
    partial tiles at both edges for every granularity but 1x1."""
    rng = np.random.default_rng(1)
    m, k, n = shape
    kern = matmuls[granularity]
    for sparsity in SPARSITIES:
        mask = tile_mask(rng, (m, k), granularity, sparsity)
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        expect = (a * mask) @ b
        got = kern(A=a, B=b, masks={"A": mask})
        assert np.allclose(np.asarray(got), expect, atol=1e-4), sparsity
        derived = kern(A=a * mask, B=b)
        assert np.allclose(np.asarray(derived), expect, atol=1e-4), sparsity


@pytest.mark.parametrize("granularity", [(1, 8), (32, 1), (32, 64)])
def test_matmul_on_the_c_target(granularity):
    rng = np.random.default_rng(2)
    kern = ucf.compile(MATMUL, dynamic={"A": granularity}, dtype=np.float32, target="c")
    for sparsity in (0.0, 0.9, 1.0):
        mask = tile_mask(rng, (70, 100), granularity, sparsity)
        a = rng.standard_normal((70, 100)).astype(np.float32)
        b = rng.standard_normal((100, 9)).astype(np.float32)
        got = kern(A=a, B=b, masks={"A": mask})
        assert np.allclose(np.asarray(got), (a * mask) @ b, atol=1e-4)


def test_the_mask_wins_over_nonzeros_outside_it():
    """A is fully dense; only the masked entries count, even inside a live tile."""
    rng = np.random.default_rng(3)
    kern = ucf.compile(MATMUL, dynamic={"A": (4, 4)}, dtype=np.float64)
    a, b = rng.random((12, 16)) + 1, rng.random((16, 5))
    mask = np.zeros((12, 16), bool)
    mask[1, 2] = mask[5, 9] = True  # one element in each of two tiles
    got = np.asarray(kern(A=a, B=b, masks={"A": mask}))
    assert np.allclose(got, (a * mask) @ b)
    for m in (mask.astype(np.float32) * 3, mask.astype(np.int8)):  # any nonzero is live
        assert np.allclose(np.asarray(kern(A=a, B=b, masks={"A": m})), (a * mask) @ b)


def test_masks_change_between_calls_of_one_kernel():
    rng = np.random.default_rng(4)
    kern = ucf.compile(MATMUL, dynamic={"A": (32, 1)}, dtype=np.float32)
    a = rng.standard_normal((64, 40)).astype(np.float32)
    b = rng.standard_normal((40, 8)).astype(np.float32)
    for sparsity in (0.9, 0.0, 1.0, 0.5, 0.99, 0.9):
        mask = tile_mask(rng, a.shape, (32, 1), sparsity)
        assert np.allclose(np.asarray(kern(A=a, B=b, masks={"A": mask})), (a * mask) @ b, atol=1e-4)
        assert np.allclose(np.asarray(kern(A=a * mask, B=b)), (a * mask) @ b, atol=1e-4)


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_operands_and_masks_in_any_layout_and_dtype(target):
    """Fortran-order, strided and reversed operands and masks, masks of any number
    dtype, and operands of another dtype than the kernel's, on a condensed kernel (tiles
    of 4 x 1), a generic one with padded tiles (3 x 2, scheduled) and MoE's gathered rows: each
    against numpy."""
    rng = np.random.default_rng(21)
    a, b = rng.standard_normal((10, 7)), rng.standard_normal((7, 5))
    m = rng.random(a.shape) < 0.4
    r, x, w = rng.random((3, 9)), rng.standard_normal((9, 4)), rng.standard_normal((3, 4, 6))
    routed = rng.random(r.shape) < 0.5
    layouts = [
        np.asfortranarray,
        lambda v: np.repeat(v, 2, axis=-1)[..., ::2],
        lambda v: np.flip(np.flip(v, -1).copy(), -1),
    ]
    masks = [lambda v: v, lambda v: v.astype(np.float32), lambda v: v.astype(np.int8) * 3]
    generic = "reorder(i_blk, k_blk, i_in, k_in, n)"
    for g, schedule in [((4, 1), None), ((3, 2), generic)]:
        kern = ucf.compile(MATMUL, dynamic={"A": g}, target=target, schedule=schedule)
        assert (kern._condensed is None) == (schedule == generic)
        for lay, mk in zip(layouts, masks, strict=True):
            want = (a * m) @ b
            np.testing.assert_allclose(
                kern(A=lay(a), B=b, masks={"A": lay(mk(m))}).to_numpy(), want
            )
            np.testing.assert_allclose(kern(A=a, B=lay(b), masks={"A": mk(m)}).to_numpy(), want)
        got = kern(A=a.astype(np.float32), B=b.astype(np.int32), masks={"A": m}).to_numpy()
        np.testing.assert_allclose(got, (a.astype(np.float32) * m) @ b.astype(np.int32))
    moe = ucf.compile(MOE, dynamic={"R": (1, 1)}, target=target)
    want = np.einsum("et,td,edn->etn", r * routed, x, w)
    for lay, mk in zip(layouts, masks, strict=True):
        got = moe(R=lay(r), X=lay(x), W=lay(w), masks={"R": lay(mk(routed))}).to_numpy()
        np.testing.assert_allclose(got, want)


def test_output_into_out_and_accumulating():
    """``out=`` is written in place; ``+=`` adds to it (tiles dividing and not)."""
    rng = np.random.default_rng(10)
    for m in (64, 70):
        kern = ucf.compile("C(i,n) += A(i,k) * B(k,n)", dynamic={"A": (32, 1)})
        a, b = rng.random((m, 20)), rng.random((20, 4))
        mask = rng.random((m, 20)) < 0.3
        out = rng.random((m, 4))
        expect = out + (a * mask) @ b
        kern(A=a, B=b, masks={"A": mask}, out=out)
        assert np.allclose(out, expect)


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_batch_matmul_with_a_mask_per_b(target):
    """A(b,i,k) with 1 x 32 x 1 tiles: every b has its own mask (b is prevalent)."""
    rng = np.random.default_rng(5)
    kern = ucf.compile(
        "C(b,i,n) = A(b,i,k) * B(b,k,n)", dynamic={"A": (1, 32, 1)}, dtype=np.float32, target=target
    )
    a = rng.standard_normal((3, 70, 24)).astype(np.float32)
    b = rng.standard_normal((3, 24, 6)).astype(np.float32)
    mask = tile_mask(rng, a.shape, (1, 32, 1), 0.6)
    mask[1] = False  # one batch entirely empty
    expect = np.einsum("bik,bkn->bin", a * mask, b)
    assert np.allclose(np.asarray(kern(A=a, B=b, masks={"A": mask})), expect, atol=1e-4)
    assert np.allclose(np.asarray(kern(A=a * mask, B=b)), expect, atol=1e-4)


def test_dynamic_operand_on_the_right_and_a_vector():
    """The dynamic operand need not come first, nor be a matrix (SpMV over 1 x 8 tiles of
    x; y(i) = A(i,k) x(k) with x dynamic, tiles of 8)."""
    rng = np.random.default_rng(6)
    a = rng.standard_normal((9, 50))
    x = rng.standard_normal(50) * (rng.random(50) < 0.3)
    kern = ucf.compile("y(i) = A(i,k) * x(k)", dynamic={"x": (8,)})
    assert np.allclose(np.asarray(kern(A=a, x=x)), a @ x)
    kern = ucf.compile(MATMUL, dynamic={"B": (1, 4)})
    bm = rng.standard_normal((50, 10)) * (rng.random((50, 10)) < 0.3)
    assert np.allclose(np.asarray(kern(A=a, B=bm)), a @ bm)


def test_an_untiled_kernel_converts_a_scipy_operand_once(monkeypatch):
    """1 x 1 tiles need no split: the operands checked for their extents go on to the
    kernel as they are, so a scipy B becomes a Tensor once per call."""
    from ucf.exec import operand_intake
    from ucf.format import interop

    rng = np.random.default_rng(11)
    a = rng.standard_normal((7, 9)) * (rng.random((7, 9)) < 0.5)
    b = sp.random(9, 4, density=0.4, format="csr", random_state=3)
    kern = ucf.compile(MATMUL, {"B": "csr"}, dynamic={"A": (1, 1)})
    assert kern.blocking is None
    converted = []
    as_tensor = interop.as_tensor

    def counting(value, *args, **kwargs):
        converted.append(value is b)
        return as_tensor(value, *args, **kwargs)

    monkeypatch.setattr(interop, "as_tensor", counting)
    monkeypatch.setattr(operand_intake, "as_tensor", counting)
    np.testing.assert_allclose(np.asarray(kern(A=a, B=b)), a @ b.toarray())
    assert converted.count(True) == 1


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_a_max_beside_a_blocked_operand(target):
    """The statement fuzzer (seed 45, case 266): a dynamic operand in a max beside an
    operand blocked on the summed variable. The tile index's window over that variable
    is opened inside the max's own loops, where the block's outer variable is bound
    around them (an internal KeyError before)."""
    rng = np.random.default_rng(266)
    a = np.where(rng.random((6, 4)) < 0.5, rng.random((6, 4)), 0.0)
    b = rng.random((6, 4))
    mask = tile_mask(rng, (6, 4), (1, 2), 0.5)
    k = ucf.compile(
        "X(j) = max(i, A(i,j) - B(i,j))",
        {"A": "UCC:1,0/3,0%3"},
        dynamic={"B": (1, 2)},
        target=target,
    )
    got = k(A=ucf.from_numpy(a, "UCC:1,0/3,0%3"), B=b, masks={"B": mask})
    np.testing.assert_array_equal(np.asarray(got), (a - b * mask).max(axis=0))


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize(
    "stmt,tile,reference",
    [
        ("X(j) = max(i, B(i,j))", (1, 2), lambda a, b, x: b.max(axis=0)),
        ("X(i,j) = A(i,j) + B(i,j)", (1, 2), lambda a, b, x: a + b),
        ("X(i,j) = A(i,j) - B(i,j)", (2, 2), lambda a, b, x: a - b),
        ("y(i) = B(i,k) * x(k) + x(i)", (2, 1), lambda a, b, x: b @ x + x),
        ("s = B(i,k) * x(i) * x(k)", (1, 3), lambda a, b, x: x @ b @ x),
        ("X(j) = min(i, A(i,j) * B(i,j))", (2, 1), lambda a, b, x: (a * b).min(axis=0)),
    ],
)
def test_the_cpu_index_is_ordered_so_it_co_iterates(target, stmt, tile, reference):
    """On the CPU a row's live tiles are listed in order (one thread scans them), so the
    index is ordered compressed there: a dynamic operand co-iterates with a sparse one,
    and a max meets every coordinate (each was refused while the index was unordered)."""
    rng = np.random.default_rng(sum(tile))
    a = np.where(rng.random((6, 6)) < 0.4, rng.random((6, 6)) - 0.5, 0.0)
    b, x = rng.random((6, 6)) - 0.5, rng.random(6)
    mask = tile_mask(rng, (6, 6), tile, 0.5)
    k = ucf.compile(stmt, {"A": "csr"} if "A(" in stmt else {}, dynamic={"B": tile}, target=target)
    ops = {"A": ucf.from_numpy(a, "csr")} if "A(" in stmt else {}
    ops |= {"x": x} if re.search(r"\bx\(", stmt) else {}
    got = np.asarray(k(B=b, masks={"B": mask}, **ops).to_numpy())
    np.testing.assert_allclose(got, reference(a, b * mask, x), rtol=1e-13, atol=1e-15)


def test_refusals_name_the_tensor_or_variable():
    conv = "O(n,m,x,y) = I(n,c,x+r,y+s) * W(m,c,r,s)"
    with pytest.raises(ucf.ScheduleError, match="x is a compound variable"):
        ucf.compile(conv, dynamic={"I": (1, 1, 4, 4)})
    with pytest.raises(ucf.OperandError, match="dynamic= names Z"):
        ucf.compile(MATMUL, dynamic={"Z": (1, 1)})
    with pytest.raises(ucf.OperandError, match="dynamic operand A: the granularity"):
        ucf.compile(MATMUL, dynamic={"A": (32,)})
    with pytest.raises(ucf.OperandError, match="dynamic operand A is passed dense"):
        ucf.compile(MATMUL, {"A": "csr"}, dynamic={"A": (1, 1)})
    with pytest.raises(ucf.UnsupportedError, match="run on llvm, c, cuda, not 'metal'"):
        ucf.compile(MATMUL, dynamic={"A": (1, 1)}, target="metal")
    kern = ucf.compile(MATMUL, dynamic={"A": (2, 2)})
    a, b = np.ones((4, 6)), np.ones((6, 3))
    with pytest.raises(ucf.OperandError, match=r"mask of A has shape \(4, 5\)"):
        kern(A=a, B=b, masks={"A": np.ones((4, 5), bool)})
    with pytest.raises(ucf.OperandError, match="mask of A has dtype complex128"):
        kern(A=a, B=b, masks={"A": np.ones((4, 6), complex)})
    with pytest.raises(ucf.OperandError, match="operand B: value dtype complex128"):
        kern(A=a, B=b.astype(complex), masks={"A": np.ones((4, 6), bool)})
    with pytest.raises(ucf.OperandError, match="operand A: value dtype complex128"):
        kern(A=a.astype(complex), B=b)  # its nonzeros would be the mask: A's dtype is named
    with pytest.raises(ucf.OperandError, match="operand A: value dtype bool"):
        kern(A=a > 0, B=b)
    with pytest.raises(ucf.OperandError, match="mask for B, which is not a dynamic operand"):
        kern(A=a, B=b, masks={"B": np.ones((6, 3), bool)})
    with pytest.raises(ucf.OperandError, match="dynamic operand A is passed dense"):
        kern(A=ucf.from_numpy(a, "csr"), B=b)
    with pytest.raises(ucf.ShapeError, match=r"index variable k has extent 6 in A \(mode 1\)"):
        kern(A=a, B=np.ones((5, 3)))
    with pytest.raises(ucf.ShapeError, match=r"out= has shape \(5, 3\) but C\(i, n\)"):
        kern(A=a, B=b, out=np.zeros((5, 3)))
    with pytest.raises(ucf.ShapeError, match="operand A has order 3"):
        kern(A=a[None], B=b)
    with pytest.raises(ucf.OperandError, match="not as a scipy sparse csr matrix"):
        kern(A=sp.csr_array(a), B=b)
    with pytest.raises(ucf.ShapeError, match=r"extent 6 in A \(mode 1\) but 5 in B"):
        ucf.compile(MATMUL, dynamic={"A": (1, 1)})(A=a, B=np.ones((5, 3)))  # no split
    with pytest.raises(ucf.OperandError, match="its format may not be 'dense@qint8'"):
        ucf.compile(MATMUL, {"A": "dense@qint8"}, dynamic={"A": (2, 2)})
    with pytest.raises(ucf.OperandError, match="passes A, B, T"):
        kern(A=a, B=b, T=a)
    with pytest.raises(ucf.OperandError, match="passes A$"):
        kern(A=a)
    with pytest.raises(ucf.UnsupportedError, match=r"B is read through an index of its live"):
        # the index's tiles of two rows come unordered, so the max's loop over them can
        # neither co-iterate nor fold the fill in once (tiles of one row run on CUDA:
        # tests/stile/test_dynamic_cuda.py)
        ucf.compile("X(j) = max(i, B(i,j))", dynamic={"B": (2, 2)}, target="cuda")
    plain = ucf.compile(MATMUL)
    with pytest.raises(ucf.OperandError, match="mask for A, which is not a dynamic operand"):
        plain(A=a, B=b, masks={"A": np.ones((4, 6), bool)})


@pytest.mark.parametrize("full", [False, True])
def test_compute_kernel_is_asan_clean_on_empty_and_full_masks(asan_cc, tmp_path, full, monkeypatch):  # noqa: F811
    """The split kernel, saved as C, reads the index, the mask and A in exactly sized
    buffers."""
    monkeypatch.setitem(asan.CTYPE, "u8", "uint8_t")
    monkeypatch.setitem(asan.NPTYPE, "u8", np.uint8)
    m, k, n, g = 64, 24, 5, (32, 4)
    rng = np.random.default_rng(7)
    kern = ucf.compile(MATMUL, dynamic={"A": g}, dtype=np.float64, target="c")
    a, b = rng.random((m, k)), rng.random((k, n))
    mask = np.full((m, k), full)
    index = tile_index.build(tile_index.mask_array(mask, "mask"), g, "c", np.float64, np.int32)
    split_a = Tensor.from_numpy(a.reshape(m // 32, 32, k // 4, 4))
    split_b = Tensor.from_numpy(b.reshape(k // 4, 4, n))
    inner = kern.kernel
    extents = {"i_blk": m // 32, "i_in": 32, "k_blk": k // 4, "k_in": 4, "n": n, "i": m, "k": k}
    split_k = Tensor.from_numpy(mask.view(np.uint8).reshape(m // 32, 32, k // 4, 4))
    operands = {"T": index, "K": split_k, "A": split_a, "B": split_b}
    got = run_under_asan(asan_cc, tmp_path, inner, "UUU", (m // 32, 32, n), extents, operands)
    assert np.allclose(got.to_numpy().reshape(m, n), (a * mask) @ b)


MOE = "C(e,t,n) = R(e,t) * X(t,d) * W(e,d,n)"


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_moe_with_empty_experts_and_all_tokens_on_one(target):
    """Routing changes every call: random top-2, some experts empty, every token on one
    expert, nothing routed at all."""
    rng = np.random.default_rng(8)
    experts, tokens, d, n = 6, 40, 12, 7
    kern = ucf.compile(MOE, dynamic={"R": (1, 1)}, dtype=np.float32, target=target)
    x = rng.standard_normal((tokens, d)).astype(np.float32)
    w = rng.standard_normal((experts, d, n)).astype(np.float32)
    top2 = np.zeros((experts, tokens), np.float32)
    for t in range(tokens):
        top2[rng.choice(experts, 2, replace=False), t] = rng.random(2) + 0.1
    empty = top2.copy()
    empty[[1, 3, 4]] = 0
    one = np.zeros((experts, tokens), np.float32)
    one[2] = rng.random(tokens) + 0.1
    for r in (top2, empty, one, np.zeros_like(one), top2):
        expect = np.einsum("et,td,edn->etn", r, x, w)
        assert np.allclose(np.asarray(kern(R=r, X=x, W=w)), expect, atol=1e-4)


# SparDA Table 2: a mask of i.i.d. (g, 1) blocks at sparsity s, covered by (t, 1) data
# tiles, is left with sparsity s ** (t / g); the table lists it for a 4096^3 matmul.
TABLE2 = [
    ((2, 1), 0.95, (16, 1), 0.6639),
    ((2, 1), 0.99, (8, 1), 0.9606),
    ((4, 1), 0.95, (16, 1), 0.8145),
    ((4, 1), 0.99, (16, 1), 0.9605),
    ((8, 1), 0.95, (8, 1), 0.95),
    ((8, 1), 0.99, (32, 1), 0.9602),
    ((32, 1), 0.95, (32, 1), 0.95),
    ((32, 1), 0.99, (32, 1), 0.99),
]


@pytest.mark.parametrize("granularity, sparsity, tile, after", TABLE2)
def test_cover_leaves_the_sparsity_of_sparda_table_2(granularity, sparsity, tile, after):
    """The index's count of live tiles gives the sparsity after cover, on an i.i.d.
    mask of 4096 x 512 (a few thousand tiles per row of the table: the table's value
    within 0.015)."""
    rng = np.random.default_rng(9)
    m, k = 4096, 512
    blocks = rng.random((m // granularity[0], k)) >= sparsity
    mask = np.repeat(blocks, granularity[0], axis=0)
    index = ucf.stile_index(mask, tile)
    tiles = index.shape[0] * index.shape[1]
    left = 1 - index.nnz / tiles
    assert abs(left - after) < 0.015, (left, after)
    assert abs(left - sparsity ** (tile[0] / granularity[0])) < 0.015


def test_choose_stile_prefers_the_tile_that_covers_least_work():
    """SparDA's Algorithm 2 over measured tile costs: on i.i.d. 1% masks a 32 x 64 tile
    is almost always live (it computes the dense product), a 1 x 1 tile covers only
    the nonzeros; the live counts are numpy's tile reductions."""
    rng = np.random.default_rng(11)
    n = 512  # large enough that the dense product, not a call's fixed cost, decides
    samples = [rng.random((n, n)) < 0.01 for _ in range(2)]
    b = rng.random((n, 128), dtype=np.float32)
    # One thread: the suite forces even tiny loops parallel, and threads waiting on a
    # busy machine would swamp a millisecond's work and so the measured costs.
    ucf.set_num_threads(1)
    choice = ucf.choose_stile(samples, [(32, 64), (1, 1)], operands={"B": b})
    for g in ((32, 64), (1, 1)):
        expect = [
            int(m.reshape(n // g[0], g[0], n // g[1], g[1]).any(axis=(1, 3)).sum()) for m in samples
        ]
        assert choice.live[g] == expect
        assert choice.costs[g] > 0
    assert choice.granularity == (1, 1), choice.costs
    with pytest.raises(ucf.OperandError, match="sample 1 has shape"):
        ucf.choose_stile([samples[0], samples[0][:8]], [(1, 1)], operands={"B": b})
    with pytest.raises(ucf.OperandError, match="at least one candidate"):
        ucf.choose_stile(samples, [], operands={"B": b})


def test_a_mask_of_none_derives_the_mask_from_the_zeros():
    """``masks={"A": None}`` is no mask given (docs/stile.md): the live micro-tiles are
    A's nonzeros, as without ``masks=``."""
    rng = np.random.default_rng(41)
    a = rng.standard_normal((40, 30)) * (rng.random((40, 30)) < 0.2)
    b = rng.standard_normal((30, 7))
    kern = ucf.compile("C(i,n) = A(i,k) * B(k,n)", dynamic={"A": (8, 1)})
    np.testing.assert_allclose(np.asarray(kern(A=a, B=b, masks={"A": None})), a @ b, atol=1e-12)


def test_choose_stile_measures_a_tile_cost_once_and_keeps_it_in_the_cache(monkeypatch):
    """The second choice over the same candidates reads the kernel cache and builds no
    dynamic kernel to measure again; a new candidate is measured."""
    from ucf.stile import dynamic

    rng = np.random.default_rng(13)
    samples = [rng.random((64, 48)) < 0.1]
    b = rng.random((48, 8))
    first = ucf.choose_stile(samples, [(8, 1), (1, 1)], operands={"B": b}, dtype=np.float64)
    built = []
    real = dynamic.DynamicKernel

    def counting(*args, **kwargs):
        built.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(dynamic, "DynamicKernel", counting)
    again = ucf.choose_stile(samples, [(8, 1), (1, 1)], operands={"B": b}, dtype=np.float64)
    assert again.costs == first.costs and again.granularity == first.granularity
    assert built == []
    ucf.choose_stile(samples, [(4, 1)], operands={"B": b}, dtype=np.float64)
    assert len(built) == 1
