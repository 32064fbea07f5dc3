"""Every public entry point, called with an argument of the wrong type, says so with a
``ucf.UcfError`` (``ArgumentError`` where nothing more specific applies): never an
``InternalError``, nor a bare Python exception from deep inside.

Each entry point is called with valid arguments but one, which is replaced in turn by
values of the wrong kinds: numbers, strings, lists, dicts, bytes, arrays, objects.
What a call returns when the wrong value happens to mean something is not judged
here; that it does not fail as a bug is.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import pytest
import scipy.sparse as sp

import ucf

WRONG = [1, 2.5, "x", [1], {"a": 1}, object(), b"x", np.zeros(2), (1, 2), True, -1]

A = np.eye(3)
X = np.ones(3)


def sweep(fn: Callable, **valid) -> list[str]:
    """The calls of ``fn`` with one argument of ``valid`` wrong that fail as a bug."""
    bad = []
    for key in valid:
        for wrong in WRONG:
            args = {**valid, key: wrong}
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    fn(**args)
            except ucf.InternalError as e:
                bad.append(f"{key}={wrong!r}: {e}")
            except ucf.UcfError:
                pass
            except Exception as e:  # noqa: BLE001 (what this test looks for)
                bad.append(f"{key}={wrong!r}: {type(e).__name__}: {e}")
    return bad


def kernel() -> ucf.Kernel:
    return ucf.compile("y(i) = A(i,j)*x(j)", {"A": "csr"})


ENTRIES = {
    "compile": lambda: (
        ucf.compile,
        dict(
            expr="y(i) = A(i,j)*x(j)",
            formats={"A": "csr"},
            schedule=None,
            target="llvm",
            dtype=None,
            index_dtype="int32",
            emulate=False,
            static=None,
            dynamic=None,
        ),
    ),
    "einsum": lambda: (
        ucf.einsum,
        dict(expr="y(i) = A(i,j)*x(j)", formats={"A": "csr"}, out=None, shapes=None, A=A, x=X),
    ),
    "Kernel.__call__": lambda: (kernel(), dict(A=A, x=X, out=None, shapes=None)),
    "Kernel.save": lambda: (kernel().save, dict(path="/nonexistent-dir/k")),
    "from_numpy": lambda: (ucf.from_numpy, dict(array=A, format="csr", dtype=None)),
    "from_scipy": lambda: (ucf.from_scipy, dict(m=sp.csr_matrix(A), format=None, dtype=None)),
    "from_coo": lambda: (
        ucf.from_coo,
        dict(coords=np.array([[0, 0], [1, 1]]), vals=np.ones(2), shape=(3, 3), format="csr"),
    ),
    "from_dlpack": lambda: (ucf.from_dlpack, dict(obj=A)),
    "parse_format": lambda: (ucf.parse_format, dict(text="csr", order=2)),
    "quantize": lambda: (ucf.quantize, dict(array=A, format="csr@qint8")),
    "Tensor.convert": lambda: (ucf.from_numpy(A).convert, dict(format="csc", dtype=None)),
    "Tensor.astype": lambda: (ucf.from_numpy(A).astype, dict(dtype=np.float32)),
    "TeSA": lambda: (ucf.TeSA, dict(bits=np.full((2, 2), 8))),
    "TeSA.from_mask": lambda: (ucf.TeSA.from_mask, dict(mask=np.ones((2, 2), bool), bits=8)),
    "TeSA.dense": lambda: (ucf.TeSA.dense, dict(shape=(2, 2), bits=8)),
    "Policy": lambda: (ucf.Policy, dict(bits={8, 32}, blocks={(1, 1): 1.0})),
    "program": lambda: (
        ucf.program,
        dict(text="y(i) = W(i,j)*x(j)", shapes={"x": (3,), "W": (3, 3)}, outputs=None),
    ),
    "Program.transform": lambda: (
        ucf.program("y(i) = W(i,j)*x(j)", shapes={"x": (3,), "W": (3, 3)}).transform,
        dict(policy=ucf.Policy()),
    ),
    "invariance": lambda: (ucf.invariance, dict(expr="y(i) = A(i,j)*x(j)")),
    "condensable": lambda: (ucf.condensable, dict(expr="y(i) = A(i,j)*x(j)", operand="A")),
    "stile_index": lambda: (
        ucf.stile_index,
        dict(mask=np.ones((4, 4), bool), granularity=(2, 2)),
    ),
    "choose_stile": lambda: (
        ucf.choose_stile,
        dict(samples=[np.ones((4, 4), bool)], candidates=[(2, 2)], operands={"B": np.ones((4, 2))}),
    ),
    "set_num_threads": lambda: (ucf.set_num_threads, dict(n=2)),
    "read": lambda: (ucf.read, dict(path="/nonexistent.mtx")),
    "write": lambda: (ucf.write, dict(path="/nonexistent-dir/a.mtx", tensor=ucf.from_numpy(A))),
    "Plan.compile": lambda: (
        ucf.program("y(i) = W(i,j)*x(j)", shapes={"x": (3,), "W": (3, 3)})
        .transform(ucf.Policy())
        .compile,
        dict(target="llvm", dtype="float64", static=None),
    ),
    "dask.einsum": lambda: (
        __import__("ucf.dask").dask.einsum,
        dict(stmt="y(i) = A(i,j)*x(j)", formats=None, A=A, x=X),
    ),
    "Schedule.split": lambda: (
        ucf.Schedule().split,
        dict(i="i", outer="i0", inner="i1", factor=4),
    ),
    "Schedule.parallelize": lambda: (
        ucf.Schedule().parallelize,
        dict(i="i", unit="CPUThread"),
    ),
}


@pytest.mark.parametrize("entry", list(ENTRIES))
def test_a_wrong_argument_type_is_a_ucf_error(entry):
    fn, valid = ENTRIES[entry]()
    bad = sweep(fn, **valid)
    assert not bad, "\n".join(bad)


def test_formats_as_a_string_says_what_formats_takes():
    with pytest.raises(ucf.ArgumentError, match=r"ucf.compile: formats= takes a dict .* by tensor"):
        ucf.compile("y(i) = A(i,j) * x(j)", formats="csr")


def test_the_torch_op_refuses_wrong_types():
    pytest.importorskip("torch")
    op = ucf.torch.op("y(i) = A(i,j) * x(j)")
    bad = sweep(lambda **kw: ucf.torch.op(**kw), stmt="y(i) = A(i,j) * x(j)", formats=None)
    assert not bad, "\n".join(bad)
    assert op is not None
