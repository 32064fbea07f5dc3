"""The peers of bench/peers.py behind one small interface each: MKL's inspector-executor
(through ctypes on the libmkl_rt that sparse_dot_mkl loads), SuiteSparse:GraphBLAS
(python-graphblas) and TACO (the C files in bench/taco/, which TACO generated).

Every peer is set up outside the timing (MKL's handle, hint and ``mkl_sparse_optimize``,
GraphBLAS's matrices, TACO's ``taco_tensor_t`` structs and its compiled library) and
timed on the call alone, as ucf is.
"""

from __future__ import annotations

import ctypes
import os
import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from spmv_spmm import load_mkl

TACO_DIR = Path(__file__).resolve().parent / "taco"

# --------------------------------------------------------------------------- MKL


class _Descr(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("mode", ctypes.c_int), ("diag", ctypes.c_int)]


_NON_TRANSPOSE, _GENERAL, _ROW_MAJOR, _ZERO_BASED = 10, 20, 101, 0


class Mkl:
    """MKL's inspector-executor on float64 CSR with 32-bit indices: a handle per matrix
    and thread count, with the operation's hint and ``mkl_sparse_optimize`` given before
    any timing (in the untimed check call of each row and thread count)."""

    def __init__(self):
        module, self.version = load_mkl()
        if module is None:
            raise RuntimeError(self.version)
        self.module = module
        self.lib = ctypes.CDLL(os.environ["MKL_RT"])
        self.descr = _Descr(_GENERAL, 0, 0)
        self._keep: list[Any] = []

    def threads(self, n: int) -> None:
        self.module.mkl_set_num_threads(n)

    def _per_thread_count(self, make):
        """A getter of the handle ``make()`` builds for MKL's current thread count, built
        on first use at that count. ``mkl_sparse_optimize`` fixes the threads a handle
        runs on: a handle optimized at 2 threads kept running on 2 after
        ``mkl_set_num_threads(1)`` (process CPU time twice the wall time), so one
        handle shared by the 1- and 2-thread rows timed MKL's 2 threads as its 1."""
        handles: dict[int, Any] = {}

        def get():
            n = self.lib.MKL_Get_Max_Threads()
            if n not in handles:
                handles[n] = make()
            return handles[n]

        return get

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"MKL {what} returned status {status}")

    def handle(self, m: sp.csr_matrix, hint: str, calls: int = 1000, columns: int = 0):
        """An optimized handle of ``m`` for ``hint`` ("mv" or "mm")."""
        m = sp.csr_matrix(m)
        indptr = np.ascontiguousarray(m.indptr, dtype=np.int32)
        indices = np.ascontiguousarray(m.indices, dtype=np.int32)
        data = np.ascontiguousarray(m.data, dtype=np.float64)
        self._keep += [indptr, indices, data]
        h = ctypes.c_void_p()
        p32 = ctypes.POINTER(ctypes.c_int32)
        self._check(
            self.lib.mkl_sparse_d_create_csr(
                ctypes.byref(h),
                _ZERO_BASED,
                m.shape[0],
                m.shape[1],
                indptr.ctypes.data_as(p32),
                indptr[1:].ctypes.data_as(p32),
                indices.ctypes.data_as(p32),
                data.ctypes.data_as(ctypes.POINTER(ctypes.c_double)),
            ),
            "create_csr",
        )
        if hint == "mv":
            status = self.lib.mkl_sparse_set_mv_hint(h, _NON_TRANSPOSE, self.descr, calls)
        else:
            status = self.lib.mkl_sparse_set_mm_hint(
                h, _NON_TRANSPOSE, self.descr, _ROW_MAJOR, columns, calls
            )
        self._check(status, f"set_{hint}_hint")
        self._check(self.lib.mkl_sparse_optimize(h), "optimize")
        return h

    def spmv(self, m: sp.csr_matrix):
        handle = self._per_thread_count(lambda: self.handle(m, "mv"))
        mv = self.lib.mkl_sparse_d_mv
        mv.argtypes = [
            ctypes.c_int,
            ctypes.c_double,
            ctypes.c_void_p,
            _Descr,
            ctypes.c_void_p,
            ctypes.c_double,
            ctypes.c_void_p,
        ]

        def call(x: np.ndarray) -> np.ndarray:
            y = np.empty(m.shape[0])
            h = handle()
            self._check(
                mv(_NON_TRANSPOSE, 1.0, h, self.descr, x.ctypes.data, 0.0, y.ctypes.data), "d_mv"
            )
            return y

        return call

    def spmm(self, m: sp.csr_matrix, columns: int):
        handle = self._per_thread_count(lambda: self.handle(m, "mm", columns=columns))
        mm = self.lib.mkl_sparse_d_mm
        mm.argtypes = [
            ctypes.c_int,
            ctypes.c_double,
            ctypes.c_void_p,
            _Descr,
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_double,
            ctypes.c_void_p,
            ctypes.c_int64,
        ]

        def call(b: np.ndarray) -> np.ndarray:
            c = np.empty((m.shape[0], b.shape[1]))
            n = b.shape[1]
            h = handle()
            self._check(
                mm(
                    _NON_TRANSPOSE,
                    1.0,
                    h,
                    self.descr,
                    _ROW_MAJOR,
                    b.ctypes.data,
                    n,
                    n,
                    0.0,
                    c.ctypes.data,
                    n,
                ),
                "d_mm",
            )
            return c

        return call

    def spgemm(self, a: sp.csr_matrix, b: sp.csr_matrix):
        """sparse_dot_mkl's CSR times CSR into CSR (MKL's ``mkl_sparse_spmm`` and the
        export), the whole call."""
        return lambda: self.module.dot_product_mkl(a, b)


