"""The two entry points, ``ucf.compile`` and ``ucf.einsum``: where the user's statement,
formats and schedule enter the compiler. Here, not in ``ucf/__init__.py``, so that the
feature packages above the compiler (``ucf.torch``) call them without importing the
package back; importing this module costs nothing (the compiler loads on first use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ucf.errors import OperandError, ShapeError, UnsupportedError, boundary

if TYPE_CHECKING:
    from ucf.exec.kernel import Kernel


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
        from ucf.stile.dynamic import DynamicKernel

        return DynamicKernel(expr, formats, schedule, target, dtype, index_dtype, dynamic, emulate)
    return Kernel(expr, formats, schedule, target, dtype, index_dtype, emulate, static)


#: ``ucf.einsum``'s own keywords, which a misspelt one (``format=``) is compared with.
EINSUM_KEYWORDS = ("formats", "schedule", "target", "out", "shapes", "as_tensor")


@boundary
def einsum(
    expr: str,
    *positional: Any,
    formats: dict[str, Any] | None = None,
    schedule: str | None = None,
    target: str = "llvm",
    out: Any = None,
    shapes: dict[str, Any] | None = None,
    as_tensor: bool = False,
    **operands: Any,
) -> Any:
    """Compile (or fetch from the cache) and run in one call.

    ``expr`` is a statement with operands passed by name
    (``einsum("y(i) = A(i,j) * x(j)", A=A, x=x)``), or numpy's subscripts with
    operands passed in order (``einsum("ij,j->i", A, x)``; the operands are
    then named ``T0, T1, ...`` and the output ``out``, for ``formats=``).
    Operand formats and dtypes are taken from the operands themselves, so a
    scipy CSR matrix is read as CSR without repacking. ``shapes`` gives
    extents the operands do not fix: an index variable mapped to an int
    (``{"j": 8}``) or a tensor mapped to its shape (``{"C": (4, 8)}``).

    The result comes back as the kind of array the operands were, as opt_einsum
    does: a torch tensor if any operand is one; else a numpy array when the output
    is dense, and a scipy sparse array when it is sparse in a layout scipy shares
    (CSR, CSC, BSR); other sparse outputs are ``ucf.Tensor``. ``as_tensor=True``
    always returns the ``ucf.Tensor``, and ``out=`` is returned as it was passed
    (docs/interop.md).
    """
    import numpy as np

    from ucf.exec.binding import unknown_operand
    from ucf.exec.kernel import Kernel
    from ucf.exec.shapes import wrong_order
    from ucf.format.format import parse_format
    from ucf.format.interop import as_tensor as to_tensor
    from ucf.format.interop import like_operands
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
        given = [to_tensor(v, format=None, name=f"operand {k}") for k, v in enumerate(positional)]
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
        t = to_tensor(value, name=name)
        if t.order != orders[name]:
            raise ShapeError(wrong_order(name, t.shape, orders[name]))
        if name in fmts:
            t = to_tensor(t, format=fmts[name], name=name)
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
    given = [*positional, *operands.values()]
    operands.update(tensors)
    result = kernel(out=out, shapes=shapes, **operands)
    if as_tensor:
        return result
    return out if out is not None else like_operands(result, given)
