"""PyTorch tensors to and from ucf tensors, layout by layout.

torch stores its sparse layouts in the same arrays ucf's formats do: a
``sparse_csr`` tensor is format ``UC`` (``crow_indices`` is ``pos``,
``col_indices`` is ``crd``), ``sparse_csc`` is ``UC:1,0``, ``sparse_bsr`` with
R x C blocks is ``UCUU:0/R,1/C,0%R,1%C`` and a coalesced ``sparse_coo`` is
``CS...``. So conversion in either direction shares the buffers (through
numpy's views of CPU tensors) whenever the dtypes match and the arrays are in
canonical order; everything else is repacked.

torch is optional: it is imported on first use, and its absence is a
:class:`MissingDependencyError` with the pip command.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ucf.errors import MissingDependencyError, OperandError, UnsupportedError, boundary
from ucf.format.construction import from_coo, from_numpy, plain_values
from ucf.format.format import CSC, CSR, Format, parse_format
from ucf.format.levels import checks
from ucf.format.scipy_layouts import from_compressed
from ucf.format.storage import foreign_type, zero_filled
from ucf.format.tensor import BUILDERS, Tensor, held
from ucf.format.values import VALUES, index_dtype_of, value_dtype

#: torch's value dtypes that ucf kernels read, by name (torch.float64 -> "float64").
VALUE_NAMES = tuple(VALUES)


def need_torch(feature: str = "this") -> Any:
    """The torch module, or a MissingDependencyError saying how to install it."""
    try:
        import torch
    except ImportError:
        raise MissingDependencyError(
            f"{feature} needs PyTorch, which is not installed: pip install torch (or pip "
            "install '.[torch]' in a ucf checkout)"
        ) from None
    return torch


def is_torch(obj: Any) -> bool:
    """Whether ``obj`` is a torch tensor, without importing torch when it cannot be one."""
    if not (type(obj).__module__ or "").startswith("torch"):
        return False
    import torch

    return isinstance(obj, torch.Tensor)


def _describe(t: Any) -> str:
    layout = str(t.layout).removeprefix("torch.")
    return f"torch.Tensor ({layout}, shape {tuple(t.shape)}, {t.dtype})"


def _values(torch: Any, v: Any, dtype: Any, where: str, fmt: Format | None) -> np.ndarray:
    """A numpy view of torch values (a cast copy when ``dtype``, or the values ``fmt``
    states, ask for another)."""
    if fmt is not None and fmt.values is not None:
        dtype = fmt.stored_dtype(dtype, np.float64)
    if dtype is not None:
        dt = value_dtype(dtype)
        if v.is_complex():
            raise OperandError(f"{where}: complex values cannot be cast to {dt}")
        return v.to(getattr(torch, dt.name)).numpy()
    if v.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds each one exactly
        return v.to(torch.float32).numpy()
    if str(v.dtype).removeprefix("torch.") not in VALUE_NAMES:
        raise OperandError(
            f"{where}: value dtype {v.dtype} is not supported; use one of "
            f"{', '.join(VALUE_NAMES)}, pass dtype= to cast, or give a format holding "
            "bfloat16 values (format='csr@bfloat16')"
        )
    return v.numpy()


def _bsr_format(rows: int, cols: int) -> Format:
    """The blocked format of torch's ``sparse_bsr`` with rows x cols blocks."""
    return parse_format(f"UCUU:0/{rows},1/{cols},0%{rows},1%{cols}", order=2)


