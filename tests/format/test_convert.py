"""``Tensor.convert`` between formats, against numpy's dense arrays and scipy's layouts.

Every result is checked by the validating constructor (``validate``), read back
densely against the source's array, and for the layouts scipy has (CSR, CSC, COO,
BSR) compared array by array with scipy's canonical conversion of the same matrix.
Stored zeros (stored fill values) must be gone from sparse targets.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import ucf
from ucf.errors import FormatError
from ucf.format.tensor import Tensor

MATRIX_FORMATS = [
    "dense",
    "csr",
    "csc",
    "coo",
    "dcsr",
    "dcsc",
    "csf",
    "UQ",
    "CC:1,0",
    "bcsr(2,2)",
    "bcsr(2,3)",
    "bcsc(3,2)",
    "bcsc(1,4)",
    "bdcsr(2,2)",
]
#: Targets that store no position a coordinate does not name (no blocks, no dense
#: levels below a sparse one): a stored zero there was dropped or not.
TIGHT = {"csr", "csc", "coo", "dcsr", "dcsc", "csf", "CC:1,0"}
CUBE_FORMATS = ["dense", "csf", "coo", "CCC:2,0,1", "UCC:1,2,0", "CSS", "UUC:2,1,0", "CUC"]


def matrix(rng: np.random.Generator, shape: tuple[int, ...], density: float) -> np.ndarray:
    """Random values on a random pattern; some rows and columns left empty."""
    a = np.round(rng.standard_normal(shape), 2) * (rng.random(shape) < density)
    if a.ndim and a.shape[0] > 2:
        a[rng.integers(0, a.shape[0])] = 0
    return a


def with_stored_zeros(a: np.ndarray, fmt: str, idt, rng: np.random.Generator) -> Tensor:
    """``a`` in ``fmt`` with some zeros stored explicitly (from_coo keeps them)."""
    coords = np.argwhere(a != 0)
    extra = np.argwhere(a == 0)
    if len(extra):
        extra = extra[rng.random(len(extra)) < 0.2]
    coords = np.concatenate([coords, extra]).astype(np.int64)
    vals = a[tuple(coords.T)] if len(coords) else np.zeros(0)
    return ucf.from_coo(coords, vals, a.shape, fmt, index_dtype=idt)


def check(u: Tensor, a: np.ndarray, target: str, idt, source: Tensor) -> None:
    Tensor(u.shape, u.format, u.levels, u.vals, u.index_dtype, check=True, scales=u.scales)
    assert u.format == ucf.parse_format(target, order=a.ndim)
    assert u.index_dtype == np.dtype(idt)
    np.testing.assert_array_equal(u.to_numpy(), a)
    changed = u.format.structure != source.format.structure  # else stored zeros stay
    if changed and (target in TIGHT or target in CUBE_FORMATS[1:]):
        assert not (u.vals == u.format.fill).any(), "a stored fill value survived"


def scipy_layout(a: np.ndarray, target: str):
    """scipy's canonical arrays for ``target``, or None where scipy has no such layout."""
    m = sp.csr_array(a)
    if target == "csr":
        return [m.indptr, m.indices], m.data
    if target == "csc":
        c = m.tocsc()
        return [c.indptr, c.indices], c.data
    if target == "coo":
        c = m.tocoo()
        return [c.coords[0], c.coords[1]], c.data
    if target.startswith("bcsr"):
        block = tuple(int(x) for x in target[5:-1].split(","))
        if any(n % b for n, b in zip(a.shape, block, strict=True)):
            return None
        b = m.tobsr(block)
        b.sort_indices()
        return [b.indptr, b.indices], b.data.reshape(-1)
    return None


@settings(max_examples=300)
@given(
    st.integers(0, 2**32 - 1),
    st.tuples(st.integers(0, 9), st.integers(0, 9)),
    st.sampled_from([0.0, 0.3, 0.8]),
    st.sampled_from(MATRIX_FORMATS),
    st.sampled_from(MATRIX_FORMATS),
    st.sampled_from([np.int32, np.int64]),
    st.sampled_from([np.int32, np.int64]),
)
def test_matrices_convert_between_every_pair(seed, shape, density, src, dst, sidt, didt):
    rng = np.random.default_rng(seed)
    a = matrix(rng, shape, density)
    t = with_stored_zeros(a, src, sidt, rng)
    before = [x.copy() for x in t.arrays]
    u = t.convert(dst, index_dtype=didt)
    check(u, a, dst, didt, t)
    assert all(np.array_equal(x, y) for x, y in zip(t.arrays, before, strict=True)), (
        "converting wrote into the source"
    )
    want = scipy_layout(a, dst)
    if want is not None and u.format.structure != t.format.structure:
        arrays, data = want
        lv = u.levels
        got = [lv[0]["crd"], lv[1]["crd"]] if dst == "coo" else [lv[1]["pos"], lv[1]["crd"]]
        np.testing.assert_array_equal(u.vals, data)
        for g, w in zip(got, arrays, strict=True):
            np.testing.assert_array_equal(g, w)


