"""The gradient of a sparse output is sparse, on the output's positions.

A sampled product (SDDMM, ``A(i,j) = B(i,j) * C(i,k) * D(k,j)``) with its output
in CSR or COO has a gradient that lives where ``A`` stores entries; its kernels
read it in ``A``'s format, so ``grad_C`` is an SpMM over it and never an array of
``A``'s full shape. Checked against torch autograd on dense tensors (the pattern
as zeros of ``B``), through ``ucf.gradients`` and through ``ucf.torch.einsum``
(whose sparse result gets its gradient back from torch sparse or strided), and
against scipy at 100k rows, where a dense gradient would not fit.
"""

from __future__ import annotations

import tracemalloc
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import ucf
from tests.fuzz_common import Draw, RandomDraw

torch = pytest.importorskip("torch")
import ucf.torch  # noqa: E402  (after the skip)

SDDMM = "A(i,j) = B(i,j) * C(i,k) * D(k,j)"
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch's sparse-beta notes


def operands(n=9, m=7, K=3, seed=0):
    rng = np.random.default_rng(seed)
    B = rng.standard_normal((n, m))
    B[rng.random((n, m)) < 0.6] = 0
    B[2] = 0  # an empty row
    return B, rng.standard_normal((n, K)), rng.standard_normal((K, m)), rng.standard_normal((n, m))


def torch_reference(B, C, D, G):
    """Gradients of sum(G * A) by torch autograd on dense tensors; B's masked to its
    pattern (the gradient of a sparse operand lives on its stored entries)."""
    Bt, Ct, Dt = (torch.tensor(x, requires_grad=True) for x in (B, C, D))
    A = Bt * (Ct @ Dt)
    gB, gC, gD = torch.autograd.grad((A * torch.tensor(G)).sum(), (Bt, Ct, Dt))
    return gB.numpy() * (B != 0), gC.numpy(), gD.numpy()


SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "out, target",
    [("csr", "llvm"), ("coo", "llvm"), ("dense", "llvm"), ("csr", "c")]
    + [pytest.param(o, "c", marks=SLOW) for o in ("coo", "dense")],
)
def test_sddmm_gradients_against_torch(out, target):
    B, C, D, G = operands()
    Bs = ucf.from_numpy(B, format="csr")
    k = ucf.compile(SDDMM, {"A": out, "B": "csr"}, target=target)
    A = k(B=Bs, C=C, D=D)
    back = ucf.gradients(k)
    if out == "dense":
        grad = G
    else:  # the output's gradient on the forward result's index arrays
        cols, count = A.columns()
        at = tuple(A.format.mode_coords(cols, count).T)
        grad = ucf.Tensor(A.shape, A.format, A.levels, G[at])
        assert back.output_format.structure == A.format.structure
        assert f"grad_A: {back.output_format}" in back.text()
        # Off the output's positions the gradient reaches nothing: zero them in the reference.
        G = np.where(B != 0, G, 0)
    want = torch_reference(B, C, D, G)
    ops = {"B": Bs, "C": C, "D": D}
    with warnings.catch_warnings():
        warnings.simplefilter("error", ucf.ConversionWarning)  # read in place, no conversion
        got = [back(w, grad, ops) for w in "BCD"]
    assert got[0].levels is Bs.levels
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.to_numpy(), w, rtol=1e-10, atol=1e-12)


def test_a_sparse_outputs_gradient_in_any_form():
    """Dense numpy, scipy and another format are converted into the output's format;
    entries where the output stores nothing change nothing."""
    B, C, D, G = operands(seed=1)
    k = ucf.compile(SDDMM, {"A": "csr", "B": "csr"})
    back = ucf.gradients(k)
    ops = {"B": sp.csr_matrix(B), "C": C, "D": D}
    want = torch_reference(B, C, D, np.where(B != 0, G, 0))[1]
    for grad in (G, sp.coo_matrix(G), ucf.from_numpy(G, format="coo")):
        np.testing.assert_allclose(np.asarray(back("C", grad, ops)), want, rtol=1e-10)


