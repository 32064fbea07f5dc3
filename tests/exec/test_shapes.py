"""``shapes=``: index variables mapped to extents, tensors mapped to shapes, and the
conflicts between them and the operands, checked against numpy broadcasting."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import TARGETS

B = np.arange(1.0, 4.0)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "shapes",
    [{"A": (3, 5)}, {"j": 5}, {"A": [3, 5], "j": 5}, {"A": (np.int64(3), 5)}],
    ids=["tensor", "variable", "both", "numpy-int"],
)
def test_broadcast_extent_from_shapes(shapes, target):
    got = ucf.compile("A(i,j) = b(i)", target=target)(b=B, shapes=shapes)
    np.testing.assert_array_equal(got.to_numpy(), np.broadcast_to(B[:, None], (3, 5)))


def test_sparse_output_and_sparse_operand():
    rng = np.random.default_rng(3)
    M = sp.random(4, 6, density=0.4, format="csr", random_state=rng)
    x = rng.random(6)
    k = ucf.compile("C(i,j,k) = M(i,j) * x(j)", formats={"M": "csr", "C": "UCU"})
    got = k(M=M, x=x, shapes={"C": (4, 6, 2)}).to_numpy()
    want = np.repeat((M.toarray() * x)[:, :, None], 2, axis=2)
    np.testing.assert_allclose(got, want)


@pytest.mark.parametrize(
    "shapes, words",
    [
        ({"A": (4, 5)}, ["index variable i", "b (mode 0)", "shapes= (A, mode 0)"]),
        ({"A": (3, 5), "j": 6}, ["index variable j", "shapes= (A, mode 1)", "6"]),
        ({"b": (4,), "j": 2}, ["operand b", "size 3 in mode 0", "shapes= gives 4"]),
        ({"A": (3,)}, ["shape (3,)", "A(i, j) has 2 indices"]),
        ({"Z": (3, 5)}, ["tensor 'Z'", "no tensor Z"]),
        ({"z": 3}, ["'z'", "not an index variable", "its variables: i, j"]),
        ({"A": (3, -1)}, ["mode 1 of A", "-1", "non-negative integer"]),
        ({"j": 2.5}, ["index variable j", "2.5"]),
        ({"j": True}, ["index variable j", "True"]),
    ],
)
def test_conflicts_name_both_sources(shapes, words):
    k = ucf.compile("A(i,j) = b(i)")
    with pytest.raises(ucf.ShapeError) as e:
        k(b=B, shapes=shapes)
    for w in words:
        assert w in str(e.value)


def test_out_and_shapes_must_agree():
    k = ucf.compile("A(i,j) = b(i)")
    with pytest.raises(ucf.ShapeError, match=r"index variable j .*out \(mode 1\).*shapes="):
        k(b=B, out=np.zeros((3, 5)), shapes={"A": (3, 4)})
    got = k(b=B, out=np.zeros((3, 5)), shapes={"A": (3, 5)})
    np.testing.assert_array_equal(got.to_numpy(), np.broadcast_to(B[:, None], (3, 5)))


def test_einsum_passes_shapes():
    got = ucf.einsum("A(i,j) = b(i)", b=B, shapes={"A": (3, 2)})
    np.testing.assert_array_equal(got, np.broadcast_to(B[:, None], (3, 2)))
