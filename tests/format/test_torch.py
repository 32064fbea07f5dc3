"""PyTorch and DLPack interchange: every torch layout both ways against torch's and
scipy's own view of the same data, the buffers shared where ucf promises it,
kernels fed torch tensors, and kernels as torch custom ops under torch.compile."""

from __future__ import annotations

import collections
import sys
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import ucf

torch = pytest.importorskip("torch")

warnings.filterwarnings("ignore", "Sparse (CSR|CSC|BSR) tensor support is in beta")

VALUE_DTYPES = [torch.float64, torch.float32, torch.int64, torch.int32]


def random_dense(shape, seed, dtype=torch.float64, density=0.3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(1, 10, shape, generator=g).to(dtype)
    return values * (torch.rand(shape, generator=g) < density)


def ptr(a) -> int:
    """Address of a numpy array's or a torch tensor's first element."""
    return a.ctypes.data if isinstance(a, np.ndarray) else a.data_ptr()


LAYOUTS = {
    "strided": lambda d: d,
    "csr": lambda d: d.to_sparse_csr(),
    "csc": lambda d: d.to_sparse_csc(),
    "coo": lambda d: d.to_sparse(),
    "bsr": lambda d: d.to_sparse_bsr((2, 3)),
}
FORMATS = {
    "strided": "UU",
    "csr": "UC",
    "csc": "UC:1,0",
    "coo": "CS",
    "bsr": "UCUU:0/2,1/3,0%2,1%3",
}


# ------------------------------------------------------------------ round trips


@pytest.mark.parametrize("dtype", VALUE_DTYPES, ids=str)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout_round_trips(layout, dtype):
    dense = random_dense((8, 9), seed=len(layout), dtype=dtype)
    t = LAYOUTS[layout](dense)
    u = ucf.from_torch(t)
    assert str(u.format) == FORMATS[layout]
    assert u.dtype == dense.numpy().dtype
    np.testing.assert_array_equal(u.to_numpy(), dense.numpy())
    back = u.to_torch()
    assert back.layout == t.layout and back.dtype == t.dtype and back.shape == t.shape
    assert torch.equal(back.to_dense(), dense)


@pytest.mark.parametrize("layout", ["csr", "csc"])
def test_compressed_layouts_agree_with_scipy(layout):
    dense = random_dense((40, 30), seed=3)
    u = ucf.from_torch(LAYOUTS[layout](dense))
    ref = (sp.csr_array if layout == "csr" else sp.csc_array)(dense.numpy())
    np.testing.assert_array_equal(u.levels[1]["pos"], ref.indptr)
    np.testing.assert_array_equal(u.levels[1]["crd"], ref.indices)
    np.testing.assert_array_equal(u.vals, ref.data)
    assert (u.to_scipy() != ref).nnz == 0


def test_three_dimensional_coo_round_trips():
    dense = random_dense((5, 6, 7), seed=4, dtype=torch.float32)
    u = ucf.from_torch(dense.to_sparse())
    assert str(u.format) == "CSS" and u.dtype == np.float32
    np.testing.assert_array_equal(u.to_numpy(), dense.numpy())
    assert torch.equal(u.to_torch().to_dense(), dense)


def test_int32_indices_are_kept():
    dense = random_dense((6, 7), seed=5)
    t = torch.sparse_csr_tensor(
        dense.to_sparse_csr().crow_indices().int(),
        dense.to_sparse_csr().col_indices().int(),
        dense.to_sparse_csr().values(),
        size=dense.shape,
    )
    u = ucf.from_torch(t)
    assert u.index_dtype == np.int32
    assert u.to_torch().crow_indices().dtype == torch.int32
    assert ucf.from_torch(t, index_dtype=np.int64).index_dtype == np.int64


# ------------------------------------------------------------------ zero copy


def test_dense_shares_memory_both_ways():
    t = random_dense((6, 5), seed=6)
    u = ucf.from_torch(t)
    assert np.shares_memory(u.vals, t.numpy())
    back = u.to_torch()
    assert ptr(back) == ptr(t)
    permuted = ucf.from_numpy(t.numpy(), "UU:1,0")
    view = permuted.to_torch()
    assert ptr(view) == ptr(permuted.vals) and torch.equal(view, t)


@pytest.mark.parametrize("layout", ["csr", "csc", "bsr"])
def test_compressed_layouts_share_memory(layout):
    t = LAYOUTS[layout](random_dense((8, 9), seed=7))
    u = ucf.from_torch(t)
    if layout == "csc":
        pos, crd = t.ccol_indices(), t.row_indices()
    else:
        pos, crd = t.crow_indices(), t.col_indices()
    assert ptr(u.levels[1]["pos"]) == ptr(pos)
    assert ptr(u.levels[1]["crd"]) == ptr(crd)
    assert ptr(u.vals) == ptr(t.values())
    back = u.to_torch()
    back_pos = back.ccol_indices() if layout == "csc" else back.crow_indices()
    assert ptr(back_pos) == ptr(pos) and ptr(back.values()) == ptr(t.values())


def test_coalesced_coo_shares_its_index_rows_and_values():
    t = random_dense((7, 8), seed=8).to_sparse()
    u = ucf.from_torch(t)
    idx = t.indices().numpy()
    assert np.shares_memory(u.levels[0]["crd"], idx) and np.shares_memory(u.levels[1]["crd"], idx)
    assert np.shares_memory(u.vals, t.values().numpy())


# ------------------------------------------------------------------ copies that must be right


def test_non_contiguous_strided_is_copied_correctly():
    t = random_dense((6, 5), seed=9)
    u = ucf.from_torch(t.T)
    assert not np.shares_memory(u.vals, t.numpy())
    np.testing.assert_array_equal(u.to_numpy(), t.T.numpy())


def test_uncoalesced_coo_sums_duplicates_like_torch():
    g = torch.Generator().manual_seed(10)
    idx = torch.randint(0, 4, (2, 30), generator=g)
    vals = torch.rand(30, generator=g, dtype=torch.float64)
    t = torch.sparse_coo_tensor(idx, vals, (4, 4))
    assert not t.is_coalesced()
    u = ucf.from_torch(t)
    np.testing.assert_allclose(u.to_numpy(), t.coalesce().to_dense().numpy(), rtol=1e-14)


def test_csr_with_unsorted_columns_is_repacked():
    crow = torch.tensor([0, 3, 3, 5])
    col = torch.tensor([4, 0, 2, 3, 1])
    vals = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=torch.float64)
    t = torch.sparse_csr_tensor(crow, col, vals, size=(3, 5))
    u = ucf.from_torch(t)
    u.validate()
    ref = sp.csr_array((vals.numpy(), col.numpy(), crow.numpy()), shape=(3, 5))
    np.testing.assert_array_equal(u.to_numpy(), ref.toarray())


