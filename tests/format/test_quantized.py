"""Values numpy has no type for (``@bfloat16``, ``@int4``) and quantized values
(``@qint8``, ``@quint8``, ``@qint4``, ``:L`` for a scale per position of level L):
their layouts, ``ucf.quantize``, kernels against numpy on llvm, c and emulated cuda,
integer sums exact against numpy's int64 arithmetic, and the errors."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import TARGETS, needs_cc
from ucf.errors import FormatError
from ucf.format.format import parse_format
from ucf.schedule import cpu_model
from ucf.toolchain.cuda_build import nvcc_check, nvcc_path

ALL = [*TARGETS, "cuda"]


def compile_for(target, expr, formats, **kw):
    if target == "cuda":
        return ucf.compile(expr, formats=formats, target="cuda", emulate=True, **kw)
    return ucf.compile(expr, formats=formats, target=target, **kw)


def sparse(rng, shape, density=0.4):
    return rng.standard_normal(shape) * (rng.random(shape) < density)


def ints(rng, shape, lo, hi, density=0.5):
    return (rng.integers(lo, hi + 1, size=shape) * (rng.random(shape) < density)).astype(np.int64)


def bf16(x):
    """numpy's float32 rounded to bfloat16 by torch (the reference), back in float32."""
    torch = pytest.importorskip("torch")
    return torch.tensor(np.asarray(x, dtype=np.float32)).to(torch.bfloat16).float().numpy()


# ------------------------------------------------------------------ formats


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("csr@bfloat16", "UC@bfloat16"),
        ("bcsr(4,4)@int4", "UCUU:0/4,1/4,0%4,1%4@int4"),
        ("csr@qint8", "UC@qint8"),
        ("csr @ QINT8 : 0", "UC@qint8:0"),
        ("bcsr(4,4)@quint8:1", "UCUU:0/4,1/4,0%4,1%4@quint8:1"),
    ],
)
def test_value_kinds_parse_and_print_round_trip(text, shown):
    fmt = parse_format(text, order=2)
    assert str(fmt) == shown and parse_format(str(fmt), order=2) == fmt


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("csr@int8:1", r"int8 values have no scales"),
        ("csr@qint8:2", r"level 2, but the format has levels 0\.\.1"),
        ("csr@qint16", r"not one of .*bfloat16, int4, qint8"),
    ],
)
def test_bad_value_suffixes_are_refused(text, match):
    with pytest.raises(FormatError, match=match):
        parse_format(text, order=2)


# ------------------------------------------------------------------ layouts


def test_bfloat16_rounds_as_torch_and_widens_exactly():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(200) * 1e3, [0.0, -0.0, 1.0, 3.0e38, 1e-40]])
    t = ucf.from_numpy(x.astype(np.float32), format="dense@bfloat16")
    assert t.vals.dtype == np.uint16 and t.dtype == np.float32
    np.testing.assert_array_equal(t.to_numpy(), bf16(x))


def test_int4_packs_two_per_byte_low_nibble_first():
    t = ucf.from_numpy(np.array([1, -2, 7, -8, 3]), format="dense@int4")
    # documented layout: value 2k in the low nibble of byte k, value 2k+1 in its high one
    assert t.vals.tolist() == [0x1 | 0xE << 4, 0x7 | 0x8 << 4, 0x3]
    assert t.dtype == np.int8 and t.nnz == 5
    np.testing.assert_array_equal(t.to_numpy(), [1, -2, 7, -8, 3])


@pytest.mark.parametrize("fmt", ["csr@int4", "bcsr(4,4)@int4", "csf@int4"])
def test_int4_round_trips_through_every_structure(fmt):
    rng = np.random.default_rng(1)
    shape = (7, 10) if fmt != "csf@int4" else (3, 5, 4)
    a = ints(rng, shape, -8, 7)
    t = ucf.from_numpy(a, format=fmt)
    np.testing.assert_array_equal(t.to_numpy(), a)
    np.testing.assert_array_equal(t.convert("csr" if len(shape) == 2 else "coo").to_numpy(), a)
    if len(shape) == 2:
        np.testing.assert_array_equal(t.to_scipy().toarray(), a)


