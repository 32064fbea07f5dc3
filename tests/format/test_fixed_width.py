"""Fixed-width levels (``F<w>``) and the formats behind them, ``ell(w)`` and ``nm(n,m)``:
storage round trips against numpy and scipy, the constraint checked on packing and
on user arrays, and kernels mixed with dense and CSR operands on the llvm, c and
emulated cuda targets, checked against numpy."""

from __future__ import annotations

import ctypes
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import TARGETS, needs_cc, rand_dense, stored_coords
from ucf.errors import ConversionWarning
from ucf.format.format import parse_format


def compile_for(target, expr, formats, **kw):
    if target == "cuda":
        return ucf.compile(expr, formats=formats, target="cuda", emulate=True, **kw)
    return ucf.compile(expr, formats=formats, target=target, **kw)


def values(rng, n):
    return rng.integers(1, 10, size=n) * rng.choice([-1, 1], size=n)


def ell_matrix(rng, shape, w, fill="random"):
    """Rows of at most ``w`` nonzeros (``fill``: "random", "full": exactly w, "zero")."""
    a = np.zeros(shape)
    for r in range(shape[0]):
        k = {"random": rng.integers(0, w + 1), "full": w, "zero": 0}[fill]
        a[r, rng.choice(shape[1], size=k, replace=False)] = values(rng, k)
    return a


def nm_tensor(rng, shape, n, m, fill="random"):
    """At most ``n`` nonzeros in every group of ``m`` along the last mode (a last,
    partial group holds at most as many as it has places)."""
    a = np.zeros(shape)
    rows = a.reshape(-1, shape[-1])
    for r in range(rows.shape[0]):
        for g in range(0, shape[-1], m):
            places = np.arange(g, min(g + m, shape[-1]))
            most = min(n, len(places))
            k = {"random": rng.integers(0, most + 1), "full": most, "zero": 0}[fill]
            rows[r, rng.choice(places, size=k, replace=False)] = values(rng, k)
    return a


# ------------------------------------------------------------------ formats


def test_the_names_spell_fixed_width_levels():
    assert parse_format("ell(4)") == parse_format("UF4")
    assert str(parse_format(" ELL( 4 ) ")) == "UF4"
    assert str(parse_format("nm(2,4)")) == "UUF2:0,1/4,1%4"
    assert str(parse_format("nm(2,4)", order=3)) == "UUUF2:0,1,2/4,2%4"
    assert str(parse_format("ell(3)", order=3)) == "UUF3"
    assert parse_format("UF4") != parse_format("UF2")  # the width is part of the format
    assert parse_format("uf12c:2,0,1").levels[1].width == 12


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("UF", "takes its width after the letter, e.g. 'F4'"),
        ("UF0", "width of at least 1"),
        ("U4C", "dense level .U. takes no number"),
        ("nm(5,4)", "n = 5 nonzeros cannot exceed the group size m = 4"),
        ("nm(0,4)", "must be positive"),
        ("ell(2,2)", "unknown format 'ell' with 2 parameter"),
        ("elk(2)", "unknown format 'elk'.*ell\\(w\\), nm\\(n, m\\)"),
    ],
)
def test_bad_fixed_width_formats_are_named(text, message):
    with pytest.raises(ucf.FormatError, match=message):
        parse_format(text)


# ------------------------------------------------------------------ storage


