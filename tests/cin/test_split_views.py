"""A tensor read under two index lists beside a blocked, N:M or dynamic-tile operand.

A blocked format splits each variable it stores in blocks (``i`` into ``i_blk`` and
``i_in``) in every access of the statement (``ucf.cin.blocking``), and a dynamic
operand's tiles split its variables the same way (``ucf.stile.dynamic``). A tensor read
twice, ``x(i)`` and ``x(j)``, ``D(i,j)`` and ``D(j,i)``, ``A(i,j) * A(j,k)``, is cut
differently in each read when the blocks of its variables differ, so each read gets
a view of its own. Before, one view served both reads: wrong answers, NaN, an
over-read (see tests/toolchain/test_asan_formats.py) and ``IndexError`` for ``nm(n,m)``.
Every result here is checked against numpy.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import ucf
from tests.helpers import TARGETS, format_targets, rand_sparse

#: Blocked formats whose two modes have different block sizes, the ones the issue
#: found wrong (equal block sizes were right before too, and are here for contrast).
UNEQUAL = ["bcsr(2,3)", "bcsr(3,1)", "bcsr(1,2)", "bcsc(2,3)", "bdcsr(2,1)", "bcsr(2,2)"]


def nm_matrix(rng: np.random.Generator, rows: int, cols: int, n: int, m: int) -> np.ndarray:
    """At most n nonzeros (small integers) in every group of m consecutive columns."""
    a = np.zeros((rows, cols))
    for r in range(rows):
        for g in range(0, cols, m):
            width = min(m, cols - g)
            keep = rng.choice(width, size=min(n, width), replace=False)
            a[r, g + keep] = rng.integers(1, 5, size=len(keep)) * rng.choice([-1, 1], len(keep))
    return a


def blocked(rng, fmt: str, shape=(6, 6)) -> np.ndarray:
    if fmt.startswith("nm"):
        n, m = (int(x) for x in fmt[3:-1].split(","))
        return nm_matrix(rng, *shape, n, m)
    return rand_sparse(rng, shape, 0.5, empty_rows=1, high=5)


def run(expr: str, formats: dict, target: str, **operands) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ucf.ConversionWarning)  # re-packed views warn
        k = ucf.compile(expr, formats, target=target)
        ops = {
            n: ucf.from_numpy(a, format=formats[n]) if n in formats else a
            for n, a in operands.items()
        }
        return k(**ops).to_numpy()


# ----------------------------------------------------------------------- the issue's repros


@pytest.mark.parametrize("target", TARGETS)
def test_issue_repro_spmv_plus_x(target):
    a = np.arange(1.0, 37.0).reshape(6, 6) * (np.arange(36).reshape(6, 6) % 3 == 0)
    x = np.arange(1.0, 7.0)
    got = run("y(i) = A(i,j) * x(j) + x(i)", {"A": "bcsr(2,3)"}, target, A=a, x=x)
    np.testing.assert_array_equal(got, a @ x + x)


@pytest.mark.parametrize(
    ("fmt", "target"), format_targets([*UNEQUAL, "nm(2,4)", "nm(1,3)"], ("bcsr(2,3)", "nm(1,3)"))
)
def test_vector_read_under_both_variables(fmt, target):
    rng = np.random.default_rng(1)
    a = blocked(rng, fmt, (6, 8) if fmt.startswith("nm(2") else (6, 6))
    x = rng.integers(1, 5, a.shape[1]).astype(float)
    v = rng.integers(1, 5, a.shape[0]).astype(float)
    got = run("y(i) = A(i,j) * x(j) + v(i)", {"A": fmt}, target, A=a, x=x, v=v)
    np.testing.assert_array_equal(got, a @ x + v)
    if a.shape[0] == a.shape[1]:
        got = run("s = A(i,j) * x(i) * x(j)", {"A": fmt}, target, A=a, x=x)
        np.testing.assert_array_equal(got, x @ a @ x)
        got = run("y(i) = A(i,j) * x(j) + x(i)", {"A": fmt}, target, A=a, x=x)
        np.testing.assert_array_equal(got, a @ x + x)


@pytest.mark.parametrize(
    ("fmt", "target"), format_targets(["bcsr(2,3)", "bcsc(3,1)", "bdcsr(1,2)", "nm(2,4)"], ())
)
@pytest.mark.parametrize("dfmt", [None, "csr", "coo", "dcsr"])
def test_matrix_and_its_transpose(fmt, target, dfmt):
    rng = np.random.default_rng(2)
    n = 8 if fmt.startswith("nm") else 6
    a = blocked(rng, fmt, (n, n))
    d = rand_sparse(rng, (n, n), 0.6, high=5)
    formats = {"A": fmt, **({"D": dfmt} if dfmt else {})}
    got = run("C(i,j) = A(i,j) + D(i,j) * D(j,i)", formats, target, A=a, D=d)
    np.testing.assert_array_equal(got, a + d * d.T)


@pytest.mark.parametrize(
    ("fmt", "target"),
    format_targets(["bcsr(2,3)", "bcsr(2,2)", "nm(2,4)", "bcsc(3,2)"], ("nm(2,4)",)),
)
def test_blocked_matrix_times_itself(fmt, target):
    """``A(i,j) * A(j,k)``: the second read cuts A's rows by the blocks of its columns
    (or, where those disagree with A's own row blocks, reads A re-packed)."""
    rng = np.random.default_rng(3)
    a = blocked(rng, fmt, (8, 8) if fmt.startswith("nm") else (6, 6))
    got = run("C(i,k) = A(i,j) * A(j,k)", {"A": fmt}, target, A=a)
    np.testing.assert_array_equal(got, a @ a)


@pytest.mark.parametrize("target", TARGETS)
def test_nm_statements_of_the_issue(target):
    """Each of these raised IndexError from ``_level_sets`` (an InternalError)."""
    rng = np.random.default_rng(4)
    a = nm_matrix(rng, 8, 8, 2, 4)
    x = rng.integers(1, 5, 8).astype(float)
    f = {"A": "nm(2,4)"}
    np.testing.assert_array_equal(run("a = A(i,j)*x(i)*x(j)", f, target, A=a, x=x), x @ a @ x)
    np.testing.assert_array_equal(run("C(i,k) = A(i,j)*A(j,k)", f, target, A=a), a @ a)
    got = run("y(i) = relu(sum(j, A(i,j)*x(j))) + x(i)", f, target, A=a, x=x)
    np.testing.assert_array_equal(got, np.maximum(a @ x, 0) + x)
    np.testing.assert_array_equal(run("y(i) = A(i,j)*x(j) + x(i)", f, target, A=a, x=x), a @ x + x)


@pytest.mark.parametrize("target", TARGETS)
def test_blocked_diagonal_read(target):
    """``A(i,i)`` in blocks of 2x3: the access's own blocks disagree, so it is read
    re-packed; in 2x2 blocks both of its modes split ``i`` alike."""
    rng = np.random.default_rng(5)
    a = rand_sparse(rng, (6, 6), 0.7, high=5)
    x = rng.integers(1, 5, 6).astype(float)
    for fmt in ("bcsr(2,3)", "bcsr(2,2)"):
        got = run("y(i) = A(i,i) * x(i) + A(i,j) * x(j)", {"A": fmt}, target, A=a, x=x)
        np.testing.assert_array_equal(got, np.diag(a) * x + a @ x)


def test_views_are_named_in_cin():
    k = ucf.compile("C(i,j) = A(i,j) + D(i,j) * D(j,i)", {"A": "bcsr(2,3)"})
    assert "D_v2(j_blk, j_in, i_blk, i_in)" in k.cin
    assert "D_v2 is D read in the split of another of its accesses" in k.cin


def test_cuda_emulated_views():
    rng = np.random.default_rng(6)
    a = rand_sparse(rng, (6, 6), 0.5, high=5)
    x = rng.integers(1, 5, 6).astype(float)
    k = ucf.compile("y(i) = A(i,j) * x(j) + x(i)", {"A": "bcsr(2,3)"}, target="cuda", emulate=True)
    got = k(A=ucf.from_numpy(a, format="bcsr(2,3)"), x=x).to_numpy()
    np.testing.assert_array_equal(got, a @ x + x)


# ----------------------------------------------------------------------- dynamic tiles


@pytest.mark.parametrize(
    ("tile", "target"), format_targets([(2, 1), (1, 3), (2, 3), (3, 2)], ((2, 3),))
)
def test_dynamic_tiles_beside_a_vector_read_twice(tile, target):
    rng = np.random.default_rng(7)
    a = rand_sparse(rng, (6, 6), 0.5, high=5)
    x = rng.integers(1, 5, 6).astype(float)
    k = ucf.compile("y(i) = A(i,k)*x(k) + x(i)", dynamic={"A": tile}, target=target)
    np.testing.assert_array_equal(k(A=a, x=x).to_numpy(), a @ x + x)
    k = ucf.compile("s = A(i,k)*x(i)*x(k)", dynamic={"A": tile}, target=target)
    np.testing.assert_array_equal(k(A=a, x=x).to_numpy(), x @ a @ x)
    mask = rng.random((6, 6)) < 0.5
    got = k(A=a, x=x, masks={"A": mask}).to_numpy()
    np.testing.assert_array_equal(got, x @ (a * mask) @ x)


@pytest.mark.parametrize("tile", [(1, 2), (4, 1)])
def test_dynamic_tiles_beside_an_nm_operand(tile):
    """B in ``nm(2,4)`` cuts ``l`` into groups of 4 while D's tiles along ``l`` are of 1
    (or of 4): the tiles claim first, and the tile index reads ``l`` rebuilt from its
    block and place. Found by the schedule fuzzer (an InternalError-like ShapeError)."""
    rng = np.random.default_rng(8)
    b = np.stack([nm_matrix(rng, 3, 9, 2, 4) for _ in range(2)])  # (i, k, l)
    c = rng.integers(1, 5, (3, 5)).astype(float)
    d = rand_sparse(rng, (9, 5), 0.6, high=5)
    k = ucf.compile("A(i,j) = B(i,k,l) * C(k,j) * D(l,j)", {"B": "nm(2,4)"}, dynamic={"D": tile})
    got = k(B=ucf.from_numpy(b, format="nm(2,4)"), C=c, D=d).to_numpy()
    np.testing.assert_array_equal(got, np.einsum("ikl,kj,lj->ij", b, c, d))


def test_a_dynamic_operand_with_a_repeated_variable_is_refused():
    with pytest.raises(ucf.UnsupportedError, match=r"A\(i, k, i\), with the index variable i"):
        ucf.compile("X(i) = sum(k, A(i,k,i))", dynamic={"A": (3, 1, 1)})


@pytest.mark.parametrize("tile", [(1, 2, 2), (2, 3, 2)])
def test_partial_tiles_do_not_reach_a_function_of_other_operands(tile):
    """Tiles that do not divide the extents pad them; under ``max(a(j), ...)`` the
    padding is not zero, so the loops over a last, partial tile must stop at the
    extent, as a blocked format's do (the dynamic kernel now says where its tiles
    split: ``Kernel(blocks=...)``). Found by the statement fuzzer."""
    rng = np.random.default_rng(9)
    b = rng.integers(1, 5, (2, 3, 3)).astype(float)
    c = rng.integers(1, 5, (2, 4, 3)).astype(float)
    a = rng.integers(1, 5, 4).astype(float)
    mask = rng.random(b.shape) < 0.5
    k = ucf.compile("X = sum(l,j,k, max(a(j), sum(i, B(l,i,k)) + C(l,j,k)))", dynamic={"B": tile})
    s = (b * mask).sum(1)
    want = np.maximum(a[None, :, None], s[:, None, :] + c).sum()
    assert k(B=b, C=c, a=a, masks={"B": mask}).to_numpy() == want


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt", ["bcsr(1,2)@qint8:1", "bcsr(2,3)@qint8:1", "bcsr(1,2)@qint8"])
def test_quantized_matrix_and_its_transpose_read_the_same_numbers(fmt, target):
    """``A(i,j) * x(j) - A(j,i) * z(j)`` with A quantized in blocks: the transposed read
    is re-packed and read dequantized, and must see the numbers the first read computes
    from the quantized values (a float32 copy differed in the last bits)."""
    rng = np.random.default_rng(11)
    a = rand_sparse(rng, (6, 6), 0.6, high=5) * rng.random((6, 6))
    x, z = rng.random(6), rng.random(6)
    t = ucf.from_numpy(a, format=fmt)
    stored = t.astype(np.float64).to_numpy()  # q * scale, exact in float64
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ucf.ConversionWarning)
        k = ucf.compile("y(i) = A(i,j) * x(j) - A(j,i) * z(j)", {"A": fmt}, target=target)
        got = k(A=t, x=x, z=z).to_numpy()
    np.testing.assert_allclose(got, stored @ x - stored.T @ z, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("target", TARGETS)
def test_quantized_transpose_in_a_float32_kernel_reads_float32(target):
    """In a float32 kernel the re-packed read is dequantized to float32 (the rounding of
    the product the kernel's own reads compute): no float64 copy for the call to warn
    about and round again."""
    rng = np.random.default_rng(12)
    a = rand_sparse(rng, (6, 6), 0.6, high=5) * rng.random((6, 6))
    x, z = rng.random(6).astype(np.float32), rng.random(6).astype(np.float32)
    t = ucf.from_numpy(a, format="bcsr(1,2)@qint8:1")
    stored = t.astype(np.float64).to_numpy()
    k = ucf.compile(
        "y(i) = A(i,j) * x(j) - A(j,i) * z(j)",
        {"A": "bcsr(1,2)@qint8:1"},
        dtype="float32",
        target=target,
    )
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = k(A=t, x=x, z=z).to_numpy()
    assert not [w for w in seen if "float64 values" in str(w.message)], seen
    np.testing.assert_allclose(got, stored @ x - stored.T @ z, rtol=1e-5)
