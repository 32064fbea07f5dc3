"""Kernels over blocked formats (``bcsr``, ``bcsc``, ``bdcsr`` and any level map with
blocks), checked against numpy on the llvm, c and emulated cuda targets: partial
blocks, empty block rows, one block, dense and all-zero tensors, mixed with plain
U/C operands, sparse and blocked outputs, and scipy's BSR zero-copy."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import TARGETS, needs_cc, rand_dense, rand_sparse, stored_coords
from ucf.errors import ConversionWarning, ScheduleError, UnsupportedError
from ucf.format.format import parse_format
from ucf.schedule import cpu_model


def compile_for(target, expr, formats, **kw):
    if target == "cuda":
        return ucf.compile(expr, formats=formats, target="cuda", emulate=True, **kw)
    return ucf.compile(expr, formats=formats, target=target, **kw)


def blocky(rng, shape, block, density=0.4, empty_block_rows=1):
    """A matrix whose nonzeros fill about ``density`` of its blocks (each block sparse
    inside too), with ``empty_block_rows`` block rows all zero."""
    bh, bw = block
    rows, cols = -(-shape[0] // bh), -(-shape[1] // bw)
    keep = rng.random((rows, cols)) < density
    if empty_block_rows and rows > 1:
        keep[rng.choice(rows, size=min(empty_block_rows, rows - 1), replace=False)] = False
    mask = np.kron(keep, np.ones(block, dtype=bool))[: shape[0], : shape[1]]
    mask &= rng.random(shape) < 0.8
    a = np.zeros(shape)
    a[mask] = rng.integers(1, 10, size=int(mask.sum())) * rng.choice([-1, 1], int(mask.sum()))
    return a


# (format, shape): exact blocks, partial blocks, 1x1 blocks, one block for everything
CASES = [
    ("bcsr(2,3)", (10, 12)),
    ("bcsr(4,4)", (11, 13)),
    ("bcsr(1,1)", (7, 6)),
    ("bcsr(8,8)", (8, 8)),
    ("bcsc(2,3)", (9, 10)),
    ("bdcsr(3,2)", (14, 9)),
    ("UUUU:0/2,1/2,0%2,1%2", (6, 7)),
    ("CUCU:0/3,0%3,1/2,1%2", (9, 8)),
]
IDS = [f"{f}-{s[0]}x{s[1]}" for f, s in CASES]


def block_of(fmt: str) -> tuple[int, int]:
    sizes = {m.mode: m.mod for m in parse_format(fmt).maps if m.mod}
    return sizes.get(0, 1), sizes.get(1, 1)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("fmt", "shape"), CASES, ids=IDS)
def test_spmv_and_its_transpose(target, fmt, shape):
    rng = np.random.default_rng(1)
    A = blocky(rng, shape, block_of(fmt))
    x, z = rand_dense(rng, shape[1]), rand_dense(rng, shape[0])
    At = ucf.from_numpy(A, format=fmt)
    k = compile_for(target, "y(i) = A(i,k)*x(k)", {"A": fmt})
    np.testing.assert_allclose(k(A=At, x=x).to_numpy(), A @ x)
    kt = compile_for(target, "y(k) = A(i,k)*z(i)", {"A": fmt})
    np.testing.assert_allclose(kt(A=At, z=z).to_numpy(), A.T @ z)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("fmt", "shape"), CASES, ids=IDS)
def test_spmm(target, fmt, shape):
    rng = np.random.default_rng(2)
    A = blocky(rng, shape, block_of(fmt))
    B = rand_dense(rng, (shape[1], 5))
    k = compile_for(target, "C(i,j) = A(i,k)*B(k,j)", {"A": fmt})
    np.testing.assert_allclose(k(A=ucf.from_numpy(A, format=fmt), B=B).to_numpy(), A @ B)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("fmt", "shape"), CASES[:4], ids=IDS[:4])
def test_sddmm_keeps_the_blocks(target, fmt, shape):
    """A blocked sampling matrix and a blocked output of the same format."""
    rng = np.random.default_rng(3)
    A = blocky(rng, shape, block_of(fmt))
    B, C = rand_dense(rng, (shape[0], 4)), rand_dense(rng, (4, shape[1]))
    k = compile_for(target, "D(i,j) = A(i,j)*B(i,k)*C(k,j)", {"A": fmt, "D": fmt})
    At = ucf.from_numpy(A, format=fmt)
    got = k(A=At, B=B, C=C)
    assert got.format == At.format
    got.validate()
    np.testing.assert_allclose(got.to_numpy(), A * (B @ C))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("other", ["dense", "csr", "csc", "bcsr(2,3)"])
@pytest.mark.parametrize("out", ["dense", "csr", "bcsr(2,3)"])
def test_add_with_plain_and_blocked_operands(target, other, out):
    rng = np.random.default_rng(4)
    A, B = blocky(rng, (9, 10), (2, 3)), blocky(rng, (9, 10), (2, 3), density=0.3)
    k = compile_for(target, "C(i,j) = A(i,j) + B(i,j)", {"A": "bcsr(2,3)", "B": other, "C": out})
    got = k(A=ucf.from_numpy(A, format="bcsr(2,3)"), B=ucf.from_numpy(B, format=other))
    got.validate()
    np.testing.assert_allclose(got.to_numpy(), A + B)
    if out == "csr":  # a plain sparse output stores no padding
        assert stored_coords(got) <= {(i, j) for i in range(9) for j in range(10)}


def test_a_blocked_sparse_output_of_many_split_variables_is_appended_in_its_level_order():
    """Eight split variables are too many to try every loop order: the order that
    appends the output follows the output's levels (found by the fuzzer)."""
    rng = np.random.default_rng(5)
    A, B = rng.integers(-3, 4, (3, 2, 4)) * 1.0, rng.integers(-3, 4, (3, 2)) * 1.0
    C, D = rng.integers(-3, 4, (3, 2)) * 1.0, rng.integers(-3, 4, 3) * 1.0
    formats = {"A": "UUF2:0,2,1", "B": "bcsr(1,2)", "C": "UF2:0,1", "D": "dense"}
    k = ucf.compile(
        "X(i,l,k,j) = max(2 * A(i,j,l), max(B(i,j), max(C(i,k), D(i))))",
        formats={**formats, "X": "UUUUUUC:0,1/1,2/1,3/2,1%1,2%1,3%2"},
    )
    ops = {
        n: ucf.from_numpy(a, format=formats[n]) for n, a in zip("ABCD", (A, B, C, D), strict=True)
    }
    want = np.maximum(
        2 * A.transpose(0, 2, 1)[:, :, None, :],
        np.maximum(B[:, None, None, :], np.maximum(C[:, None, :, None], D[:, None, None, None])),
    )
    np.testing.assert_array_equal(k(**ops).to_numpy(), want)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("B_format", ["dense", "csr", "dcsr"])
