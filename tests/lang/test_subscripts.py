"""numpy-style subscripts (``ucf.einsum("ij,j->i", A, x)``) against ``np.einsum``."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import rand_sparse

EXTENT = {"i": 5, "j": 4, "k": 3, "l": 6}


@pytest.mark.parametrize(
    "subscripts",
    [
        "ij,j->i",
        "ij,jk->ik",
        "ij,jk",
        "ij,ij->",
        "i,i",
        "ijk,jl,kl->il",
        "ij->ji",
        "ij->",
        "ij,i->ij",
        "ij",
        "ji,j",
        "ik,kj->ij",
        " i j , j -> i ",
        "ii->i",
        "ii",
    ],
)
@pytest.mark.parametrize("sparse_first", [False, True])
def test_matches_numpy(subscripts, sparse_first):
    rng = np.random.default_rng(len(subscripts))
    specs = "".join(subscripts.split()).split("->")[0].split(",")
    dense = [rand_sparse(rng, [EXTENT[c] for c in spec], 0.5) for spec in specs]
    ops = list(dense)
    if sparse_first and dense[0].ndim == 2:
        ops[0] = sp.csr_array(dense[0])  # "ii": the diagonal of a sparse operand too
    got = ucf.einsum(subscripts, *ops)
    want = np.einsum(subscripts.replace(" ", ""), *dense)
    assert isinstance(got, (np.ndarray, np.generic)), type(got)  # numpy's own kind, as np.einsum
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_output_format_by_the_translated_name():
    rng = np.random.default_rng(0)
    a, b = rand_sparse(rng, (5, 4), 0.4), rand_sparse(rng, (5, 4), 0.4)
    got = ucf.einsum("ij,ij->ij", sp.csr_array(a), sp.csr_array(b), formats={"out": "csr"})
    assert isinstance(got, sp.csr_array)  # a CSR output is scipy's own CSR
    np.testing.assert_allclose(got.toarray(), a * b)


@pytest.mark.parametrize(
    "args, error, words",
    [
        (("ij,j->i", np.ones((2, 2))), ucf.ShapeError, ["name 2 operands", "1 were given"]),
        (("ij,j->i", np.ones(2), np.ones(2)), ucf.ShapeError, ["operand 0 has 1 dimensions"]),
        (("i1,j->i", np.ones((2, 2)), np.ones(2)), ucf.ParseError, ["'1' is not an index"]),
        (("...i,i", np.ones(2), np.ones(2)), ucf.UnsupportedError, ["ellipsis"]),
        (("i,i->k", np.ones(2), np.ones(2)), ucf.ShapeError, ["'k' is in no operand"]),
        (("i,i->ii", np.ones(2), np.ones(2)), ucf.ShapeError, ["an index repeats"]),
        (("y(i) = x(i)", np.ones(2)), ucf.OperandError, ["passed by name"]),
    ],
)
def test_bad_subscripts_are_ucf_errors(args, error, words):
    with pytest.raises(error) as e:
        ucf.einsum(*args)
    for w in words:
        assert w in str(e.value)


def test_subscripts_refuse_named_operands():
    with pytest.raises(ucf.OperandError, match="in order, not by name"):
        ucf.einsum("ij,j->i", A=np.ones((2, 2)), x=np.ones(2))


def test_parse_error_points_at_the_bad_letter():
    with pytest.raises(ucf.ParseError) as e:
        ucf.einsum("ij,j2->i", np.ones((2, 2)), np.ones((2, 2)))
    assert "^" in str(e.value)