@pytest.mark.parametrize(
    ("fmt", "shape", "fill"),
    [
        ("ell(3)", (9, 10), "random"),
        ("ell(3)", (6, 10), "full"),
        ("ell(3)", (5, 3), "full"),  # the width is the row length: every element stored
        ("ell(3)", (1, 7), "random"),
        ("ell(3)", (5, 8), "zero"),
        ("nm(2,4)", (8, 12), "random"),
        ("nm(2,4)", (7, 10), "full"),  # the last group is partial
        ("nm(3,4)", (5, 9), "full"),  # padding past the extent in the last group
        ("nm(2,4)", (3, 4, 6), "random"),
        ("nm(1,3)", (1, 7), "zero"),
    ],
)
def test_round_trips_and_padding(fmt, shape, fill):
    rng = np.random.default_rng(1)
    if fmt.startswith("nm"):
        n, m = (int(x) for x in fmt[3:-1].split(","))
        a = nm_tensor(rng, shape, n, m, fill)
    else:
        a = ell_matrix(rng, shape, 3, fill)
    t = ucf.from_numpy(a, format=fmt)
    t.validate()
    np.testing.assert_array_equal(t.to_numpy(), a)
    width = t.format.levels[-1].width
    crd = t.levels[-1]["crd"].reshape(-1, width)
    assert (np.diff(crd, axis=1) > 0).all()  # padding keeps every segment sorted
    assert t.nnz == crd.size  # exactly w slots per parent
    coords, vals = t.to_coo()
    np.testing.assert_array_equal(a[tuple(coords.T)], vals)
    assert np.count_nonzero(t.vals) == np.count_nonzero(a)
    if len(shape) == 2:
        s = t.to_scipy()
        assert s.format == "csr"
        np.testing.assert_array_equal(s.toarray(), a)
        back = ucf.from_scipy(sp.csr_array(a), format=fmt)
        np.testing.assert_array_equal(back.to_numpy(), a)
    nz = np.argwhere(a)
    again = ucf.from_coo(nz, a[tuple(nz.T)], shape=shape, format=fmt)
    np.testing.assert_array_equal(again.levels[-1]["crd"], t.levels[-1]["crd"])
    np.testing.assert_array_equal(t.convert("csr" if len(shape) == 2 else "csf").to_numpy(), a)


def test_packing_names_the_first_row_over_the_width():
    a = np.zeros((6, 8))
    a[1, :2] = 1
    a[3, [0, 2, 4, 6]] = 2  # the first row with more than 3
    a[5, :5] = 3
    for make in (
        lambda: ucf.from_numpy(a, format="ell(3)"),
        lambda: ucf.from_scipy(sp.csr_array(a), format="ell(3)"),
        lambda: ucf.from_coo(np.argwhere(a), a[a != 0], shape=a.shape, format="ell(3)"),
        lambda: ucf.from_numpy(a).convert("ell(3)"),
    ):
        with pytest.raises(ucf.FormatError, match=r"level 1 .*: row 3 has 4 entries, more than"):
            make()
    with pytest.raises(ucf.FormatError, match="width 9 exceeds the level's dimension 8"):
        ucf.from_numpy(a, format="ell(9)")


def test_packing_names_the_first_group_over_n():
    a = np.zeros((4, 10))
    a[0, [0, 1]] = 1
    a[2, [8, 9]] = 1  # a partial group, full but not over
    a[2, [4, 6, 7]] = 2  # row 2, group 1 holds 3
    a[3, :4] = 3
    with pytest.raises(
        ucf.FormatError, match=r"row 2, group 1 \(columns 4..7\) has 3 entries, more than the"
    ):
        ucf.from_numpy(a, format="nm(2,4)")
    b = np.zeros((2, 3, 8))
    b[1, 2, 4:7] = 1
    with pytest.raises(
        ucf.FormatError, match=r"index 1 of mode 0, index 2 of mode 1, group 1 \(4..7\) of mode 2"
    ):
        ucf.from_numpy(b, format="nm(2,4)")


def test_user_arrays_are_checked():
    vals = np.arange(1.0, 7.0)
    ok = {"crd": np.array([0, 2, 1, 3, 0, 4], dtype=np.int32)}
    ucf.Tensor((3, 5), "ell(2)", [{}, ok], vals)
    cases = [
        ({"crd": np.array([0, 2, 1, 3], dtype=np.int32)}, "crd has length 4, expected"),
        ({"crd": np.array([0, 2, 1, 5, 0, 4], dtype=np.int32)}, "crd 5 at position 3 is out"),
        ({"crd": np.array([0, 2, 3, 1, 0, 4], dtype=np.int32)}, "parent position 1 at position 3"),
        ({"crd": np.array([0, 2, 1, 3, 4, 4], dtype=np.int32)}, "not strictly sorted"),
        ({"pos": np.array([0, 2], dtype=np.int32), **ok}, "unexpected array.*'pos'"),
    ]
    for arrays, message in cases:
        with pytest.raises(ucf.FormatError, match=message):
            ucf.Tensor((3, 5), "ell(2)", [{}, arrays], vals)


@pytest.mark.parametrize("fmt", ["ell(3)", "nm(2,4)"])
def test_an_output_cannot_be_fixed_width(fmt):
    with pytest.raises(ucf.FormatError, match=r"output C .*, level \d: a fixed-width \d level"):
        ucf.compile("C(i,j) = A(i,j) * B(i,j)", formats={"A": fmt, "C": fmt})