@pytest.mark.parametrize(
    ("values", "match"),
    [([[8, 0]], r"value 8 is out of the int4 range -8\.\.7"), ([[0.5, 1]], r"integers")],
)
def test_int4_refuses_what_it_cannot_hold(values, match):
    with pytest.raises(FormatError, match=match):
        ucf.from_numpy(np.array(values), format="csr@int4")


# ------------------------------------------------------------------ quantize


@pytest.mark.parametrize(
    ("fmt", "groups"),
    [
        ("dense@qint8", lambda a: np.zeros(a.shape, int)),
        ("csr@qint8:0", lambda a: np.indices(a.shape)[0]),
        ("bcsr(4,4)@qint8:1", None),  # per block: checked against the blocks below
    ],
)
def test_quantize_picks_a_symmetric_scale_per_group(fmt, groups):
    rng = np.random.default_rng(2)
    a = sparse(rng, (10, 7))
    t = ucf.quantize(a, format=fmt)
    s, z = t.scales.scale, t.scales.zero_point
    assert not z.any()
    if groups is None:  # the nonzero blocks in row-major order, as scipy's BSR stores them
        bsr = sp.bsr_array(np.pad(a, ((0, 2), (0, 1))), blocksize=(4, 4))
        bsr.sort_indices()
        want = np.abs(bsr.data).max(axis=(1, 2)) / 127
    else:
        g = groups(a)
        want = np.array([np.abs(a[g == k]).max() / 127 for k in range(g.max() + 1)])
    np.testing.assert_allclose(s, want.astype(np.float32), rtol=1e-7)
    back = t.to_numpy()
    assert back.dtype == np.float32
    step = np.max(s) / 2 * 1.0001
    assert np.abs(back - a).max() <= step and ((back == 0) == (a == 0)).all()


def test_a_given_scale_and_zero_point_are_used_as_they_are():
    a = np.array([[0.0, 1.0, -1.0], [0.5, 0.0, 2.0]])
    t = ucf.quantize(a, format="dense@quint8:0", scale=[0.25, 0.5], zero_point=[10, 3])
    np.testing.assert_array_equal(t.scales.scale, [0.25, 0.5])
    np.testing.assert_array_equal(t.vals.reshape(2, 3), [[10, 14, 6], [4, 3, 7]])
    np.testing.assert_array_equal(t.to_numpy(), a)


def test_quint8_without_a_scale_covers_the_range_with_zero_exact():
    rng = np.random.default_rng(3)
    a = sparse(rng, (6, 9)) + 0.5 * (rng.random((6, 9)) < 0.3)
    t = ucf.quantize(sp.csr_array(a), format="csr@quint8")
    s, z = float(t.scales.scale[0]), int(t.scales.zero_point[0])
    lo, hi = min(a.min(), 0), max(a.max(), 0)
    assert s == pytest.approx((hi - lo) / 255, rel=1e-6)
    assert z == round(-lo / s)
    np.testing.assert_allclose(t.to_numpy(), a, atol=s / 2 * 1.0001)


def test_converting_keeps_the_scales_where_the_groups_stay():
    rng = np.random.default_rng(11)
    a = sparse(rng, (9, 12))
    t = ucf.quantize(a, format="csr@qint8:0")
    wide = t.convert(index_dtype=np.int64)
    assert wide.levels[1]["crd"].dtype == np.int64
    np.testing.assert_array_equal(wide.vals, t.vals)
    np.testing.assert_array_equal(wide.scales.scale, t.scales.scale)
    per_tensor = ucf.quantize(a, format="csr@qint8", scale=0.01)
    blocked = per_tensor.convert("bcsr(4,4)@qint8")
    assert blocked.scales.scale[0] == np.float32(0.01)
    np.testing.assert_array_equal(blocked.to_numpy(), per_tensor.to_numpy())
    np.testing.assert_array_equal(t.convert("csr").to_numpy(), t.to_numpy())
    s = ucf.from_scipy(sp.csr_array(a), format="csr@qint8:0")
    np.testing.assert_array_equal(s.vals, t.vals)
    c = t.copy()
    assert not np.shares_memory(c.scales.scale, t.scales.scale)
    np.testing.assert_array_equal(c.to_numpy(), t.to_numpy())