# --------------------------------------------------------------------------- GraphBLAS


def graphblas(threads: int):
    """python-graphblas on SuiteSparse:GraphBLAS, with its thread count set."""
    import graphblas as gb

    gb.ss.config["nthreads"] = threads
    return gb


# --------------------------------------------------------------------------- TACO


class _TacoTensor(ctypes.Structure):
    _fields_ = [
        ("order", ctypes.c_int32),
        ("dimensions", ctypes.POINTER(ctypes.c_int32)),
        ("csize", ctypes.c_int32),
        ("mode_ordering", ctypes.POINTER(ctypes.c_int32)),
        ("mode_types", ctypes.POINTER(ctypes.c_int)),
        ("indices", ctypes.POINTER(ctypes.POINTER(ctypes.c_void_p))),
        ("vals", ctypes.c_void_p),
        ("fill_value", ctypes.c_void_p),
        ("vals_size", ctypes.c_int32),
    ]


@dataclass
class TacoTensor:
    """A ``taco_tensor_t`` over numpy arrays (kept alive here). ``levels`` gives each
    stored level's kind, "d" or "s", in storage order; ``arrays`` each sparse level's
    ``(pos, crd)``."""

    struct: _TacoTensor
    keep: list

    @property
    def ref(self):
        return ctypes.byref(self.struct)


def taco_tensor(
    dims: tuple[int, ...],
    levels: str,
    order: tuple[int, ...] | None = None,
    arrays: dict[int, tuple[np.ndarray, np.ndarray]] | None = None,
    vals: np.ndarray | None = None,
) -> TacoTensor:
    n = len(dims)
    order = order or tuple(range(n))
    keep: list = []

    def c_array(ctype, items):
        a = (ctype * max(len(items), 1))(*items)
        keep.append(a)
        return a

    per_level = []
    for lvl, kind in enumerate(levels):
        if kind == "s" and arrays and lvl in arrays:
            pos, crd = (np.ascontiguousarray(x, dtype=np.int32) for x in arrays[lvl])
            keep += [pos, crd]
            slots = c_array(ctypes.c_void_p, [pos.ctypes.data, crd.ctypes.data])
        else:
            slots = c_array(ctypes.c_void_p, [None, None])  # an output's, or a dense level
        per_level.append(ctypes.cast(slots, ctypes.POINTER(ctypes.c_void_p)))
    indices = c_array(ctypes.POINTER(ctypes.c_void_p), per_level)
    if vals is not None:
        vals = np.ascontiguousarray(vals, dtype=np.float64)
        keep.append(vals)
    struct = _TacoTensor(
        n,
        c_array(ctypes.c_int32, dims),
        8,
        c_array(ctypes.c_int32, order),
        c_array(ctypes.c_int, [1 if k == "s" else 0 for k in levels]),
        indices,
        None if vals is None else vals.ctypes.data,
        None,
        0 if vals is None else len(vals),
    )
    return TacoTensor(struct, keep)


