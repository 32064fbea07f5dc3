"""torch tensors whose arrays are views (strided, broadcast): ``ucf.from_torch`` copies
what its levels take as they stand and a kernel reads by address. A broadcast value
(the gradient torch.sparse.sum hands back) and indices sliced from a larger tensor
were refused as malformed (COO) or read out of place (BSR: a segfault)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import ucf
from tests.fuzz_common import Draw, RandomDraw

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(
    "what",
    ["broadcast values", "strided values", "transposed indices", "three modes, broadcast"],
)
def test_coalesced_coo_whose_arrays_are_views_is_copied(what):
    """A coalesced COO tensor whose values or indices are a view that is not contiguous
    (the gradient torch.sparse.sum hands back is one value broadcast, stride 0) is read
    by copying those, not refused as malformed."""
    idx = torch.tensor([[0, 1, 1], [1, 0, 2]])
    shape: tuple[int, ...] = (2, 3)
    vals = torch.arange(1.0, 4.0, dtype=torch.float64)
    if what == "broadcast values":
        vals = torch.tensor([2.5], dtype=torch.float64).expand(3)
    elif what == "strided values":
        vals = torch.arange(1.0, 7.0, dtype=torch.float64)[::2]
    elif what == "transposed indices":
        idx = idx.T.contiguous().T
    else:
        idx, shape = torch.tensor([[0, 1, 1], [1, 0, 0], [0, 2, 3]]), (2, 2, 4)
        vals = torch.tensor([-1.5], dtype=torch.float64).expand(3)
    t = torch.sparse_coo_tensor(idx, vals, shape, is_coalesced=True)
    u = ucf.from_torch(t)
    np.testing.assert_array_equal(u.to_numpy(), t.to_dense().numpy())
    u.validate()


@pytest.mark.parametrize("layout", ["csr", "csc", "bsr"])
def test_compressed_indices_that_are_views_are_copied(layout):
    """Compressed indices sliced from a larger tensor (strided views) are copied into
    the levels, which kernels read by address: a BSR tensor's were taken as they stood,
    unchecked, and a kernel with int64 indices read the memory between them
    (segfault)."""
    pos = torch.tensor([0, 9, 1, 9, 3, 9])[::2]  # [0, 1, 3]
    crd = torch.tensor([1, 9, 0, 9, 1, 9])[::2]  # [1, 0, 1]
    vals = torch.arange(1.0, 13.0, dtype=torch.float64)
    build = {
        "csr": lambda: torch.sparse_csr_tensor(pos, crd, vals[:3], (2, 2)),
        "csc": lambda: torch.sparse_csc_tensor(pos, crd, vals[:3], (2, 2)),
        "bsr": lambda: torch.sparse_bsr_tensor(pos, crd, vals.reshape(3, 2, 2), (4, 4)),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's note on unchecked invariants
        t = build[layout]()
    u = ucf.from_torch(t)
    assert all(a.flags.c_contiguous for level in u.levels for a in level.values())
    dense = t.to_dense().numpy()
    x = np.arange(1.0, dense.shape[1] + 1)
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": u.format}, index_dtype="int64")
    np.testing.assert_array_equal(k(A=u, x=x).to_numpy(), dense @ x)


def test_bsr_values_on_a_view_are_copied():
    """A BSR tensor's blocks taken every other element of a larger tensor: evenly
    strided, so they flatten to a strided view, which kernels read by address as if it
    were contiguous (SpMV read the zeros between the values: a wrong answer; found
    through the gradient of a row-major D, now written column-major)."""
    dense = torch.arange(1.0, 25.0, dtype=torch.float64).reshape(4, 6)
    dense[0:2, 0:3] = 0
    t = dense.to_sparse_bsr((2, 3))
    blocks = torch.stack([t.values(), torch.zeros_like(t.values())], dim=-1)[..., 0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's note on unchecked invariants
        v = torch.sparse_bsr_tensor(t.crow_indices(), t.col_indices(), blocks, t.shape)
    u = ucf.from_torch(v)
    assert u.vals.flags.c_contiguous
    x = np.arange(1.0, 7.0)
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": u.format}, index_dtype="int64")
    np.testing.assert_array_equal(k(A=u, x=x).to_numpy(), dense.numpy() @ x)


def _viewed(t, which: str):
    """``t`` (CSR, CSC, COO or BSR) rebuilt on strided views of its index arrays
    (``which``: 'pos', 'crd', 'vals' or 'all'), each every other element of a tensor
    twice its size."""

    def spread(a, part):
        return (
            torch.stack([a, torch.zeros_like(a)], dim=-1)[..., 0] if which in (part, "all") else a
        )

    if t.layout == torch.sparse_coo:
        idx, vals = spread(t.indices(), "crd"), spread(t.values(), "vals")
        return torch.sparse_coo_tensor(idx, vals, t.shape, is_coalesced=True)
    if t.layout == torch.sparse_csc:
        pos, crd, build = t.ccol_indices(), t.row_indices(), torch.sparse_csc_tensor
    else:
        pos, crd = t.crow_indices(), t.col_indices()
        build = torch.sparse_bsr_tensor if t.layout == torch.sparse_bsr else torch.sparse_csr_tensor
    return build(spread(pos, "pos"), spread(crd, "crd"), spread(t.values(), "vals"), t.shape)


def draw_viewed(d: Draw) -> dict:
    """A torch sparse matrix on views of its arrays, read by a kernel in place."""
    return {
        "layout": d.choice(["bsr", "csr", "csc", "coo"]),
        "which": d.choice(["all", "pos", "crd", "vals"]),
        "index_dtype": d.choice(["int64", "int32"]),
        "blocks": (d.integer(1, 4), d.integer(1, 5)),
        "density": d.choice([0.5, 0.0, 1.0]),
        "seed": d.integer(0, 2**16),
    }


#: The seeded draws (each reruns as it failed).
VIEWED = [draw_viewed(RandomDraw(f"viewed:{n}")) for n in range(24)]


def test_the_viewed_draw_reaches_bsr_read_in_place():
    """A BSR matrix on views of its indices, read by an int64 kernel in place, is drawn
    more than once."""
    reach = [c for c in VIEWED if c["layout"] == "bsr" and c["which"] in ("all", "pos", "crd")]
    assert sum(c["index_dtype"] == "int64" for c in reach) >= 2
    assert {c["layout"] for c in VIEWED} == {"bsr", "csr", "csc", "coo"}


@pytest.mark.parametrize("case", VIEWED, ids=lambda c: f"{c['layout']}-{c['which']}")
def test_views_of_every_layout_read_in_place(case):
    """A kernel in the tensor's own format and index dtype reads it where it can: its
    arrays must be C-contiguous, views copied (a BSR's indices were not: segfault)."""
    rows, cols = case["blocks"]
    g = torch.Generator().manual_seed(case["seed"])
    dense = torch.rand(2 * rows, 3 * cols, dtype=torch.float64, generator=g)
    dense[dense > case["density"]] = 0
    if case["layout"] == "bsr":
        t = dense.to_sparse_bsr((2, 3))
    else:
        make = {"csr": dense.to_sparse_csr, "csc": dense.to_sparse_csc, "coo": dense.to_sparse}
        t = make[case["layout"]]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's note on unchecked invariants
        v = _viewed(t, case["which"])
    u = ucf.from_torch(v, index_dtype=case["index_dtype"])
    assert all(a.flags.c_contiguous for level in u.levels for a in level.values())
    assert u.vals.flags.c_contiguous
    x = np.arange(1.0, dense.shape[1] + 1)
    k = ucf.compile(
        "y(i) = A(i,j) * x(j)", formats={"A": u.format}, index_dtype=case["index_dtype"]
    )
    np.testing.assert_allclose(k(A=u, x=x).to_numpy(), dense.numpy() @ x, rtol=1e-13)
