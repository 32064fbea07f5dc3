"""The per-plan fast path of a kernel call binds what the full path would."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from ucf.exec.binding import address, binding


def test_a_remembered_address_cannot_go_stale():
    """numpy moves a buffer under the same array object only in ``resize``, which it
    refuses for an array with a weak reference, such as the cache's."""
    a = np.zeros(4)
    assert address(a) == a.ctypes.data
    with pytest.raises(ValueError, match="resize"):
        a.resize(1 << 16, refcheck=False)
    assert address(a) == a.ctypes.data


def test_address_entry_goes_with_its_array():
    from ucf.exec import binding as module

    a = np.ones(3)
    address(a)
    key = id(a)
    assert key in module._ADDRESSES
    del a
    gc.collect()
    assert key not in module._ADDRESSES


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_repeated_calls_with_changing_operands(target):
    """Operands that come back (cached addresses), fresh ones, views and a converted
    one all give numpy's answer."""
    rng = np.random.default_rng(7)
    k = ucf.compile(
        "y(i) = A(i,j) * x(j) + z(i) * w(i)", formats={"A": "csr"}, schedule="", target=target
    )
    a = sp.random(30, 20, density=0.3, format="csr", random_state=rng)
    A = ucf.from_scipy(a)
    x, z, w = rng.random(20), rng.random(30), rng.random(30)
    for _ in range(3):
        np.testing.assert_allclose(k(A=A, x=x, z=z, w=w).to_numpy(), a @ x + z * w)
    x = np.concatenate([rng.random(20), x])[:20]  # a view of a new buffer
    y = np.zeros(30)
    k(A=A, x=x, z=z, w=w, out=y)
    np.testing.assert_allclose(y, a @ x + z * w)
    with pytest.warns(ucf.ConversionWarning):
        got = k(A=a.toarray(), x=x, z=z, w=w)  # dense A: converted to CSR
    np.testing.assert_allclose(got.to_numpy(), a @ x + z * w)


def test_disagreeing_extents_still_name_both_places():
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"})
    A = ucf.from_scipy(sp.random(5, 4, density=0.5, format="csr", random_state=0))
    with pytest.raises(ucf.ShapeError, match=r"j has extent 4 in A \(mode 1\) but 3 in x"):
        k(A=A, x=np.ones(3))
    with pytest.raises(ucf.ShapeError, match="out"):
        k(A=A, x=np.ones(4), out=np.zeros(6))


def test_binding_is_made_once_per_plan():
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"})
    assert binding(k._plan) is binding(k._plan)
    b = binding(k._plan)
    assert b.closed and set(b.lhs) == {"i"}