@settings(max_examples=150)
@given(
    st.integers(0, 2**32 - 1),
    st.tuples(st.integers(0, 5), st.integers(0, 5), st.integers(0, 5)),
    st.sampled_from(CUBE_FORMATS),
    st.sampled_from(CUBE_FORMATS),
    st.sampled_from([np.int32, np.int64]),
)
def test_order_three_tensors_convert_between_mode_orders(seed, shape, src, dst, idt):
    rng = np.random.default_rng(seed)
    a = matrix(rng, shape, 0.3)
    t = with_stored_zeros(a, src, idt, rng)
    check(t.convert(dst), a, dst, idt, t)


@pytest.mark.parametrize("src", ["csr fill=-inf", "coo fill=-inf", "CC:1,0 fill=-inf"])
@pytest.mark.parametrize("dst", ["csc fill=-inf", "dcsr fill=-inf", "coo fill=-inf", "csr"])
def test_fill_values_survive_a_conversion(src, dst):
    rng = np.random.default_rng(3)
    a = np.where(rng.random((6, 7)) < 0.4, np.round(rng.standard_normal((6, 7)), 2), -np.inf)
    a[2] = -np.inf
    t = ucf.from_numpy(a, src)
    u = t.convert(dst)
    check(u, a, dst, np.int32, t)
    assert u.format.fill == (0.0 if dst == "csr" else -np.inf)


def test_large_conversions_agree_with_scipy():
    """A matrix big enough for the counting sorts' several passes and int32 keys."""
    rng = np.random.default_rng(7)
    m = sp.random_array((3000, 2000), density=0.004, rng=rng, format="csr")
    t = ucf.from_scipy(m)
    for dst in ("csc", "coo", "dcsc", "bcsc(4,4)", "bcsr(3,5)", "csf", "CC:1,0"):
        u = t.convert(dst)
        Tensor(u.shape, u.format, u.levels, u.vals, check=True)
        back = u.convert("csr").to_scipy()
        assert back.nnz == m.nnz and (back != m).nnz == 0, dst
    got = t.convert("csc")
    want = m.tocsc()
    np.testing.assert_array_equal(got.levels[1]["pos"], want.indptr)
    np.testing.assert_array_equal(got.levels[1]["crd"], want.indices)
    np.testing.assert_array_equal(got.vals, want.data)


def test_an_index_dtype_too_narrow_is_refused():
    """And a hypersparse matrix converts without arrays as long as its dimensions."""
    coords = [[0, 0], [1, 2**31 + 3]]
    t = ucf.from_coo(coords, [1.0, 2.0], (2, 2**31 + 5), "csr", index_dtype=np.int64)
    for dst in ("coo", "dcsr", "dcsc", "csf", "CC:1,0"):
        with pytest.raises(FormatError, match="does not fit index dtype int32"):
            t.convert(dst, index_dtype=np.int32)
        u = t.convert(dst)
        assert u.index_dtype == np.int64
        assert max(len(a) for a in u.arrays) <= 3
        np.testing.assert_array_equal(u.to_coo()[0], coords)


@pytest.mark.parametrize("dst", ["csc@bfloat16", "coo@bfloat16", "bcsc(2,2)@bfloat16", "csr"])
def test_held_values_convert_through_their_numbers(dst):
    rng = np.random.default_rng(11)
    a = matrix(rng, (6, 5), 0.4).astype(np.float32)
    t = ucf.from_numpy(a, "csr@bfloat16")
    u = t.convert(dst)
    Tensor(u.shape, u.format, u.levels, u.vals, check=True)
    np.testing.assert_array_equal(u.to_numpy(), t.to_numpy())


