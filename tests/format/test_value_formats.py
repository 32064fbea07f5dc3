"""Value descriptions as part of a format (``csr@float32``): parsing and printing,
tensors that hold the stated values, and kernels that read an operand's values in
place and widen them, checked against numpy on llvm, c and emulated cuda."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import TARGETS, needs_cc, rand_dense
from ucf.errors import FormatError
from ucf.format.format import parse_format
from ucf.format.tensor import Tensor
from ucf.passes import pairs

ALL_TARGETS = [*TARGETS, "cuda"]


def compile_for(target, expr, formats, **kw):
    if target == "cuda":
        return ucf.compile(expr, formats=formats, target="cuda", emulate=True, **kw)
    return ucf.compile(expr, formats=formats, target=target, **kw)


def sparse(rng, shape, density=0.3, dtype=np.float64):
    """Random values with a fraction (so a float32 copy differs from the float64 one)."""
    a = rng.standard_normal(shape) * (rng.random(shape) < density)
    return a.astype(dtype)


# ------------------------------------------------------------------ the format


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("csr@float32", "UC@float32"),
        ("csc@int32", "UC:1,0@int32"),
        ("bcsr(2,3)@float32", "UCUU:0/2,1/3,0%2,1%3@float32"),
        ("dense @ INT64", "UU@int64"),
        ("UC", "UC"),
    ],
)
def test_values_parse_and_print_round_trip(text, shown):
    fmt = parse_format(text, order=2)
    assert str(fmt) == shown
    assert parse_format(str(fmt), order=2) == fmt
    assert fmt.structure == parse_format(text.partition("@")[0], order=2)


@pytest.mark.parametrize("text", ["csr@float16x", "csr@", "csr@complex128"])
def test_unknown_values_are_refused_with_the_choices(text):
    with pytest.raises(FormatError, match=r"values .* not one of float64, float32"):
        parse_format(text, order=2, tensor="A")


# ------------------------------------------------------------------ tensors


def test_constructors_hold_the_stated_values():
    rng = np.random.default_rng(0)
    a = sparse(rng, (6, 5))
    for t in [
        ucf.from_numpy(a, format="csr@float32"),
        ucf.from_scipy(sp.csr_array(a), format="csr@float32"),
        ucf.from_coo(np.argwhere(a), a[a != 0], a.shape, format="csr@float32"),
        ucf.from_numpy(a).convert("csr@float32"),
    ]:
        assert t.dtype == np.float32 and str(t.format) == "UC@float32"
        np.testing.assert_array_equal(t.to_numpy(), a.astype(np.float32))
    z = Tensor.zeros((3, 4), format="dense@int32")
    assert z.dtype == np.int32 and not z.to_numpy().any()
    assert Tensor.zeros((3, 4)).dtype == np.float64


def test_a_dtype_beside_other_stated_values_is_refused():
    with pytest.raises(FormatError, match=r"holds float32 values but dtype=float64"):
        ucf.from_numpy(np.eye(3), format="csr@float32", dtype=np.float64)


def test_arrays_that_disagree_with_the_stated_values_are_refused():
    t = ucf.from_numpy(np.eye(3), format="csr")
    with pytest.raises(FormatError, match=r"holds float32 values but vals is float64"):
        Tensor(t.shape, "csr@float32", t.levels, t.vals)


def test_astype_and_scipy_keep_the_statement_and_the_buffers():
    t = ucf.from_numpy(np.diag([1.5, 2.5, 0.0, 4.0]), format="csr@float32")
    assert str(t.astype(np.float64).format) == "UC@float64"
    m = t.to_scipy()
    assert m.dtype == np.float32 and np.shares_memory(m.data, t.vals)
    back = ucf.from_scipy(m, format="csr@float32")
    assert np.shares_memory(back.vals, t.vals)


# ------------------------------------------------------------------ kernels


FORMATS = ["csr", "csc", "dcsr", "bcsr(2,2)"]


# the emulated cuda target (seconds a kernel) only where its loads differ: CSR, blocks
@pytest.mark.parametrize(
    ("target", "fmt"),
    [("llvm", f) for f in FORMATS]
    + [pytest.param("c", f, marks=needs_cc) for f in FORMATS]
    + [("cuda", "csr"), ("cuda", "bcsr(2,2)")],
)
def test_spmv_reads_float32_values_and_computes_in_float64(target, fmt):
    rng = np.random.default_rng(1)
    a, x = sparse(rng, (9, 7)), rng.standard_normal(7)
    k = compile_for(target, "y(i) = A(i,j)*x(j)", {"A": f"{fmt}@float32"})
    assert k.dtype == np.float64
    y = k(A=ucf.from_numpy(a, format=f"{fmt}@float32"), x=x).to_numpy()
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, a.astype(np.float32).astype(np.float64) @ x, rtol=1e-13)
    # the float64 sum of float32 inputs is not the float32 kernel's sum
    assert not np.array_equal(y, (a.astype(np.float32) @ x.astype(np.float32)).astype(y.dtype))


@pytest.mark.parametrize("target", TARGETS)
def test_integer_operands_into_wider_kernels_are_exact(target):
    rng = np.random.default_rng(2)
    a = (rng.integers(-3, 4, size=(8, 6)) * (rng.random((8, 6)) < 0.5)).astype(np.int32)
    b = rng.integers(-(2**40), 2**40, size=(6, 3)).astype(np.int64)
    k = compile_for(target, "C(i,j) = A(i,k)*B(k,j)", {"A": "csr@int32"}, dtype="int64")
    got = k(A=ucf.from_numpy(a, format="csr@int32"), B=b).to_numpy()
    np.testing.assert_array_equal(got, a.astype(np.int64) @ b)
    kf = compile_for(target, "y(i) = A(i,k)*x(k)", {"A": "csr@int32"})
    x = rng.standard_normal(6)
    np.testing.assert_allclose(kf(A=ucf.from_numpy(a, format="csr@int32"), x=x).to_numpy(), a @ x)


@pytest.mark.parametrize("target", ALL_TARGETS)
def test_the_output_format_states_what_the_kernel_computes_in(target):
    rng = np.random.default_rng(3)
    a, b = sparse(rng, (7, 6), dtype=np.float32), sparse(rng, (6, 5), dtype=np.float32)
    out = "dense@float32" if target == "cuda" else "csr@float32"  # cuda: dense outputs
    k = compile_for(target, "C(i,j) = A(i,k)*B(k,j)", {"A": "csr", "B": "csr", "C": out})
    assert k.dtype == np.float32
    c = k(A=ucf.from_numpy(a, format="csr"), B=ucf.from_numpy(b, format="csr"))
    assert c.dtype == np.float32 and c.format == parse_format(out, 2)
    np.testing.assert_allclose(c.to_numpy(), a @ b, rtol=1e-5)


@pytest.mark.parametrize("target", TARGETS)
def test_mixed_operands_sparse_output(target):
    """SpGEMM of a float32 and a float64 operand into a float64 CSR, and an add."""
    rng = np.random.default_rng(4)
    a, b = sparse(rng, (9, 8)), sparse(rng, (8, 7))
    fa = "csr@float32"
    k = compile_for(target, "C(i,j) = A(i,k)*B(k,j)", {"A": fa, "B": "csr", "C": "csr"})
    c = k(A=ucf.from_numpy(a, format=fa), B=ucf.from_numpy(b, format="csr")).to_scipy()
    np.testing.assert_allclose(c.toarray(), a.astype(np.float32).astype(np.float64) @ b)
    add = compile_for(target, "C(i,j) = A(i,j) + B(i,j)", {"A": fa, "B": "csr", "C": "csr"})
    s = add(A=ucf.from_numpy(a[:8, :7], format=fa), B=ucf.from_numpy(b, format="csr"))
    np.testing.assert_allclose(s.to_numpy(), a[:8, :7].astype(np.float32) + b)


def test_an_operand_in_its_stated_values_is_read_in_place(monkeypatch):
    rng = np.random.default_rng(5)
    a, x = sparse(rng, (6, 6)), rng.standard_normal(6)
    t = ucf.from_numpy(a, format="csr@float32")
    stated = ucf.compile("y(i) = A(i,j)*x(j)", {"A": "csr@float32"})
    plain = ucf.compile("y(i) = A(i,j)*x(j)", {"A": "csr"})
    converted = []
    convert = Tensor.convert

    def counting(self, *args, **kw):
        converted.append(self)
        return convert(self, *args, **kw)

    monkeypatch.setattr(Tensor, "convert", counting)
    y = stated(A=t, x=x).to_numpy()
    assert converted == []
    # without the statement, a float64 kernel converts the float32 operand per call
    np.testing.assert_array_equal(plain(A=t, x=x).to_numpy(), y)
    assert converted == [t]


def test_operands_in_other_values_are_converted_to_the_stated_ones():
    rng = np.random.default_rng(6)
    a, x = sparse(rng, (5, 4)), rng.standard_normal(4)
    k = ucf.compile("y(i) = A(i,j)*x(j)", {"A": "csr@float32"})
    for given in [a, sp.csr_array(a), ucf.from_numpy(a, format="csc")]:
        y = k(A=given, x=x).to_numpy()
        np.testing.assert_allclose(y, a.astype(np.float32).astype(np.float64) @ x, rtol=1e-13)


def test_einsum_reads_the_operands_stated_values():
    rng = np.random.default_rng(7)
    a, x = sparse(rng, (6, 5)), rng.standard_normal(5)
    y = ucf.einsum("y(i) = A(i,j)*x(j)", A=ucf.from_numpy(a, format="csr@float32"), x=x)
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, a.astype(np.float32).astype(np.float64) @ x)
    y32 = ucf.einsum("y(i) = A(i,j)*x(j)", formats={"y": "dense@float32"}, A=sp.csr_array(a), x=x)
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, a @ x, rtol=1e-5)


@pytest.mark.parametrize(
    ("formats", "dtype", "match"),
    [
        ({"A": "csr@float32"}, "int64", r"operand A .*float32 values .* int64"),
        ({"A": "csr@int64"}, "int32", r"operand A .*int64 values .* int32"),
        ({"y": "dense@float32"}, "float64", r"output y is stored as 'UU@float32'|'U@float32'"),
    ],
)
def test_values_a_kernel_cannot_read_unchanged_are_refused(formats, dtype, match):
    with pytest.raises(FormatError, match=match):
        ucf.compile("y(i) = A(i,j)*x(j)", formats, dtype=dtype)


@needs_cc
def test_exported_c_declares_each_operand_in_its_own_type(tmp_path):
    k = ucf.compile("y(i) = A(i,j)*x(j)", {"A": "csr@float32", "x": "dense@int32"}, target="c")
    k.save(tmp_path / "spmv")
    header = (tmp_path / "spmv.h").read_text()
    assert "const float* restrict A_vals" in header.replace("UCF_RESTRICT", "restrict")
    assert "const int32_t* restrict x_vals" in header.replace("UCF_RESTRICT", "restrict")
    assert "double* restrict y_vals" in header.replace("UCF_RESTRICT", "restrict")


@needs_cc
def test_taco_abi_casts_each_operand_to_its_own_type(tmp_path):
    k = ucf.compile("y(i) = A(i,j)*x(j)", {"A": "csr@float32"}, target="c")
    k.save(tmp_path / "spmv", abi="taco")
    src = (tmp_path / "spmv.c").read_text()
    assert "(const float*)A->vals" in src and "(const double*)x->vals" in src


def test_cli_compiles_a_value_format():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ucf",
            "compile",
            "y(i) = A(i,j)*x(j)",
            "-f",
            "A:csr@float32",
            "--target",
            "c",
            "--print",
            "source",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "const float* restrict A_vals" in out


@pytest.mark.parametrize("target", ALL_TARGETS)
def test_dense_operands_in_float32(target):
    rng = np.random.default_rng(8)
    a, b = sparse(rng, (6, 5)), rand_dense(rng, (5, 4)).astype(np.float32)
    k = compile_for(target, "C(i,j) = A(i,k)*B(k,j)", {"A": "csr", "B": "dense@float32"})
    np.testing.assert_allclose(k(A=sp.csr_array(a), B=b).to_numpy(), a @ b.astype(np.float64))


# ------------------------------------------------------------------ held-only values


@pytest.mark.parametrize(
    ("target", "fmt"),
    [("llvm", "csr"), ("llvm", "bcsr(8,8)"), pytest.param("c", "csr", marks=needs_cc)]
    + [pytest.param("c", "bcsr(8,8)", marks=needs_cc), ("cuda", "csr")],
)
def test_half_values_sum_in_float32(target, fmt):
    """The issue's `bcsr(8,8)@float16`: half-precision storage, float32 arithmetic,
    within float32 rounding of numpy's sum over the same half values."""
    rng = np.random.default_rng(9)
    a, b = sparse(rng, (19, 24)), rng.standard_normal((24, 6)).astype(np.float32)
    held = f"{fmt}@float16"
    A = ucf.from_numpy(a, format=held)
    assert A.vals.dtype == np.float16
    k = compile_for(target, "C(i,j) = A(i,k)*B(k,j)", {"A": held}, dtype="float32")
    got = k(A=A, B=b).to_numpy()
    assert got.dtype == np.float32
    np.testing.assert_allclose(
        got, a.astype(np.float16).astype(np.float32) @ b, rtol=2e-6, atol=1e-6
    )