# ------------------------------------------------------------------ kernels

#: (format, shape, fill): random, every slot used, a single row, all zero, and extents
#: the group size does not divide.
CASES = [
    ("ell(3)", (9, 10), "random"),
    ("ell(3)", (6, 10), "full"),
    ("ell(3)", (1, 7), "random"),
    ("ell(3)", (5, 8), "zero"),
    ("nm(2,4)", (8, 12), "random"),
    ("nm(2,4)", (7, 10), "full"),
    ("nm(2,4)", (1, 7), "random"),
    ("nm(2,4)", (5, 9), "zero"),
]
IDS = [f"{f}-{s[0]}x{s[1]}-{fill}" for f, s, fill in CASES]


def sample(rng, fmt, shape, fill):
    return (
        ell_matrix(rng, shape, 3, fill)
        if fmt.startswith("ell")
        else nm_tensor(rng, shape, 2, 4, fill)
    )


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("fmt", "shape", "fill"), CASES, ids=IDS)
def test_spmv_spmm_and_the_transpose(target, fmt, shape, fill):
    rng = np.random.default_rng(2)
    a = sample(rng, fmt, shape, fill)
    A = ucf.from_numpy(a, format=fmt)
    x, z, B = rand_dense(rng, shape[1]), rand_dense(rng, shape[0]), rand_dense(rng, (shape[1], 3))
    k = compile_for(target, "y(i) = A(i,k)*x(k)", {"A": fmt})
    np.testing.assert_allclose(k(A=A, x=x).to_numpy(), a @ x)
    k = compile_for(target, "y(k) = A(i,k)*z(i)", {"A": fmt})
    np.testing.assert_allclose(k(A=A, z=z).to_numpy(), a.T @ z)
    k = compile_for(target, "C(i,j) = A(i,k)*B(k,j)", {"A": fmt})
    np.testing.assert_allclose(k(A=A, B=B).to_numpy(), a @ B)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("fmt", "shape", "fill"), [CASES[0], CASES[5]], ids=[IDS[0], IDS[5]])
@pytest.mark.parametrize("out", ["dense", "csr"])
def test_sddmm(target, fmt, shape, fill, out):
    rng = np.random.default_rng(3)
    a = sample(rng, fmt, shape, fill)
    B, C = rand_dense(rng, (shape[0], 4)), rand_dense(rng, (4, shape[1]))
    k = compile_for(target, "D(i,j) = A(i,j)*B(i,k)*C(k,j)", {"A": fmt, "D": out})
    got = k(A=ucf.from_numpy(a, format=fmt), B=B, C=C)
    got.validate()
    np.testing.assert_allclose(got.to_numpy(), a * (B @ C))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt", ["ell(3)", "nm(2,4)"])
@pytest.mark.parametrize("other", ["dense", "csr", "ell(3)"])
def test_element_wise_with_dense_csr_and_fixed_width_operands(target, fmt, other):
    """A sum (a union) and a product (an intersection, with a sparse output) co-iterate
    the fixed-width level with the other operand's."""
    rng = np.random.default_rng(4)
    shape = (7, 10)
    a = sample(rng, fmt, shape, "random")
    b = (
        ell_matrix(rng, shape, 3)
        if other == "ell(3)"
        else sp.random(*shape, density=0.3, random_state=5).toarray()
    )
    A, B = ucf.from_numpy(a, format=fmt), ucf.from_numpy(b, format=other)
    with warnings.catch_warnings():  # a plain operand over nm's blocked variable is re-packed
        warnings.simplefilter("ignore", ConversionWarning)
        k = compile_for(target, "C(i,j) = A(i,j) + B(i,j)", {"A": fmt, "B": other})
        np.testing.assert_allclose(k(A=A, B=B).to_numpy(), a + b)
        k = compile_for(target, "C(i,j) = A(i,j) * B(i,j)", {"A": fmt, "B": other, "C": "csr"})
        got = k(A=A, B=B)
    got.validate()
    np.testing.assert_allclose(got.to_numpy(), a * b)
    assert stored_coords(got) <= {(i, j) for i in range(7) for j in range(10)}