def test_spmm_with_a_sparse_right_operand_and_a_sparse_output(target, B_format):
    rng = np.random.default_rng(5)
    A = blocky(rng, (12, 10), (4, 2))
    B = sp.random(10, 7, density=0.3, random_state=6).toarray()
    k = compile_for(target, "C(i,j) = A(i,k)*B(k,j)", {"A": "bcsr(4,2)", "B": B_format, "C": "csr"})
    got = k(A=ucf.from_numpy(A, format="bcsr(4,2)"), B=ucf.from_numpy(B, format=B_format))
    got.validate()
    np.testing.assert_allclose(got.to_numpy(), A @ B)


@pytest.mark.parametrize(("fmt", "shape"), [CASES[1], CASES[5]], ids=[IDS[1], IDS[5]])
def test_emulated_cuda(fmt, shape):
    """The CUDA kernel of a blocked SpMV and SpMM, run by the CPU emulator."""
    rng = np.random.default_rng(13)
    A = blocky(rng, shape, block_of(fmt))
    x, B = rand_dense(rng, shape[1]), rand_dense(rng, (shape[1], 3))
    At = ucf.from_numpy(A, format=fmt)
    k = compile_for("cuda", "y(i) = A(i,k)*x(k)", {"A": fmt})
    np.testing.assert_allclose(k(A=At, x=x).to_numpy(), A @ x)
    k = compile_for("cuda", "C(i,j) = A(i,k)*B(k,j)", {"A": fmt})
    np.testing.assert_allclose(k(A=At, B=B).to_numpy(), A @ B)


@pytest.mark.parametrize("target", TARGETS)
def test_sparse_vector_over_a_blocked_variable(target):
    rng = np.random.default_rng(7)
    A = blocky(rng, (10, 11), (2, 4))
    x = np.where(rng.random(11) < 0.5, rand_dense(rng, 11), 0.0)
    k = compile_for(target, "y(i) = A(i,k)*x(k)", {"A": "bcsr(2,4)", "x": "C"})
    got = k(A=ucf.from_numpy(A, format="bcsr(2,4)"), x=ucf.from_numpy(x, format="C"))
    np.testing.assert_allclose(got.to_numpy(), A @ x)


