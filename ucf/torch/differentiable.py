"""``ucf.torch.einsum``: a statement over torch tensors, differentiable in each of them.

The forward call runs the statement's kernel; the backward call runs, for each
operand that requires a gradient, the kernel of the statement ucf derived for it
(``ucf.autodiff``), through a ``torch.autograd.Function``. Both are compiled
once per statement, formats, dtypes and target, and cached on disk like any
kernel.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from ucf.autodiff.backward import Backward
from ucf.errors import OperandError, UnsupportedError, boundary
from ucf.format.format import Format, parse_format
from ucf.format.tensor import Tensor
from ucf.format.torch_layouts import need_torch
from ucf.lang.ast import Statement, accesses
from ucf.lang.parser import parse_statement
from ucf.torch import operands as ops

_LOCK = threading.Lock()
_COMPILED: dict[tuple, Compiled] = {}


class Compiled:
    """A statement's forward kernel and its gradients, for one set of formats and dtypes."""

    def __init__(
        self,
        text: str,
        statement: Statement,
        formats: Mapping[str, Format],
        schedule: str | None,
        dynamic: Mapping[str, tuple[int, ...]],
        target: str,
        dtype: np.dtype,
        index_dtype: np.dtype,
    ):
        from ucf.api import compile as ucf_compile

        self.statement = statement
        self.names = list(dict.fromkeys(a.tensor for a in accesses(statement.rhs)))
        self.dynamic = dict(dynamic)
        self.kernel = ucf_compile(
            text, dict(formats), schedule, target, dtype, index_dtype, dynamic=self.dynamic or None
        )
        self._backward_args = (formats, target, dtype, index_dtype)
        self._backward: Backward | None = None

    @property
    def backward(self) -> Backward:
        """The gradients, derived and compiled on first need (an integer kernel has none)."""
        if self._backward is None:
            formats, target, dtype, idx = self._backward_args
            self._backward = Backward(
                self.statement, formats, self.dynamic, target=target, dtype=dtype, index_dtype=idx
            )
        return self._backward

    def run(self, operands: Mapping[str, ops.Operand], masks: Mapping[str, Any]) -> Tensor:
        """The forward kernel's result, a ucf Tensor (in the output's format)."""
        args = {n: operands[n].read for n in self.names}
        if self.dynamic:
            return self.kernel(masks=dict(masks), **args)
        return self.kernel(**args)

    def forward(self, operands: Mapping[str, ops.Operand], masks: Mapping[str, Any]) -> Any:
        return self.run(operands, masks).to_torch()

    def gradient(
        self,
        name: str,
        grad: Any,
        operands: Mapping[str, ops.Operand],
        masks: Mapping[str, Any],
        hoisted: dict | None = None,
        output: Tensor | None = None,
    ) -> Any:
        """Operand ``name``'s gradient in its layout; ``hoisted`` shares the sums the
        gradients of one backward call read (``ucf.autodiff.Backward``). ``output`` is
        the forward result when it is sparse: the output's gradient is then taken at its
        stored positions (``ops.output_gradient``), never densified."""
        dtype = self.backward.dtype
        if output is not None:
            g: Any = ops.output_gradient(grad, output, dtype)
        else:
            g = np.ascontiguousarray(grad.detach().numpy(), dtype=dtype)
        reads = {n: operands[n].read for n in self.names}
        found = self.backward(name, g, reads, masks, hoisted=hoisted)
        return ops.gradient(operands[name], found)


def compiled(
    text: str,
    statement: Statement,
    formats: Mapping[str, Format],
    schedule: str | None,
    dynamic: Mapping[str, tuple[int, ...]],
    target: str,
    dtype: np.dtype,
    index_dtype: np.dtype,
) -> Compiled:
    """The cached pair for this statement, formats, schedule, dtypes and target."""
    key = (
        "".join(text.split()),
        tuple(sorted((n, str(f)) for n, f in formats.items())),
        schedule,
        tuple(sorted(dynamic.items())),
        target,
        str(dtype),
        str(index_dtype),
    )
    with _LOCK:
        found = _COMPILED.get(key)
    if found is None:
        found = Compiled(text, statement, formats, schedule, dynamic, target, dtype, index_dtype)
        with _LOCK:
            found = _COMPILED.setdefault(key, found)
    return found


