"""Dynamic matmuls as gathered dense compute tiles (``ucf.stile.kernels``): checked
against numpy, against the generic rewrite bit for bit, across targets, depths and
the edges of tiles, panels and slabs."""

from __future__ import annotations

import re

import numpy as np
import pytest

import ucf
import ucf.stile.gathered
from tests.asan import driver_under_asan
from tests.helpers import tile_mask
from ucf.stile import gather_step, kernels
from ucf.stile.index_kernel import _function as index_function

MATMUL = "C(i,n) = A(i,k) * B(k,n)"
#: test_dynamic checks 1x64 and 32x64 against numpy (the condensed kernels run there).
GRANULARITIES = [(1, 1), (1, 8), (32, 1), (8, 3)]
#: The generic rewrite's default schedule for tiles split along i only, along k only,
#: along both, and for untiled operands.
GENERIC = {
    (True, False): "reorder(i_blk, k, i_in, n); parallelize(i_blk, CPUThread, NoRaces)",
    (False, True): "reorder(i, k_blk, k_in, n); parallelize(i, CPUThread, NoRaces)",
    (True, True): "reorder(i_blk, k_blk, i_in, k_in, n); parallelize(i_blk, CPUThread, NoRaces)",
    (False, False): "reorder(i, k, n); parallelize(i, CPUThread, NoRaces)",
}


def _generic(granularity, target, dtype):
    bh, bw = granularity
    schedule = GENERIC[bh > 1, bw > 1]
    return ucf.compile(
        MATMUL, dynamic={"A": granularity}, schedule=schedule, target=target, dtype=dtype
    )


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_condensed_matmul_matches_numpy_and_the_generic_kernel_bit_for_bit(granularity):
    """Both targets, masks empty to full; 300 columns of B are two slabs of panels and a
    tail, 70 x 100 leaves partial tiles. Every element sums its terms in the index's
    order in all three kernels, so they agree exactly."""
    rng = np.random.default_rng(3)
    m, k, n = 70, 100, 300
    kernels = {
        t: ucf.compile(MATMUL, dynamic={"A": granularity}, target=t, dtype=np.float32)
        for t in ("llvm", "c")
    }
    assert all("condensed:" in kern.cin for kern in kernels.values())
    generic = _generic(granularity, "llvm", np.float32)
    assert "condensed:" not in generic.cin
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    for sparsity in (0.0, 0.5, 0.9, 1.0):
        mask = tile_mask(rng, (m, k), granularity, sparsity)
        expect = (a * mask) @ b
        got = {t: np.asarray(kern(A=a, B=b, masks={"A": mask})) for t, kern in kernels.items()}
        assert np.allclose(got["llvm"], expect, atol=1e-4), sparsity
        assert np.array_equal(got["llvm"], got["c"]), sparsity
        assert np.array_equal(got["llvm"], np.asarray(generic(A=a, B=b, masks={"A": mask})))


@pytest.mark.parametrize("depth", [1, 5, 64, 1000])
def test_the_condense_depth_sets_the_compute_tile_and_keeps_the_result(depth):
    """``condense(k, A, depth)``: any depth (one tile, not a multiple of the tile, more
    than the live k's) gives the same sums; the notes say how deep a step is."""
    rng = np.random.default_rng(4)
    g = (32, 4)
    kern = ucf.compile(MATMUL, dynamic={"A": g}, schedule=f"condense(k, A, {depth})")
    default = ucf.compile(MATMUL, dynamic={"A": g})
    gathered = gather_step.depth_tiles(depth, 4) * 4
    assert f"gathers up to {gathered} of its live k's ({depth} asked" in kern.cin
    a, b = rng.standard_normal((96, 90)), rng.standard_normal((90, 21))
    mask = tile_mask(rng, a.shape, g, 0.4)
    got = np.asarray(kern(A=a, B=b, masks={"A": mask}))
    assert np.allclose(got, (a * mask) @ b)
    assert np.array_equal(got, np.asarray(default(A=a, B=b, masks={"A": mask})))


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_batched_condensed_matmuls_with_a_b_per_batch_and_a_shared_b(target):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 70, 24))
    mask = tile_mask(rng, a.shape, (1, 32, 1), 0.6)
    mask[1] = False  # one batch entirely empty
    for stmt, b, expect in (
        ("C(b,i,n) = A(b,i,k) * B(b,k,n)", rng.standard_normal((3, 24, 20)), "bik,bkn->bin"),
        ("C(b,i,n) = A(b,i,k) * B(k,n)", rng.standard_normal((24, 20)), "bik,kn->bin"),
    ):
        kern = ucf.compile(stmt, dynamic={"A": (1, 32, 1)}, target=target)
        assert "condensed:" in kern.cin
        got = np.asarray(kern(A=a, B=b, masks={"A": mask}))
        assert np.allclose(got, np.einsum(expect, a * mask, b))