def test_bsr_with_unsorted_block_columns_is_repacked():
    g = torch.Generator().manual_seed(23)
    crow, col = torch.tensor([0, 2, 3]), torch.tensor([2, 0, 1])
    blocks = torch.randint(1, 9, (3, 2, 3), generator=g).double()
    t = torch.sparse_bsr_tensor(crow, col, blocks, size=(4, 9), check_invariants=False)
    u = ucf.from_torch(t)
    u.validate()
    assert str(u.format) == FORMATS["bsr"] and not np.shares_memory(u.vals, blocks.numpy())
    ref = sp.bsr_array((blocks.numpy(), col.numpy(), crow.numpy()), shape=(4, 9))
    np.testing.assert_array_equal(u.to_numpy(), ref.toarray())


def test_autograd_history_is_dropped():
    t = torch.rand(3, 4, dtype=torch.float64, requires_grad=True)
    u = ucf.from_torch(t * 2)
    np.testing.assert_array_equal(u.to_numpy(), (t * 2).detach().numpy())


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("fmt", ["csr", "csc", "dcsr", "dense"])
def test_any_layout_into_any_format(layout, fmt):
    dense = random_dense((8, 9), seed=11)
    u = ucf.from_torch(LAYOUTS[layout](dense), format=fmt, dtype=np.float32)
    assert u.format == ucf.parse_format(fmt, order=2) and u.dtype == np.float32
    np.testing.assert_array_equal(u.to_numpy(), dense.numpy().astype(np.float32))
    if fmt != "dense":  # the zeros padding BSR blocks are not stored in another format
        assert u.nnz == int((dense != 0).sum())


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("fmt", ["csr@qint8:0", "dense@qint8:0", "dcsr@qint8"])
def test_any_layout_into_quantized_formats_as_torch_quantizes(layout, fmt):
    """Quantized values from a torch tensor: the symmetric scale per group numpy computes,
    and the numbers torch's own quantization with those scales gives."""
    dense = torch.randn((8, 9), generator=torch.Generator().manual_seed(21), dtype=torch.float64)
    dense = dense * (random_dense((8, 9), seed=22) != 0)
    u = ucf.from_torch(LAYOUTS[layout](dense), format=fmt)
    assert u.format == ucf.parse_format(fmt, order=2)
    a = dense.numpy()
    per_row = fmt.endswith(":0")
    s = np.abs(a).max(axis=1) / 127 if per_row else np.array([np.abs(a).max() / 127])
    np.testing.assert_allclose(u.scales.scale, s.astype(np.float32), rtol=1e-7)
    scales = torch.tensor(np.repeat(u.scales.scale, 8 if not per_row else 1), dtype=torch.float64)
    q = torch.quantize_per_channel(
        dense.float(), scales, torch.zeros(8, dtype=torch.int64), 0, torch.qint8
    )
    np.testing.assert_array_equal(u.to_numpy(), q.dequantize().numpy())


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_any_layout_into_bfloat16_and_int4(layout):
    dense = torch.randn((8, 9), generator=torch.Generator().manual_seed(23), dtype=torch.float32)
    dense = dense * (random_dense((8, 9), seed=24) != 0)
    bf16 = dense.to(torch.bfloat16)
    for t in (dense, bf16):  # torch rounds the first, the second is held exactly
        u = ucf.from_torch(LAYOUTS[layout](t), format="csr@bfloat16")
        assert u.vals.dtype == np.uint16
        np.testing.assert_array_equal(u.to_numpy(), bf16.float().numpy())
    small = torch.randint(-8, 8, (8, 9), generator=torch.Generator().manual_seed(25))
    small = small * (random_dense((8, 9), seed=26) != 0)
    u = ucf.from_torch(LAYOUTS[layout](small), format="bcsr(2,3)@int4")
    np.testing.assert_array_equal(u.to_numpy(), small.numpy())