@pytest.mark.parametrize("given_as", ["scipy", "unsorted", "repeats", "numpy", "torch"])
def test_a_sparse_operands_gradient_as_the_forward_call_took_it(given_as):
    """B's gradient where B came as scipy (sorted or not, repeats summed), numpy or torch
    (it raised AttributeError: no levels): on the entries the forward call read."""
    B, C, D, G = operands(seed=7)
    rows = np.repeat(np.arange(B.shape[0]), B.shape[1])
    cols = np.tile(np.arange(B.shape[1]), B.shape[0])
    keep = B.ravel() != 0
    given = {
        "scipy": lambda: sp.csr_matrix(B),
        "unsorted": lambda: sp.coo_matrix(
            (B.ravel()[keep][::-1], (rows[keep][::-1], cols[keep][::-1])), B.shape
        ).tocsr(copy=False),
        "repeats": lambda: sp.coo_matrix(
            (np.tile(B.ravel()[keep] / 2, 2), (np.tile(rows[keep], 2), np.tile(cols[keep], 2))),
            B.shape,
        ).tocsr(),
        "numpy": lambda: B,
        "torch": lambda: torch.tensor(B),
    }[given_as]()
    if given_as == "unsorted":
        given.has_sorted_indices = False
    back = ucf.gradients(ucf.compile(SDDMM, {"A": "csr", "B": "csr"}))
    got = back("B", G, {"B": given, "C": C, "D": D})
    want = torch_reference(B, C, D, np.where(B != 0, G, 0))[0]
    np.testing.assert_allclose(got.to_numpy(), want, rtol=1e-10, atol=1e-12)


def test_a_wrong_gradient_is_refused_by_name():
    B, C, D, G = operands()
    k = ucf.compile(SDDMM, {"A": "csr", "B": "csr"})
    back = ucf.gradients(k)
    ops = {"B": sp.csr_matrix(B), "C": C, "D": D}
    with pytest.raises(ucf.ShapeError, match=r"gradient of output A\(i, j\).*\(10, 7\).*\(9, 7\)"):
        back("C", np.ones((10, 7)), ops)
    with pytest.raises(ucf.ShapeError, match="scipy.*coo_matrix of shape \\(7, 9\\)"):
        back("C", sp.coo_matrix(G.T), ops)
    with pytest.raises(ucf.ShapeError, match="of shape \\(9,\\)"):
        back("D", np.ones(9), ops)
    with pytest.raises(ucf.OperandError, match="gradient of output A.* is a object"):
        back("C", object(), ops)
    dense = ucf.gradients(ucf.compile(SDDMM, {"B": "csr"}))
    with pytest.raises(ucf.ShapeError, match="gradient of output A"):
        dense("C", np.ones((9, 8)), ops)
    # a forward operand left out (it was an InternalError: KeyError)
    with pytest.raises(ucf.OperandError, match=r"gradient of D .* without C \(operands of"):
        back("D", G, {"B": ops["B"], "D": D})


