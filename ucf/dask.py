"""Sparse einsum over Dask arrays: ucf kernels on blocks, Dask for everything between.

A statement's index variables become ``dask.array.blockwise`` indices, so Dask
pairs up the blocks of its operands the way the statement pairs up their
modes. Each block product is one call of a ucf kernel, compiled once per
process (the disk cache hands a kernel built by one process to the others on
the same machine). A contracted variable that sums the whole right-hand side
(``C(i,k) = A(i,j) * B(j,k)``) keeps its block axis in the per-block results,
and a Dask tree reduction adds them up; a contraction nested inside (``A(i,j) *
x(j) + b(i)``) gets its blocks concatenated instead, since adding partial
results would count ``b`` once per block. ``docs/distributed.md`` describes how
this maps onto clusters and what it costs.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ucf.errors import OperandError, ShapeError, UcfError, UnsupportedError, boundary
from ucf.format.construction import from_coo
from ucf.format.format import parse_format
from ucf.format.interop import as_tensor
from ucf.format.tensor import Tensor
from ucf.format.values import value_dtype
from ucf.lang.ast import Sum, accesses
from ucf.lang.parser import parse_statement

INSTALL = "pip install dask distributed (or pip install '.[dask]' in a ucf checkout)"

#: Kinds of sparse output chunks: scipy matrix or array, pydata/sparse, ucf Tensor.
SCIPY_MATRIX, SCIPY_ARRAY, PYDATA, UCF = "scipy-matrix", "scipy-array", "pydata", "ucf"


def _dask_array():
    try:
        import dask.array as da
    except ImportError:
        raise UcfError(f"ucf.dask needs dask and distributed: {INSTALL}") from None
    return da


@dataclass(frozen=True)
class _Plan:
    """What every task needs to run its block: small, hashable and picklable, so Dask
    ships it to workers once per graph layer."""

    statement: str
    formats: tuple[tuple[str, str], ...]
    schedule: str | None
    target: str
    dtype: str
    names: tuple[str, ...]  # the operand of each block argument, in order
    scalars: tuple[tuple[str, Any], ...]  # order-0 operands given as plain numbers
    output_format: str | None  # None: dense output
    chunk_kind: str | None  # sparse output chunks: SCIPY_MATRIX, SCIPY_ARRAY, PYDATA or UCF
    partial: bool  # blocks are partial sums, added up by a reduction afterwards


@boundary
def einsum(
    stmt: str,
    formats: dict[str, Any] | None = None,
    schedule: str | None = None,
    target: str = "llvm",
    **operands: Any,
) -> Any:
    """``stmt`` over Dask arrays, as a Dask array with the output's chunks.

    Operands are Dask arrays whose chunks are numpy arrays, scipy.sparse matrices
    or arrays, pydata/sparse arrays or ucf Tensors; plain numbers stand for order-0
    operands, and a numpy or scipy array is taken as one chunk (Dask rechunks it to
    match the others). ``formats`` gives the format a kernel reads an operand in
    (its chunks are converted), defaulting to what the chunks are (CSR for scipy CSR,
    dense for numpy); giving the output a sparse format makes sparse output chunks,
    of the kind of the first sparse operand's chunks (scipy for matrices), else ucf
    Tensors. Operands that share an index variable should share their chunks along
    it, or Dask rechunks them to a common refinement first.
    """
    da = _dask_array()

    parsed = parse_statement(stmt)
    lhs_vars = _plain_variables(parsed.lhs.tensor, parsed.lhs.indices)
    reads = _reads(parsed, lhs_vars, operands)

    arrays: dict[str, Any] = {}
    scalars: dict[str, Any] = {}
    for name, index in reads.items():
        value = operands[name]
        if not index and not isinstance(value, da.Array) and np.ndim(value) == 0:
            scalars[name] = value
            continue
        arrays[name] = _as_dask(da, value, name)
        if arrays[name].ndim != len(index):
            raise ShapeError(
                f"operand {name} has order {arrays[name].ndim} (shape {arrays[name].shape}) but "
                f"is accessed with {len(index)} indices"
            )
    _check_extents(arrays, reads)

    fmts = {
        k: str(parse_format(v, order=len(reads.get(k, parsed.lhs.indices))))
        for k, v in (formats or {}).items()
    }
    for name, arr in arrays.items():
        if name not in fmts:
            found = _chunk_format(arr._meta, arr.ndim)
            if found is not None:
                fmts[name] = found
    dtype = value_dtype(
        np.result_type(
            *(a.dtype for a in arrays.values()), *(np.asarray(v) for v in scalars.values())
        )
    )
    out_name = parsed.lhs.tensor
    output_format = fmts.get(out_name)
    if output_format is not None and parse_format(output_format, len(lhs_vars)).is_dense:
        output_format = None
    split = _split_variables(parsed.rhs, arrays, reads)
    if split and output_format is not None:
        unordered = [
            k for k, lvl in enumerate(parse_format(output_format).levels) if not lvl.ordered
        ]
        if unordered:
            raise UnsupportedError(
                f"output {out_name} in '{output_format}': partial results over the blocks of "
                f"{', '.join(split)} are added, and level {unordered[0]} is unordered, which "
                f"cannot be merged; give {', '.join(split)} one block, or an ordered format"
            )
    plan = _Plan(
        statement=stmt,
        formats=tuple(sorted(fmts.items())),
        schedule=None if schedule is None else str(schedule),
        target=target,
        dtype=str(dtype),
        names=tuple(arrays),
        scalars=tuple(sorted(scalars.items())),
        output_format=output_format,
        chunk_kind=None if output_format is None else _chunk_kind(arrays, len(lhs_vars)),
        partial=bool(split),
    )
    _kernel(plan, np.dtype(np.int32).str)  # errors in the statement, formats or schedule now
    meta = _meta(plan, len(lhs_vars))
    args = [x for name, arr in arrays.items() for x in (arr, reads[name])]
    # Dask hands a task the blocks along a variable missing from the output joined into
    # one (concatenate=True), which copies even a lone block: a whole dense B per task.
    # When every such variable has one block, the tasks take the blocks as they are.
    joined = set(lhs_vars) | set(split)
    whole = all(
        arr.numblocks[m] == 1
        for name, arr in arrays.items()
        for m, v in enumerate(reads[name])
        if v not in joined
    )
    blocks = da.blockwise(
        functools.partial(_block, plan),
        (*lhs_vars, *split),
        *args,
        adjust_chunks=dict.fromkeys(split, 1),
        dtype=dtype,
        # Partial sums are Tensors for a sparse output, whose order has no room for the
        # contracted block axes; nothing reads their meta, which only has to exist.
        meta=meta if not split else np.empty((0,) * (len(lhs_vars) + len(split)), dtype),
        concatenate=not whole,
    )
    if not split:
        return blocks
    return da.reduction(
        blocks,
        _unchanged,
        functools.partial(_sum_parts, plan, True),
        combine=functools.partial(_sum_parts, plan, False),
        axis=tuple(range(len(lhs_vars), len(lhs_vars) + len(split))),
        concatenate=False,
        dtype=dtype,
        meta=meta,
    )


@boundary
def balanced_rows(matrix: Any, blocks: int, row_weight: float = 1.0) -> tuple[int, ...]:
    """Row chunk sizes that cut a sparse matrix into ``blocks`` pieces of about equal
    work, for ``dask.array.from_array(m, chunks=(balanced_rows(m, p), -1))``.

    Rows of equal count hold very unequal work in skewed (power-law) matrices, and the
    slowest block sets the pace of a Dask step. Equal nonzeros are not equal work
    either: a block of many short rows writes many more output rows. So a block's work
    is counted as its nonzeros plus ``row_weight`` per row; the default of 1 is what an
    SpMM with a dense output measures (a row costs about as much as one nonzero), and
    ``row_weight=0`` balances nonzeros alone."""
    import scipy.sparse as sp

    if not sp.issparse(matrix) or len(matrix.shape) != 2:
        raise OperandError(
            f"balanced_rows takes a scipy.sparse matrix, got {type(matrix).__name__}"
        )
    if isinstance(blocks, bool) or not isinstance(blocks, (int, np.integer)) or blocks < 1:
        raise OperandError(f"balanced_rows needs a positive number of blocks, got {blocks!r}")
    if isinstance(row_weight, bool) or not (
        isinstance(row_weight, (int, float, np.integer, np.floating))
        and np.isfinite(row_weight)
        and row_weight >= 0
    ):
        raise OperandError(
            f"balanced_rows needs a finite row_weight of at least 0, got {row_weight!r}"
        )
    indptr = matrix.tocsr().indptr
    work = indptr + float(row_weight) * np.arange(len(indptr))
    targets = np.linspace(0, work[-1], int(blocks) + 1)[1:-1]
    cuts = np.searchsorted(work, targets, side="left")
    edges = np.concatenate(([0], cuts, [matrix.shape[0]]))
    return tuple(int(n) for n in np.diff(edges))


# --------------------------------------------------------------------------- graph building


def _reads(
    parsed: Any, lhs_vars: tuple[str, ...], operands: dict[str, Any]
) -> dict[str, tuple[str, ...]]:
    """Each operand's index variables, after the checks that make the statement one
    Dask can run: ``=``, one index list per tensor, every output variable read."""
    stmt = parsed.text
    if parsed.op != "=":
        raise UnsupportedError(
            f"ucf.dask.einsum computes a new array; '{parsed.op}' into an existing one is not "
            f"supported ({stmt})"
        )
    if len(set(lhs_vars)) != len(lhs_vars):
        raise UnsupportedError(f"output {parsed.lhs} repeats an index variable")
    reads: dict[str, tuple[str, ...]] = {}
    for a in accesses(parsed.rhs):
        index = _plain_variables(a.tensor, a.indices)
        if reads.setdefault(a.tensor, index) != index:
            raise UnsupportedError(
                f"tensor {a.tensor} is read as {a.tensor}({', '.join(reads[a.tensor])}) and as "
                f"{a}; on Dask arrays each tensor is read with one index, so pass the second "
                "read as an operand of its own name"
            )
    unknown = sorted(set(operands) - set(reads))
    if unknown:
        raise OperandError(
            f"unknown operand {unknown[0]}: the statement reads {', '.join(sorted(reads))}"
        )
    missing = sorted(set(reads) - set(operands))
    if missing:
        raise OperandError(f"missing operand {missing[0]} for {stmt}")
    rhs_vars = {v for index in reads.values() for v in index}
    alone = [v for v in lhs_vars if v not in rhs_vars]
    if alone:
        raise UnsupportedError(
            f"index variable {alone[0]} appears only in the output {parsed.lhs}; on Dask arrays "
            "every output variable must index an operand"
        )
    return reads


def _plain_variables(tensor: str, indices: Sequence[Any]) -> tuple[str, ...]:
    """The access's index variables; affine or constant indices have no block mapping."""
    names = []
    for m, idx in enumerate(indices):
        if idx.single_variable is None:
            raise UnsupportedError(
                f"index '{idx}' of {tensor} (mode {m}) is not a plain index variable; "
                "ucf.dask.einsum maps each variable onto a Dask block axis, which affine "
                "indices such as convolution windows do not have (use ucf.einsum on one "
                "machine)"
            )
        names.append(idx.single_variable)
    return tuple(names)