def test_held_formats_from_torch_are_read_by_kernels(target):
    A = torch.randn((10, 7), generator=torch.Generator().manual_seed(27), dtype=torch.float64)
    A = A * (random_dense((10, 7), seed=28) != 0)
    x = torch.randn(7, generator=torch.Generator().manual_seed(29), dtype=torch.float64)
    fmts = {"A": "csr@qint8:0", "x": "dense@qint8"}
    k = ucf.compile("y(i) = A(i,j) * x(j)", fmts, target=target, index_dtype="int64")
    Aq, xq = ucf.from_torch(A.to_sparse_csr(), format=fmts["A"]), ucf.from_torch(x, fmts["x"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", ucf.ConversionWarning)  # read as they are
        got = k(A=Aq, x=xq).to_numpy()
    sa = torch.from_numpy(Aq.scales.scale).double()
    qa = torch.quantize_per_channel(A.float(), sa, torch.zeros(10).long(), 0, torch.qint8)
    sx = float(xq.scales.scale[0])
    qx = torch.quantize_per_tensor(x.float(), sx, 0, torch.qint8)
    ref = (qa.int_repr().double() @ qx.int_repr().double()) * sa * sx  # one int sum a row
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-14)


def test_held_formats_from_torch_refuse_what_they_cannot_build():
    with pytest.raises(ucf.FormatError, match=r"holds qint8 values; dtype="):
        ucf.from_torch(torch.eye(3), format="csr@qint8", dtype="float32")
    with pytest.raises(ucf.FormatError, match=r"int4 values must be integers"):
        ucf.from_torch(torch.eye(3) / 2, format="csr@int4")
    batched = torch.eye(4).reshape(2, 2, 4).to_sparse_csr()
    with pytest.raises(ucf.UnsupportedError, match="batched or hybrid"):  # not a format's order
        ucf.from_torch(batched, format="csr@qint8")
    with pytest.raises(ucf.UnsupportedError, match="hybrid COO"):
        ucf.from_torch(torch.eye(4).to_sparse(sparse_dim=1), format="coo@bfloat16")
    q = torch.quantize_per_tensor(torch.eye(3), 0.1, 0, torch.qint8)
    with pytest.raises(ucf.UnsupportedError, match=r"torch.qint8\): torch's quantized tensors"):
        ucf.from_torch(q, format="dense@qint8")


@pytest.mark.parametrize(
    "fmt, layout",
    [
        ("CC", torch.sparse_coo),
        ("UC:1,0", torch.sparse_csc),
        ("UCUU:0/3,1/2,0%3,1%2", torch.sparse_bsr),
        ("UCUU:0/4,1/2,0%4,1%2", torch.sparse_coo),  # 9 rows are not whole 4-row blocks
        ("CU", torch.sparse_coo),
    ],
)
def test_ucf_formats_pick_the_matching_torch_layout(fmt, layout):
    a = random_dense((9, 8), seed=12).numpy()
    back = ucf.from_numpy(a, fmt).to_torch()
    assert back.layout == layout
    np.testing.assert_array_equal(back.to_dense().numpy(), a)


# ------------------------------------------------------------------ kernels on torch operands


@pytest.mark.parametrize("layout", ["csr", "csc", "coo", "bsr"])
def test_spmm_on_torch_operands(layout, target):
    A = LAYOUTS[layout](random_dense((8, 9), seed=13))
    B = random_dense((9, 4), seed=14, density=1.0)
    # kernels do not read blocked formats yet: a BSR operand is converted to CSR; the
    # others arrive in the kernel's format and index dtype, so nothing is converted
    fmt = "csr" if layout == "bsr" else layout
    k = ucf.compile("C(i,k) = A(i,j) * B(j,k)", {"A": fmt}, target=target, index_dtype="int64")
    with warnings.catch_warnings():
        warnings.simplefilter("error" if layout != "bsr" else "ignore", ucf.ConversionWarning)
        got = k(A=A, B=B).to_numpy()
    ref = torch.sparse.mm(A.to_sparse() if layout == "bsr" else A, B)
    np.testing.assert_allclose(got, ref.to_dense().numpy(), rtol=1e-13)


def test_einsum_on_torch_operands_both_spellings():
    A = random_dense((10, 7), seed=15, dtype=torch.float32).to_sparse_csr()
    x = torch.rand(7, generator=torch.Generator().manual_seed(16))
    ref = (A.to_dense() @ x).numpy()
    by_name = ucf.einsum("y(i) = A(i,j) * x(j)", A=A, x=x)
    assert isinstance(by_name, torch.Tensor) and by_name.dtype == torch.float32
    np.testing.assert_allclose(by_name.numpy(), ref, rtol=1e-6)
    np.testing.assert_allclose(ucf.einsum("ij,j->i", A, x).numpy(), ref, rtol=1e-6)
    mixed = ucf.einsum("y(i) = A(i,j) * x(j)", A=A, x=x.numpy())  # any torch operand: torch
    assert isinstance(mixed, torch.Tensor)


# ------------------------------------------------------------------ DLPack


def test_dlpack_both_ways_with_numpy_and_torch():
    a = np.random.default_rng(17).random((4, 6))
    u = ucf.from_dlpack(a)
    assert np.shares_memory(u.vals, a)
    t = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    v = ucf.from_dlpack(t)
    assert ptr(v.vals) == ptr(t) and v.dtype == np.int32
    np.testing.assert_array_equal(v.to_numpy(), t.numpy())
    to_torch = torch.from_dlpack(u)
    assert ptr(to_torch) == ptr(a) and torch.equal(to_torch, torch.from_numpy(a))
    to_numpy = np.from_dlpack(v)
    assert np.shares_memory(to_numpy, t.numpy())
    np.testing.assert_array_equal(to_numpy, t.numpy())
    assert u.__dlpack_device__() == a.__dlpack_device__()


def test_dlpack_refuses_sparse_storage():
    u = ucf.from_numpy(np.eye(3), "csr")
    with pytest.raises(ucf.DLPackError, match="format 'UC'") as info:
        np.from_dlpack(u)
    assert isinstance(info.value, BufferError) and isinstance(info.value, ucf.UcfError)
    with pytest.raises(ucf.UcfError, match="torch.Tensor.*cannot be read through DLPack"):
        ucf.from_dlpack(torch.eye(3).to_sparse())
    with pytest.raises(ucf.OperandError, match="builtins|dict does not export DLPack"):
        ucf.from_dlpack({})


# ------------------------------------------------------------------ errors


def test_errors_name_the_torch_tensor():
    with pytest.raises(ucf.OperandError, match=r"torch.Tensor .*on device meta.*t.cpu\(\)"):
        ucf.from_torch(torch.zeros(3, device="meta"))
    with pytest.raises(ucf.OperandError, match=r"torch.Tensor .*torch.complex64 is not supported"):
        ucf.from_torch(torch.zeros(3, dtype=torch.complex64))
    assert ucf.from_torch(torch.ones(3, dtype=torch.bfloat16), dtype="float64").dtype == np.float64
    with pytest.raises(ucf.OperandError, match="complex"):
        ucf.from_torch(torch.zeros(3, dtype=torch.complex64), dtype="float64")
    with pytest.raises(ucf.UnsupportedError, match="torch.Tensor .*sparse_bsc.*not supported"):
        ucf.from_torch(torch.eye(4).to_sparse_bsc((2, 2)))
    with pytest.raises(ucf.UnsupportedError, match="hybrid COO"):
        ucf.from_torch(torch.eye(4).to_sparse(sparse_dim=1))
    with pytest.raises(ucf.UnsupportedError, match="batched or hybrid"):
        ucf.from_torch(torch.eye(4).reshape(2, 2, 4).to_sparse_csr())
    with pytest.raises(ucf.OperandError, match="expects a torch.Tensor, got numpy.ndarray"):
        ucf.from_torch(np.eye(2))


def test_kernel_errors_name_operand_and_torch_type():
    k = ucf.compile("y(i) = A(i,j) * x(j)")
    bad = torch.zeros((3, 3), dtype=torch.complex128)
    with pytest.raises(ucf.OperandError, match=r"operand A: torch.Tensor \(strided.*complex128"):
        k(A=bad, x=np.ones(3))
    with pytest.raises(ucf.OperandError, match="unsupported type collections.OrderedDict"):
        k(A=collections.OrderedDict(), x=np.ones(3))

    class Tensor:
        """Another library's class that happens to share ucf's name."""

    with pytest.raises(
        ucf.OperandError, match=r"unsupported type [\w.]*test_torch\.[\w.<>]*Tensor;"
    ):
        k(A=Tensor(), x=np.ones(3))


def test_without_torch_the_error_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    hint = r"pip install torch \(or pip install '\.\[torch\]' in a ucf checkout\)"
    with pytest.raises(ucf.MissingDependencyError, match=hint):
        ucf.from_torch(object())
    with pytest.raises(ucf.MissingDependencyError, match="Tensor.to_torch needs PyTorch"):
        ucf.from_numpy(np.eye(2)).to_torch()
    with pytest.raises(ImportError, match="ucf.torch.op"):
        ucf.torch.op("y(i) = A(i,j) * x(j)")


# ------------------------------------------------------------------ custom ops

SPMV = "y(i) = A(i,j) * x(j)"


def test_custom_op_runs_eagerly_on_sparse_and_dense_inputs():
    spmv = ucf.torch.op(SPMV, formats={"A": "csr"})
    A = random_dense((12, 10), seed=18)
    x = torch.rand(10, dtype=torch.float64, generator=torch.Generator().manual_seed(19))
    for operand in (A.to_sparse_csr(), A, A.to_sparse()):
        y = spmv(operand, x)
        torch.testing.assert_close(y, A @ x, rtol=1e-13, atol=0)
    torch.testing.assert_close(spmv(A=A.to_sparse_csr(), x=x), A @ x, rtol=1e-13, atol=0)
    assert ucf.torch.op(SPMV, formats={"A": "csr"}) is spmv


def test_custom_op_compiles_without_graph_breaks():
    """aot_eager traces through the fake implementation, as inductor does, without
    inductor's code generation (tens of seconds)."""
    spmm = ucf.torch.op("C(i,k) = A(i,j) * B(j,k)")

    def model(A, B, bias):
        return torch.relu(spmm(A, B) + bias)

    A = random_dense((6, 5), seed=20, dtype=torch.float32)
    B = torch.rand((5, 3), generator=torch.Generator().manual_seed(21))
    bias = torch.full((3,), -2.0)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    got = compiled(A, B, bias)
    assert got.dtype == torch.float32 and got.shape == (6, 3)
    torch.testing.assert_close(got, torch.relu(A @ B + bias))


@pytest.mark.slow
def test_custom_op_under_inductor():
    spmv = ucf.torch.op(SPMV)
    A = random_dense((7, 4), seed=22)
    x = torch.rand(4, dtype=torch.float64)
    compiled = torch.compile(lambda A, x: spmv(A, x) * 2, fullgraph=True)
    torch.testing.assert_close(compiled(A, x), (A @ x) * 2)


def test_custom_op_refuses_what_it_cannot_shape():
    with pytest.raises(ucf.UnsupportedError, match="sparse format 'C'"):
        ucf.torch.op(SPMV, formats={"y": "C"})
    with pytest.raises(ucf.UnsupportedError, match="output index i \\+ 1"):
        ucf.torch.op("y(i+1) = x(i)")
    with pytest.raises(ucf.OperandError, match="formats names B, which"):
        ucf.torch.op(SPMV, formats={"B": "csr"})
    with pytest.raises(ucf.UnsupportedError, match="'\\+='"):
        ucf.torch.op("y(i) += x(i)")
    ucf.torch.op(SPMV, name="ucf_test_spmv")
    with pytest.raises(ucf.OperandError, match="already registered as ucf::ucf_test_spmv"):
        ucf.torch.op("y(i) = A(i,j) * x(j) * 2", name="ucf_test_spmv")


def test_a_bsr_operand_is_read_in_place_by_a_blocked_kernel():
    rng = torch.Generator().manual_seed(21)
    dense = torch.rand(8, 12, dtype=torch.float64, generator=rng)
    dense[dense < 0.5] = 0
    A = dense.to_sparse_bsr((4, 3))
    x = torch.rand(12, dtype=torch.float64, generator=rng)
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "bcsr(4,3)"}, index_dtype="int64")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ucf.ConversionWarning)
        got = k(A=A, x=x).to_torch()
    assert torch.allclose(got, dense @ x)