@pytest.mark.parametrize("target", TARGETS)
def test_order_three_blocks_over_two_modes(target):
    """TTV over a tensor blocked in its first two modes, its third mode compressed
    between the blocks and the places in them."""
    fmt = "UCCUU:0/2,1/3,2,0%2,1%3"
    rng = np.random.default_rng(8)
    A = np.where(rng.random((5, 7, 4)) < 0.3, rand_dense(rng, (5, 7, 4)), 0.0)
    x = rand_dense(rng, 4)
    k = compile_for(target, "y(i,j) = A(i,j,k)*x(k)", {"A": fmt})
    got = k(A=ucf.from_numpy(A, format=fmt), x=x).to_numpy()
    np.testing.assert_allclose(got, np.einsum("ijk,k->ij", A, x))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind", ["dense", "zero"])
def test_dense_and_all_zero_tensors(target, kind):
    rng = np.random.default_rng(9)
    A = rand_dense(rng, (7, 9)) if kind == "dense" else np.zeros((7, 9))
    x = rand_dense(rng, 9)
    k = compile_for(target, "y(i) = A(i,k)*x(k)", {"A": "bcsr(3,4)"})
    np.testing.assert_allclose(k(A=ucf.from_numpy(A, format="bcsr(3,4)"), x=x).to_numpy(), A @ x)


@pytest.mark.parametrize("target", TARGETS)
def test_sums_never_visit_the_padding(target, monkeypatch):
    """A term that does not vanish on the zero padding of a partial block (a constant, or
    exp(0) = 1) is summed over the true extent only (found by the differential fuzzer),
    also by the kernels the default model picks per call."""
    monkeypatch.setattr(cpu_model, "REPLAN_WORK", 0)
    rng = np.random.default_rng(15)
    a = np.where(rng.random(7) < 0.5, rand_dense(rng, 7), 0.0)
    A = blocky(rng, (5, 7), (2, 3))
    fa = "UU:0/3,0%3"
    k = compile_for(target, "s = sum(i, a(i) + 2)", {"a": fa})
    np.testing.assert_allclose(k(a=ucf.from_numpy(a, format=fa)).to_numpy(), a.sum() + 14)
    k = compile_for(target, "y(j) = exp(A(i,j))", {"A": "bcsr(2,3)"})
    got = k(A=ucf.from_numpy(A, format="bcsr(2,3)")).to_numpy()
    np.testing.assert_allclose(got, np.exp(A).sum(axis=0))


def test_non_zero_preserving_functions_leave_no_padding_behind():
    """exp(0) = 1 in the padded rows of a partial block is cut away with the padding."""
    rng = np.random.default_rng(10)
    A = blocky(rng, (5, 7), (2, 4))
    k = ucf.compile("C(i,j) = exp(A(i,j))", formats={"A": "bcsr(2,4)", "C": "bcsr(2,4)"})
    got = k(A=ucf.from_numpy(A, format="bcsr(2,4)"))
    np.testing.assert_allclose(got.to_numpy(), np.exp(A))


@pytest.mark.parametrize("op", ["=", "+="])
@pytest.mark.parametrize("rows", [9, 12])
@pytest.mark.parametrize("target", TARGETS)
def test_writing_into_a_given_output(target, rows, op):
    """Into out=, padded (9 rows in blocks of 4) or written in place (12): the result is
    numpy's either way, and the returned tensor holds it too."""
    rng = np.random.default_rng(11)
    A = blocky(rng, (rows, 6), (4, 3))
    x, y0 = rand_dense(rng, 6), rand_dense(rng, rows)
    k = compile_for(target, f"y(i) {op} A(i,k)*x(k)", {"A": "bcsr(4,3)"})
    y = y0.copy()
    got = k(A=ucf.from_numpy(A, format="bcsr(4,3)"), x=x, out=y)
    expected = (y0 if op == "+=" else 0) + A @ x
    np.testing.assert_allclose(y, expected)
    np.testing.assert_allclose(got.to_numpy(), expected)


def test_scipy_bsr_is_read_without_a_copy():
    A = sp.random(12, 18, density=0.2, random_state=12).tobsr(blocksize=(3, 3))
    A.sort_indices()
    t = ucf.from_scipy(A)
    assert t.format == parse_format("bcsr(3,3)")
    assert np.shares_memory(t.vals, A.data) and np.shares_memory(t.levels[1]["crd"], A.indices)
    back = t.to_scipy()
    assert back.format == "bsr" and back.blocksize == (3, 3)
    assert np.shares_memory(back.data, A.data)
    x = np.arange(18.0)
    k = ucf.compile("y(i) = A(i,k)*x(k)", formats={"A": "bcsr(3,3)"})
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConversionWarning)  # read as it is
        np.testing.assert_allclose(k(A=A, x=x).to_numpy(), A @ x)