@boundary
def from_torch(t: Any, format: Any = None, dtype: Any = None, index_dtype: Any = None) -> Tensor:
    """A ucf Tensor from a CPU torch tensor of layout strided, sparse_csr, sparse_csc,
    sparse_coo or sparse_bsr.

    The format defaults to the layout's own (dense, ``csr``, ``csc``, ``coo``,
    ``UCUU:0/R,1/C,0%R,1%C`` for R x C blocks) and the index dtype to torch's
    (int64 unless the tensor was built with int32 indices). In that format, with
    those dtypes, the result shares torch's buffers: a C-contiguous strided tensor,
    a CSR, CSC or BSR tensor whose indices are sorted within each row (column), and
    a coalesced COO tensor (whose 2-entry root ``pos`` alone is new). Anything
    else copies: another format, dtype or index dtype, a non-contiguous strided
    tensor, unsorted indices, an uncoalesced COO tensor (duplicates are summed, as
    torch's ``coalesce`` does), index or value arrays that are strided views.
    Autograd history is dropped (``detach``).

    A format holding bfloat16, int4 or quantized values (``'csr@qint8:0'``) converts
    the numbers as :func:`ucf.from_numpy` does (a bfloat16 tensor is widened to
    float32 first, exactly). torch's own quantized tensors are refused: dequantize
    them, or give their scales to :func:`ucf.quantize`.
    """
    torch = need_torch("ucf.from_torch")
    if not isinstance(t, torch.Tensor):
        raise OperandError(f"from_torch expects a torch.Tensor, got {foreign_type(t)}")
    where = _describe(t)
    if t.device.type != "cpu":
        raise OperandError(f"{where} is on device {t.device}; ucf reads CPU memory: pass t.cpu()")
    if t.is_quantized:
        raise UnsupportedError(
            f"{where}: torch's quantized tensors are not read as they are; pass "
            "t.dequantize() with a quantized format (format='dense@qint8'), or ucf.quantize("
            "t.dequantize().numpy(), format=..., scale=..., zero_point=...) to keep its scales"
        )
    t = t.detach().resolve_conj().resolve_neg()
    layout = t.layout
    if layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr):
        if t.dim() != 2 or t.values().dim() != (3 if layout == torch.sparse_bsr else 1):
            raise UnsupportedError(
                f"{where}: batched or hybrid compressed tensors are not supported; "
                "ucf reads matrices with scalar (or block) values"
            )
    if layout == torch.sparse_coo and t.dense_dim():
        raise UnsupportedError(
            f"{where}: hybrid COO tensors (dense_dim {t.dense_dim()}) are not supported"
        )
    fmt = None if format is None else parse_format(format, order=t.dim())
    if fmt is not None and not plain_values(fmt, dtype):  # bfloat16, int4, quantized
        numbers = np.float32 if t.dtype == torch.bfloat16 else None  # widened exactly
        return held(from_torch(t, fmt.structure, numbers, index_dtype), fmt)
    if fmt is not None and fmt.fill and layout != torch.strided:
        t, layout = t.to_dense(), torch.strided  # its absent entries are zeros to store
    if layout == torch.strided:
        a = _values(torch, t, dtype, where, fmt)
        return from_numpy(a, format, None, np.int32 if index_dtype is None else index_dtype)
    if layout == torch.sparse_csr:
        fmt = parse_format("csr" if format is None else format, order=2)
        vals = _values(torch, t.values(), dtype, where, fmt)
        crow, col = t.crow_indices().numpy(), t.col_indices().numpy()
        return from_compressed(where, "csr", t.shape, crow, col, vals, fmt, vals.dtype, index_dtype)
    if layout == torch.sparse_csc:
        fmt = parse_format("csc" if format is None else format, order=2)
        vals = _values(torch, t.values(), dtype, where, fmt)
        ccol, row = t.ccol_indices().numpy(), t.row_indices().numpy()
        return from_compressed(where, "csc", t.shape, ccol, row, vals, fmt, vals.dtype, index_dtype)
    if layout == torch.sparse_bsr:
        return _from_bsr(torch, t, format, dtype, index_dtype, where)
    if layout == torch.sparse_coo:
        return _from_coo(torch, t, format, dtype, index_dtype, where)
    raise UnsupportedError(
        f"{where}: layout {layout} is not supported; use strided, sparse_csr, sparse_csc, "
        "sparse_coo or sparse_bsr"
    )


def _from_coo(torch: Any, t: Any, format: Any, dtype: Any, index_dtype: Any, where: str) -> Tensor:
    """COO: a coalesced tensor is already sorted and unique, so its index rows are the
    levels' ``crd`` arrays as they stand, where they are contiguous. torch's values may
    be a view that is not: the gradient ``torch.sparse.sum`` hands back is one value
    broadcast (stride 0) over a coalesced pattern; those are copied."""
    order = t.dim()
    fmt = parse_format("coo" if format is None else format, order=order)
    vals = np.ascontiguousarray(_values(torch, t._values(), dtype, where, fmt))
    idx = np.ascontiguousarray(t._indices().numpy())
    idt = np.dtype(np.int64) if index_dtype is None else index_dtype_of(index_dtype)
    if (
        t.is_coalesced()
        and order
        and fmt.structure == parse_format("coo", order=order)
        and idt == idx.dtype
    ):
        levels = [{"pos": np.array([0, len(vals)], dtype=idt), "crd": idx[0]}]
        levels += [{"crd": idx[m]} for m in range(1, order)]
        return Tensor(tuple(t.shape), fmt, levels, vals, idt)
    return from_coo(idx.T, vals, tuple(t.shape), fmt, None, idt)


