"""ucf.torch.einsum and ucf.torch.op under torch's autograd.

``torch.autograd.gradcheck`` compares each derived gradient with finite
differences in float64. A sparse operand is checked through its values (the
torch constructor of its layout is differentiable in them, and perturbing a
value keeps the pattern); a strided operand read in a sparse format, through a
scatter of its values into its pattern. Gradients of sparse operands must come
back on the operand's own index arrays.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import ucf

torch = pytest.importorskip("torch")
from torch.autograd import gradcheck  # noqa: E402

import ucf.torch  # noqa: E402  (after the skip: the package imports torch on use)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch's sparse-beta notes


@pytest.fixture(autouse=True)
def _one_thread():
    """Kernels on one thread: these tests are about gradients, and two test workers on two
    cores make threads that wait for each other slow every small call."""
    ucf.set_num_threads(1)


MM = "C(i,k) = A(i,j) * B(j,k)"


def rand(*shape, seed=0, sparsity=0.0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, dtype=torch.float64, generator=g)
    if sparsity:
        t[torch.rand(*shape, generator=g) < sparsity] = 0
    return t


def test_gradcheck_dense_operands():
    A, B = rand(5, 4).requires_grad_(), rand(4, 3, seed=1).requires_grad_()
    assert gradcheck(lambda A, B: ucf.torch.einsum(MM, A=A, B=B), (A, B))
    got = ucf.torch.einsum(MM, A=A, B=B)
    torch.testing.assert_close(got, A @ B)


def test_gradcheck_functions_and_sums_of_terms():
    A, B = rand(5, 4).requires_grad_(), rand(4, 3, seed=1).requires_grad_()
    x = rand(4, seed=2).requires_grad_()
    stmt = (
        "C(i,k) = relu(A(i,j) * B(j,k)) + tanh(A(i,j)) * sigmoid(B(j,k)) "
        "+ max(A(i,j), B(j,k)) - gelu(x(j)) * B(j,k)"
    )

    def f(A, B, x):
        return ucf.torch.einsum(stmt, A=A, B=B, x=x)

    assert gradcheck(f, (A, B, x))
    want = (
        torch.relu(A[:, :, None] * B[None]).sum(1)
        + (torch.tanh(A)[:, :, None] * torch.sigmoid(B)[None]).sum(1)
        + torch.maximum(A[:, :, None], B[None]).sum(1)
        - torch.nn.functional.gelu(x) @ B
    )
    torch.testing.assert_close(f(A, B, x), want)


def test_gradcheck_an_affine_convolution():
    inp, filt = rand(1, 2, 5, 5).requires_grad_(), rand(3, 2, 3, 3, seed=1).requires_grad_()
    stmt = "O(n,m,p,q) = I(n,c,p+r-1,q+s-1) * F(m,c,r,s)"
    assert gradcheck(lambda i, f: ucf.torch.einsum(stmt, I=i, F=f), (inp, filt), fast_mode=True)
    out = ucf.torch.einsum(stmt, I=inp, F=filt)
    torch.testing.assert_close(out, torch.nn.functional.conv2d(inp, filt, padding=1))


def test_gradcheck_a_csr_operand_and_its_gradients_layout():
    A = rand(6, 5, sparsity=0.5).to_sparse_csr()
    crow, col = A.crow_indices(), A.col_indices()
    B = rand(5, 3, seed=1).requires_grad_()
    vals = A.values().clone().requires_grad_()

    def f(v, B):
        return ucf.torch.einsum(MM, A=torch.sparse_csr_tensor(crow, col, v, A.shape), B=B)

    assert gradcheck(f, (vals, B))
    leaf = torch.sparse_csr_tensor(crow, col, vals.detach(), A.shape).requires_grad_()
    ucf.torch.einsum(MM, A=leaf, B=B).sum().backward()
    grad = leaf.grad
    assert grad.layout == torch.sparse_csr
    assert torch.equal(grad.crow_indices(), crow) and torch.equal(grad.col_indices(), col)
    dense = A.to_dense().requires_grad_()
    (dense @ B).sum().backward()
    torch.testing.assert_close(grad.to_dense(), dense.grad * (A.to_dense() != 0))


def test_gradcheck_a_bsr_operand_keeps_its_blocks():
    dense = rand(6, 8, sparsity=0.0)
    blocks = torch.kron(
        torch.tensor([[1.0, 0, 1, 0], [0, 1, 0, 0], [1, 1, 0, 1]]), torch.ones(2, 2)
    )
    A = (dense * blocks).to_sparse_bsr((2, 2))
    crow, col = A.crow_indices(), A.col_indices()
    x = rand(8, seed=1).requires_grad_()
    vals = A.values().clone().requires_grad_()
    stmt = "y(i) = tanh(A(i,j)) * x(j)"

    def f(v, x):
        return ucf.torch.einsum(stmt, A=torch.sparse_bsr_tensor(crow, col, v, A.shape), x=x)

    assert gradcheck(f, (vals, x))
    leaf = torch.sparse_bsr_tensor(crow, col, vals.detach(), A.shape).requires_grad_()
    # torch accumulates no BSR .grad ("do not have is_contiguous"); autograd.grad returns it
    (grad,) = torch.autograd.grad(ucf.torch.einsum(stmt, A=leaf, x=x).sum(), leaf)
    assert grad.layout == torch.sparse_bsr
    assert torch.equal(grad.crow_indices(), crow) and torch.equal(grad.col_indices(), col)
    ref = A.to_dense().requires_grad_()
    (torch.tanh(ref) @ x).sum().backward()
    torch.testing.assert_close(grad.to_dense(), ref.grad * blocks)


@pytest.mark.parametrize("fmt", ["nm(2,4)", "csr"])
def test_gradcheck_a_dense_operand_read_in_a_sparse_format(fmt):
    """Its pattern is its nonzeros; its gradient is zero off them."""
    pattern = torch.tensor([[1, 0, 1, 0, 0, 1, 1, 0]] * 3 + [[0, 1, 0, 1, 1, 0, 0, 1]] * 2)
    where = pattern.nonzero(as_tuple=True)
    B = rand(8, 3, seed=1).requires_grad_()
    vals = rand(int(pattern.sum()), seed=2).requires_grad_()

    def f(v, B):
        W = torch.zeros(5, 8, dtype=torch.float64).index_put(where, v)
        return ucf.torch.einsum("C(i,k) = W(i,j) * B(j,k)", formats={"W": fmt}, W=W, B=B)

    assert gradcheck(f, (vals, B))
    W = torch.zeros(5, 8, dtype=torch.float64).index_put(where, vals.detach()).requires_grad_()
    out = ucf.torch.einsum("C(i,k) = sin(W(i,j)) * B(j,k)", formats={"W": fmt}, W=W, B=B)
    out.sum().backward()
    assert W.grad.layout == torch.strided
    assert torch.equal(W.grad != 0, pattern.bool())


@pytest.mark.parametrize("tile", [(1, 1), (32, 1), (2, 3)])
def test_gradcheck_dynamic_operands(tile):
    rows = 64 if tile[0] == 32 else 6
    W, X = rand(rows, 6).requires_grad_(), rand(6, 3, seed=1).requires_grad_()
    g = torch.Generator().manual_seed(5)
    grid = torch.rand(-(-rows // tile[0]), -(-6 // tile[1]), generator=g) < 0.5
    mask = grid.repeat_interleave(tile[0], 0).repeat_interleave(tile[1], 1)[:rows, :6]
    stmt = "C(i,n) = W(i,k) * X(k,n)"

    def f(W, X):
        return ucf.torch.einsum(stmt, dynamic={"W": tile}, masks={"W": mask}, W=W, X=X)

    assert gradcheck(f, (W, X), fast_mode=rows > 8)  # a random projection of the Jacobian
    f(W, X).sum().backward()
    ref_W = W.detach().clone().requires_grad_()
    ((ref_W * mask) @ X.detach()).sum().backward()
    torch.testing.assert_close(W.grad, ref_W.grad)
    assert not W.grad[~mask].any()  # computed in the live tiles only, zero elsewhere


def test_gradients_against_torch_in_float32():
    """A linear layer's product, float32, sparse weight: the dense masked computation's
    gradients at the stored positions, within float32 rounding."""
    W = rand(16, 12, sparsity=0.7).float().to_sparse_csr().requires_grad_()
    X = rand(12, 8, seed=1).float().requires_grad_()
    out = ucf.torch.einsum("Y(o,t) = relu(W(o,i) * X(i,t))", W=W, X=X)
    grad = rand(16, 8, seed=2).float()
    out.backward(grad)
    ref_W, ref_X = W.detach().to_dense().requires_grad_(), X.detach().clone().requires_grad_()
    torch.relu(ref_W[:, :, None] * ref_X[None]).sum(1).backward(grad)
    mask = W.detach().to_dense() != 0
    torch.testing.assert_close(W.grad.to_dense(), ref_W.grad * mask, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(X.grad, ref_X.grad, rtol=1e-5, atol=1e-5)


def test_einsum_refuses_what_it_cannot_run():
    A, x = rand(3, 4), rand(4)
    with pytest.raises(ucf.UnsupportedError, match="'\\+='"):
        ucf.torch.einsum("y(i) += A(i,j) * x(j)", A=A, x=x)
    with pytest.raises(ucf.OperandError, match="missing operand x"):
        ucf.torch.einsum("y(i) = A(i,j) * x(j)", A=A)
    with pytest.raises(ucf.OperandError, match="not a torch tensor"):
        ucf.torch.einsum("y(i) = A(i,j) * x(j)", A=A, x=np.ones(4))
    with pytest.raises(ucf.OperandError, match="masks= gives a mask for A"):
        ucf.torch.einsum("y(i) = A(i,j) * x(j)", masks={"A": A != 0}, A=A, x=x)


# ------------------------------------------------------------------ custom ops


def test_custom_op_gradients_eager_on_dense_and_sparse_operands():
    spmm = ucf.torch.op(MM, formats={"A": "csr"})
    A, B = rand(5, 4, sparsity=0.5).requires_grad_(), rand(4, 3, seed=1).requires_grad_()
    assert gradcheck(lambda B: spmm(A.detach(), B), (B,))
    spmm(A, B).sum().backward()
    torch.testing.assert_close(A.grad, (torch.ones(5, 3, dtype=torch.float64) @ B.T) * (A != 0))
    sparse = A.detach().to_sparse_csr().requires_grad_()
    spmm(sparse, B).sum().backward()
    assert sparse.grad.layout == torch.sparse_csr
    torch.testing.assert_close(sparse.grad.to_dense(), A.grad)


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.W = torch.nn.Parameter(rand(6, 5).float())
        self.mm = ucf.torch.op("Y(t,o) = relu(X(t,i) * W(i,o))")

    def forward(self, x):
        return self.mm(x, self.W).sum()


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_custom_op_forward_and_backward_compile_whole(backend):
    model = _Model()
    x = rand(4, 6, seed=1).float().requires_grad_()
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ucf.ConversionWarning)
        loss = compiled(x)
        loss.backward()
    W, xr = model.W.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    want = torch.relu(xr[:, :, None] * W[None]).sum()
    want.backward()
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(model.W.grad, W.grad)
    torch.testing.assert_close(x.grad, xr.grad)