@pytest.mark.parametrize(
    "text, formats",
    [
        ("A(i,j) = B(i,j) * C(i,j)", {"A": "csr", "B": "csr"}),
        ("A(i,j) = B(i,j) * C(i,j) - B(i,j)", {"A": "coo", "B": "coo"}),
        ("A(i,j) = B(i,j) * C(i,k) * D(k,j)", {"A": "csc", "B": "csc"}),
        ("A(i,j) = tanh(B(i,j)) * C(i,k) * D(k,j)", {"A": "csr", "B": "csr"}),
        ("y(i) = B(i,j) * x(j)", {"y": "C", "B": "dcsr"}),
    ],
)
def test_sparse_outputs_of_other_statements(text, formats):
    """Every operand's gradient against torch's, given the output's gradient at its
    stored positions (the reference's is zero elsewhere)."""
    from tests.autodiff.test_derive import torch_eval
    from ucf.lang.ast import accesses
    from ucf.lang.parser import parse_statement

    stmt = parse_statement(text)
    dims = {"i": 8, "j": 7, "k": 3}
    rng = np.random.default_rng(7)
    operands, masked = {}, {}
    for a in accesses(stmt.rhs):
        shape = tuple(dims[str(i)] for i in a.indices)
        x = rng.standard_normal(shape)
        if a.tensor in formats:
            x[rng.random(shape) < 0.5] = 0
        operands[a.tensor] = ucf.from_numpy(x, format=formats.get(a.tensor, "dense"))
        masked[a.tensor] = torch.tensor(x, requires_grad=True)
    k = ucf.compile(text, formats)
    out = k(**operands)
    g = rng.standard_normal(len(out.vals))
    grad = ucf.Tensor(out.shape, out.format, out.levels, g)
    want = torch_eval(stmt, masked, dims)
    want.backward(torch.tensor(grad.to_numpy()))
    back = ucf.gradients(k)
    for n, t in operands.items():
        got = back(n, grad, operands)
        ref = masked[n].grad.numpy() * (t.to_numpy() != 0 if n in formats else 1)
        np.testing.assert_allclose(got.to_numpy(), ref, rtol=1e-10, atol=1e-12, err_msg=n)


_KERNELS: dict = {}


@settings(max_examples=12)
@given(
    n=st.integers(1, 12),
    m=st.integers(1, 12),
    K=st.integers(1, 5),
    density=st.floats(0, 1),
    out=st.sampled_from(["csr", "coo"]),
    seed=st.integers(0, 2**16),
    given_as=st.sampled_from(["scipy", "ucf", "scipy coo", "numpy"]),
)
def test_sddmm_gradients_fuzzed_against_numpy(n, m, K, density, out, seed, given_as):
    """Shapes, densities (empty and full rows included), output formats and how B is
    given (as the forward call takes it) at random; each gradient against numpy's,
    given the output's gradient on its positions."""
    rng = np.random.default_rng(seed)
    B = rng.standard_normal((n, m)) * (rng.random((n, m)) < density)
    C, D = rng.standard_normal((n, K)), rng.standard_normal((K, m))
    if out not in _KERNELS:  # one kernel and its gradients' per format, for every example
        k = ucf.compile(SDDMM, {"A": out, "B": "csr"})
        _KERNELS[out] = k, ucf.gradients(k)
    k, back = _KERNELS[out]
    Bs = {
        "ucf": lambda: ucf.from_numpy(B, format="csr"),
        "scipy": lambda: sp.csr_matrix(B),
        "scipy coo": lambda: sp.coo_matrix(B),
        "numpy": lambda: B,
    }[given_as]()
    A = k(B=Bs, C=C, D=D)
    g = rng.standard_normal(len(A.vals))
    grad = ucf.Tensor(A.shape, A.format, A.levels, g)
    G = grad.to_numpy()
    ops = {"B": Bs, "C": C, "D": D}
    np.testing.assert_allclose(back("B", grad, ops).to_numpy(), G * (C @ D) * (B != 0), atol=1e-12)
    np.testing.assert_allclose(np.asarray(back("C", grad, ops)), (G * B) @ D.T, atol=1e-12)
    np.testing.assert_allclose(np.asarray(back("D", grad, ops)), ((G * B).T @ C).T, atol=1e-12)


# ------------------------------------------------------------------------ torch


def _losses(V, W):
    """Losses whose gradient torch hands back sparse CSR (torch.sparse.mm, to_dense)
    or strided (the matmul operator), each with its dense equivalent."""
    return {
        "sparse.mm": (lambda A: (torch.sparse.mm(A, V) ** 2).sum(), lambda A: ((A @ V) ** 2).sum()),
        "to_dense": (lambda A: (A.to_dense() * W).sum(), lambda A: (A * W).sum()),
        "matmul": (lambda A: (A @ V).sum(), lambda A: (A @ V).sum()),
    }


