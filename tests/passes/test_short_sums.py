"""Branch-free short sums (``branchless(k, w)``, ucf.passes.short_sums): TTV's fibers and
SpMV's rows of every length from 0 past the width, against numpy and scipy on both CPU
targets, bit for bit equal to the loop without the command (the same terms in the same
order); the default's choice on short and long fibers; bad widths; ASan."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.asan import run_under_asan
from ucf.errors import ScheduleError

TTV = "A(i,j) = B(i,j,k) * c(k)"
SPMV = "y(i) = A(i,j) * x(j)"
#: Row lengths: empty, every length to past the widest width, a long row.
LENGTHS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 40, 3, 2]


def _rows(rng, lengths, cols: int, dtype) -> sp.csr_matrix:
    indptr = np.concatenate(([0], np.cumsum(lengths)))
    indices = np.concatenate([np.sort(rng.choice(cols, n, replace=False)) for n in lengths])
    data = rng.standard_normal(int(indptr[-1])).astype(dtype)
    return sp.csr_matrix((data, indices.astype(np.int32), indptr), shape=(len(lengths), cols))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("width", [2, 4, 8])
def test_spmv_rows_of_every_length(width, dtype):
    rng = np.random.default_rng(width)
    m = _rows(rng, LENGTHS, 50, dtype)
    x = rng.standard_normal(50).astype(dtype)
    a = ucf.from_scipy(m, format="csr")
    got = {}
    for target in ("llvm", "c"):
        k = ucf.compile(SPMV, formats={"A": "csr"}, dtype=dtype, target=target,
                        schedule=f"branchless(j, {width})")  # fmt: skip
        got[target] = np.asarray(k(A=a, x=x).to_numpy())
        assert f"branchless: the sum over j into t0 runs {width} steps" in k.cin, k.cin
        plain = ucf.compile(SPMV, formats={"A": "csr"}, dtype=dtype, target=target, schedule="")
        np.testing.assert_array_equal(got[target], plain(A=a, x=x).to_numpy())
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got["llvm"], m.astype(np.float64) @ x, rtol=tol, atol=tol)
    np.testing.assert_array_equal(got["llvm"], got["c"])


def _tensor(rng, dims, nnz):
    keys = np.unique(rng.integers(0, np.prod(dims), nnz))
    coords = np.stack(np.unravel_index(keys, dims), axis=1)
    return coords, rng.standard_normal(len(keys))


def test_ttv_default_on_short_fibers():
    """Fibers of k holding 2.5 entries on average, c small: the default runs them
    branch-free (the peer run's TTV, scaled down), on one and two threads; the result
    is numpy's, and the same bits as the plain loop's."""
    rng = np.random.default_rng(38)
    dims = (800, 300, 40)
    coords, vals = _tensor(rng, dims, 620_000)
    c = rng.standard_normal(dims[2])
    want = np.zeros(dims[:2])
    np.add.at(want, (coords[:, 0], coords[:, 1]), vals * c[coords[:, 2]])
    b = ucf.from_coo(coords, vals, dims, format="CCC")
    plain = ucf.compile(TTV, formats={"B": "CCC"}, schedule="")(B=b, c=c).to_numpy()
    for threads in (1, 2):
        ucf.set_num_threads(threads)
        k = ucf.compile(TTV, formats={"B": "CCC"})
        got = k(B=b, c=c).to_numpy()
        assert "branchless(k, 4)" in k.schedule_used, k.cin
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(got, plain)


@pytest.mark.parametrize(("per_row", "cols"), [(10, 1000), (2, 1 << 16)])
def test_default_keeps_the_loop(per_row, cols):
    """Rows of 10 (most take the loop anyway), and short rows gathering from an x of
    512 KB (the branch-free steps wait on its misses): no branchless."""
    rng = np.random.default_rng(per_row)
    m = sp.random(20_000, cols, density=per_row / cols, format="csr", random_state=rng)
    x = rng.standard_normal(cols)
    k = ucf.compile(SPMV, formats={"A": "csr"})
    got = k(A=ucf.from_scipy(m), x=x).to_numpy()
    np.testing.assert_allclose(got, m @ x, rtol=1e-12, atol=1e-12)
    assert "branchless" not in k.cin, k.cin


@pytest.mark.parametrize("text", ["branchless(j, 1)", "branchless(j, 9)", "branchless(j, x)"])
def test_bad_widths(text):
    with pytest.raises(ScheduleError, match="branchless"):
        ucf.compile(SPMV, formats={"A": "csr"}, schedule=text)


def test_under_asan(asan_cc, tmp_path):
    """The steps past a row's end read at its last position: nothing outside the arrays,
    where the last rows are short (1 and 2 entries) and the first empty."""
    rng = np.random.default_rng(7)
    m = _rows(rng, [0, 3, 7, 1, 4, 2, 1, 2], 12, np.float64)
    x = rng.standard_normal(12)
    k = ucf.compile(SPMV, formats={"A": "csr"}, target="c", schedule="branchless(j, 4)")
    ops = {"A": ucf.from_scipy(m, format="csr"), "x": ucf.from_numpy(x)}
    out = run_under_asan(asan_cc, tmp_path, k, "U", (8,), {"i": 8, "j": 12}, ops)
    np.testing.assert_allclose(out.to_numpy(), m @ x, rtol=1e-12)
    assert "branchless" in k.cin


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_c_blends_bit_for_bit(dtype):
    """The c target keeps a step's sum by blending its bits (``ucf_blend_f64``), not by a
    branch: on each target the same bits as the plain loop, where the terms hold -0.0,
    infinities and NaN; and the same values on llvm and c, with every bit equal but a
    NaN's sign (where a NaN made of inf - inf meets a NaN of the data, x86 keeps the
    first operand's, and GCC and LLVM order the operands of an add differently: the
    plain loops differ there as well)."""
    rng = np.random.default_rng(3)
    m = _rows(rng, LENGTHS * 3, 40, dtype)
    m.data[::7] = -0.0
    m.data[3::13] = np.inf
    m.data[5::17] = -np.inf
    m.data[8::29] = np.nan
    x = rng.standard_normal(40).astype(dtype)
    x[[1, 9]] = -0.0
    a = ucf.from_scipy(m, format="csr")
    bits = "int32" if dtype == "float32" else "int64"
    got = {}
    for target in ("llvm", "c"):
        for sched in ("branchless(j, 4)", ""):
            k = ucf.compile(SPMV, formats={"A": "csr"}, dtype=dtype, target=target, schedule=sched)
            got[target, sched] = np.asarray(k(A=a, x=x).to_numpy())
            if target == "c" and sched:
                assert f"ucf_blend_{'f32' if dtype == 'float32' else 'f64'}(" in k.c_source
        plain, short = got[target, ""].view(bits), got[target, "branchless(j, 4)"].view(bits)
        np.testing.assert_array_equal(short, plain, err_msg=target)
    llvm, c = got["llvm", ""], got["c", ""]
    assert np.isnan(llvm).any() and np.isinf(llvm).any() and (llvm.view(bits) < 0).any()
    np.testing.assert_array_equal(c, llvm)  # NaN where NaN
    number = ~np.isnan(llvm)
    np.testing.assert_array_equal(c.view(bits)[number], llvm.view(bits)[number])


def test_blend_keeps_the_bits_without_a_branch(tmp_path):
    """``ucf_blend_f32`` and ``ucf_blend_f64`` (ucf_runtime.h), built with the kernels'
    flags: no jump or conditional move in their code, and each returns the bits of the
    value it keeps, -0.0, infinities and NaN payloads included (a first form made the
    vectors as ``{0} + a``, which turned -0.0 into 0.0: a kept sum never is -0.0, so
    the kernels' tests cannot see it)."""
    import ctypes

    from ucf.codegen.c import source
    from ucf.toolchain.cc import assembly, build_shared

    body = source([]) + "\n".join(
        f"{t} keep_{s}(bool c, {t} a, {t} b) {{ return ucf_blend_{s}(c, a, b); }}"
        for t, s in (("float", "f32"), ("double", "f64"))
    )
    asm = assembly(body)
    for s in ("f32", "f64"):
        fn = asm[asm.index(f"keep_{s}:") :]
        fn = fn[: fn.index("ret")]
        ops = [line.split()[0] for line in fn.splitlines() if line.strip()]
        assert not [op for op in ops if op.startswith(("j", "cmov"))], fn
    so = tmp_path / "blend.so"
    so.write_bytes(build_shared(body))
    lib = ctypes.CDLL(str(so))
    for s, ct, dt, it in (("f32", ctypes.c_float, np.float32, np.int32),
                          ("f64", ctypes.c_double, np.float64, np.int64)):  # fmt: skip
        keep = getattr(lib, f"keep_{s}")
        keep.restype, keep.argtypes = ct, [ctypes.c_bool, ct, ct]
        values = np.array([-0.0, 0.0, 1.5, -np.inf, np.inf, np.nan, -np.nan], dtype=dt)
        values = np.append(values, (values[-1:].view(it) | 5).view(dt))  # another payload
        for a in values:
            for b in values:
                for c, want in ((True, a), (False, b)):
                    got = np.array(keep(c, a, b), dtype=dt)
                    assert got.view(it) == want.view(it), (s, c, a, b)