def _as_dask(da, value: Any, name: str):
    if isinstance(value, da.Array):
        return value
    if isinstance(value, Tensor):
        raise OperandError(
            f"operand {name} is a ucf Tensor; wrap it into a Dask array (for instance "
            "dask.array.from_array(t.to_scipy(), asarray=False)) or pass it to ucf.einsum"
        )
    if isinstance(value, np.ndarray) or _is_scipy(value) or _is_pydata(value):
        return da.from_array(value, chunks=-1, asarray=False)
    raise OperandError(
        f"operand {name}: unsupported type {type(value).__name__}; expected a dask.array "
        "(chunks of numpy, scipy.sparse, pydata/sparse or ucf Tensors), a numpy or scipy "
        "array, or a number for an order-0 operand"
    )


def _check_extents(arrays: dict[str, Any], reads: dict[str, tuple[str, ...]]) -> None:
    seen: dict[str, tuple[int, str]] = {}
    for name, arr in arrays.items():
        for m, v in enumerate(reads[name]):
            size = arr.shape[m]
            if np.isnan(size):
                raise ShapeError(
                    f"operand {name} has unknown chunk sizes in mode {m}; call "
                    ".compute_chunk_sizes() on it first"
                )
            who = f"{name} (mode {m})"
            if v in seen and seen[v][0] != size:
                raise ShapeError(
                    f"index variable {v} has extent {seen[v][0]} in {seen[v][1]} but {size} "
                    f"in {who}"
                )
            seen.setdefault(v, (int(size), who))


