"""Block costs measured on this machine, for ``ucf.Policy(blocks="measure")``.

The weighted block cover needs what a block of each shape costs. SparTA profiles
its kernels; here each cost is the time of ucf's own SpMM over a matrix stored
fully (0 % sparsity) in blocks of that shape (CSR for single elements), divided by
the number of blocks. Each measurement is taken once and kept in the kernel
cache, under the shape, dtype, thread count and ucf's code version.
"""

from __future__ import annotations

import time

import numpy as np

#: The shapes measured by default: single elements and square blocks.
MEASURED = ((1, 1), (8, 8), (32, 32))
#: The SpMM measured: a ROWS x COLS blocked matrix times a dense COLS x N matrix.
ROWS, COLS, N = 256, 256, 32
SPMM = "C(i,k) = A(i,j) * B(j,k)"


def measured_costs(
    shapes: tuple[tuple[int, int], ...] = MEASURED, dtype: str = "float32", repeat: int = 5
) -> dict[tuple[int, int], float]:
    """Seconds per block of each shape in ``shapes`` (cached after the first time)."""
    return {tuple(shape): _cost(tuple(shape), dtype, repeat) for shape in shapes}


def _cost(shape: tuple[int, int], dtype: str, repeat: int) -> float:
    from ucf.exec.kernel import Kernel
    from ucf.format.construction import from_numpy
    from ucf.format.format import Format
    from ucf.toolchain import cache
    from ucf.toolchain.jit import num_threads

    fields = {
        "kind": "tesa block cost",
        "block": list(shape),
        "dtype": dtype,
        "threads": num_threads(),
        "spmm": [ROWS, COLS, N],
        "code": cache.code_version(),
    }
    name = f"{cache.key(fields)}.cost"
    cost = cache.load(name, fields)
    if cost is not None:
        return cost
    fmt = Format.compressed(2, 1) if shape == (1, 1) else Format.blocked_rows(*shape)
    kernel = Kernel(SPMM, {"A": fmt}, dtype=dtype)
    a = from_numpy(np.ones((ROWS, COLS), dtype=dtype), format=fmt)
    b = np.ones((COLS, N), dtype=dtype)
    kernel(A=a, B=b)  # the first call binds and allocates
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        kernel(A=a, B=b)
        best = min(best, time.perf_counter() - start)
    cost = best * shape[0] * shape[1] / (ROWS * COLS)
    cache.store(name, fields, cost)
    return cost
