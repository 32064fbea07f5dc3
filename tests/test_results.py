"""What ``ucf.einsum`` hands back (the operands' own kind of array, as opt_einsum does),
what a ``ucf.Tensor`` answers to under numpy's and scipy's names, and the short reprs
of tensors, kernels, programs and plans."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import rand_sparse

SPMV = "y(i) = A(i,j) * x(j)"
ADD = "S(i,j) = A(i,j) + B(i,j)"
pytestmark = pytest.mark.filterwarnings("ignore::ucf.ConversionWarning")


@pytest.fixture
def data():
    rng = np.random.default_rng(37)
    return rand_sparse(rng, (9, 7), 0.3), rand_sparse(rng, (9, 7), 0.3), rng.random(7)


def test_numpy_and_scipy_operands_give_numpy_for_a_dense_result(data):
    a, _, x = data
    for A in (a, sp.csr_array(a), sp.csr_matrix(a), sp.csc_array(a)):
        y = ucf.einsum(SPMV, A=A, x=x)
        assert type(y) is np.ndarray and y.shape == (9,)
        np.testing.assert_allclose(y, a @ x)
    s = ucf.einsum("s() = x(i) * x(i)", x=x)
    assert isinstance(s, np.floating)  # as np.einsum gives a full reduction
    assert s == pytest.approx(x @ x)


@pytest.mark.parametrize(
    "fmt, kind",
    [("csr", sp.csr_array), ("csc", sp.csc_array), ("bcsr(3,7)", sp.bsr_array), ("UQ", None)],
)
def test_a_sparse_result_in_a_scipy_layout_is_scipy_on_its_own_arrays(data, fmt, kind):
    a, b, _ = data
    S = ucf.einsum(ADD, A=sp.csr_array(a), B=sp.csr_array(b), formats={"S": fmt})
    assert sp.issparse(S) and not isinstance(S, sp.spmatrix)
    if kind is not None:
        assert isinstance(S, kind)
    np.testing.assert_array_equal(S.toarray(), a + b)
    T = ucf.einsum(ADD, A=a, B=b, formats={"S": fmt}, as_tensor=True)
    assert isinstance(T, ucf.Tensor)
    if fmt != "UQ":  # scipy holds the tensor's own arrays
        assert np.shares_memory(T.to_scipy().data, T.vals)


def test_a_scipy_matrix_operand_gives_a_matrix(data):
    a, b, _ = data
    S = ucf.einsum(ADD, A=sp.csr_matrix(a), B=b, formats={"S": "csr"})
    assert isinstance(S, sp.csr_matrix)
    np.testing.assert_array_equal(S.toarray(), a + b)


@pytest.mark.parametrize("fmt", ["dcsr", "coo", "CC:1,0"])
def test_a_sparse_result_without_a_scipy_layout_stays_a_ucf_tensor(data, fmt):
    a, b, _ = data
    S = ucf.einsum(ADD, A=a, B=b, formats={"S": fmt})
    assert isinstance(S, ucf.Tensor) and S.format == ucf.parse_format(fmt, order=2)
    np.testing.assert_array_equal(S.toarray(), a + b)


def test_any_torch_operand_gives_torch(data):
    torch = pytest.importorskip("torch")
    a, b, x = data
    y = ucf.einsum(SPMV, A=torch.from_numpy(a).to_sparse_csr(), x=x)
    assert isinstance(y, torch.Tensor) and y.layout == torch.strided
    np.testing.assert_allclose(y.numpy(), a @ x)
    S = ucf.einsum(ADD, A=a, B=torch.from_numpy(b), formats={"S": "csr"})
    assert isinstance(S, torch.Tensor) and S.layout == torch.sparse_csr
    np.testing.assert_array_equal(S.to_dense().numpy(), a + b)


def test_out_is_returned_as_given_and_kernels_keep_returning_tensors(data):
    a, _, x = data
    out = np.zeros(9)
    assert ucf.einsum(SPMV, A=a, x=x, out=out) is out
    np.testing.assert_allclose(out, a @ x)
    k = ucf.compile(SPMV, {"A": "csr"})
    assert isinstance(k(A=a, x=x), ucf.Tensor)


def test_tensor_answers_to_numpy_and_scipy_names(data):
    a, _, _ = data
    for fmt in ("dense", "csr", "csc", "dcsr", "coo", "bcsr(2,2)", "UU:1,0"):
        t = ucf.from_numpy(a, fmt)
        assert t.shape == a.shape and t.ndim == 2 and len(t) == 9
        assert t.dtype == np.float64 and t.nnz >= np.count_nonzero(a)
        np.testing.assert_array_equal(t.toarray(), a)
        np.testing.assert_array_equal(t.todense(), a)
        np.testing.assert_array_equal(np.asarray(t), a)
        m = t.tocsr()
        assert isinstance(m, sp.csr_array)
        np.testing.assert_array_equal(m.toarray(), a)
    csr = ucf.from_numpy(a, "csr")
    assert np.shares_memory(csr.tocsr().data, csr.vals)
    with pytest.raises(TypeError, match="order-0"):
        len(ucf.from_numpy(np.float64(2.0)))


def test_a_small_tensor_prints_its_levels_and_a_large_one_a_line():
    a = np.array([[0, 1.5, 0], [0, 0, 0], [2.0, 0, 3.0]])
    text = repr(ucf.from_numpy(a, "csr"))
    head, *levels = text.splitlines()
    assert head == "Tensor(shape=(3, 3), format='csr', dtype=float64, nnz=3)"
    assert levels[0].split() == ["level", "0", "U", "mode", "0"]
    assert levels[1].split()[:5] == ["level", "1", "C", "mode", "1"]
    assert "pos=[0 1 1 3]" in levels[1] and "crd=[1 0 2]" in levels[1]
    assert levels[2].strip() == "vals=[1.5 2.  3. ]"
    big = ucf.from_numpy(np.ones((30, 30)), "csr")
    assert "\n" not in repr(big) and "nnz=900" in repr(big)


def test_kernels_programs_and_plans_say_what_they_are():
    k = ucf.compile(SPMV, {"A": "csr"}, schedule="split(i, i0, i1, 8)", dtype="float32")
    assert repr(k) == (
        "Kernel('y(i) = A(i,j) * x(j)', formats={'A': 'csr'}, target='llvm', "
        "dtype=float32, schedule='split(i, i0, i1, 8)')"
    )
    assert "schedule=default: chosen per call" in repr(ucf.compile(SPMV))
    assert repr(k._plan).startswith("Plan('y(i) = sum(j, A(i, j) * x(j))', output 'dense'")
    p = ucf.program(
        "H(i,k) = X(i,j) * W(j,k)\nY(i,k) = relu(H(i,k))",
        shapes={"X": (4, 6), "W": (6, 3)},
        outputs=("Y",),
    )
    head, *lines = repr(p).splitlines()
    assert head == "Program(inputs X, W; outputs Y)"
    assert [s.strip() for s in lines] == [str(s) for s in p.statements]
    w = np.kron(np.eye(4, dtype=bool), np.ones((4, 4), dtype=bool))
    plan = ucf.program(
        "y(i) = W(i,j) * x(j)", shapes={"x": (16,)}, attrs={"W": ucf.TeSA.from_mask(w)}
    ).transform(ucf.Policy(blocks={(1, 1): 1.0, (4, 4): 6.0}))
    head, *lines = repr(plan).splitlines()
    assert head == f"Plan({len(plan.steps)} steps over {len(plan.parts)} parts; outputs y)"
    assert [s.strip() for s in lines] == str(plan).splitlines()
    from ucf.tuning import Tuned

    tuned = Tuned("split(i, i0, i1, 8)", 2e-6, 3e-6, SimpleNamespace(trials=[1, 2, 3]), k)
    assert repr(tuned) == "Tuned('split(i, i0, i1, 8)', 2.0 us vs default 3.0 us (1.50x), 3 trials)"