def _from_bsr(torch: Any, t: Any, format: Any, dtype: Any, index_dtype: Any, where: str) -> Tensor:
    """BSR: block rows are a ``UC`` pair over the block grid and every stored block a
    dense R x C tile, row-major, exactly as ucf's blocked format lays its values."""
    blocks = t.values()
    rows, cols = int(blocks.shape[1]), int(blocks.shape[2])
    own = _bsr_format(rows, cols)
    fmt = own if format is None else parse_format(format, order=2)
    vals = _values(torch, blocks, dtype, where, fmt)
    # the level's own arrays below, unchecked, which a kernel reads by address: a view
    # with strides (indices sliced from a larger tensor) is copied
    crow = np.ascontiguousarray(t.crow_indices().numpy())
    col = np.ascontiguousarray(t.col_indices().numpy())
    grid = (t.shape[0] // rows, t.shape[1] // cols)
    nnzb = checks.positions(f"{where} (crow_indices)", crow, grid[0])
    checks.in_range(f"{where} (col_indices)", col, grid[1], what="block column")
    if len(col) != nnzb or len(vals) != nnzb:
        raise OperandError(
            f"{where}: crow_indices ends at {nnzb} but there are {len(col)} block columns "
            f"and {len(vals)} blocks"
        )
    idt = crow.dtype if index_dtype is None else index_dtype_of(index_dtype)
    sorted_rows = checks.increasing(crow, col)
    if sorted_rows and fmt.structure == own and idt == crow.dtype == col.dtype:
        levels = [{}, {"pos": crow, "crd": col}, {}, {}]
        # vals too: blocks sliced from a larger tensor, evenly strided, reshape to a
        # strided view (SpMV read every other value of one: a wrong answer)
        flat = np.ascontiguousarray(vals).reshape(-1)
        return Tensor(tuple(t.shape), fmt, levels, flat, idt, check=False)
    block_rows = np.repeat(np.arange(grid[0], dtype=np.int64), np.diff(crow))
    r = block_rows[:, None, None] * rows + np.arange(rows)[None, :, None]
    c = col.astype(np.int64)[:, None, None] * cols + np.arange(cols)[None, None, :]
    r, c = np.broadcast_arrays(r, c)
    coords = np.stack([r.reshape(-1), c.reshape(-1)], axis=1)
    flat = vals.reshape(-1)
    if fmt.structure != own:  # the zeros that pad blocks are not entries of another format
        keep = flat != 0
        coords, flat = coords[keep], flat[keep]
    return from_coo(coords, flat, tuple(t.shape), fmt, None, idt)


def _bsr_blocks(tensor: Tensor) -> tuple[int, int] | None:
    """(R, C) when the tensor is in torch's BSR layout and its shape is a whole number
    of blocks (torch requires that), else None."""
    fmt = tensor.format
    if len(fmt.maps) != 4 or tensor.order != 2:
        return None
    rows, cols = fmt.maps[2].mod, fmt.maps[3].mod
    if not (rows and cols) or fmt.structure != _bsr_format(rows, cols):
        return None
    if tensor.shape[0] % rows or tensor.shape[1] % cols:
        return None
    return rows, cols


@boundary
def to_torch(tensor: Tensor) -> Any:
    """The torch tensor of the matching layout; shares ucf's buffers except for COO.

    Dense formats give a strided tensor (a permuted view for a permuted dense
    format), ``csr`` gives sparse_csr, ``csc`` sparse_csc, the blocked
    ``UCUU:0/R,1/C,0%R,1%C`` sparse_bsr (when the shape is a whole number of
    blocks), and every other format a coalesced sparse_coo tensor on fresh arrays.
    Read-only ucf arrays (say, from ``np.from_dlpack``) are copied, since torch
    tensors are always writable.
    """
    zero_filled(tensor.format, "torch")
    torch = need_torch("Tensor.to_torch")
    fmt = tensor.format

    def share(a: np.ndarray) -> Any:
        return torch.from_numpy(a if a.flags.writeable else a.copy())

    if fmt.is_dense and not fmt.blocked:
        dense = share(tensor.vals).reshape(fmt.level_dims(tensor.shape))
        return dense.permute(*np.argsort(fmt.mode_order).tolist()) if fmt.order else dense
    size = tensor.shape
    fmt = fmt.structure
    if fmt in (CSR, CSC):
        lv = tensor.levels[1]
        build = torch.sparse_csr_tensor if fmt == CSR else torch.sparse_csc_tensor
        arrays = share(lv["pos"]), share(lv["crd"]), share(tensor.vals)
        return build(*arrays, size=size, check_invariants=False)
    blocks = _bsr_blocks(tensor)
    if blocks is not None:
        lv = tensor.levels[1]
        vals = share(tensor.vals).reshape(-1, *blocks)
        pos, crd = share(lv["pos"]), share(lv["crd"])
        return torch.sparse_bsr_tensor(pos, crd, vals, size=size, check_invariants=False)
    coords, vals = tensor.to_coo()
    indices = torch.from_numpy(np.ascontiguousarray(coords.T))
    values = torch.from_numpy(vals.copy())
    return torch.sparse_coo_tensor(indices, values, size=size, check_invariants=False).coalesce()


BUILDERS["to_torch"] = to_torch