@pytest.mark.parametrize("src", ["bcsr(1,2)@float16", "csr@float16"])
@pytest.mark.parametrize("dst", ["csr", "csc", "coo", "dcsr", "bcsr(1,2)", "bcsc(2,2)"])
def test_values_scipy_cannot_hold_convert_the_general_way(src, dst):
    """float16 values (a TeSA plan's 16-bit parts): scipy's sparse arrays refuse them, so
    those conversions take the general path (the schedule fuzzer, seed 57 case 1895:
    an InternalError from scipy where a diagonal read converted a float16 part)."""
    rng = np.random.default_rng(57)
    a = matrix(rng, (6, 6), 0.4).astype(np.float16)
    t = ucf.from_numpy(a, src)
    u = t.convert(f"{dst}@float16")
    assert u.vals.dtype == np.float16
    Tensor(u.shape, u.format, u.levels, u.vals, check=True)
    np.testing.assert_array_equal(u.to_numpy(), a)


def test_dtype_and_empty_tensors():
    a = np.zeros((0, 4))
    for dst in ("csc", "coo", "dcsr", "bcsc(2,2)", "csf"):
        u = ucf.from_numpy(a, "csr").convert(dst, dtype=np.float32)
        assert u.vals.dtype == np.float32 and u.shape == (0, 4)
        Tensor(u.shape, u.format, u.levels, u.vals, check=True)
    b = np.arange(12.0).reshape(3, 4)
    u = ucf.from_numpy(b, "csr").convert("bcsc(2,3)", dtype=np.int64)
    assert u.vals.dtype == np.int64
    np.testing.assert_array_equal(u.to_numpy(), b.astype(np.int64))


def test_several_counting_passes_match_packing_from_coordinates():
    """Order 3 with more entries than one counting sort's key range takes: each
    conversion's arrays equal those packed from the coordinates (a general sort)."""
    rng = np.random.default_rng(5)
    shape = (300, 200, 250)
    coords = np.unique(np.stack([rng.integers(0, d, 40_000) for d in shape], axis=1), axis=0)
    vals = rng.standard_normal(len(coords))
    t = ucf.from_coo(coords, vals, shape, "csf")
    for dst in ("CCC:2,0,1", "CCC:1,2,0", "UCC:2,1,0", "CSS", "CUC:1,0,2"):
        got = t.convert(dst)
        want = ucf.from_coo(coords, vals, shape, dst)
        Tensor(got.shape, got.format, got.levels, got.vals, check=True)
        for g, w in zip(got.levels, want.levels, strict=True):
            assert g.keys() == w.keys() and all(np.array_equal(g[k], w[k]) for k in g), dst
        np.testing.assert_array_equal(got.vals, want.vals)


@pytest.mark.parametrize("dst", ["ell(3)", "nm(2,4)", "csr", "csc", "dcsc", "bcsc(2,4)"])
@pytest.mark.parametrize("src", ["ell(3)", "nm(2,4)", "csc", "coo"])
def test_fixed_width_formats_convert_both_ways(src, dst):
    """Their padding is stored zeros: dropped when leaving the format, re-made when
    entering it."""
    a = np.zeros((5, 8))
    a[0, [1, 2]] = [1.5, -2.0]
    a[2, [0, 5, 7]] = [3.0, 4.0, 0.5]
    a[4, 6] = 7.0
    t = ucf.from_numpy(a, src)
    u = t.convert(dst)
    Tensor(u.shape, u.format, u.levels, u.vals, check=True)
    np.testing.assert_array_equal(u.to_numpy(), a)
    if dst in ("csr", "csc", "dcsc"):
        assert u.nnz == np.count_nonzero(a)