def test_all_zero_tensors_quantize_to_zero():
    z = np.zeros((5, 6))
    for fmt in ["dense@qint8:0", "csr@qint4", "bcsr(4,4)@qint8:1", "csr@quint8"]:
        t = ucf.quantize(z, format=fmt)
        assert np.isfinite(t.scales.scale).all() and not t.to_numpy().any()
    k = ucf.compile("y(i) = A(i,j)*x(j)", {"A": "csr@qint8", "x": "dense@qint8"})
    y = k(A=ucf.quantize(z, format="csr@qint8"), x=ucf.quantize(np.ones(6), format="dense@qint8"))
    assert not y.to_numpy().any()


# ------------------------------------------------------------------ kernels


def _operand(rng, fmt, shape):
    """A random operand in ``fmt`` and the numbers it holds (the reference's input)."""
    if "@q" in fmt:  # exactly the numbers the kernel computes with, in float64
        t = ucf.quantize(sparse(rng, shape), format=fmt)
        d, s = _stored(t)
        return t, d * s
    if fmt.endswith("@int4"):
        t = ucf.from_numpy(ints(rng, shape, -8, 7), format=fmt)
    else:
        t = ucf.from_numpy(sparse(rng, shape), format=fmt)
    return t, t.to_numpy().astype(np.float64)


# partial blocks everywhere (10 x 7 over 4 x 4 blocks); cuda only where its loads differ
KERNEL_CASES = (
    [("llvm", f) for f in ["csr@bfloat16", "bcsr(4,4)@bfloat16", "dense@bfloat16"]]
    + [("llvm", f) for f in ["csr@int4", "bcsr(4,4)@int4", "dense@int4"]]
    + [("llvm", f) for f in ["csr@qint8:0", "bcsr(4,4)@qint8:1", "dense@quint8", "csr@qint4"]]
    + [pytest.param("c", f, marks=needs_cc) for f in ["bcsr(4,4)@bfloat16", "csr@int4"]]
    + [pytest.param("c", f, marks=needs_cc) for f in ["bcsr(4,4)@qint4:1", "csr@quint8:0"]]
    + [("cuda", "bcsr(4,4)@bfloat16"), ("cuda", "csr@int4"), ("cuda", "bcsr(4,4)@qint8:1")]
)