@pytest.mark.parametrize("target", [*TARGETS, "cuda"])
def test_int8_times_uint8_is_exact_in_int32(target):
    rng = np.random.default_rng(10)
    w = (rng.integers(-128, 128, size=(16, 40)) * (rng.random((16, 40)) < 0.4)).astype(np.int8)
    x = rng.integers(0, 256, size=(40, 5)).astype(np.uint8)
    fmts = {"W": "csr@int8", "X": "dense@uint8"}
    k = compile_for(target, "Y(i,j) = W(i,k)*X(k,j)", fmts, dtype="int32")
    got = k(W=ucf.from_numpy(w, format="csr@int8"), X=x).to_numpy()
    np.testing.assert_array_equal(got, w.astype(np.int32) @ x.astype(np.int32))


def test_held_only_values_are_refused_as_a_kernels_type():
    with pytest.raises(ucf.OperandError, match=r"float16 is a storage type.*csr@float16"):
        ucf.compile("y(i) = A(i,j)*x(j)", {"A": "csr"}, dtype="float16")
    with pytest.raises(FormatError, match=r"output y .*hold int8 values in operands only"):
        ucf.compile("y(i) = A(i,j)*x(j)", {"y": "dense@int8"})


def test_values_that_do_not_fit_the_held_type_are_refused_per_call():
    k = ucf.compile("y(i) = A(i,j)*x(j)", {"A": "csr@uint8"}, dtype="int32")
    with pytest.raises(ucf.OperandError, match=r"operand A: value -3\.0 .*uint8"):
        k(A=np.array([[1.0, -3.0], [0.0, 2.0]]), x=np.ones(2, dtype=np.int32))