def test_statements_the_condensed_kernel_does_not_cover_keep_the_generic_one():
    """Per-batch tiles over b > 1, a B without A's batch variables in order, integers,
    a sparse B, an extra factor: all run the generic rewrite, and still right."""
    rng = np.random.default_rng(6)
    cases = [
        ("C(b,i,n) = A(b,i,k) * B(b,k,n)", {"A": (2, 8, 1)}, {}, np.float64),
        (MATMUL, {"A": (32, 1)}, {}, np.int64),
        (MATMUL, {"A": (32, 1)}, {"B": "csr"}, np.float64),
        ("C(i,n) = A(i,k) * B(k,n) * d(n)", {"A": (8, 1)}, {}, np.float64),
        ("C(n,i) = A(i,k) * B(k,n)", {"A": (8, 1)}, {}, np.float64),
    ]
    for stmt, dynamic, formats, dtype in cases:
        kern = ucf.compile(stmt, formats, dynamic=dynamic, dtype=dtype)
        assert "condensed:" not in kern.cin, stmt
    kern = ucf.compile(MATMUL, dynamic={"A": (32, 1)}, dtype=np.int64)
    a = rng.integers(-5, 5, (40, 30))
    b = rng.integers(-5, 5, (30, 7))
    mask = rng.random(a.shape) < 0.5
    assert np.array_equal(np.asarray(kern(A=a, B=b, masks={"A": mask})), (a * mask) @ b)


def test_condense_requests_that_cannot_be_honoured_are_refused():
    with pytest.raises(ucf.ScheduleError, match=r"write condense\(k, A, depth\)"):
        ucf.compile(MATMUL, dynamic={"A": (32, 1)}, schedule="condense(i, A, 8)")
    with pytest.raises(ucf.ScheduleError, match="depth must be a positive integer"):
        ucf.compile(MATMUL, dynamic={"A": (32, 1)}, schedule="condense(k, A, 0)")
    with pytest.raises(ucf.UnsupportedError, match="condense.* is the whole schedule"):
        ucf.compile(MATMUL, dynamic={"A": (32, 1)}, schedule="condense(k, A, 8); reorder(i_blk, k)")
    with pytest.raises(ucf.UnsupportedError, match="gathered compute tiles are built for"):
        ucf.compile(
            "C(i,n) = A(i,k) * B(k,n) * d(n)", dynamic={"A": (8, 1)}, schedule="condense(k, A, 8)"
        )


def test_out_and_accumulating_into_it():
    rng = np.random.default_rng(7)
    kern = ucf.compile("C(i,n) += A(i,k) * B(k,n)", dynamic={"A": (32, 1)})
    a, b = rng.random((70, 20)), rng.random((20, 40))
    mask = rng.random(a.shape) < 0.3
    out = rng.random((70, 40))
    expect = out + (a * mask) @ b
    result = kern(A=a, B=b, masks={"A": mask}, out=out)
    assert np.allclose(out, expect) and np.shares_memory(np.asarray(result), out)
    with pytest.raises(ucf.OperandError, match=r"'\+=' needs the output"):
        kern(A=a, B=b, masks={"A": mask})
    with pytest.raises(ucf.OperandError, match="C must be a writable C-contiguous float64.*: it"):
        kern(A=a, B=b, masks={"A": mask}, out=np.zeros((40, 70)).T)
    with pytest.raises(ucf.OperandError, match="float64 .*: its dtype is float32$"):
        kern(A=a, B=b, masks={"A": mask}, out=np.zeros((70, 40), np.float32))
    with pytest.raises(ucf.OperandError, match="must have format 'UU' and dtype float64, got 'UC'"):
        kern(A=a, B=b, masks={"A": mask}, out=ucf.from_numpy(np.ones((70, 40)), "csr"))
    assigned = ucf.compile(MATMUL, dynamic={"A": (32, 1)})
    out = ucf.from_numpy(rng.random((70, 40)))
    assert assigned(A=a, B=b, masks={"A": mask}, out=out) is out
    assert np.allclose(out.to_numpy(), (a * mask) @ b)