@pytest.mark.parametrize(
    "out, target",
    [("csr", "llvm"), ("coo", "llvm"), (None, "llvm"), ("csr", "c")]
    + [pytest.param(o, "c", marks=SLOW) for o in ("coo", None)],
)
def test_torch_einsum_with_a_sparse_output(out, target):
    B, C, D, _ = operands(seed=2)
    V = torch.randn(7, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    W = torch.randn(9, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    for name, (loss, dense_loss) in _losses(V, W).items():
        if out == "coo" and name == "sparse.mm":
            continue  # torch's COO mm takes another path; covered by the other two
        Bs = torch.tensor(B).to_sparse_csr().requires_grad_()
        Ct, Dt = torch.tensor(C, requires_grad=True), torch.tensor(D, requires_grad=True)
        formats = {"A": out} if out else None
        A = ucf.torch.einsum(SDDMM, formats=formats, target=target, B=Bs, C=Ct, D=Dt)
        want_layout = {"csr": torch.sparse_csr, "coo": torch.sparse_coo, None: torch.strided}
        assert A.layout == want_layout[out]
        if out is None and name == "sparse.mm":
            continue
        got = torch.autograd.grad(loss(A), (Bs, Ct, Dt))
        Bd, Cd, Dd = (torch.tensor(x, requires_grad=True) for x in (B, C, D))
        want = torch.autograd.grad(dense_loss(Bd * (Cd @ Dd)), (Bd, Cd, Dd))
        assert got[0].layout == torch.sparse_csr
        assert torch.equal(got[0].col_indices(), Bs.col_indices())
        torch.testing.assert_close(got[0].to_dense(), want[0] * torch.tensor(B != 0), msg=name)
        torch.testing.assert_close(got[1], want[1], msg=name)
        torch.testing.assert_close(got[2], want[2], msg=name)


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_torch_sparse_sum_of_a_coo_output(target):
    """torch.sparse.sum's gradient is a coalesced COO tensor on the output's positions
    whose values are one value broadcast (stride 0): read, not refused as malformed.
    B is torch's CSR, so the output's indices are int64, as the gradient's are, and the
    gradient's arrays would be taken as they stand."""
    B, C, D, _ = operands(seed=6)
    Ct, Dt = torch.tensor(C, requires_grad=True), torch.tensor(D, requires_grad=True)
    Bs = torch.tensor(B).to_sparse_csr()
    A = ucf.torch.einsum(SDDMM, {"A": "coo"}, target=target, B=Bs, C=Ct, D=Dt)
    got = torch.autograd.grad(torch.sparse.sum(A), (Ct, Dt))
    want = torch_reference(B, C, D, (B != 0).astype(float))[1:]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-10, atol=1e-12)


def test_torch_gradient_outside_the_outputs_positions_is_dropped():
    """A sparse gradient that stores more positions than the output (every one here)
    gives what its entries at the output's positions give."""
    B, C, D, G = operands(seed=5)
    Bs = torch.tensor(B).to_sparse_csr()
    Ct = torch.tensor(C, requires_grad=True)
    A = ucf.torch.einsum(SDDMM, formats={"A": "csr"}, B=Bs, C=Ct, D=torch.tensor(D))
    (got,) = torch.autograd.grad(A, Ct, grad_outputs=torch.tensor(G).to_sparse_csr())
    want = torch_reference(B, C, D, np.where(B != 0, G, 0))[1]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10)


