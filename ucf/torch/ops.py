"""ucf kernels as PyTorch operators: ``ucf.torch.op`` registers a statement with
``torch.library``, so ``torch.compile`` treats it as one opaque node instead of
breaking the graph at the Python call into ucf. Its gradients are registered
too (``register_autograd``): each operand's is an operator of its own that runs
the statement ucf derives for it, so the backward graph stays whole as well.

torch is imported on first use; without it the functions here raise
:class:`ucf.MissingDependencyError` with the pip command.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from ucf.errors import OperandError, UnsupportedError, boundary
from ucf.format.format import parse_format
from ucf.format.torch_layouts import need_torch
from ucf.lang.ast import accesses
from ucf.lang.parser import parse_statement
from ucf.torch.differentiable import prepare
from ucf.torch.operands import read_as

#: Ops registered in this process, by definition: torch.library takes a name once.
_OPS: dict[tuple, Any] = {}
_NAMES: dict[str, tuple] = {}


@boundary
def op(
    stmt: str,
    formats: dict[str, Any] | None = None,
    schedule: str | None = None,
    target: str = "llvm",
    name: str | None = None,
) -> Any:
    """Register ``stmt`` as the torch operator ``torch.ops.ucf.<name>`` and return it.

    The operator takes the statement's operands as torch tensors, positionally in
    the order they first appear on the right-hand side or by name, and returns a
    new dense tensor. Operands may be strided or sparse (csr, csc, coo, bsr; they
    reach the kernel through :func:`ucf.from_torch`, sharing memory where it can),
    on the CPU; the kernel's value dtype follows the operands as in
    :func:`ucf.einsum`, compiled once per dtype. Inside ``torch.compile`` the op
    is a single graph node whose output shape and dtype come from the operands'
    (its fake implementation), so the graph does not break there; torch itself
    still refuses sparse tensors as inputs of compiled code. The op is
    differentiable in every operand: the gradient of operand ``X`` is the op
    ``torch.ops.ucf.<name>_grad_X``, running the statement ucf derives for it (a
    strided operand gets a strided gradient, zero off its pattern when ``formats``
    reads it sparse; a sparse operand, in eager mode, one of its layout on its
    index arrays). ``name`` defaults to one derived from the definition, and the
    same definition returns the op registered before.
    """
    torch = need_torch("ucf.torch.op")
    statement = parse_statement(stmt)
    operands = list(dict.fromkeys(a.tensor for a in accesses(statement.rhs)))
    out = statement.lhs.tensor
    if not operands:
        raise UnsupportedError(f"statement '{stmt}' reads no tensor; a torch op needs operands")
    if out in operands or statement.op != "=":
        raise UnsupportedError(
            f"statement '{stmt}': a torch op returns a new tensor, so its output {out} can be "
            "neither read nor accumulated into ('+=')"
        )
    fmts = {k: str(v) for k, v in (formats or {}).items()}
    unknown = sorted(set(fmts) - {out, *operands})
    if unknown:
        raise OperandError(
            f"formats names {', '.join(unknown)}, which statement '{stmt}' does not use "
            f"(tensors: {', '.join([out, *operands])})"
        )
    if out in fmts and not parse_format(fmts[out], order=len(statement.lhs.indices)).is_dense:
        raise UnsupportedError(
            f"output {out} has the sparse format '{fmts[out]}'; a torch op returns a dense "
            "tensor: drop it from formats (call ucf.from_torch/einsum for sparse results)"
        )
    extents = _output_extents(statement, operands)
    key = ("".join(stmt.split()), tuple(sorted(fmts.items())), schedule, target, name)
    if key in _OPS:
        return _OPS[key]
    opname = name or "k" + hashlib.sha1(repr(key).encode()).hexdigest()[:16]
    if not opname.isidentifier():
        raise OperandError(f"op name {opname!r} is not a Python identifier")
    if opname in _NAMES:
        raise OperandError(f"a different ucf op is already registered as ucf::{opname}")

    def prepared(tensors: tuple) -> tuple:
        given = dict(zip(operands, tensors, strict=True))
        return prepare(stmt, fmts, schedule, None, None, target, given)

    def run(*tensors: Any) -> Any:
        kernels, read, masks = prepared(tensors)
        return kernels.forward(read, masks)

    def fake(*tensors: Any) -> Any:
        dtype = np.result_type(*(read_as(t) for t in tensors))
        shape = [tensors[operands.index(tensor)].shape[mode] for tensor, mode in extents]
        return torch.empty(shape, dtype=getattr(torch, dtype.name), device=tensors[0].device)

    schema = "(" + ", ".join(f"Tensor {n}" for n in operands) + ") -> Tensor"
    registered = torch.library.custom_op(f"ucf::{opname}", run, mutates_args=(), schema=schema)
    registered.register_fake(fake)
    grads = [_gradient_op(torch, opname, n, operands, prepared) for n in operands]

    def setup(ctx: Any, inputs: tuple, output: Any) -> None:
        ctx.save_for_backward(*inputs)

    def backward(ctx: Any, grad: Any) -> tuple:
        inputs = ctx.saved_tensors
        found = []
        for k, (n, need) in enumerate(zip(operands, ctx.needs_input_grad, strict=True)):
            if not need:
                found.append(None)
            elif inputs[k].layout != torch.strided:  # eager only: torch.compile refuses these
                kernels, read, masks = prepared(inputs)
                found.append(kernels.gradient(n, grad, read, masks))
            else:
                found.append(grads[k](grad.contiguous(), *inputs))
        return tuple(found)

    registered.register_autograd(backward, setup_context=setup)
    _OPS[key], _NAMES[opname] = registered, key
    return registered


def _gradient_op(torch: Any, opname: str, name: str, operands: list[str], prepared: Any) -> Any:
    """The operator ``ucf::<opname>_grad_<name>``: the gradient of strided operand
    ``name`` from the output's gradient and the operands, as a new strided tensor."""

    def run(grad: Any, *tensors: Any) -> Any:
        kernels, read, masks = prepared(tensors)
        return kernels.gradient(name, grad, read, masks)

    def fake(grad: Any, *tensors: Any) -> Any:
        return torch.empty_like(tensors[operands.index(name)], layout=torch.strided)

    schema = "(Tensor grad, " + ", ".join(f"Tensor {n}" for n in operands) + ") -> Tensor"
    found = torch.library.custom_op(
        f"ucf::{opname}_grad_{name}", run, mutates_args=(), schema=schema
    )
    found.register_fake(fake)
    return found


def _output_extents(statement: Any, operands: list[str]) -> list[tuple[str, int]]:
    """For each output index, an (operand, mode) whose extent it is: the fake
    implementation sees only operand shapes."""
    bound: dict[str, tuple[str, int]] = {}
    for a in accesses(statement.rhs):
        for mode, idx in enumerate(a.indices):
            if idx.single_variable is not None:
                bound.setdefault(idx.single_variable, (a.tensor, mode))
    found = []
    for idx in statement.lhs.indices:
        var = idx.single_variable
        if var is None or var not in bound:
            raise UnsupportedError(
                f"output index {idx} of {statement.lhs} is not an operand's index on its own, "
                "so the op cannot tell the output's shape from the operands' shapes"
            )
        found.append(bound[var])
    return found
