"""Execution details: out= and +=, the disk cache under concurrency, conversions."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from ucf.exec.kernel import forget_loaded
from ucf.toolchain.cache import CacheWarning

REPO = Path(__file__).resolve().parents[2]

_CHILD = """
import numpy as np, scipy.sparse as sp, ucf
A = sp.random(300, 200, density=0.05, format="csr", random_state=3)
x = np.linspace(0, 1, 200)
k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, target=TARGET)
y = k(A=A, x=x).to_numpy()
assert np.allclose(y, A @ x), "wrong result"
print("ok")
"""


@pytest.mark.parametrize("target", ["llvm", pytest.param("c", marks=pytest.mark.slow)])
def test_concurrent_compiles_share_one_cache(tmp_path, target):
    """Several processes compiling one kernel at once all succeed and agree."""
    if target == "c" and not _has_cc():
        pytest.skip("no C compiler")
    env = dict(os.environ, UCF_CACHE_DIR=str(tmp_path), PYTHONPATH=str(REPO))
    code = _CHILD.replace("TARGET", repr(target))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert out.strip() == "ok"
    assert not list(tmp_path.glob("*.tmp")), "temporary cache files were left behind"
    # A later process reuses what the racers left.
    again = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr


def test_corrupt_cache_entry_is_recompiled(tmp_path, monkeypatch):
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))
    forget_loaded()
    ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"})
    for f in tmp_path.glob("*.plan"):
        f.write_bytes(b"not a pickle")
    forget_loaded()
    with pytest.warns(CacheWarning, match="is not a ucf cache entry"):
        k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"})
    A = sp.random(20, 10, density=0.3, format="csr", random_state=0)
    x = np.arange(10.0)
    assert np.allclose(k(A=A, x=x).to_numpy(), A @ x)


def test_plus_equals_accumulates_into_out():
    A = sp.random(30, 20, density=0.2, format="csr", random_state=1)
    x = np.random.default_rng(0).random(20)
    y = np.full(30, 2.0)
    k = ucf.compile("y(i) += A(i,j) * x(j)", formats={"A": "csr"})
    k(A=A, x=x, out=y)
    assert np.allclose(y, 2.0 + A @ x)
    with pytest.raises(ucf.OperandError, match=r"\+="):
        k(A=A, x=x)


def test_assign_overwrites_out():
    A = sp.random(30, 20, density=0.2, format="csr", random_state=1)
    x = np.random.default_rng(0).random(20)
    y = np.full(30, 7.0)
    ucf.einsum("y(i) = A(i,j) * x(j)", A=A, x=x, out=y)
    assert np.allclose(y, A @ x)


def test_out_with_wrong_dtype_is_refused():
    with pytest.raises(ucf.OperandError, match="out"):
        ucf.einsum("y(i) = x(i)", x=np.ones(3), out=np.ones(3, dtype=np.float32))


def test_conversion_is_stated_in_cin_and_warned_once():
    expr = "T(i,j) = A(i,j) * B(j,i)"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        k = ucf.compile(expr, formats={"A": "csr", "B": "csr"})
    assert "converted" in k.cin
    assert sum("converted" in str(w.message) for w in caught) <= 1
    A = sp.random(6, 5, density=0.5, format="csr", random_state=2)
    B = sp.random(5, 6, density=0.5, format="csr", random_state=3)
    assert np.allclose(k(A=A, B=B).to_numpy(), A.multiply(B.T).toarray())


def test_in_process_kernels_are_reused():
    k1 = ucf.compile("z = a(i) * b(i)")
    k2 = ucf.compile("z  =  a(i)*b(i)")  # same statement, other spacing
    assert k1._functions is k2._functions


def _has_cc() -> bool:
    import shutil

    return shutil.which("cc") is not None


def test_the_thread_count_reaches_kernels_called_from_other_threads():
    """OpenMP keeps the count per calling thread; ucf applies the one asked for in every
    thread that calls a kernel (a thread pool, Dask's threaded scheduler)."""
    from concurrent.futures import ThreadPoolExecutor

    from ucf.toolchain.jit import openmp_runtime

    lib = openmp_runtime()
    if lib is None:
        pytest.skip("no OpenMP runtime")
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"})
    A = sp.random(20, 10, density=0.3, format="csr", random_state=3)
    x = np.arange(10.0)

    def call() -> int:
        np.testing.assert_allclose(k(A=A, x=x).to_numpy(), A @ x)
        return lib.omp_get_max_threads()

    for n in (1, 3):
        ucf.set_num_threads(n)
        with ThreadPoolExecutor(2) as pool:
            assert set(pool.map(lambda _: call(), range(4))) == {n}