@settings(max_examples=40)
@given(
    rows=st.integers(0, 9),
    cols=st.integers(0, 9),
    entries=st.integers(0, 40),
    kind=st.sampled_from(["coo", "csr", "csc", "dok", "lil"]),
    target=st.sampled_from(MATRIX_FORMATS),
    seed=st.integers(0, 2**16),
)
def test_from_scipy_into_any_format_keeps_stored_zeros_and_sums_repeats(
    rows, cols, entries, kind, target, seed
):
    """``ucf.from_scipy(m, format=...)`` of every scipy layout into every matrix format:
    scipy's own dense array, repeated entries summed, stored zeros kept where the target
    stores only named coordinates (scipy's ``sum_duplicates`` count: the layouts scipy
    builds in linear time must keep what packing coordinates kept)."""
    rng = np.random.default_rng(seed)
    n = entries if rows and cols else 0
    r, c = rng.integers(0, max(rows, 1), n), rng.integers(0, max(cols, 1), n)
    v = rng.integers(-2, 3, n).astype(np.float64)  # zeros, and repeats that cancel
    m = sp.coo_array((v, (r, c)), shape=(rows, cols))
    if kind == "csr":  # unsorted rows with repeats, as scipy's products leave them
        m = sp.csr_array((v, c, np.searchsorted(np.sort(r), np.arange(rows + 1))), (rows, cols))
        r = np.sort(r)
    elif kind != "coo":
        m = m.asformat(kind)
    t = ucf.from_scipy(m, format=target)
    t.validate()
    np.testing.assert_array_equal(t.to_numpy(), m.toarray())
    if target in TIGHT and kind in ("coo", "csr"):
        summed = sp.coo_array((v, (r, c)), shape=(rows, cols)).tocsr()
        summed.sum_duplicates()
        assert t.nnz == summed.nnz


@pytest.mark.parametrize("target", ["coo", "dcsr", "csc", "bcsr(2,2)"])
def test_from_scipy_into_another_format_shares_no_array(target):
    """Another format than the input's own is built on fresh arrays (docs/interop.md),
    even where scipy's layout would let the column indices and values through."""
    m = sp.random_array((30, 20), density=0.2, format="csr", random_state=4)
    t = ucf.from_scipy(m, format=target)
    for a in [*t.arrays]:
        assert not any(np.may_share_memory(a, b) for b in (m.indptr, m.indices, m.data))


@pytest.mark.parametrize("target", [None, "csr", "coo", "dense"])
def test_from_scipy_of_coo_keeps_the_default_index_dtype(target):
    """A COO built from numpy's int64 coordinates packs with int32 indices unless asked,
    whatever the target (through scipy's CSR too), so a kernel call on it binds without
    converting the indices every call (the review of h48/lead's from_scipy change)."""
    import warnings

    rng = np.random.default_rng(5)
    r, c = rng.integers(0, 50, 200), rng.integers(0, 40, 200)
    m = sp.coo_array((rng.random(200), (r.astype(np.int64), c.astype(np.int64))), (50, 40))
    t = ucf.from_scipy(m, format=target)
    assert t.index_dtype == np.int32
    assert ucf.from_scipy(m, format=target, index_dtype=np.int64).index_dtype == np.int64
    k = ucf.compile("y(i) = A(i,j)*x(j)", formats={"A": "csr"})
    x = rng.random(40)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ucf.ConversionWarning)
        np.testing.assert_allclose(k(A=m, x=x), m @ x, rtol=1e-12)


@pytest.mark.parametrize("idt", [np.int32, np.int64])
@pytest.mark.parametrize("src, dst", [("csr", "csc"), ("csc", "csr")])
def test_the_direct_transposing_pass_agrees_with_scipy(src, dst, idt):
    """CSR to CSC and back run scipy's pass on the tensor's own arrays (``flipped``):
    the arrays of scipy's canonical conversion, in the index dtype asked for; stored
    zeros, which that pass would keep, go the wrappers' way and are dropped."""
    from ucf.format.convert import flipped

    m = sp.random(37, 23, density=0.2, format=src, random_state=5)
    m.sort_indices()
    t = ucf.from_scipy(m, index_dtype=np.int64 if idt is np.int32 else np.int32)
    u = t.convert(dst, index_dtype=idt)
    want = m.tocsc() if dst == "csc" else m.tocsr()
    assert flipped(t, u.format, np.dtype(idt)) is not None
    np.testing.assert_array_equal(u.levels[1]["pos"], want.indptr)
    np.testing.assert_array_equal(u.levels[1]["crd"], want.indices)
    np.testing.assert_array_equal(u.vals, want.data)
    assert u.index_dtype == idt and u.levels[1]["crd"].dtype == idt
    m.data[::3] = 0.0
    t = ucf.from_scipy(m)
    assert flipped(t, u.format, np.dtype(idt)) is None
    u = t.convert(dst, index_dtype=idt)
    u.validate()
    assert u.vals.all() and u.nnz == m.count_nonzero()
    np.testing.assert_array_equal(u.to_numpy(), m.toarray())