def test_a_non_canonical_bsr_is_repacked():
    A = sp.bsr_array(
        (np.arange(1.0, 9.0).reshape(2, 2, 2), np.array([1, 0]), np.array([0, 2])),
        shape=(2, 4),
    )
    t = ucf.from_scipy(A)
    t.validate()
    np.testing.assert_allclose(t.to_numpy(), A.toarray())


def test_a_schedule_names_the_split_loops():
    rng = np.random.default_rng(14)
    A = blocky(rng, (8, 8), (2, 2))
    x = rand_dense(rng, 8)
    k = ucf.compile(
        "y(i) = A(i,k)*x(k)", formats={"A": "bcsr(2,2)"}, schedule="split(i_blk,i0,i1,2)"
    )
    np.testing.assert_allclose(k(A=ucf.from_numpy(A, format="bcsr(2,2)"), x=x).to_numpy(), A @ x)
    with pytest.raises(ScheduleError, match="its loops are i_blk .* and i_in"):
        ucf.compile(
            "y(i) = A(i,k)*x(k)",
            formats={"A": "bcsr(2,2)"},
            schedule="parallelize(i,CPUThread,NoRaces)",
        )


def test_the_cin_names_the_split():
    k = ucf.compile("y(i) = A(i,k)*x(k)", formats={"A": "bcsr(2,2)"})
    assert "i runs over blocks of 2: i_blk is the block and i_in the place in it" in k.cin


@pytest.mark.parametrize(
    ("expr", "formats", "message"),
    [
        ("y(i) = A(i,k)*x(k+1)", {"A": "bcsr(2,2)"}, "uses a blocked variable"),
        ("y(i) = A(i+1,k)*x(k)", {"A": "bcsr(2,2)"}, "must be a single variable"),
        ("y(i) = A(i,k)*x(k)", {"A": "UUUU:0/4,0/2%2,0%2,1"}, "nests blocks"),
    ],
)
def test_what_blocks_cannot_express_is_named(expr, formats, message):
    with pytest.raises(UnsupportedError, match=message):
        ucf.compile(expr, formats=formats)


@pytest.mark.parametrize("target", TARGETS)
def test_operands_blocked_differently_are_read_re_packed(target):
    """``A`` claims the blocks of ``i`` and ``j`` (the first blocked access); ``B``, in
    blocks that disagree, is read re-packed from its coordinates into A's, with a
    ConversionWarning naming it, rather than refused."""
    rng = np.random.default_rng(11)
    a, b = rand_sparse(rng, (6, 7), 0.5), rand_sparse(rng, (6, 7), 0.5)
    fmts = {"A": "bcsr(2,2)", "B": "bcsr(3,3)"}
    k = ucf.compile("C(i,j) = A(i,j) + B(i,j)", formats=fmts, target=target)
    ops = {n: ucf.from_numpy(v, format=fmts[n]) for n, v in (("A", a), ("B", b))}
    with pytest.warns(ucf.ConversionWarning, match="operand B"):
        np.testing.assert_array_equal(k(**ops).to_numpy(), a + b)


def test_a_dense_operand_is_reshaped_in_place_when_the_blocks_divide_it():
    from ucf.cin.split_operands import split_operand

    x = ucf.from_numpy(np.arange(12.0))
    k = ucf.compile("y(i) = A(i,k)*x(k)", formats={"A": "bcsr(2,3)"})
    b = k._plan.blocking
    assert np.shares_memory(split_operand(b, "x", x, np.dtype(np.float64)).vals, x.vals)
    odd = ucf.from_numpy(np.arange(11.0))
    padded = split_operand(b, "x", odd, np.dtype(np.float64))
    assert padded.shape == (4, 3) and not np.shares_memory(padded.vals, odd.vals)
    np.testing.assert_array_equal(padded.to_numpy().ravel(), [*range(11), 0])


def test_a_dense_output_is_the_kernels_buffer_when_the_blocks_divide_it():
    """A blocked kernel's dense output is returned without a copy (was copied on every
    call); cutting the padding off the last block is a view of a prefix here."""
    from ucf.exec.blocked_call import _join

    k = ucf.compile("y(i) = A(i,k)*x(k)", formats={"A": "bcsr(2,3)"})
    b = k._plan.blocking
    split = ucf.from_numpy(np.arange(12.0).reshape(6, 2))
    assert np.shares_memory(_join(b, "y", split, (12,)).vals, split.vals)
    cut = _join(b, "y", split, (11,))
    assert cut.vals.flags.c_contiguous
    np.testing.assert_array_equal(cut.to_numpy(), np.arange(11.0))