@pytest.mark.parametrize("granularity", [(32, 8), (1, 8)])
def test_condensed_kernel_is_asan_clean_on_empty_and_full_masks(tmp_path, granularity):
    """The index built in C, copied into exactly sized buffers; A, the mask, B and C
    exactly sized too, with partial tiles along both modes and a tail of columns."""
    bh, bw = granularity
    nb, m, k, n = 2, 70, 45, 37
    rows, kb = nb * -(-m // bh), -(-k // bw)
    index = index_function("u8", "i32", (1, bh, bw))
    fn = kernels.function("f64", "i32", bh, bw, 8, 0)
    driver = f"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {{
  for (int full = 0; full < 2; full++) {{
    uint8_t *mask = malloc({nb * m * k});
    memset(mask, full, {nb * m * k});
    int32_t *flags = calloc({rows * kb}, 4), *pos = calloc({rows + 1}, 4);
    int32_t *slots = malloc({rows * kb} * 4);
    {index.name}(mask, {nb}, {m}, {k}, flags, pos, slots);
    int32_t *crd = malloc(pos[{rows}] * 4 + 1);
    memcpy(crd, slots, pos[{rows}] * 4);
    double *a = malloc({nb * m * k} * 8), *b = malloc({nb * k * n} * 8);
    double *c = calloc({nb * m * n}, 8);
    for (int q = 0; q < {nb * m * k}; q++) a[q] = 1.0;
    for (int q = 0; q < {nb * k * n}; q++) b[q] = 1.0;
    {fn.name}(a, mask, pos, crd, b, c, {nb}, {m}, {k}, {n}, {k * n});
    double sum = 0;
    for (int q = 0; q < {nb * m * n}; q++) sum += c[q];
    printf("%.0f\\n", sum);
    free(mask); free(flags); free(pos); free(slots); free(crd); free(a); free(b); free(c);
  }}
  return 0;
}}
"""
    assert driver_under_asan(tmp_path, [index, fn], driver) == ["0", str(nb * m * n * k)]


MOE = "C(e,t,n) = R(e,t) * X(t,d) * W(e,d,n)"


def _routing(rng, experts, tokens):
    """Top-2 gates, expert 1 left empty, and the last token on expert 0 alone."""
    r = np.zeros((experts, tokens))
    for t in range(tokens):
        chosen = rng.choice([e for e in range(experts) if e != 1], 2, replace=False)
        r[chosen, t] = rng.random(2)
    r[:, -1] = 0
    r[0, -1] = 0.5
    return r


@pytest.mark.parametrize(
    "target, tile, depth", [("llvm", (1, 1), None), ("c", (1, 4), 5), ("llvm", (1, 1), 24)]
)
def test_moe_gathers_each_experts_tokens_and_matches_numpy_and_the_generic_kernel(
    target, tile, depth
):
    """Rows of X at an expert's live tokens, scaled by their gates, times the expert's W:
    against numpy, and bit for bit against the rewrite (which sums over d in the same
    order). 600 d's are two steps, 300 columns of W slabs and a tail; 70 tokens leave a
    partial tile; at a depth of 24 an expert's live tokens are cut into equal items
    (some 46 of a top-2 routing into 23 and 23, all 70 into 24, 24 and 22)."""
    rng = np.random.default_rng(8)
    schedule = None if depth is None else f"condense(t, R, {depth})"
    kern = ucf.compile(MOE, dynamic={"R": tile}, schedule=schedule, target=target)
    assert "condensed: each step gathers up to" in kern.cin
    generic = ucf.compile(
        MOE, dynamic={"R": tile}, schedule="reorder(e, t, d, n)" if tile == (1, 1) else None
    )
    e, t, d, n = 4, 70, 600, 300
    x, w = rng.standard_normal((t, d)), rng.standard_normal((e, d, n))
    for r in (_routing(rng, e, t), np.zeros((e, t)), np.ones((e, t))):
        got = np.asarray(kern(R=r, X=x, W=w))
        assert np.allclose(got, np.einsum("et,td,edn->etn", r, x, w))
        if tile == (1, 1):
            assert np.array_equal(got, np.asarray(generic(R=r, X=x, W=w)))


def test_gathered_rows_without_a_batch_variable_and_with_a_mask():
    """``C(t,n) = R(t) * X(t,d) * W(d,n)``: one row of tiles; the mask wins over R."""
    rng = np.random.default_rng(9)
    kern = ucf.compile("C(t,n) = R(t) * X(t,d) * W(d,n)", dynamic={"R": (8,)})
    assert "condensed:" in kern.cin
    r, x, w = rng.random(50), rng.standard_normal((50, 30)), rng.standard_normal((30, 20))
    mask = rng.random(50) < 0.3
    got = np.asarray(kern(R=r, X=x, W=w, masks={"R": mask}))
    assert np.allclose(got, (r * mask)[:, None] * (x @ w))


def test_gathered_rows_kernel_is_asan_clean_on_empty_and_full_masks(tmp_path):
    """Tiles of 4 tokens cut at 70, 600 d's (two steps), 37 columns (a tail); C starts
    as ones, which SET=0 adds to, SET=1 overwrites at the live rows and SET=2 also
    zeroes elsewhere."""
    e, t, d, n, bt = 3, 70, 600, 37, 4
    kb = -(-t // bt)
    index = index_function("u8", "i32", (1, bt))
    fn = kernels.rows_function("f64", "i32", bt, 6, 0)
    driver = f"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {{
  for (int full = 0; full < 2; full++) for (int set = 0; set < 3; set++) {{
    uint8_t *mask = malloc({e * t});
    memset(mask, full, {e * t});
    int32_t *flags = calloc({e * kb}, 4), *pos = calloc({e + 1}, 4);
    int32_t *slots = malloc({e * kb} * 4);
    {index.name}(mask, {e}, {t}, flags, pos, slots);
    int32_t *crd = malloc(pos[{e}] * 4 + 1);
    memcpy(crd, slots, pos[{e}] * 4);
    double *r = malloc({e * t} * 8), *x = malloc({t * d} * 8), *w = malloc({e * d * n} * 8);
    double *c = malloc({e * t * n} * 8);
    for (int q = 0; q < {e * t * n}; q++) c[q] = 1.0;
    for (int q = 0; q < {e * t}; q++) r[q] = 1.0;
    for (int q = 0; q < {t * d}; q++) x[q] = 1.0;
    for (int q = 0; q < {e * d * n}; q++) w[q] = 1.0;
    {fn.name}(r, mask, pos, crd, x, w, c, {e}, {t}, {d}, {n}, set);
    double sum = 0;
    for (int q = 0; q < {e * t * n}; q++) sum += c[q];
    printf("%.0f ", sum);
    free(mask); free(flags); free(pos); free(slots); free(crd);
    free(r); free(x); free(w); free(c);
  }}
  printf("\\n");
  return 0;
}}
"""
    ones, live = e * t * n, e * t * n * d
    got = driver_under_asan(tmp_path, [index, fn], driver)
    assert got[0].split() == [str(ones), str(ones), "0", str(ones + live), str(live), str(live)]


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_gathered_rows_into_out_set_the_live_rows_and_zero_the_others(target):
    """``=`` into a used out= (the kernel sets the rows it computes, the rest are
    zeroed), ``+=`` adds to it; tiles of 2 tokens, one partial at the end."""
    rng = np.random.default_rng(10)
    e, t, d, n = 3, 41, 20, 24
    r, x, w = _routing(rng, e, t), rng.standard_normal((t, d)), rng.standard_normal((e, d, n))
    want = np.einsum("et,td,edn->etn", r, x, w)
    setting = ucf.compile(MOE, dynamic={"R": (1, 2)}, target=target)
    adding = ucf.compile(MOE.replace(") =", ") +="), dynamic={"R": (1, 2)}, target=target)
    assert setting._condensed is not None and adding._condensed is not None
    out = rng.standard_normal((e, t, n))
    before = out.copy()
    assert np.shares_memory(np.asarray(adding(R=r, X=x, W=w, out=out)), out)
    assert np.allclose(out, before + want)
    setting(R=r, X=x, W=w, out=out)
    assert np.allclose(out, want)
    assert not out[1].any()  # expert 1 has no tokens: its rows were zeroed, not computed
    out = rng.standard_normal((e, t, n))  # no d's: every row is an empty sum
    setting(R=r, X=x[:, :0], W=w[:, :0], out=out)
    assert not out.any()