@pytest.mark.parametrize(("target", "fmt"), KERNEL_CASES)
def test_spmv_and_spmm_read_held_values(target, fmt):
    rng = np.random.default_rng(4)
    A, a = _operand(rng, fmt, (10, 7))
    x, b = rng.standard_normal(7), rng.standard_normal((7, 3))
    if target == "cuda":  # one kernel a case: the emulator compiles for seconds
        k = compile_for(target, "C(i,j) = A(i,k)*B(k,j)", {"A": fmt}, dtype="float32")
        got = k(A=A, B=b.astype(np.float32)).to_numpy()
        np.testing.assert_allclose(got, a @ b.astype(np.float32), rtol=1e-5, atol=1e-5)
        return
    spmv = compile_for(target, "y(i) = A(i,k)*x(k)", {"A": fmt})
    np.testing.assert_allclose(spmv(A=A, x=x).to_numpy(), a @ x, rtol=1e-12, atol=1e-12)
    spmm = compile_for(target, "C(i,j) = A(i,k)*B(k,j)", {"A": fmt}, dtype="float32")
    got = spmm(A=A, B=b.astype(np.float32)).to_numpy()
    np.testing.assert_allclose(got, a @ b.astype(np.float32), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", TARGETS)
def test_element_wise_statements_of_held_operands(target):
    rng = np.random.default_rng(5)
    A, a = _operand(rng, "csr@qint8", (10, 7))
    B, b = _operand(rng, "bcsr(4,4)@bfloat16", (10, 7))
    D, d = _operand(rng, "dense@int4", (10, 7))
    fmts = {"A": "csr@qint8", "B": "bcsr(4,4)@bfloat16", "D": "dense@int4"}
    k = compile_for(target, "C(i,j) = A(i,j)*B(i,j) + D(i,j)", fmts)
    np.testing.assert_allclose(k(A=A, B=B, D=D).to_numpy(), a * b + d, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("target", TARGETS)
def test_order_3_operands(target):
    rng = np.random.default_rng(6)
    A, a = _operand(rng, "csf@qint8:1", (4, 5, 6))
    B, b = _operand(rng, "dense@int4", (4, 5, 6))
    x = rng.standard_normal(6)
    k = compile_for(target, "y(i,j) = A(i,j,k)*x(k)", {"A": "csf@qint8:1"})
    np.testing.assert_allclose(k(A=A, x=x).to_numpy(), a @ x, rtol=1e-12, atol=1e-12)
    e = compile_for(target, "C(i,j,k) = A(i,j,k)*B(i,j,k)", {"A": "csf@qint8:1", "B": "dense@int4"})
    np.testing.assert_allclose(e(A=A, B=B).to_numpy(), a * b, rtol=1e-12, atol=1e-12)


def test_plain_operands_are_held_as_the_kernel_states():
    rng = np.random.default_rng(7)
    a, x = sparse(rng, (6, 5)), rng.standard_normal(5)
    k = ucf.compile("y(i) = A(i,j)*x(j)", {"A": "csr@bfloat16"})
    with pytest.warns(ucf.ConversionWarning, match=r"operand A is stored as 'dense'.*every call"):
        np.testing.assert_allclose(k(A=a, x=x).to_numpy(), bf16(a).astype(np.float64) @ x)
    q = ucf.compile("y(i) = A(i,j)*x(j)", {"A": "csr@qint8:0"})
    d, s = _stored(ucf.quantize(a, format="csr@qint8:0"))
    want = (d * s) @ x
    with pytest.warns(ucf.ConversionWarning):
        np.testing.assert_allclose(q(A=sp.csr_array(a), x=x).to_numpy(), want, rtol=1e-12)


@pytest.mark.skipif(nvcc_path() is None, reason="needs nvcc")
def test_held_loads_compile_with_nvcc():
    """The emulator accepts C++ nvcc may reject: the loads of every kind, and a nested
    int32 sum, compile for a GPU too."""
    fmts = {"A": "csr@qint8:0", "H": "csr@bfloat16", "D": "dense@int4", "x": "dense@qint4"}
    k = ucf.compile(
        "y(i) = A(i,k)*x(k) + H(i,k)*x(k) + D(i,k)*x(k)", fmts, target="cuda", dtype="float32"
    )
    nvcc_check(k.source)


# ------------------------------------------------------------------ integer sums


def _stored(t):
    """Dense arrays of a quantized tensor's stored integers minus their zero points (0
    where nothing is stored) and of each element's scale: the data the kernel reads."""
    from ucf.format.encoding import unpack_int4

    values = t.format.values
    q = unpack_int4(t.vals, t.nnz) if values.packed else t.vals
    g = t.scale_groups(values.level)
    d = q.astype(np.int64) - t.scales.zero_point[g]
    s = t.scales.scale[g].astype(np.float64)
    dense = [ucf.Tensor(t.shape, t.format.structure, t.levels, v).to_numpy() for v in (d, s)]
    return dense[0], dense[1]


@pytest.mark.parametrize(
    ("target", "fmt"),
    [("llvm", "csr@qint8"), ("llvm", "csr@qint8:0"), ("llvm", "dense@quint8:0")]
    + [pytest.param("c", "csr@qint4:0", marks=needs_cc)],
)
def test_quantized_spmv_sums_integers_exactly(target, fmt):
    rng = np.random.default_rng(8)
    A = ucf.quantize(sparse(rng, (12, 300), 0.6), format=fmt)
    x = ucf.quantize(rng.standard_normal(300), format="dense@qint8")
    k = compile_for(target, "y(i) = A(i,k)*x(k)", {"A": fmt, "x": "dense@qint8"})
    assert k._plan.integer_sums == [(("A", "x"), ("k",))]  # the int32 sum is what is tested
    da, sa = _stored(A)
    dx, sx = _stored(x)
    want = (da @ dx).astype(np.float64) * sa.max(axis=1) * sx[0]  # one scale per row
    np.testing.assert_allclose(k(A=A, x=x).to_numpy(), want, rtol=1e-15)


@pytest.mark.parametrize(
    ("target", "fmt"),
    [("llvm", "csr@qint8"), ("llvm", "csr@qint8:0"), ("llvm", "dcsr@qint4:0")]
    + [pytest.param("c", "csr@quint8:0", marks=needs_cc), ("cuda", "csr@qint8:0")],
)
def test_quantized_spmm_sums_integers_exactly_by_default(target, fmt, monkeypatch):
    """CSR SpMM's storage order (i, k, j) accumulates each output entry across k, which
    rescaled every product; the default schedule runs k inside j instead, so each entry
    is one int32 sum rescaled once: exactly numpy's int64 product times the scales. Both
    the plan compiled before a call and the one a call's statistics choose."""
    rng = np.random.default_rng(12)
    A = ucf.quantize(sparse(rng, (9, 40), 0.5), format=fmt)
    B = ucf.quantize(rng.standard_normal((40, 6)), format="dense@qint8")
    da, sa = _stored(A)
    db, sb = _stored(B)
    want = (da @ db).astype(np.float64) * sa.max(axis=1)[:, None] * sb[0, 0]
    k = compile_for(target, "C(i,j) = A(i,k)*B(k,j)", {"A": fmt, "B": "dense@qint8"})
    assert k._plan.integer_sums == [(("A", "B"), ("k",))]
    np.testing.assert_array_equal(k(A=A, B=B).to_numpy(), want)

    monkeypatch.setattr(cpu_model, "REPLAN_WORK", 0)  # this call plans for its statistics
    np.testing.assert_array_equal(k(A=A, B=B).to_numpy(), want)
    assert "sums its quantized products in int32" in k.cin


@pytest.mark.parametrize("target", TARGETS)
def test_block_scaled_spmm_sums_each_block_in_int32(target):
    """C(i,j) = sum_kb s(ib,kb) * s_B * sum_kk q_A * q_B: the block's places summed in
    int32 by default; numpy computes each block's int64 sum and the same rescale."""
    rng = np.random.default_rng(9)
    a, b = sparse(rng, (10, 11), 0.5), rng.standard_normal((11, 3))
    A = ucf.quantize(a, format="bcsr(4,4)@qint8:1")
    B = ucf.quantize(b, format="dense@qint8")
    fmts = {"A": "bcsr(4,4)@qint8:1", "B": "dense@qint8"}
    k = compile_for(target, "C(i,j) = A(i,k)*B(k,j)", fmts)
    assert k._plan.integer_sums == [(("A", "B"), (4,))]
    assert k._plan.cin.order == ["i_blk", "k_blk", "i_in", "j", "k_in"]
    bsr = sp.bsr_array(np.pad(a, ((0, 2), (0, 1))), blocksize=(4, 4))  # the same blocks
    bsr.sort_indices()
    qb = np.pad(B.vals.reshape(11, 3).astype(np.int64), ((0, 1), (0, 0)))
    sb = float(B.scales.scale[0])
    want = np.zeros((12, 3))
    for n, (ib, kb) in enumerate(_blocks(bsr)):
        q = A.vals.reshape(-1, 4, 4)[n].astype(np.int64)
        want[4 * ib : 4 * ib + 4] += (q @ qb[4 * kb : 4 * kb + 4]) * float(A.scales.scale[n]) * sb
    np.testing.assert_allclose(k(A=A, B=B).to_numpy(), want[:10], rtol=1e-14, atol=1e-14)


def _blocks(bsr):
    for ib in range(bsr.indptr.size - 1):
        for p in range(bsr.indptr[ib], bsr.indptr[ib + 1]):
            yield ib, bsr.indices[p]


def test_unit_scales_give_numpys_integer_products():
    rng = np.random.default_rng(10)
    qa, qx = ints(rng, (8, 50), -128, 127, 0.7), rng.integers(-128, 128, 50)
    A = ucf.quantize(qa, format="csr@qint8", scale=1.0)
    x = ucf.quantize(qx, format="dense@qint8", scale=1.0)
    k = ucf.compile("y(i) = A(i,k)*x(k)", {"A": "csr@qint8", "x": "dense@qint8"})
    np.testing.assert_array_equal(k(A=A, x=x).to_numpy(), qa @ qx)


# ------------------------------------------------------------------ errors


def test_an_int32_overflow_risk_is_refused_with_the_bound():
    k = ucf.compile("y(i) = A(i,k)*x(k)", {"A": "dense@qint8", "x": "dense@qint8"})
    n = 2**31 // (128 * 128) + 1
    A = ucf.quantize(np.ones((1, n)), format="dense@qint8")
    x = ucf.quantize(np.ones(n), format="dense@qint8")
    with pytest.raises(FormatError, match=r"A, x adds up to 131073 terms .* at most 131071"):
        k(A=A, x=x)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(scale=[1.0, 2.0]), r"scale has shape \(2,\), but the format has 3 scale group"),
        (dict(scale=np.ones((3, 1))), r"scale has shape \(3, 1\)"),
        (dict(scale=[1.0, 0.0, 1.0]), r"positive and finite, got 0\.0"),
        (dict(scale=1.0, zero_point=[0, 0, 128]), r"zero_point 128 is out of the qint8 range"),
        (dict(zero_point=[0, -129, 0]), r"zero_point -129 is out of the qint8 range"),
    ],
)
def test_bad_scales_and_zero_points_are_refused(kw, match):
    if np.ndim(kw.get("scale", 0)) == 0 and "scale" in kw:
        kw["scale"] = [kw["scale"]] * 3
    with pytest.raises(FormatError, match=match):
        ucf.quantize(np.eye(3), format="csr@qint8:0", **kw)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_refused(bad):
    """A NaN quantized to 0 and an inf to the top of the range, silently (found in review)."""
    with pytest.raises(FormatError, match="cannot be quantized: quantized values are finite"):
        ucf.quantize(np.array([1.0, bad]), format="dense@qint8")