@needs_cc
@pytest.mark.parametrize("fmt", ["bcsr(2,2)", "nm(2,4)"])
def test_the_exported_check_accepts_the_split_operands(tmp_path, fmt):
    """``NAME_check`` of a saved blocked kernel compares each operand with the split
    statement's extents (it compared block counts with the unsplit extents, and
    refused good arrays)."""
    import ctypes

    from ucf.codegen.c_check import check_params

    rng = np.random.default_rng(12)
    a = blocky(rng, (6, 8), (2, 2), density=0.6)
    if fmt.startswith("nm"):
        a[:, 2::4] = a[:, 3::4] = 0  # at most 2 of every 4
    k = ucf.compile("y(i) = A(i,k)*x(k)", formats={"A": fmt}, target="c")
    (lib,) = [p for p in k.save(tmp_path / "blk", lib="shared") if p.suffix == ".so"]
    check = ctypes.CDLL(str(lib)).blk_check
    check.restype = ctypes.c_int
    plan = k._plan
    A, x = ucf.from_numpy(a, format=fmt), np.ones(8)
    extents = plan.blocking.split_extents({"i": 6, "k": 8})
    shapes = {
        "A": plan.blocking.split_shape("A", A.shape),
        "x": plan.blocking.split_shape("x", (8,)),
    }
    args = []
    for p in check_params(plan.compute, "y"):
        role = p.role
        if role[0] == "extent":
            args.append(ctypes.c_int64(extents[role[1]]))
        elif role[0] == "dim":
            args.append(ctypes.c_int64(shapes[role[1]][role[2]]))
        elif role[0] == "vals":
            args.append(ctypes.c_void_p((A.vals if role[1] == "A" else x).ctypes.data))
        else:
            args.append(ctypes.c_void_p(A.levels[role[2]][role[0]].ctypes.data))
    msg = ctypes.create_string_buffer(200)
    assert check(*args, msg, len(msg)) == 0, msg.value


GPU_TILE_CASES = [
    ("bcsr(32,32)", (70, 96), 40),
    pytest.param("bcsr(4,8)", (13, 30), 5, marks=pytest.mark.slow),
    pytest.param("bcsr(64,16)", (64, 48), 33, marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("fmt", "shape", "n"), GPU_TILE_CASES)
def test_cuda_default_puts_blocks_over_gpu_blocks_and_places_over_threads(fmt, shape, n):
    """With no schedule, a blocked operand's block rows go to GPU blocks and the places
    in a block (and, for SpMM, a tile of B's columns) to threads; partial blocks and a
    column count the tile does not divide are right (emulated CUDA against numpy; the
    sources compile with nvcc in test_cuda.py)."""
    rng = np.random.default_rng(14)
    A = blocky(rng, shape, block_of(fmt))
    At = ucf.from_numpy(A, format=fmt)
    x, B = rand_dense(rng, shape[1]), rand_dense(rng, (shape[1], n))
    spmv = compile_for("cuda", "y(i) = A(i,k)*x(k)", {"A": fmt})
    assert "i_blk over GPU blocks and i_in over their threads" in spmv.cin
    np.testing.assert_allclose(spmv(A=At, x=x).to_numpy(), A @ x)
    spmm = compile_for("cuda", "C(i,j) = A(i,k)*B(k,j)", {"A": fmt})
    lanes = min(32, 1024 // block_of(fmt)[0])
    assert f"i_blk and j_blk over GPU blocks, i_in and j_thr ({lanes} of j)" in spmm.cin
    np.testing.assert_allclose(spmm(A=At, B=B).to_numpy(), A @ B)


@pytest.mark.parametrize("op", ["=", "+="])
def test_a_scalar_output_of_a_blocked_kernel_into_out(op):
    """No block splits a scalar output, so out= is the user's 0-d array itself (it was
    made 1-d on the way and refused: found by the schedule fuzzer's TeSA plans)."""
    rng = np.random.default_rng(13)
    a, x = rand_sparse(rng, (5, 5), 0.5), rng.integers(1, 5, 5).astype(float)
    k = ucf.compile(f"s {op} A(i,j) * x(i) * x(j)", formats={"A": "bcsr(2,1)"})
    out = np.array(3.0)
    got = k(A=ucf.from_numpy(a, format="bcsr(2,1)"), x=x, out=out)
    want = x @ a @ x + (3.0 if op == "+=" else 0.0)
    assert got.to_numpy() == want and out == want
