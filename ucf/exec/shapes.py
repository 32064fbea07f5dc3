"""The extent of every index variable of a call, from its operands' shapes.

A call's extents come from the plain indices of its operands (``A(i,j)`` fixes
``i`` and ``j``), from ``out=`` and ``shapes=``, and, for a variable only read
through affine indices (``I(x+r)``), from what those constrain
(``ucf.cin.extents.infer``). Plain kernels and kernels over dynamic operands
(``ucf.stile.dynamic``) both check their operands here, so a mismatch is
reported the same way, naming the two places that disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ucf.cin.extents import infer
from ucf.errors import ShapeError
from ucf.format.tensor import Tensor
from ucf.lang.ast import Statement, accesses


def check_orders(orders: Mapping[str, int], given: Mapping[str, Tensor]) -> None:
    """Refuse an operand whose order is not the number of indices it is read with
    (``orders``: the statement's, by tensor)."""
    for n, t in given.items():
        if t.order != orders[n]:
            raise ShapeError(wrong_order(n, t.shape, orders[n]))


def wrong_order(name: str, shape: tuple[int, ...], indices: int) -> str:
    """The one message for an operand whose order is not its access's number of indices
    (kernels, ``ucf.einsum``, dynamic operands and the command line alike)."""
    return (
        f"operand {name} has order {len(shape)} (shape {tuple(shape)}) but is accessed with "
        f"{indices} {'index' if indices == 1 else 'indices'}"
    )


def plain_extents(b: Any, given: Mapping[str, Tensor], out: Any) -> dict[str, int] | None:
    """The extents when the operands' plain indices fix them all and agree with each
    other and with ``out`` (``b`` is the plan's ``ucf.exec.binding.Binding``); None
    otherwise (``bound_extents`` then says what is wrong)."""
    if not b.closed:
        return None
    found: dict[str, int] = {}
    for v, tensor, mode in b.plain:
        size = given[tensor].shape[mode]
        if found.setdefault(v, size) != size:
            return None
    if out is not None:
        shape = out.shape if isinstance(out, (Tensor, np.ndarray)) else np.shape(out)
        if len(shape) != len(b.lhs):
            return None
        for v, size in zip(b.lhs, shape, strict=True):
            if found.setdefault(v, size) != size:
                return None
    return found


def bound_extents(
    stmt: Statement,
    variables: Sequence[str],
    given: Mapping[str, Tensor],
    out: Any = None,
    shapes: Mapping[str, Any] | None = None,
    takes_shapes: bool = True,
) -> dict[str, int]:
    """Every extent of ``stmt`` (operands of the right orders: ``check_orders``),
    inferred where no plain index fixes it; a ShapeError names the two places that
    disagree, or the first of ``variables`` whose extent is still unknown (and, when
    the caller ``takes_shapes``, how to give it)."""
    found: dict[str, tuple[int, str]] = {}

    def bind(v: str, size: int, who: str) -> None:
        if v in found and found[v][0] != size:
            raise ShapeError(
                f"index variable {v} has extent {found[v][0]} in {found[v][1]} but {size} in {who}"
            )
        found.setdefault(v, (size, who))

    for a in accesses(stmt.rhs):
        for m, idx in enumerate(a.indices):
            if idx.single_variable is not None:
                bind(idx.single_variable, given[a.tensor].shape[m], f"{a.tensor} (mode {m})")
    if out is not None:
        shape = np.shape(out) if not isinstance(out, Tensor) else out.shape
        if len(shape) != len(stmt.lhs.indices):
            raise ShapeError(
                f"out has shape {tuple(shape)} but {stmt.lhs} has {len(stmt.lhs.indices)} indices"
            )
        for m, idx in enumerate(stmt.lhs.indices):
            bind(idx.single_variable, int(shape[m]), f"out (mode {m})")
    for key, size in (shapes or {}).items():
        if isinstance(size, (tuple, list)):
            _bind_tensor_shape(stmt, key, size, given, bind)
            continue
        if key not in variables:
            raise ShapeError(
                f"shapes= names '{key}', which is not an index variable of {stmt} (its "
                f"variables: {', '.join(variables)}); map a tensor name to "
                "a tuple, as in shapes={'" + stmt.lhs.tensor + "': (n, ...)}"
            )
        bind(key, _extent(size, f"shapes= gives index variable {key}"), "shapes=")
    sizes = {
        (a.tensor, m): given[a.tensor].shape[m]
        for a in accesses(stmt.rhs)
        for m in range(len(a.indices))
    }
    known = {v: n for v, (n, _) in found.items()}
    for v, (n, who) in infer(stmt, known, sizes).items():
        found[v] = (n, who)
    for v in variables:
        if v not in found:
            how = f"; pass shapes={{'{v}': n}}" if takes_shapes else ""
            raise ShapeError(f"the extent of index variable {v} is unknown{how}")
    return {v: s for v, (s, _) in found.items()}


def _bind_tensor_shape(
    stmt: Statement,
    name: str,
    shape: Any,
    given: Mapping[str, Tensor],
    bind: Callable[[str, int, str], None],
) -> None:
    """``shapes={name: (n, ...)}``: the extents of ``name``'s plain indices, and for an
    operand, a check that the operand has that shape."""
    access = next((a for a in (stmt.lhs, *accesses(stmt.rhs)) if a.tensor == name), None)
    if access is None:
        raise ShapeError(f"shapes= gives tensor '{name}' a shape, but {stmt} has no tensor {name}")
    if len(shape) != len(access.indices):
        raise ShapeError(
            f"shapes= gives {name} the shape {tuple(shape)}, but {access} has "
            f"{len(access.indices)} indices"
        )
    for m, (idx, size) in enumerate(zip(access.indices, shape, strict=True)):
        size = _extent(size, f"shapes= gives mode {m} of {name}")
        if name in given and given[name].shape[m] != size:
            raise ShapeError(
                f"operand {name} has size {given[name].shape[m]} in mode {m} but "
                f"shapes= gives {size}"
            )
        if idx.single_variable is not None:
            bind(idx.single_variable, size, f"shapes= ({name}, mode {m})")


def _extent(size: Any, what: str) -> int:
    """A user-given extent as an int, or a ShapeError saying ``what`` was wrong."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
        raise ShapeError(f"{what} the extent {size!r}; an extent is a non-negative integer")
    return int(size)