def test_a_depth_past_the_largest_is_refused_and_long_tiles_still_gather():
    """A depth sizes per-thread workspaces when the kernel starts: past MAX_DEPTH it is
    refused (it segfaulted at 2**32 and wrapped around past int64). Micro-tiles of 1 x
    3000 gather one whole tile a step (a workspace of 48 KB), checked against numpy."""
    with pytest.raises(ucf.ScheduleError, match="at most 16384 k's; write a depth from 1"):
        ucf.compile(MATMUL, dynamic={"A": (3, 2)}, schedule="condense(k, A, 4294967296)")
    k = ucf.compile(MATMUL, dynamic={"A": (1, 3000)})
    assert k._condensed.shape.depth == gather_step.DEPTH
    rng = np.random.default_rng(11)
    a, b = rng.random((5, 3100)), rng.random((3100, 4))
    mask = rng.random(a.shape) < 0.5
    np.testing.assert_allclose(k(A=a, B=b, masks={"A": mask}).to_numpy(), (a * mask) @ b)


def test_an_explicit_depth_is_honoured_where_the_default_one_would_not_fit():
    """The reviewer's bug: micro-tiles of 40000 rows gathered 128 deep (the default) did
    not fit the old bound, and an explicit depth of 64, which does, was refused too.
    Likewise MoE's tiles of 4096 tokens, one per step. Both run, against numpy."""
    rng = np.random.default_rng(12)
    tall = ucf.compile(MATMUL, dynamic={"A": (40000, 1)}, schedule="condense(k, A, 64)")
    assert tall._condensed.shape.depth == 64
    a, b = rng.random((40001, 3)), rng.random((3, 2))
    mask = rng.random(a.shape) < 0.5
    np.testing.assert_allclose(tall(A=a, B=b, masks={"A": mask}).to_numpy(), (a * mask) @ b)
    for target in ("llvm", "c"):
        wide = ucf.compile(
            MOE, dynamic={"R": (1, 4096)}, schedule="condense(t, R, 1)", target=target
        )
        assert wide._condensed.shape.depth == 1
        r, x, w = _routing(rng, 3, 37), rng.standard_normal((37, 5)), rng.standard_normal((3, 5, 9))
        want = np.einsum("et,td,edn->etn", r, x, w)
        np.testing.assert_allclose(wide(R=r, X=x, W=w).to_numpy(), want, rtol=1e-12, atol=1e-12)