def _split_variables(
    rhs: Any, arrays: dict[str, Any], reads: dict[str, tuple[str, ...]]
) -> tuple[str, ...]:
    """Reduction variables whose sum covers the whole right-hand side and whose operands
    have several blocks along them: those blocks give partial results that add up.
    Reductions nested deeper, or over one block, are left whole to each task."""
    found: list[str] = []
    while isinstance(rhs, Sum) and rhs.op == "sum":
        found.extend(rhs.vars)
        rhs = rhs.body
    return tuple(
        v
        for v in found
        if any(arr.numblocks[reads[n].index(v)] > 1 for n, arr in arrays.items() if v in reads[n])
    )


def _chunk_format(meta: Any, order: int) -> str | None:
    """The format a chunk like ``meta`` is in; None for dense (or unknown: Dask records
    ucf Tensor chunks as numpy, so their format comes from ``formats``)."""
    if _is_scipy(meta):
        if order != 2:
            return "coo"
        return "csc" if meta.format == "csc" else "csr"
    if _is_pydata(meta):
        return "coo"
    return None


def _chunk_kind(arrays: dict[str, Any], order: int) -> str:
    for arr in arrays.values():
        meta = arr._meta
        if _is_scipy(meta) and order == 2:
            import scipy.sparse as sp

            return SCIPY_MATRIX if sp.isspmatrix(meta) else SCIPY_ARRAY
        if _is_pydata(meta):
            return PYDATA
    return UCF