def test_tensors_with_wrong_scales_are_refused():
    t = ucf.quantize(np.eye(3), format="csr@qint8:0")
    with pytest.raises(FormatError, match=r"quantized but the tensor has no scales"):
        ucf.Tensor(t.shape, t.format, t.levels, t.vals)
    from ucf.format.encoding import Scales

    bad = Scales(t.scales.scale[:2], t.scales.zero_point[:2])
    with pytest.raises(FormatError, match=r"scale has shape \(2,\), but the format has 3"):
        ucf.Tensor(t.shape, t.format, t.levels, t.vals, scales=bad)


def test_a_scale_per_row_cannot_follow_another_operands_blocks():
    fmts = {"A": "csr@qint8:0", "B": "bcsr(4,4)"}
    k = ucf.compile("C(i,j) = A(i,j)*B(i,j)", fmts)
    A = ucf.quantize(np.eye(5), format="csr@qint8:0")
    with pytest.raises(FormatError, match=r"operand A .*scale per position of level 0 .*blocks"):
        k(A=A, B=ucf.from_numpy(np.eye(5), format="bcsr(4,4)"))


def test_quantize_needs_a_quantized_format():
    with pytest.raises(FormatError, match=r"holds no quantized values; end it in @qint8"):
        ucf.quantize(np.eye(2), format="csr@int8")