#: Losses over ucf.torch.einsum's sparse output A, each with its dense twin, and the
#: torch layouts of A it applies to (what torch supports). torch hands their gradient
#: back strided, as CSR, or as a coalesced COO: torch.sparse.sum's is one value
#: broadcast (stride 0), on int64 indices where B was a torch sparse tensor.
TORCH_LOSSES = {
    "sparse.sum": ("coo", lambda A, V, W: torch.sparse.sum(A)),
    "sparse.sum(dim)": ("coo", lambda A, V, W: (torch.sparse.sum(A, dim=1).to_dense() ** 2).sum()),
    "A * A": ("coo", lambda A, V, W: torch.sparse.sum(A * A)),
    "sparse.mm": ("csr coo", lambda A, V, W: (torch.sparse.mm(A, V) ** 2).sum()),
    "to_dense": ("csr coo csc", lambda A, V, W: (A.to_dense() * W).sum()),
    "matmul": ("csr coo csc", lambda A, V, W: ((A @ V) ** 2).sum()),
}
DENSE_LOSSES = {
    "to_dense": lambda A, V, W: (A * W).sum(),
    "matmul": lambda A, V, W: ((A @ V) ** 2).sum(),
    "sparse.mm": lambda A, V, W: ((A @ V) ** 2).sum(),
    "sparse.sum": lambda A, V, W: A.sum(),
    "sparse.sum(dim)": lambda A, V, W: (A.sum(dim=1) ** 2).sum(),
    "A * A": lambda A, V, W: (A * A).sum(),
}