def test_einsum_sums_narrow_operands_in_their_compute_type():
    rng = np.random.default_rng(11)
    a = rng.integers(-100, 100, size=(5, 7)).astype(np.int8)
    x = rng.integers(0, 255, size=7).astype(np.uint8)
    y = ucf.einsum("y(i) = A(i,j)*x(j)", A=sp.csr_array(a), x=x)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, a.astype(np.int32) @ x)
    h = ucf.einsum("ij,j->i", a.astype(np.float16), np.ones(7, dtype=np.float16))
    assert h.dtype == np.float32
    np.testing.assert_allclose(h, a.astype(np.float32).sum(axis=1))


def test_torch_half_tensors_are_held_as_half():
    torch = pytest.importorskip("torch")
    t = torch.tensor([[0.5, 0.0], [0.0, 1.25]], dtype=torch.float16).to_sparse_csr()
    A = ucf.from_torch(t)
    assert A.dtype == np.float16
    k = ucf.compile("y(i) = A(i,j)*x(j)", {"A": "csr@float16"}, dtype="float32")
    y = k(A=A, x=np.array([2.0, 4.0], dtype=np.float32)).to_numpy()
    np.testing.assert_array_equal(y, [1.0, 5.0])


def test_asm_shows_the_host_code_of_both_cpu_targets():
    k = ucf.compile("y(i) = W(i,k)*x(k)", {"W": "dense@float32"}, dtype="float32", schedule="")
    asm = k.asm
    assert "kernel" in asm and ("ymm" in asm or "xmm" in asm)  # the k loop vectorized
    with pytest.raises(ucf.UcfError, match="no host assembly"):
        _ = ucf.compile("y(i) = W(i,k)*x(k)", target="cuda").asm