def test_a_depth_whose_workspace_does_not_fit_is_refused_with_the_largest_that_does():
    """Each thread allocates its gathered tile and packed slab when the kernel starts, up
    to MAX_WORKSPACE: a deeper request names the operand, its micro-tiles, the variable
    and the largest depth that fits (which compiles, one more does not); without
    ``condense`` the default depth is lowered to fit; micro-tiles that fit no depth are
    refused with that said, and without ``condense`` run the generic kernel."""
    with pytest.raises(ucf.UnsupportedError, match=r"R's micro-tiles of 1x1 gathered 16384 t's"):
        ucf.compile(MOE, dynamic={"R": (1, 1)}, schedule="condense(t, R, 16384)")
    with pytest.raises(ucf.UnsupportedError) as refused:
        ucf.compile(MATMUL, dynamic={"A": (40000, 1)}, schedule="condense(k, A, 16384)")
    message = str(refused.value)
    assert "A's micro-tiles of 40000x1 gathered 16384 k's deep need" in message
    largest = int(re.search(r"use a depth of at most (\d+)$", message).group(1))
    deepest = ucf.compile(MATMUL, dynamic={"A": (40000, 1)}, schedule=f"condense(k, A, {largest})")
    assert deepest._condensed.shape.depth == largest
    with pytest.raises(ucf.UnsupportedError, match=f"at most {largest}$"):
        ucf.compile(MATMUL, dynamic={"A": (40000, 1)}, schedule=f"condense(k, A, {largest + 1})")
    # 70000 rows of float64 by 128 k's need 72 MB: the default lowers its depth.
    lowered = ucf.compile(MATMUL, dynamic={"A": (70000, 1)})._condensed.shape.depth
    assert 64 < lowered < gather_step.DEPTH
    fits = ucf.stile.gathered.fits
    assert fits("matmul", np.dtype("f8"), (70000, 1), lowered)
    assert not fits("matmul", np.dtype("f8"), (70000, 1), lowered + 1)
    with pytest.raises(ucf.UnsupportedError, match="no depth fits micro-tiles of 4x1048576"):
        ucf.compile(MATMUL, dynamic={"A": (4, 1 << 20)}, schedule="condense(k, A, 1)")
    assert ucf.compile(MATMUL, dynamic={"A": (4, 1 << 20)})._condensed is None