@pytest.mark.parametrize("target", TARGETS)
def test_order_three(target):
    """N:M along the last mode of an order-3 tensor (its last group partial), and an
    order-3 ELL (every mode dense but the last), against a CSF operand."""
    rng = np.random.default_rng(6)
    a = nm_tensor(rng, (3, 4, 7), 2, 4)
    e = np.stack([ell_matrix(rng, (4, 7), 2) for _ in range(3)])
    c = np.where(rng.random((3, 4, 7)) < 0.3, rand_dense(rng, (3, 4, 7)), 0.0)
    x = rand_dense(rng, 7)
    A, E = ucf.from_numpy(a, format="nm(2,4)"), ucf.from_numpy(e, format="ell(2)")
    k = compile_for(target, "y(i,j) = A(i,j,k)*x(k)", {"A": "nm(2,4)"})
    np.testing.assert_allclose(k(A=A, x=x).to_numpy(), np.einsum("ijk,k->ij", a, x))
    k = compile_for(target, "C(i,j,k) = A(i,j,k) * B(i,j,k)", {"A": "ell(2)", "B": "csf"})
    got = k(A=E, B=ucf.from_numpy(c, format="csf")).to_numpy()
    np.testing.assert_allclose(got, e * c)


@pytest.mark.parametrize("target", TARGETS)
def test_functions_and_sums_ignore_the_padding(target):
    """exp(0) = 1 at a padding slot is what an unstored zero gives too, and padding past
    the extent of a partial group is never summed."""
    rng = np.random.default_rng(7)
    a = nm_tensor(rng, (4, 9), 3, 4)
    k = compile_for(target, "y(j) = exp(A(i,j))", {"A": "nm(3,4)"})
    np.testing.assert_allclose(
        k(A=ucf.from_numpy(a, format="nm(3,4)")).to_numpy(), np.exp(a).sum(0)
    )


def test_emulated_cuda():
    """The CUDA kernels of an ELL SpMV and an N:M SpMM, run by the CPU emulator."""
    rng = np.random.default_rng(8)
    a, b = ell_matrix(rng, (9, 10), 3), nm_tensor(rng, (7, 10), 2, 4)
    x, B = rand_dense(rng, 10), rand_dense(rng, (10, 3))
    k = compile_for("cuda", "y(i) = A(i,k)*x(k)", {"A": "ell(3)"})
    np.testing.assert_allclose(k(A=ucf.from_numpy(a, format="ell(3)"), x=x).to_numpy(), a @ x)
    k = compile_for("cuda", "C(i,j) = A(i,k)*B(k,j)", {"A": "nm(2,4)"})
    np.testing.assert_allclose(k(A=ucf.from_numpy(b, format="nm(2,4)"), B=B).to_numpy(), b @ B)


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "shape", "fill"), CASES, ids=IDS)
def test_emulated_cuda_every_case(fmt, shape, fill):
    test_spmv_spmm_and_the_transpose("cuda", fmt, shape, fill)
    if fill == "random":  # cuda computes dense outputs only
        test_sddmm("cuda", fmt, shape, fill, "dense")


@needs_cc
def test_the_exported_check_walks_fixed_width_segments(tmp_path):
    """``NAME_check`` of a saved ELL kernel: good arrays pass, a coordinate out of range
    and a segment out of order are refused with ucf.h's codes."""
    k = ucf.compile("y(i) = A(i,j)*x(j)", formats={"A": "ell(2)"}, target="c")
    (lib,) = [p for p in k.save(tmp_path / "ell", lib="shared") if p.suffix == ".so"]
    check = ctypes.CDLL(str(lib)).ell_check
    check.restype = ctypes.c_int
    x, vals = np.zeros(5), np.zeros(6)
    msg = ctypes.create_string_buffer(200)

    def run(crd):
        crd = np.asarray(crd, dtype=np.int32)
        ptr = ctypes.c_void_p
        args = [3, 5, 3, 5, crd.ctypes.data, vals.ctypes.data, 5, x.ctypes.data]
        types = [ctypes.c_int64] * 4 + [ptr, ptr, ctypes.c_int64, ptr]
        return check(*[t(a) for t, a in zip(types, args, strict=True)], msg, len(msg))

    assert run([0, 2, 1, 3, 0, 4]) == 0
    assert run([0, 2, 1, 5, 0, 4]) != 0 and b"outside [0, 5)" in msg.value
    assert run([0, 2, 3, 1, 0, 4]) != 0 and b"segment of parent 1" in msg.value