def csr_tensor(m: sp.csr_matrix) -> TacoTensor:
    return taco_tensor(m.shape, "ds", arrays={1: (m.indptr, m.indices)}, vals=m.data)


def dense_tensor(a: np.ndarray, order: tuple[int, ...] | None = None) -> TacoTensor:
    """A dense tensor stored in ``order`` (its modes' storage order): a numpy array whose
    memory layout is that order (C order for the identity, F for the reverse)."""
    stored = a if order is None else np.ascontiguousarray(np.transpose(a, order))
    return taco_tensor(a.shape, "d" * a.ndim, order, vals=stored.ravel())


_libc = ctypes.CDLL(None)


def output_arrays(t: TacoTensor, levels: str, nvals: int | None = None) -> dict:
    """Copies of the arrays a TACO kernel allocated for an output (then freed)."""
    s = t.struct
    got: dict = {}
    parent = 1
    for lvl, kind in enumerate(levels):
        if kind == "d":
            parent *= s.dimensions[s.mode_ordering[lvl]]
            continue
        pos_p, crd_p = s.indices[lvl][0], s.indices[lvl][1]
        pos = np.ctypeslib.as_array(
            ctypes.cast(pos_p, ctypes.POINTER(ctypes.c_int32)), (parent + 1,)
        ).copy()
        crd = np.ctypeslib.as_array(
            ctypes.cast(crd_p, ctypes.POINTER(ctypes.c_int32)), (max(int(pos[-1]), 1),)
        ).copy()[: int(pos[-1])]
        got[lvl] = (pos, crd)
        parent = int(pos[-1])
    n = parent if nvals is None else nvals
    got["vals"] = np.ctypeslib.as_array(
        ctypes.cast(s.vals, ctypes.POINTER(ctypes.c_double)), (max(n, 1),)
    ).copy()[:n]
    return got


def free_output(t: TacoTensor, levels: str) -> None:
    """Free what a TACO kernel malloc'ed for an output, and forget it."""
    s = t.struct
    for lvl, kind in enumerate(levels):
        if kind == "s":
            for q in (0, 1):
                if s.indices[lvl][q]:
                    _libc.free(ctypes.c_void_p(s.indices[lvl][q]))
                    s.indices[lvl][q] = None
    if s.vals:
        _libc.free(ctypes.c_void_p(s.vals))
        s.vals = None


@dataclass
class TacoKernel:
    """One generated file: the command that made it, and its compiled functions."""

    name: str
    command: str
    lib: ctypes.CDLL

    def function(self, name: str):
        return getattr(self.lib, name)


def taco_kernels() -> dict[str, TacoKernel]:
    """Every file in bench/taco/, compiled as TACO's own benchmarks build it:
    ``cc -O3 -march=native -fopenmp`` (``UCF_CC`` picks the compiler)."""
    cc = shlex.split(os.environ.get("UCF_CC", "cc"))
    out = Path(tempfile.mkdtemp(prefix="taco-peers-"))
    kernels = {}
    for src in sorted(TACO_DIR.glob("*.c")):
        lib = out / f"{src.stem}.so"
        cmd = [
            *cc,
            "-O3",
            "-march=native",
            "-fopenmp",
            "-fPIC",
            "-shared",
            "-w",
            "-o",
            str(lib),
            str(src),
            "-lm",
        ]
        subprocess.run(cmd, check=True)
        made = re.search(r"^// (taco .*)$", src.read_text(), re.M)  # TACO's own header
        kernels[src.stem] = TacoKernel(
            src.stem, made.group(1) if made else "?", ctypes.CDLL(str(lib))
        )
    return kernels
