"""A repeated index variable in a sparse operand: ``A(i,i)``, ``T(i,j,i)``.

A sparse operand reads its repeated variable at the later level through an offset of
extent 1 (``A(i, i + i_d)``, ``ucf.cin.diagonals``): a compressed level is searched
for the one coordinate, a dense one located, and a level that can be neither
(singleton, unordered) is read from a converted copy. Every format, every target,
against numpy; and the subscripts of pydata/sparse's einsum tests, whose 2-D operands
pass as scipy CSR (5 of them were refused before).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import TARGETS, format_targets, rand_sparse

MATRIX_FORMATS = [
    "csr",
    "csc",
    "coo",
    "dcsr",
    "dcsc",
    "CU",
    "UQ",
    "ell(4)",
    "bcsr(2,2)",
    "bcsr(2,3)",
    "bcsc(3,2)",
]

STATEMENTS = {
    "y(i) = A(i,i)": lambda a, x: np.diag(a),
    "s = A(i,i)": lambda a, x: np.trace(a),
    "y(i) = A(i,i) * x(i) + A(i,j) * x(j)": lambda a, x: np.diag(a) * x + a @ x,
    "C(i,j) = A(i,i) * A(j,j) - A(i,j)": lambda a, x: np.outer(np.diag(a), np.diag(a)) - a,
    "y(i) = relu(A(i,i) - 2)": lambda a, x: np.maximum(np.diag(a) - 2, 0),
}


def matrix(seed: int, n: int = 6) -> np.ndarray:
    a = rand_sparse(np.random.default_rng(seed), (n, n), 0.5, high=5)
    a[1, 1] = 0  # a row whose diagonal is not stored
    a[2, 2] = 3
    return a


def run(expr: str, formats: dict, target: str, **operands) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ucf.ConversionWarning)
        k = ucf.compile(expr, formats, target=target)
        ops = {
            n: ucf.from_numpy(a, format=formats[n]) if n in formats else a
            for n, a in operands.items()
        }
        return k(**ops).to_numpy()


@pytest.mark.parametrize(
    ("fmt", "target"), format_targets(MATRIX_FORMATS, ("csr", "coo", "bcsr(2,3)"))
)
def test_diagonal_of_a_sparse_matrix(fmt, target):
    a, x = matrix(1), np.arange(1.0, 7.0)
    for expr, ref in STATEMENTS.items():
        if fmt == "UQ" and "A(i,j)" in expr:
            continue  # an unordered level co-iterates with nothing (docs/formats.md)
        got = run(expr, {"A": fmt}, target, A=a, **({"x": x} if "x(" in expr else {}))
        np.testing.assert_array_equal(got, ref(a, x), err_msg=f"{expr} {fmt}")


@pytest.mark.parametrize(
    ("fmt", "target"), format_targets(["csf", "coo", "UCC:2,0,1", "CCC:1,2,0", "UCU"], ("coo",))
)
def test_repeated_variables_of_a_sparse_3_tensor(fmt, target):
    rng = np.random.default_rng(2)
    t = rand_sparse(rng, (4, 3, 4), 0.6, high=5)
    cube = rand_sparse(rng, (3, 3, 3), 0.6, high=5)
    np.testing.assert_array_equal(
        run("y(j) = T(i,j,i)", {"T": fmt}, target, T=t), np.einsum("iji->j", t)
    )
    np.testing.assert_array_equal(
        run("Y(i,j) = T(i,j,i)", {"T": fmt}, target, T=t), np.einsum("iji->ij", t)
    )
    np.testing.assert_array_equal(
        run("s = T(i,i,i)", {"T": fmt}, target, T=cube), np.einsum("iii->", cube)
    )


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("out", ["C", "CC"])
def test_a_sparse_output_of_a_diagonal(target, out):
    a = matrix(3)
    expr, ref = ("X(i) = A(i,i)", np.diag(a)) if out == "C" else ("X(i,j) = A(i,i) * A(i,j)", None)
    if ref is None:
        ref = np.diag(a)[:, None] * a
    got = run(expr, {"A": "csr", "X": out}, target, A=a)
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("fmt", ["csr", "dcsr", "bcsr(2,2)"])
def test_max_and_min_over_a_diagonal(fmt):
    """The offset of a diagonal under a max or min is summed inside it (the statement
    fuzzer found both: the max taken as a sum, an absent diagonal 0 skipped)."""
    a = np.zeros((4, 4))
    a[0, 1], a[2, 2], a[3, 0] = 3.0, 2.0, 1.0
    d = np.diag(a)
    for expr, ref in (
        ("X = min(j, A(j,j))", d.min()),
        ("X = max(j, -A(j,j))", (-d).max()),
        ("X(j) = max(i, A(i,j) + A(j,j))", (a + d).max(axis=0)),
        ("X(j) = min(i, A(j,j) - A(i,j))", (d - a).min(axis=0)),
    ):
        np.testing.assert_array_equal(run(expr, {"A": fmt}, "llvm", A=a), ref, err_msg=expr)


def test_the_cin_says_how_the_diagonal_is_read():
    k = ucf.compile("y(i) = A(i,i)", {"A": "csr"})
    assert "A(i, i + i_d)" in k.cin
    assert "i_d runs over one value" in k.cin
    with pytest.raises(ucf.ShapeError, match="index variable i has extent 4"):
        k(A=sp.random(4, 5, density=0.5, format="csr", random_state=0))


@pytest.mark.parametrize(
    "stmt,fmt",
    [
        ("y(i) = A(i,i)", "csr fill=1"),
        ("s = A(i,j,i)*B(i,j)", "CUC fill=-inf"),
    ],
)
def test_a_diagonal_of_a_filled_operand_is_refused_as_written(stmt, fmt):
    """The refusal names the access the user wrote, not the offset it is read through."""
    with pytest.raises(ucf.UnsupportedError) as e:
        ucf.compile(stmt, {"A": fmt} | ({"B": "csr"} if "B" in stmt else {}))
    assert "reading A with a repeated index variable (a diagonal)" in str(e.value)
    assert "_d" not in str(e.value) and "_blk" not in str(e.value)


def test_a_diagonal_is_scheduled_by_the_user():
    a, x = matrix(4), np.arange(1.0, 7.0)
    for schedule in ("parallelize(i, CPUThread, NoRaces)", "split(i, i0, i1, 2)", "reorder(i, j)"):
        k = ucf.compile("y(i) = A(i,i) * x(i) + A(i,j) * x(j)", {"A": "csr"}, schedule=schedule)
        got = k(A=ucf.from_numpy(a, format="csr"), x=x).to_numpy()
        np.testing.assert_array_equal(got, np.diag(a) * x + a @ x)


def test_cuda_emulated_diagonal():
    a, x = matrix(5), np.arange(1.0, 7.0)
    for fmt in ("coo",):  # converted to be searched, then searched: the longest way
        k = ucf.compile(
            "y(i) = A(i,i) * x(i) + A(i,j) * x(j)", {"A": fmt}, target="cuda", emulate=True
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ucf.ConversionWarning)
            got = k(A=ucf.from_numpy(a, format=fmt), x=x).to_numpy()
        np.testing.assert_array_equal(got, np.diag(a) * x + a @ x)


# ------------------------------------------------------------------ pydata/sparse's cases


def pydata_subscripts() -> list[str]:
    """The subscripts of pydata/sparse's einsum tests (the installed package's own test
    module), but those with an ellipsis, which ucf refuses by name."""
    import sparse

    path = Path(sparse.__file__).parent / "numba_backend" / "tests" / "test_einsum.py"
    if not path.exists():
        pytest.skip("pydata/sparse's einsum tests are not installed")
    text = path.read_text()
    block = text[text.index("einsum_cases = [") :]
    block = block[: block.index("\n]")]
    found = re.findall(r'"([^"]*)"', block)
    return [s for s in dict.fromkeys(found) if "..." not in s]


#: The five that were refused (2-D operands as scipy CSR), and a few more with a
#: repeated variable in a sparse operand; all of them run in the slow test.
REFUSED = [
    "dd,fb,be,cdb->cef",
    "ed,fcd,ff,bcf->be",
    "bb,ff,be->e",
    "bcb,bb,fc,fff->",
    "afd,ba,cc,dc->bf",
    "abab->ba",
    "baa,bcc->ac",
]


def check_pydata(subscripts: str, density: float, higher: str | None) -> None:
    """Operands of extent 4, 2-D ones as scipy CSR, higher ones in ``higher`` (None:
    dense), against np.einsum on the dense copies."""
    rng = np.random.default_rng(abs(hash((subscripts, density))) % 2**32)
    terms = subscripts.split("->")[0].split(",")
    arrays = []
    for term in terms:
        shape = (4,) * len(term)
        arrays.append(rng.integers(1, 5, shape) * (rng.random(shape) < density) * 1.0)
    want = np.einsum(subscripts, *arrays)
    ops = []
    for a in arrays:
        if a.ndim == 2:
            ops.append(sp.csr_array(a))
        elif a.ndim > 2 and higher:
            ops.append(ucf.from_numpy(a, format=higher))
        else:
            ops.append(a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ucf.ConversionWarning)
        got = np.asarray(ucf.einsum(subscripts, *ops, as_tensor=True).to_numpy())
    np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=subscripts)


def test_the_pydata_cases_are_found():
    found = pydata_subscripts()
    assert len(found) == 70 and all(s in found for s in REFUSED)


@pytest.mark.parametrize("density", [0.1, 1.0])
@pytest.mark.parametrize("subscripts", REFUSED)
def test_pydata_cases_with_a_repeated_variable(subscripts, density):
    check_pydata(subscripts, density, "csf")


@pytest.mark.slow
@pytest.mark.parametrize("higher", [None, "csf", "coo"])
def test_all_pydata_cases(higher):
    """70 subscripts x 2 densities = the 140 cases, with 2-D operands as scipy CSR."""
    for subscripts in pydata_subscripts():
        for density in (0.1, 1.0):
            check_pydata(subscripts, density, higher)
