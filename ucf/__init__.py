"""ucf: a sparse tensor-algebra compiler with affine indices.

Write ``C(i,k) = A(i,j) * B(j,k)``, choose a storage format per tensor, and
get a kernel: JIT-compiled LLVM (the default, no C compiler needed) or C.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ucf._version import __version__
from ucf.errors import (
    ArgumentError,
    CacheWarning,
    CompileError,
    ConversionWarning,
    DLPackError,
    FormatError,
    InternalError,
    MissingDependencyError,
    OperandError,
    ParseError,
    ProgramError,
    ScheduleError,
    ShapeError,
    UcfError,
    UnsupportedError,
    boundary,
)

if TYPE_CHECKING:  # what _LAZY provides, for type checkers and editors
    from ucf.cin.invariance import condensable, invariance
    from ucf.exec.kernel import Kernel
    from ucf.exec.tile_choice import choose_stile
    from ucf.format.format import Format, parse_format
    from ucf.format.io import read, write
    from ucf.format.quantize import quantize
    from ucf.format.scipy_layouts import from_scipy
    from ucf.format.tensor import Tensor, from_coo, from_dlpack, from_numpy
    from ucf.format.torch_layouts import from_torch
    from ucf.schedule import Schedule
    from ucf.stile import stile_index
    from ucf.tesa.attribute import TeSA
    from ucf.tesa.plan import Policy
    from ucf.tesa.program import program
    from ucf.tuning import Tuned, tune

# Public names and the module each lives in.  They are imported on first use (PEP 562):
# the compiler behind them pulls in sympy, lark and llvmlite, which cost most of a second,
# and a script that only catches ``ucf.UcfError`` or asks ``ucf.__version__`` needs none.
_LAZY = {
    "Kernel": "ucf.exec.kernel",
    "Format": "ucf.format.format",
    "parse_format": "ucf.format.format",
    "read": "ucf.format.io",
    "write": "ucf.format.io",
    "quantize": "ucf.format.quantize",
    "from_scipy": "ucf.format.scipy_layouts",
    "Tensor": "ucf.format.tensor",
    "from_coo": "ucf.format.tensor",
    "from_dlpack": "ucf.format.tensor",
    "from_numpy": "ucf.format.tensor",
    "from_torch": "ucf.format.torch_layouts",
    "Schedule": "ucf.schedule",
    "invariance": "ucf.cin.invariance",
    "stile_index": "ucf.stile",
    "choose_stile": "ucf.exec.tile_choice",
    "condensable": "ucf.cin.invariance",
    "TeSA": "ucf.tesa.attribute",
    "Policy": "ucf.tesa.plan",
    "program": "ucf.tesa.program",
    "tune": "ucf.tuning",
    "Tuned": "ucf.tuning",
}

__all__ = [
    "__version__",
    "ArgumentError",
    "CacheWarning",
    "CompileError",
    "ConversionWarning",
    "DLPackError",
    "FormatError",
    "InternalError",
    "MissingDependencyError",
    "Format",
    "Kernel",
    "OperandError",
    "ParseError",
    "Policy",
    "ProgramError",
    "Schedule",
    "ScheduleError",
    "ShapeError",
    "Tensor",
    "TeSA",
    "UcfError",
    "UnsupportedError",
    "choose_stile",
    "compile",
    "condensable",
    "einsum",
    "from_coo",
    "from_dlpack",
    "from_numpy",
    "from_scipy",
    "from_torch",
    "invariance",
    "parse_format",
    "program",
    "quantize",
    "set_num_threads",
    "stile_index",
    "read",
    "tune",
    "Tuned",
    "write",
]


def __getattr__(name: str) -> Any:
    """The public names of ``_LAZY``, and the submodules ``ucf.torch`` and ``ucf.tesa``,
    on first use."""
    import importlib

    if name in ("torch", "tesa"):
        return importlib.import_module(f"ucf.{name}")
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ucf' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


@boundary
def set_num_threads(n: int) -> None:
    """Threads for parallel loops (else ``UCF_NUM_THREADS``, else OpenMP's default)."""
    import numbers

    from ucf.exec.jit import set_num_threads as _set

    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ArgumentError(f"ucf.set_num_threads takes a positive number of threads, got {n!r}")
    _set(n)


@boundary
def compile(
    expr: str,
    formats: dict[str, Any] | None = None,
    schedule: str | None = None,
    target: str = "llvm",
    dtype: Any = None,
    index_dtype: Any = "int32",
    emulate: bool = False,
    *,
    static: dict[str, Any] | None = None,
    dynamic: dict[str, Any] | None = None,
) -> Kernel:
    """Compile a statement once for operands arriving in ``formats`` (others dense).

    ``dtype`` is the type the kernel computes and writes its output in; without it,
    the values the output's format states (``"dense@float32"``), else float64.
    ``static`` maps operands to tensors whose pattern is known now: the kernel is
    specialized to it (``dismantle`` in the schedule unrolls over it) and refuses
    operands of another pattern (docs/tesa.md). ``dynamic`` maps an operand passed
    dense at call time to its micro-tile shape: each call computes over its live
    tiles only (docs/stile.md)."""
    from ucf.exec.kernel import Kernel

    if dynamic:
        if static:
            raise UnsupportedError(
                "a kernel takes static= or dynamic= operands, not both "
                f"(static {', '.join(static)}; dynamic {', '.join(dynamic)})"
            )
        from ucf.exec.dynamic import DynamicKernel

        return DynamicKernel(expr, formats, schedule, target, dtype, index_dtype, dynamic, emulate)
    return Kernel(expr, formats, schedule, target, dtype, index_dtype, emulate, static)


#: ``ucf.einsum``'s own keywords, which a misspelt one (``format=``) is compared with.
EINSUM_KEYWORDS = ("formats", "schedule", "target", "out", "shapes")


@boundary
def einsum(
    expr: str,
    *positional: Any,
    formats: dict[str, Any] | None = None,
    schedule: str | None = None,
    target: str = "llvm",
    out: Any = None,
    shapes: dict[str, Any] | None = None,
    **operands: Any,
) -> Tensor:
    """Compile (or fetch from the cache) and run in one call.

    ``expr`` is a statement with operands passed by name
    (``einsum("y(i) = A(i,j) * x(j)", A=A, x=x)``), or numpy's subscripts with
    operands passed in order (``einsum("ij,j->i", A, x)``; the operands are
    then named ``T0, T1, ...`` and the output ``out``, for ``formats=``).
    Operand formats and dtypes are taken from the operands themselves, so a
    scipy CSR matrix is read as CSR without repacking. ``shapes`` gives
    extents the operands do not fix: an index variable mapped to an int
    (``{"j": 8}``) or a tensor mapped to its shape (``{"C": (4, 8)}``).
    """
    import numpy as np

    from ucf.exec.binding import unknown_operand
    from ucf.exec.extents import wrong_order
    from ucf.exec.kernel import Kernel
    from ucf.format.format import parse_format
    from ucf.format.interop import as_tensor
    from ucf.format.values import VALUES
    from ucf.lang import subscripts
    from ucf.lang.ast import accesses
    from ucf.lang.parser import parse_statement

    if subscripts.is_subscripts(expr):
        if operands:
            raise OperandError(
                f"einsum subscripts '{expr}' take their operands in order, not by name "
                f"({', '.join(operands)})"
            )
        given = [as_tensor(v, format=None, name=f"operand {k}") for k, v in enumerate(positional)]
        expr = subscripts.statement(expr, [t.order for t in given])
        operands = {subscripts.OPERAND.format(k): t for k, t in enumerate(given)}
    elif positional:
        raise OperandError(
            "operands of a statement are passed by name (A=..., x=...); positional operands "
            "go with numpy-style subscripts such as 'ij,j->i'"
        )
    stmt = parse_statement(expr)
    fmts = dict(formats or {})
    tensors = {}
    orders = {a.tensor: len(a.indices) for a in accesses(stmt.rhs)}
    for name, value in operands.items():
        if name not in orders:
            raise OperandError(unknown_operand(name, stmt, EINSUM_KEYWORDS))
        t = as_tensor(value, name=name)
        if t.order != orders[name]:
            raise ShapeError(wrong_order(name, t.shape, orders[name]))
        if name in fmts:
            t = as_tensor(t, format=fmts[name], name=name)
        tensors[name] = t
        fmts.setdefault(name, str(t.format))
    # Half and 8-bit operands sum in float32 and int32 (VALUES[...].compute), and every
    # operand whose values differ from the kernel's is read in place, stating them.
    dtypes = [VALUES[t.dtype.name].compute for t in tensors.values()]
    dtype = np.result_type(*dtypes) if dtypes else np.dtype(np.float64)
    if stmt.lhs.tensor in fmts and parse_format(fmts[stmt.lhs.tensor]).values:
        dtype = None  # the output's format says what the kernel computes in
    for name, t in tensors.items():
        if t.dtype != dtype and not t.format.values:
            fmts[name] = f"{t.format}@{t.dtype}"
    idx = np.int64 if any(t.index_dtype == np.int64 for t in tensors.values()) else np.int32
    kernel = Kernel(expr, fmts, schedule, target, dtype, idx)
    operands.update(tensors)
    return kernel(out=out, shapes=shapes, **operands)