def _is_scipy(obj: Any) -> bool:
    if not (type(obj).__module__ or "").startswith("scipy"):
        return False
    import scipy.sparse as sp

    return bool(sp.issparse(obj))


def _is_pydata(obj: Any) -> bool:
    return (type(obj).__module__ or "").split(".")[0] == "sparse" and hasattr(obj, "nnz")


def _meta(plan: _Plan, order: int) -> Any:
    """An empty chunk of the output's kind, Dask's record of the chunk type (numpy for
    ucf Tensors, which Dask cannot slice to make one)."""
    if plan.output_format is None or plan.chunk_kind == UCF:
        return np.empty((0,) * order, dtype=plan.dtype)
    empty = Tensor.zeros((0,) * order, format=plan.output_format, dtype=plan.dtype)
    return _final(plan, empty)


# --------------------------------------------------------------------------- tasks


@functools.lru_cache(maxsize=256)
def _kernel(plan: _Plan, index_dtype: str) -> Any:
    """The block kernel, once per process and index dtype (ucf's disk cache makes the
    first call in a process cheap when another process on the machine compiled it)."""
    from ucf.exec.kernel import Kernel

    return Kernel(
        plan.statement, dict(plan.formats), plan.schedule, plan.target, plan.dtype, index_dtype
    )


@functools.lru_cache(maxsize=64)
def _adder(fmt: str, order: int, dtype: str, index_dtype: str) -> Any:
    """A kernel adding two sparse partial results into a third of the same format."""
    from ucf.exec.kernel import Kernel

    index = ",".join(f"i{m}" for m in range(order))
    stmt = f"S({index}) = P({index}) + Q({index})"
    return Kernel(stmt, {"S": fmt, "P": fmt, "Q": fmt}, None, "llvm", dtype, index_dtype)