@needs_cc
def test_int8_dot_products_become_vnni_for_a_vnni_cpu(monkeypatch):
    """This machine (znver3) has no AVX-512 VNNI, so the C kernel is compiled to
    assembly for one (icelake-server) and must use vpdpbusd for int8 x uint8 sums:
    GCC forms it from the plain loop. The JIT's LLVM (22) does not, so the register
    tiles multiply quads of steps with its intrinsic on a VNNI host
    (tests/passes/test_pairs.py checks the JIT's code for VNNI CPUs, and the tiles' C code);
    here the JIT's machine code has no vpdpbusd, which the host could not run."""
    monkeypatch.setenv(
        "UCF_CFLAGS", "-O3 -march=icelake-server -ffp-contract=off -fopenmp -fPIC -shared"
    )
    for w, x in [("int8", "uint8"), ("uint8", "int8")]:
        fmts = {"W": f"dense@{w}", "x": f"dense@{x}"}
        k = ucf.compile("y(i) = W(i,k)*x(k)", fmts, target="c", dtype="int32", schedule="")
        assert "vpdpbusd" in k.asm
    formats = {"A": "bcsr(32,32)@int8", "B": "dense@uint8"}
    jit = ucf.compile("C(i,j) = A(i,k) * B(k,j)", formats, dtype="int32")
    assert ("vpdpbusd" in jit.asm) == pairs.vnni(pairs.host_features())