def test_bfloat16_tensors_are_read_through_float32():
    """docs/interop.md: a torch.bfloat16 tensor is read through float32, which holds it
    exactly; from_torch, ucf.einsum and the torch op all take it (issue 32)."""
    rng = np.random.default_rng(32)
    a = rng.integers(-8, 8, (5, 6)) * (rng.random((5, 6)) < 0.5) / 4
    x = rng.integers(-8, 8, 6) / 8
    ta, tx = torch.tensor(a, dtype=torch.bfloat16), torch.tensor(x, dtype=torch.bfloat16)
    t = ucf.from_torch(ta)
    assert t.dtype == np.float32
    np.testing.assert_array_equal(t.to_numpy(), ta.float().numpy())
    for operand in (ta, ta.to_sparse_csr(), ta.to_sparse()):
        y = ucf.einsum("y(i) = A(i,j) * x(j)", A=operand, x=tx)  # torch in: torch out
        assert y.dtype == torch.float32
        np.testing.assert_allclose(y.numpy(), a @ x, rtol=1e-6)
    op = ucf.torch.op("y(i) = A(i,j) * x(j)")
    out = op(ta, tx)
    assert out.dtype == torch.float32
    np.testing.assert_allclose(out.numpy(), a @ x, rtol=1e-6)
    compiled = torch.compile(lambda m, v: op(m, v), fullgraph=True)
    np.testing.assert_allclose(compiled(ta, tx).numpy(), a @ x, rtol=1e-6)