def test_values_rounded_to_the_kernels_dtype_are_warned_about():
    k = ucf.compile("C(i,n) = A(i,k) * B(k,n)", dynamic={"A": (4, 1)}, dtype="float32")
    a, b = np.eye(8, dtype=np.float32), np.full((8, 3), 2**40 + 1, dtype=np.int64)
    with pytest.warns(ucf.ConversionWarning, match="operand B has int64 values, rounded"):
        got = k(A=a, B=b).to_numpy()
    np.testing.assert_array_equal(got, b.astype(np.float32))


def test_choose_stile_chooses_the_compute_tile_depth_too(monkeypatch):
    """Each gathering candidate is measured at each depth asked and the cheapest pair
    wins (without depths, at the kernels' default); a statement that gathers no compute
    tiles has no depth to choose."""
    from ucf.stile import choice as tile_choice

    rng = np.random.default_rng(12)
    samples = [tile_mask(rng, (128, 96), (32, 1), 0.5) for _ in range(2)]
    b = rng.random((96, 16), dtype=np.float32)
    ucf.set_num_threads(1)  # see test_choose_stile_prefers_the_tile_that_covers_least_work
    choice = ucf.choose_stile(samples, [(32, 1), (1, 8)], {"B": b}, depths=[16])
    spmv = ucf.choose_stile(
        samples, [(32, 1)], {"x": b[:, 0]}, statement="y(i) = A(i,k) * x(k)", depths=[8]
    )
    assert choice.depths == {(32, 1): 16, (1, 8): 16}
    assert choice.depth == choice.depths[choice.granularity]
    assert spmv.depth is None and spmv.depths == {(32, 1): None}
    a = rng.random((128, 96), dtype=np.float32)
    kern = ucf.compile(
        MATMUL,
        dynamic={"A": choice.granularity},
        schedule=f"condense(k, A, {choice.depth})",
        dtype=np.float32,
    )
    assert kern._condensed.shape.depth == choice.depth
    got = np.asarray(kern(A=a, B=b, masks={"A": samples[0]}))
    assert np.allclose(got, (a * samples[0]) @ b, rtol=1e-5)
    # With the measured costs given, the depth of least cost over the samples wins.
    per_tile = {8: 2.0, 64: 1.0, 256: 3.0}
    monkeypatch.setattr(
        tile_choice, "_tile_cost", lambda s, o, g, depth, *rest: (0.5, per_tile[depth])
    )
    forced = ucf.choose_stile(samples, [(32, 1)], {"B": b}, depths=[8, 64, 256])
    assert forced.depth == 64
    assert forced.costs[(32, 1)] == sum(0.5 + n * 1.0 for n in forced.live[(32, 1)])
    with pytest.raises(ucf.ArgumentError, match="depths= takes a list of depths, got int"):
        ucf.choose_stile(samples, [(32, 1)], {"B": b}, depths=5)
    with pytest.raises(ucf.ArgumentError, match="operands= takes a dict by name, got list"):
        ucf.choose_stile(samples, [(32, 1)], [b])
    for bad, message in (([], "at least one compute-tile depth"), ([0], "positive int")):
        with pytest.raises(ucf.OperandError, match=message):
            ucf.choose_stile(samples, [(32, 1)], {"B": b}, depths=bad)
    with pytest.raises(ucf.OperandError, match="at most 16384"):
        ucf.choose_stile(samples, [(32, 1)], {"B": b}, depths=[1 << 15])
