"""What a run on the page is checked and timed against: numpy on dense copies, and
scipy.sparse where the statement is a product or a sum scipy computes itself.

The numpy result evaluates the parsed statement node by node with broadcasting
(products, sums, element-wise functions and explicit reductions), so any
statement with plain indices is checked; one with affine indices (a convolution)
is run and timed, and the page says it was not checked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ucf.lang import ast

FUNCTIONS: dict[str, Callable[..., Any]] = {
    "relu": lambda a: np.maximum(a, 0),
    "abs": np.abs,
    "sign": np.sign,
    "sqrt": np.sqrt,
    "sin": np.sin,
    "tanh": np.tanh,
    "exp": np.exp,
    "cos": np.cos,
    "sigmoid": lambda a: 1 / (1 + np.exp(-a)),
    "max": np.maximum,
    "min": np.minimum,
}


def plain(stmt: ast.Statement) -> bool:
    """Whether every index of the statement is a single variable (numpy can check it)."""
    accesses = [stmt.lhs, *ast.accesses(stmt.rhs)]
    return all(i.single_variable for a in accesses for i in a.indices)


def dense(stmt: ast.Statement, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """The statement's result on dense ``arrays``, by numpy alone."""
    value, names = _eval(stmt.rhs, arrays)
    out = [i.single_variable for i in stmt.lhs.indices]
    return _aligned(value, names, out)


def _eval(e: ast.Expr, arrays: dict[str, np.ndarray]) -> tuple[Any, list[str]]:
    if isinstance(e, ast.Access):
        names = [i.single_variable for i in e.indices]
        unique = list(dict.fromkeys(names))
        letters = {v: chr(97 + k) for k, v in enumerate(unique)}
        spec = "".join(letters[v] for v in names) + "->" + "".join(letters[v] for v in unique)
        return np.einsum(spec, arrays[e.tensor]), unique
    if isinstance(e, ast.Literal):
        return e.value, []
    if isinstance(e, ast.Neg):
        value, names = _eval(e.operand, arrays)
        return -value, names
    if isinstance(e, ast.Sum):
        value, names = _eval(e.body, arrays)
        axes = tuple(names.index(v) for v in e.vars if v in names)
        return np.sum(value, axis=axes), [v for v in names if v not in e.vars]
    parts = [_eval(c, arrays) for c in ast.children(e)]
    names = list(dict.fromkeys(v for _, ns in parts for v in ns))
    values = [_aligned(v, ns, names, broadcast=True) for v, ns in parts]
    if isinstance(e, ast.Call):
        return FUNCTIONS[e.fn](*values), names
    assert isinstance(e, ast.Binary)
    a, b = values
    ops = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}
    return ops[e.op](a, b), names


def _aligned(value: Any, names: list[str], want: list[str], broadcast: bool = False) -> Any:
    """``value`` (axes ``names``) with its axes in the order of ``want``; with
    ``broadcast``, axes it lacks are added with extent 1."""
    value = np.asarray(value)
    if not broadcast:
        return np.transpose(value, [names.index(v) for v in want]) if names else value
    present = [v for v in want if v in names]
    moved = np.transpose(value, [names.index(v) for v in present]) if names else value
    shape = [moved.shape[present.index(v)] if v in names else 1 for v in want]
    return moved.reshape(shape)


def scipy_form(stmt: ast.Statement, sparse: dict[str, Any], arrays: dict[str, Any]):
    """A scipy.sparse computation of the statement, with its description, when it is
    a matrix product or a sum of two matrices scipy holds; else None."""
    rhs = stmt.rhs
    out = [i.single_variable for i in stmt.lhs.indices]
    if isinstance(rhs, ast.Sum) and isinstance(rhs.body, ast.Binary) and rhs.body.op == "*":
        a, b = rhs.body.left, rhs.body.right
        pair = isinstance(a, ast.Access) and isinstance(b, ast.Access)
        if pair and len(rhs.vars) == 1 and (a.tensor in sparse or b.tensor in sparse):
            (j,) = rhs.vars
            left, right = (
                _oriented(a, j, sparse, arrays, last=True),
                _oriented(b, j, sparse, arrays, last=False),
            )
            if left and right and [*left[1], *right[1]] == out:
                described = f"scipy {left[2]} @ {right[2]}"
                return (lambda: left[0] @ right[0]), described
    if isinstance(rhs, ast.Binary) and rhs.op in "+-":
        a, b = rhs.left, rhs.right
        if isinstance(a, ast.Access) and isinstance(b, ast.Access):
            if all(a.tensor in sparse for a in (a, b)) and _vars(a) == _vars(b) == out:
                x, y = sparse[a.tensor], sparse[b.tensor]
                fn = (lambda: x + y) if rhs.op == "+" else (lambda: x - y)
                return fn, f"scipy {a.tensor} {rhs.op} {b.tensor}"
    return None


def _vars(a: ast.Access) -> list[str | None]:
    return [i.single_variable for i in a.indices]


def _oriented(a: ast.Access, j: str, sparse: dict, arrays: dict, last: bool):
    """The operand of a product with the summed ``j`` last (left factor) or first
    (right factor), transposed if need be, with its other variables and its name."""
    names = _vars(a)
    if j not in names or len(names) > 2 or None in names or len(set(names)) != len(names):
        return None
    value = sparse.get(a.tensor, arrays[a.tensor])
    rest = [v for v in names if v != j]
    wanted = [*rest, j] if last else [j, *rest]
    if names != wanted:
        value, label = value.T, f"{a.tensor}.T"
    else:
        label = a.tensor
    return value, rest, label
