"""ucf: a sparse tensor-algebra compiler with affine indices.

Write ``C(i,k) = A(i,j) * B(j,k)``, choose a storage format per tensor, and
get a kernel: JIT-compiled LLVM (the default, no C compiler needed) or C.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ucf._version import __version__
from ucf.api import compile, einsum
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
    from ucf.autodiff import gradients
    from ucf.cin.invariance import condensable, invariance
    from ucf.exec.kernel import Kernel
    from ucf.format.construction import from_coo, from_dlpack, from_numpy
    from ucf.format.format import Format, parse_format
    from ucf.format.io import read, write
    from ucf.format.pictures import show
    from ucf.format.quantize import quantize
    from ucf.format.scipy_layouts import from_scipy
    from ucf.format.tensor import Tensor
    from ucf.format.torch_layouts import from_torch
    from ucf.nn.attention import attention
    from ucf.schedule import Schedule
    from ucf.stile.choice import choose_stile
    from ucf.stile.tile_index import stile_index
    from ucf.tesa.attribute import TeSA
    from ucf.tesa.policy import Policy
    from ucf.tesa.program import program
    from ucf.tuning import Tuned, tune

# Public names and the module each lives in.  They are imported on first use (PEP 562):
# the compiler behind them pulls in sympy, lark and llvmlite, which cost most of a second,
# and a script that only catches ``ucf.UcfError`` or asks ``ucf.__version__`` needs none.
_LAZY = {
    "Kernel": "ucf.exec.kernel",
    "Format": "ucf.format.format",
    "show": "ucf.format.pictures",
    "parse_format": "ucf.format.format",
    "read": "ucf.format.io",
    "write": "ucf.format.io",
    "quantize": "ucf.format.quantize",
    "from_scipy": "ucf.format.scipy_layouts",
    "Tensor": "ucf.format.tensor",
    "from_coo": "ucf.format.construction",
    "from_dlpack": "ucf.format.construction",
    "from_numpy": "ucf.format.construction",
    "from_torch": "ucf.format.torch_layouts",
    "Schedule": "ucf.schedule",
    "invariance": "ucf.cin.invariance",
    "stile_index": "ucf.stile.tile_index",
    "choose_stile": "ucf.stile.choice",
    "condensable": "ucf.cin.invariance",
    "TeSA": "ucf.tesa.attribute",
    "Policy": "ucf.tesa.policy",
    "program": "ucf.tesa.program",
    "tune": "ucf.tuning",
    "Tuned": "ucf.tuning",
    "attention": "ucf.nn.attention",
    "gradients": "ucf.autodiff",
}

__all__ = [
    "__version__",
    "attention",
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
    "gradients",
    "invariance",
    "parse_format",
    "program",
    "quantize",
    "set_num_threads",
    "show",
    "stile_index",
    "read",
    "tune",
    "Tuned",
    "write",
]


def __getattr__(name: str) -> Any:
    """The public names of ``_LAZY``, and the submodules ``ucf.torch``, ``ucf.nn`` and
    ``ucf.tesa``, on first use (``ucf.nn`` imports torch; ``import ucf`` never does)."""
    import importlib

    if name in ("torch", "nn", "tesa", "autodiff"):
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

    from ucf.toolchain.jit import set_num_threads as _set

    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ArgumentError(f"ucf.set_num_threads takes a positive number of threads, got {n!r}")
    _set(n)