def prepare(
    stmt: str,
    formats: Mapping[str, Any] | None,
    schedule: str | None,
    dynamic: Mapping[str, Any] | None,
    masks: Mapping[str, Any] | None,
    target: str,
    tensors: Mapping[str, Any],
) -> tuple[Compiled, dict[str, ops.Operand], dict[str, np.ndarray]]:
    """Parse and check a call (the API boundary), read its operands, and find its kernels."""
    statement = parse_statement(stmt)
    out = statement.lhs.tensor
    names = list(dict.fromkeys(a.tensor for a in accesses(statement.rhs)))
    if statement.op != "=" or out in names:
        raise UnsupportedError(
            f"statement '{stmt}': ucf.torch returns a new tensor, so its output {out} can be "
            "neither read nor accumulated into ('+=')"
        )
    orders = {a.tensor: len(a.indices) for a in (statement.lhs, *accesses(statement.rhs))}
    given = dict(formats or {})
    for n in given:
        if n not in orders:
            raise OperandError(
                f"formats names {n}, which statement '{stmt}' does not use "
                f"(tensors: {', '.join(orders)})"
            )
    fmts = {n: parse_format(f, order=orders[n], tensor=n) for n, f in given.items()}
    out_format = fmts.pop(out, None)
    dyn = _dynamic(dynamic, names, fmts)
    mask_arrays = _masks(masks, dyn)
    unknown = sorted(set(tensors) - set(names))
    missing = [n for n in names if n not in tensors]
    if unknown or missing:
        raise OperandError(
            f"statement '{stmt}' reads {', '.join(names)}; "
            + (f"missing operand {missing[0]}" if missing else f"unknown operand {unknown[0]}")
        )
    torch = need_torch("ucf.torch.einsum")
    for n in names:
        if not isinstance(tensors[n], torch.Tensor):
            raise OperandError(f"operand {n} is not a torch tensor; ucf.torch takes torch tensors")
    dtype = np.result_type(*(ops.read_as(tensors[n]) for n in names))
    idx = ops.index_dtype(tensors)
    read = {n: ops.read(n, tensors[n], fmts.get(n), n in dyn, dtype, idx) for n in names}
    kernel_formats = {n: op.read.format for n, op in read.items() if n not in dyn}
    if out_format is not None and not out_format.is_dense:
        kernel_formats[out] = out_format
    found = compiled(stmt, statement, kernel_formats, schedule, dyn, target, dtype, idx)
    return found, read, mask_arrays


def _dynamic(
    dynamic: Mapping[str, Any] | None, names: list[str], fmts: Mapping[str, Format]
) -> dict[str, tuple[int, ...]]:
    if dynamic is None:
        return {}
    if not isinstance(dynamic, Mapping):
        raise OperandError(f"dynamic= maps an operand to its micro-tile shape, got {dynamic!r}")
    for n in dynamic:
        if n not in names:
            raise OperandError(f"dynamic= names {n}, which is not an operand ({', '.join(names)})")
        if n in fmts:
            raise OperandError(f"dynamic operand {n} is read dense with a mask; drop its format")
    return {n: tuple(int(x) for x in g) for n, g in dynamic.items()}


def _masks(masks: Mapping[str, Any] | None, dynamic: Mapping[str, Any]) -> dict[str, np.ndarray]:
    found = {}
    for n, m in (masks or {}).items():
        if n not in dynamic:
            raise OperandError(f"masks= gives a mask for {n}, which is not a dynamic operand")
        if m is None:
            continue
        a = m.detach().numpy() if hasattr(m, "detach") else np.asarray(m)
        found[n] = a if a.dtype == np.bool_ else a != 0
    return found


@functools.cache
def _function() -> Any:
    """The autograd Function, defined on first use (torch is imported then)."""
    torch = need_torch("ucf.torch.einsum")

    class Apply(torch.autograd.Function):
        @staticmethod
        def forward(ctx, call: tuple, *tensors: Any) -> Any:
            kernels, operands, masks = call
            ctx.call = call
            ctx.save_for_backward(*tensors)  # torch then refuses in-place changes
            result = kernels.run(operands, masks)
            # A sparse result's positions are where its gradient is taken.
            ctx.output = None if result.format.is_dense else result
            return result.to_torch()

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, grad: Any) -> tuple:
            kernels, operands, masks = ctx.call
            hoisted: dict = {}
            grads = [
                kernels.gradient(n, grad, operands, masks, hoisted, ctx.output) if need else None
                for n, need in zip(operands, ctx.needs_input_grad[1:], strict=True)
            ]
            return (None, *grads)

    return Apply


def apply(kernels: Compiled, operands: dict[str, ops.Operand], masks: dict[str, Any]) -> Any:
    """Run the call through autograd: the torch inputs are the operands' given tensors."""
    fn = _function()
    return fn.apply((kernels, operands, masks), *(op.given for op in operands.values()))


@boundary
def einsum(
    stmt: str,
    formats: dict[str, Any] | None = None,
    schedule: str | None = None,
    dynamic: dict[str, Any] | None = None,
    masks: dict[str, Any] | None = None,
    target: str = "llvm",
    **tensors: Any,
) -> Any:
    """Run ``stmt`` on torch tensors and return a new torch tensor, differentiable in
    every operand that requires a gradient: dense, or of the torch layout of the
    output's format when ``formats`` gives the output a sparse one (``csr`` a
    sparse_csr tensor; see ``Tensor.to_torch``), whose gradient, sparse or strided,
    is taken at the output's stored positions only.

    ``formats`` gives an operand's format: a strided tensor given a sparse one is read
    in it (its pattern is its nonzeros) and its gradient is zero off that pattern; a
    sparse tensor (CSR, CSC, BSR, COO) is read in its own layout's format unless given
    another, and its gradient has its layout and index arrays. ``dynamic`` maps a
    strided operand to its micro-tile shape and ``masks`` gives its mask (its nonzeros
    without one): its gradient is computed in its live tiles only and is zero
    elsewhere. Each gradient is a statement ucf derives (docs/training.md)."""
    kernels, operands, mask_arrays = prepare(
        stmt, formats, schedule, dynamic, masks, target, tensors
    )
    return apply(kernels, operands, mask_arrays)
