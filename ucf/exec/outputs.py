"""A kernel call's output: the dense output allocated (or the caller's ``out=``
checked and written in place), a sparse output's arrays sized for the counts the
assemble pass found, and those arrays cut to what the compute pass filled.

Apart from the call path (``ucf.exec.calling``) because it is all memory: what is
allocated, what is taken again from ``ucf.exec.recycled``, zeroed or not, and what a
result may keep or share, for a plan's computed format and a kernel's dtypes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ucf.codegen.kernel_plan import Plan
from ucf.errors import OperandError
from ucf.exec import recycled
from ucf.exec.binding import same_format
from ucf.format.construction import trusted
from ucf.format.format import Format
from ucf.format.tensor import Tensor


def dense_output(plan: Plan, dtype: np.dtype, out: Any, shape: tuple[int, ...]) -> Tensor:
    """The dense output of ``plan``'s kernel computing in ``dtype``: ``out`` (a Tensor,
    or a numpy array wrapped in place) where the kernel can write it as it lies, else
    fresh (zeroed where the kernel adds into it, else taken from ``ucf.exec.recycled``);
    an ``out`` it cannot write is refused with why."""
    fmt = plan.computed_format
    size = math.prod(shape)
    if out is None:
        if plan.statement.op == "+=":
            raise OperandError(f"'+=' needs the output: pass out= for {plan.statement.lhs}")
        # a scalar's empty shape has size 1
        if plan.call_zeroes:
            vals = np.zeros(size, dtype=dtype)
        else:
            vals = recycled.uninitialized((size,), dtype)
        return trusted(shape, fmt, [{} for _ in shape], vals)
    if isinstance(out, Tensor):
        t = out
    else:
        arr = np.asarray(out)
        if (
            arr.dtype != dtype
            or not arr.flags.c_contiguous
            or not same_format(fmt.structure, Format.dense(arr.ndim))
        ):
            if arr.dtype != dtype:
                got = f"{arr.dtype}"
            elif not arr.flags.c_contiguous:
                got = "an array not C-contiguous (" + (
                    "Fortran-ordered)" if arr.flags.f_contiguous else "strided)"
                )
            else:  # the kernel writes its output in another layout
                got = f"a C-ordered array, where the kernel writes '{fmt}'"
            raise OperandError(
                f"out must be a C-contiguous {dtype} numpy array (or a ucf.Tensor in "
                f"format '{fmt}'), got {got}"
            )
        t = trusted(shape, fmt, [{} for _ in shape], arr.reshape(-1))
    if not same_format(t.format.structure, fmt.structure) or t.dtype != dtype:
        raise OperandError(f"out must have format '{fmt}' and dtype {dtype}")
    if plan.call_zeroes:
        t.vals[:] = 0
    return t


def sparse_output(
    plan: Plan,
    dtype: np.dtype,
    index_dtype: np.dtype,
    shape: tuple[int, ...],
    counts: np.ndarray,
    zeroed: bool = True,
) -> Tensor:
    """The arrays of ``plan``'s output for ``counts`` entries per level. The kernel
    writes every position and coordinate it keeps; its values are zeroed unless
    ``zeroed`` is False (a one-pass output stores each value once: zeroing a bound it
    may not fill cost a sparse add of 3.2M entries 5 ms a call, more than a tenth of it).

    What the kernel writes whole comes from ``ucf.exec.recycled``: a large output
    whose last user dropped it is taken again still mapped. SpGEMM 100k's 120 MB of
    output, freshly mapped, cost it 0-194 ms of system time a call on the 2-core VM
    of issue 38, by how long ago (and by whom) memory was freed, against about 80
    ms for the whole product on one thread; from the pool, none."""
    fmt = plan.computed_format
    levels = []
    parent = 1
    top = np.iinfo(index_dtype).max
    order = fmt.mode_order  # a property, computed on each reading
    for lvl, kind in enumerate(fmt.levels):
        dim = shape[order[lvl]]
        count = int(counts[lvl])
        if not 0 <= count <= top:  # the assemble pass counted past its index type
            raise OperandError(
                f"output {plan.statement.lhs.tensor} has more entries at level "
                f"{lvl} than {index_dtype} positions hold (at least {top}); compile "
                "with index_dtype='int64'"
            )
        arrays, parent = kind.allocate(parent, count, dim, index_dtype, recycled.uninitialized)
        levels.append(arrays)
    # a dense level below a stored coordinate holds every place, also those the
    # kernel leaves because their value is the output's fill: they start as it
    if not zeroed:
        vals = recycled.uninitialized((parent,), dtype)
    elif fmt.fill:
        vals = np.full(parent, fmt.fill, dtype=dtype)
    else:
        vals = np.zeros(parent, dtype=dtype)
    # parts already as a Tensor holds them (a Format, dicts, the kernel's index dtype)
    return trusted(tuple(map(int, shape)), fmt, levels, vals, index_dtype)


def trimmed(t: Tensor) -> Tensor:
    """The output with its arrays cut to the sizes the compute pass finished with:
    dropping entries whose segments below stayed empty leaves room at the ends, and a
    one-pass output fills only part of its bound. An array that keeps at most half of
    what was allocated is copied, as scipy prunes, so a result does not hold on to the
    bound's memory (two identical patterns added: half of it)."""
    levels, count = [], 1
    for kind, arrays, m in zip(t.format.levels, t.levels, t.format.mode_order, strict=True):
        arrays = {name: _pruned(a) for name, a in kind.trimmed(arrays, count).items()}
        count = kind.size(arrays, count, t.shape[m])
        levels.append(arrays)
    vals = _pruned(t.vals[:count])
    return trusted(t.shape, t.format, levels, vals, t.index_dtype)


def _pruned(a: np.ndarray) -> np.ndarray:
    """``a``, copied when it is a view of at most half of its allocation."""
    return a.copy() if 2 * a.nbytes <= getattr(a.base, "nbytes", 0) else a


def owned(a: np.ndarray, operand: list[np.ndarray]) -> np.ndarray:
    """``a``, copied where it shares memory with one of the ``operand``'s arrays (a
    conversion may keep those that come out unchanged: an output must not alias its
    operand)."""
    return a.copy() if any(np.may_share_memory(a, b) for b in operand) else a