def draw_torch_case(d: Draw) -> dict:
    """A random SDDMM through ucf.torch.einsum: a loss, an output format torch supports
    it on, how B comes (strided with a format, torch CSR, COO or BSR: int32 or int64
    indices; a sparse one now and then on strided views of its arrays), shapes and
    density."""
    loss = d.choice(list(TORCH_LOSSES))
    given = d.choice(["csr", "coo", "strided", "bsr"])
    n, m = d.integer(1, 8), d.integer(1, 8)
    if given == "bsr":  # whole 2 x 2 blocks
        n, m = 2 * ((n + 1) // 2), 2 * ((m + 1) // 2)
    return {
        "loss": loss,
        "out": d.choice(TORCH_LOSSES[loss][0].split()),
        "B": given,
        "views": given != "strided" and d.boolean(0.5),
        "shape": (n, m, d.integer(1, 4)),
        "density": d.choice([0.7, 0.3, 1.0, 0.0]),
        "seed": d.integer(0, 2**16),
    }


def _spread(a):
    """``a`` as a view of a tensor twice its size (every other element): strided."""
    return torch.stack([a, torch.zeros_like(a)], dim=-1)[..., 0]


def _torch_operand(B: np.ndarray, given: str, views: bool):
    """B as the case gives it; on views of its arrays where ``views``."""
    t = torch.tensor(B)
    if given == "strided":
        return t
    if given == "csr":
        s = t.to_sparse_csr()
        parts = (s.crow_indices(), s.col_indices(), s.values())
        return torch.sparse_csr_tensor(*map(_spread, parts), B.shape) if views else s
    if given == "bsr":
        s = t.to_sparse_bsr((2, 2))
        parts = (s.crow_indices(), s.col_indices(), s.values())
        return torch.sparse_bsr_tensor(*map(_spread, parts), B.shape) if views else s
    s = t.to_sparse()
    parts = (s.indices(), s.values())
    return torch.sparse_coo_tensor(*map(_spread, parts), B.shape, is_coalesced=True) if views else s


#: The draws the torch fuzz runs (seeded: each case reruns as it failed).
TORCH_CASES = [draw_torch_case(RandomDraw(f"torch:{n}")) for n in range(30)]


def test_the_torch_draw_reaches_every_loss():
    """The fuzz's draws hold each loss, and more than once torch.sparse.sum's broadcast
    gradient on int64 indices (B a torch sparse tensor) and a BSR B on strided views."""
    assert {c["loss"] for c in TORCH_CASES} == set(TORCH_LOSSES)
    assert sum(c["loss"] == "sparse.sum" and c["B"] != "strided" for c in TORCH_CASES) >= 2
    assert sum(c["B"] == "bsr" and c["views"] for c in TORCH_CASES) >= 2


@pytest.mark.parametrize(
    "case", TORCH_CASES, ids=lambda c: f"{c['loss']}-{c['out']}-{c['B']}{'-views' * c['views']}"
)
def test_torch_losses_fuzzed(case):
    """C's and D's gradients through a random loss of the sparse output against torch
    autograd on dense tensors."""
    n, m, K = case["shape"]
    rng = np.random.default_rng(case["seed"])
    B = rng.standard_normal((n, m)) * (rng.random((n, m)) < case["density"])
    C, D = rng.standard_normal((n, K)), rng.standard_normal((K, m))
    V, W = torch.tensor(rng.standard_normal((m, 2))), torch.tensor(rng.standard_normal((n, m)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's note on unchecked invariants
        Bt = _torch_operand(B, case["B"], case["views"])
    formats = {"A": case["out"], **({"B": "csr"} if case["B"] == "strided" else {})}
    Ct, Dt = torch.tensor(C, requires_grad=True), torch.tensor(D, requires_grad=True)
    A = ucf.torch.einsum(SDDMM, formats, B=Bt, C=Ct, D=Dt)
    got = torch.autograd.grad(TORCH_LOSSES[case["loss"]][1](A, V, W), (Ct, Dt), allow_unused=True)
    Cd, Dd = torch.tensor(C, requires_grad=True), torch.tensor(D, requires_grad=True)
    dense = DENSE_LOSSES[case["loss"]](torch.tensor(B) * (Cd @ Dd), V, W)
    want = torch.autograd.grad(dense, (Cd, Dd))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(torch.zeros_like(w) if g is None else g, w, msg=str(case))


# ------------------------------------------------------------------------ large


def _large(n, nnz_row, K, seed=0):
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(n), nnz_row)
    B = sp.csr_matrix((rng.standard_normal(n * nnz_row), (rows, rng.integers(0, n, n * nnz_row))))
    B.sum_duplicates()
    B.resize(n, n)
    return B, rng.standard_normal((n, K)), np.asfortranarray(rng.standard_normal((K, n)))


@pytest.mark.parametrize("per_row, K", [(3, 2), pytest.param(10, 8, marks=SLOW)])
def test_sddmm_gradients_at_100k_rows_in_bounded_memory(per_row, K):
    """At 100k x 100k a dense gradient of A would be 80 GB; the sparse one is a few MB,
    and so is every array the gradients allocate."""
    n = 100_000
    B, C, D = _large(n, per_row, K)
    k = ucf.compile(SDDMM, {"A": "csr", "B": "csr"})
    back = ucf.gradients(k)
    Bt = ucf.from_scipy(B)
    A = k(B=Bt, C=C, D=D)
    g = np.random.default_rng(1).standard_normal(A.nnz)
    grad = ucf.Tensor(A.shape, A.format, A.levels, g)
    ops = {"B": Bt, "C": C, "D": D}
    for w in "BCD":  # compile outside the measured window
        back.kernel(w)
    tracemalloc.start()
    gB, gC, gD = (back(w, grad, ops) for w in "BCD")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 * 2**20, f"gradients allocated {peak / 2**20:.0f} MiB at their peak"
    Gs = sp.csr_matrix((g, B.indices, B.indptr), shape=B.shape)  # A stores B's positions
    assert np.array_equal(A.levels[1]["crd"], B.indices)
    np.testing.assert_allclose(np.asarray(gC), (Gs.multiply(B)) @ D.T, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.asarray(gD), ((Gs.multiply(B)).T @ C).T, rtol=1e-9, atol=1e-12)
    rows = np.repeat(np.arange(n), np.diff(B.indptr))
    want_B = g * np.einsum("ek,ke->e", C[rows], D[:, B.indices])
    np.testing.assert_allclose(gB.vals, want_B, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("target", ["llvm", pytest.param("c", marks=SLOW)])
@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("layout", ["UU:1,0", "UU"])
def test_an_operands_gradient_comes_in_its_layout(target, threads, layout):
    """D declared ``UU:1,0`` or ``UU``: its gradient comes back in that mode order, equal
    to torch's. Column-major, each stored entry of A adds K contiguous values; row-major,
    the kernel writes it so too (K values a row apart were 2.5x slower), then copies it
    row-major once, which ``cin`` says."""
    B, C, D, G = operands(n=11, m=8, K=5, seed=3)
    k = ucf.compile(SDDMM, {"A": "csr", "B": "csr", "D": layout}, target=target)
    Bs = sp.csr_matrix(B)
    d = np.asfortranarray(D) if layout == "UU:1,0" else D
    A = k(B=Bs, C=C, D=d)
    lv = A.levels[1]
    g = G[np.repeat(np.arange(B.shape[0]), np.diff(lv["pos"])), lv["crd"]]
    grad = ucf.Tensor(A.shape, A.format, A.levels, g)
    back = ucf.gradients(k)
    got = back("D", grad, {"B": Bs, "C": C, "D": d})
    assert got.format.mode_order == ((1, 0) if layout == "UU:1,0" else (0, 1))
    view = np.asarray(got)
    assert np.shares_memory(view, got.vals) is (layout == "UU")  # row-major: a view
    _, _, want = torch_reference(B, C, D, G * (B != 0))
    np.testing.assert_allclose(view, want, rtol=1e-12, atol=1e-12)
    relaid = "grad_D written as 'UU:1,0'" in back.cin
    assert relaid is (layout == "UU"), back.cin
    assert back.relaid("C") is None  # grad_C(i,k): k, which no sparse operand reads, is last


@pytest.mark.parametrize("out", ["csr", "coo", "dcsr"])
def test_an_output_value_that_is_zero_keeps_its_gradient(out):
    """A row of C all zeros makes A's values 0 on B's whole row; the output keeps those
    entries in every format (COO dropped them on its conversion from the computed
    CSR, and with them the gradient of C's row: found by a read-only review)."""
    B, C, D, G = operands(seed=5)
    C[1] = 0
    Bs = torch.tensor(B).to_sparse_csr()
    Ct = torch.tensor(C, requires_grad=True)
    A = ucf.torch.einsum(SDDMM, formats={"A": out}, B=Bs, C=Ct, D=torch.tensor(D))
    (got,) = torch.autograd.grad(A, Ct, grad_outputs=torch.tensor(G))
    Cd = torch.tensor(C, requires_grad=True)
    (want,) = torch.autograd.grad(torch.tensor(B) * (Cd @ torch.tensor(D)), Cd, torch.tensor(G))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-12)
    kernel = ucf.compile(SDDMM, {"A": out, "B": "csr"})
    stored = kernel(B=ucf.from_numpy(B, format="csr"), C=C, D=D).to_scipy()
    assert stored.nnz == np.count_nonzero(B)  # the zeros of C's row 1 too


def test_a_conversion_keeps_stored_zeros_when_asked():
    """``Tensor.convert(keep_zeros=True)`` keeps what scipy's ``tocoo`` keeps."""
    m = sp.csr_matrix((np.array([1.0, 0.0, 2.0]), np.array([0, 2, 1]), np.array([0, 2, 3])))
    t = ucf.from_scipy(m, "csr")
    assert t.convert("coo").to_scipy().nnz == 2
    kept = t.convert("coo", keep_zeros=True).to_scipy()
    assert kept.nnz == m.tocoo().nnz == 3
    np.testing.assert_array_equal(kept.toarray(), m.toarray())


@pytest.mark.parametrize("out", ["csr", "coo"])
def test_gradcheck_through_a_sparse_output(out):
    """``torch.autograd.gradcheck`` (float64 finite differences) of C and D through an
    SDDMM whose output is torch sparse, made dense by torch after it."""
    B, C, D, _ = operands(n=5, m=4, seed=3)
    Bs = torch.tensor(B).to_sparse_csr()
    Ct = torch.tensor(C, requires_grad=True)
    Dt = torch.tensor(D, requires_grad=True)

    def f(C, D):
        return ucf.torch.einsum(SDDMM, formats={"A": out}, B=Bs, C=C, D=D).to_dense()

    assert torch.autograd.gradcheck(f, (Ct, Dt))