def test_quantized_values_need_a_float_kernel():
    with pytest.raises(FormatError, match=r"operand A .*qint8"):
        ucf.compile("y(i) = A(i,j)*x(j)", {"A": "csr@qint8"}, dtype="int32")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fa", ["dense@qint8", "csr@qint8", "dense@qint4"])
def test_an_operand_with_scales_per_block_is_not_requantized_by_the_loop_order(target, fa):
    """A kernel reads a per-block quantized B in an order that keeps its blocks' scale
    groups, so the result is the product of the operands' own (dequantized) values; in
    an order that would regroup them (it requantized B per column, silently, before),
    B is read from a dequantized copy, with the same result."""
    rng = np.random.default_rng(21)
    a = rng.standard_normal((8, 12)) * (rng.random((8, 12)) < 0.5)
    b = rng.standard_normal((12, 8)) * (rng.random((12, 8)) < 0.5)
    fb = "bcsr(4,4)@qint8:1"
    A, B = ucf.quantize(a, format=fa), ucf.quantize(b, format=fb)
    k = ucf.compile("C(i,j) = A(i,k) * B(k,j)", {"A": fa, "B": fb}, target=target, dtype="float64")
    want = A.to_numpy().astype(np.float64) @ B.to_numpy().astype(np.float64)
    np.testing.assert_allclose(k(A=A, B=B).to_numpy(), want, rtol=1e-6, atol=1e-6)
    k = ucf.compile(
        "C(i,j) = A(i,k) * B(k,j)",
        {"A": fa, "B": fb},
        schedule="reorder(i, j_blk, j_in, k_blk, k_in)",
        target=target,
        dtype="float64",
    )
    assert "operand B" in k.cin and "its values dequantized" in k.cin
    with pytest.warns(ucf.ConversionWarning, match="operand B"):
        np.testing.assert_allclose(k(A=A, B=B).to_numpy(), want, rtol=1e-6, atol=1e-6)
