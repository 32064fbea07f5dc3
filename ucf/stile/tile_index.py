"""SparDA's online index of nonzero micro-tiles (``ucf.stile_index``), built by a kernel.

Dynamic sparsity is known only when a call comes: a ReLU's zeros, a routing mask.
SparDA (PIT) builds, every call, the index of the micro-tiles (say 32 x 1) of a
mask that hold a nonzero, and lets the compute gather those tiles of the dense
data in place.  Over a permutation-invariant variable (``ucf.invariance``) the
tiles may be listed in any order, so the index is built without sorting: here
one thread per row of tiles marks and counts its live tiles, a prefix sum over
the counts gives each row its segment, and the threads fill their segments in
parallel.  The result is a ucf Tensor over the grid of tiles whose tile-column
level is unordered compressed (``Q``): a ucf kernel reads it directly, driving
the loop over tiles while the dense data is located in place (no copy), as in::

    T = ucf.stile_index(mask, (bh, bw))
    A4 = A.reshape(M // bh, bh, K // bw, bw)  # a view: A is not copied
    k = ucf.compile("C(i,a,n) = T(i,k) * A(i,a,k,b) * B(k,b,n)", {"T": "UQ"})

The kernel is generated as LLIR (``ucf.ir``) and compiled like any ucf kernel,
by the LLVM JIT (``llvm``) or the C compiler (``c``). On CUDA the index is SparDA's
online one: threads that find a live tile claim the next slot of its row with
``atomicAdd`` (``ucf.stile.tile_index_cuda``), run on a GPU or on the CPU emulator of
generated CUDA. The CPU builder's kernel is ``ucf.stile.index_kernel``'s.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ucf.errors import OperandError, UnsupportedError, boundary
from ucf.format.format import Format
from ucf.format.tensor import Tensor
from ucf.format.values import index_dtype_of
from ucf.ir import nodes as ir
from ucf.lower import work
from ucf.stile.index_kernel import compiled_index
from ucf.stile.tile_index_cuda import compiled_cuda

#: Where the index builds from LLIR on the CPU, and where dynamic kernels run.
TARGETS = ("llvm", "c")
#: Where ``stile_index`` runs: the CPU targets, and CUDA (a GPU, or its emulator).
INDEX_TARGETS = (*TARGETS, "cuda")


@boundary
def stile_index(
    mask: Any,
    granularity: tuple[int, ...],
    target: str = "llvm",
    dtype: Any = np.float32,
    index_dtype: Any = "int32",
    emulate: bool = False,
) -> Tensor:
    """The nonzero ``granularity`` micro-tiles of ``mask`` as a ``U...UQ`` Tensor.

    ``granularity`` has one tile extent per mode of the mask. The tensor's shape is
    the grid of tiles (the last tile of a mode may be partial); entry (I, ..., J) is
    stored, with value 1, when that tile of the mask holds a nonzero. The tiles of
    every mode but the last are dense levels; within one of their rows the tile
    columns come in whatever order the kernel wrote them (the last level is
    unordered: ``Q``). ``target`` is ``"llvm"``, ``"c"`` or ``"cuda"`` (a GPU through
    pycuda, or with ``emulate=True`` the CPU emulator of generated CUDA). A mask that
    is not C-contiguous is copied into one first.
    """
    a = mask_array(mask, "stile_index: the mask")
    g = check_granularity(granularity, a.ndim, "stile_index")
    return build(a, g, target, dtype, index_dtype, emulate)


def mask_array(mask: Any, what: str) -> np.ndarray:
    """``mask`` as a C-contiguous array the kernel reads (booleans as bytes)."""
    a = np.asarray(mask)
    if a.ndim == 0:
        raise OperandError(f"{what} must have at least one mode, got a scalar")
    if a.dtype == np.bool_:
        a = a.view(np.uint8)
    if a.dtype.name not in ir.NUMPY_TO_IR:
        raise OperandError(f"{what} has dtype {a.dtype}, which a mask cannot have")
    return np.ascontiguousarray(a)


def check_granularity(granularity: Any, order: int, who: str) -> tuple[int, ...]:
    """``granularity`` as a tuple of ``order`` positive ints, else an OperandError."""
    g = tuple(granularity) if isinstance(granularity, tuple | list) else ()
    if len(g) != order or not all(
        isinstance(x, int | np.integer) and not isinstance(x, bool) and x >= 1 for x in g
    ):
        raise OperandError(
            f"{who}: the granularity must be {order} positive integers (one tile extent "
            f"per mode), got {granularity!r}"
        )
    return tuple(int(x) for x in g)


def build(
    mask: np.ndarray,
    granularity: tuple[int, ...],
    target: str = "llvm",
    dtype: Any = np.float32,
    index_dtype: Any = "int32",
    emulate: bool = False,
    ordered: bool = False,
) -> Tensor:
    """The index of a checked C-contiguous ``mask`` (see ``stile_index``): what dynamic
    kernels call on every call. ``ordered`` labels it with ``index_format`` (what a
    dynamic kernel compiled with that format takes); else it is ``Format.dynamic``, as
    ``stile_index`` documents on every target."""
    if target not in INDEX_TARGETS:
        raise UnsupportedError(f"stile_index runs on {', '.join(INDEX_TARGETS)}, not {target!r}")
    if emulate and target != "cuda":
        raise UnsupportedError(
            "stile_index: emulate=True runs generated CUDA and needs target='cuda'"
        )
    idt = index_dtype_of(index_dtype)
    grid = tuple(-(-n // b) for n, b in zip(mask.shape, granularity, strict=True))
    rows, kb = int(np.prod(grid[:-1], dtype=np.int64)), grid[-1]
    if rows * kb > np.iinfo(idt).max:
        raise OperandError(f"stile_index: {rows * kb} tiles do not fit index dtype {idt}")
    types = ir.NUMPY_TO_IR[mask.dtype.name], ir.NUMPY_TO_IR[idt.name]
    flags = np.zeros(rows * kb, dtype=np.int32)
    pos = np.zeros(rows + 1, dtype=idt)
    crd = np.empty(max(rows * kb, 1), dtype=idt)
    if target == "cuda":
        run = compiled_cuda(*types, mask.ndim, emulate)
        run(mask, *mask.shape, *granularity, flags, pos, np.empty(max(rows, 1), dtype=idt), crd)
    else:
        call, _ = compiled_index(target, *types, granularity, work.threshold())
        call(mask.ctypes.data, *mask.shape, flags.ctypes.data, pos.ctypes.data, crd.ctypes.data)
    n = int(pos[-1])
    levels = [*({} for _ in grid[:-1]), {"pos": pos, "crd": crd[:n]}]
    vals = np.ones(n, dtype=dtype)
    fmt = index_format(len(grid), target) if ordered else Format.dynamic(len(grid))
    return Tensor(grid, fmt, levels, vals, index_dtype=idt, check=False)


def index_format(order: int, target: str) -> Format:
    """The format the index built on ``target`` truly has: a CPU thread fills its row's
    segment scanning the tile columns in order, so there its last level is ordered
    compressed, and a kernel may co-iterate it with other sparse operands or visit
    every coordinate beside it; CUDA's threads claim slots in any order."""
    return Format.dynamic(order) if target == "cuda" else Format.compressed(order, order - 1)