def _block(plan: _Plan, *blocks: Any) -> Any:
    """One block product: the chunks as ucf operands, the kernel, the result."""
    formats = dict(plan.formats)
    given = {
        name: _operand(_lone(b), formats.get(name), name)
        for name, b in zip(plan.names, blocks, strict=True)
    }
    wide = any(isinstance(t, Tensor) and t.index_dtype == np.int64 for t in given.values())
    kernel = _kernel(plan, np.dtype(np.int64 if wide else np.int32).str)
    result = kernel(**given, **dict(plan.scalars))
    if plan.output_format is None:
        return np.asarray(result)
    return result if plan.partial else _final(plan, result)


def _lone(block: Any) -> Any:
    """The one block Dask passes in a (nested) list along variables it did not join."""
    while isinstance(block, list):
        (block,) = block
    return block


def _operand(block: Any, fmt: str | None, name: str) -> Any:
    if _is_pydata(block):
        coo = block if hasattr(block, "coords") else block.tocoo()
        wide = max(coo.shape, default=0) > np.iinfo(np.int32).max
        return from_coo(
            np.asarray(coo.coords).T,
            np.asarray(coo.data),
            coo.shape,
            format=fmt or "coo",
            index_dtype=np.int64 if wide else np.int32,
        )
    if fmt is None and isinstance(block, np.ndarray):
        return block  # the kernel takes dense arrays as they are
    if fmt is None and isinstance(block, Tensor) and not block.format.is_dense:
        raise OperandError(
            f"the chunks of operand {name} are ucf Tensors in format '{block.format}', which "
            f"Dask does not record; pass formats={{'{name}': '{block.format}'}}"
        )
    return as_tensor(block, format=fmt, name=name)


def _unchanged(block: Any, axis: Any = None, keepdims: bool = False) -> Any:
    return block


def _sum_parts(plan: _Plan, last: bool, parts: Any, axis: Any = None, keepdims: bool = False):
    """Add partial results from blocks of the contracted axes (nested lists of them)."""
    flat = list(_flatten(parts))
    if plan.output_format is None:
        total = flat[0].copy() if len(flat) > 1 else flat[0]
        for p in flat[1:]:
            total += p
        return total
    total = flat[0]
    for p in flat[1:]:
        wide = np.int64 in (total.index_dtype, p.index_dtype)
        add = _adder(
            plan.output_format,
            total.order,
            plan.dtype,
            np.dtype(np.int64 if wide else np.int32).str,
        )
        total = add(P=total, Q=p)
    return _final(plan, total) if last else total


def _flatten(parts: Any):
    if isinstance(parts, list):
        for p in parts:
            yield from _flatten(p)
    else:
        yield parts


def _final(plan: _Plan, t: Tensor) -> Any:
    """A sparse output chunk in the kind ``plan`` asks for."""
    if plan.chunk_kind in (SCIPY_MATRIX, SCIPY_ARRAY):
        return t.to_scipy(matrix=plan.chunk_kind == SCIPY_MATRIX)
    if plan.chunk_kind == PYDATA:
        import sparse

        coords, vals = t.to_coo()
        return sparse.COO(coords.T, vals, shape=t.shape)
    return t


def _concatenate(parts: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Tensors side by side along ``axis``, in the first one's format: how Dask joins
    ucf Tensor chunks (``compute()``, rechunking, blocks of a nested reduction)."""
    coords, vals, offset = [], [], 0
    for t in parts:
        c, v = t.to_coo()
        c = c.copy()
        c[:, axis] += offset
        offset += t.shape[axis]
        coords.append(c)
        vals.append(v)
    first = parts[0]
    shape = (*first.shape[:axis], offset, *first.shape[axis + 1 :])
    wide = max(shape, default=0) > np.iinfo(np.int32).max or any(
        t.index_dtype == np.int64 for t in parts
    )
    return from_coo(
        np.concatenate(coords),
        np.concatenate(vals),
        shape,
        format=first.format,
        dtype=np.result_type(*(t.dtype for t in parts)),
        index_dtype=np.int64 if wide else np.int32,
    )


try:
    from dask.array.dispatch import concatenate_lookup

    concatenate_lookup.register(Tensor, _concatenate)
except ImportError:  # einsum says how to install dask when it is called
    pass
