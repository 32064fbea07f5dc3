"""The linear layers' forward and backward calls, as ``torch.autograd.Function``s over
the kernels of ``ucf.nn.plans``.

Activations cross the kernels feature-major: an input whose transpose is contiguous
(a previous layer's output, through torch's element-wise functions) is read in place,
another is transposed once; the output is the transposed view of the product's
array, and so is the input's gradient.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ucf.autodiff.backward import on_pattern
from ucf.format.construction import trusted
from ucf.format.format import Format
from ucf.format.tensor import Tensor, held
from ucf.nn.plans import DynamicPlan, StaticPlan, dense


def feature_major(x: torch.Tensor, dtype: np.dtype) -> np.ndarray:
    """``x`` (tokens x features) transposed, as a C-contiguous numpy array."""
    t = x.detach().t()
    a = t.numpy() if t.is_contiguous() else t.contiguous().numpy()
    return a if a.dtype == dtype else a.astype(dtype)


def token_major(x: torch.Tensor, dtype: np.dtype) -> np.ndarray:
    a = x.detach()
    a = a.numpy() if a.is_contiguous() else a.contiguous().numpy()
    return a if a.dtype == dtype else a.astype(dtype)


def _add_bias(y: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if bias is not None:
        y += bias.detach()[:, None]
    return y


def transposer(pattern: Tensor, columns: Format) -> tuple[list[dict], np.ndarray]:
    """The column-major format's index arrays for ``pattern``, and for each of its stored
    entries the position of the same entry in ``pattern`` (-1: a zero it pads with)."""
    n = len(pattern.vals)
    numbered = trusted(
        pattern.shape,
        pattern.format.structure,
        pattern.levels,
        np.arange(1, n + 1, dtype=np.float64),
        pattern.index_dtype,
    )
    col = numbered.convert(columns)
    return col.levels, col.vals.astype(np.int64) - 1


class StaticLinear(torch.autograd.Function):
    """``SparseLinear``: the weight is ``values`` on ``pattern``'s index arrays."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        values: torch.Tensor,
        bias: torch.Tensor | None,
        pattern: Tensor,
        plan: StaticPlan,
        kept: torch.Tensor | None,
        columns: tuple[list[dict], np.ndarray],
    ) -> torch.Tensor:
        dt = plan.dtype
        xt = feature_major(x, dt)
        vals = values.detach().numpy()
        w = trusted(pattern.shape, pattern.format, pattern.levels, vals, pattern.index_dtype)
        if plan.fmt.values is not None:  # the products read the values as stored
            w = held(w, plan.fmt)
            vals = w.numbers().astype(dt)
        y = torch.from_numpy(np.asarray(plan.forward(W=w, X=dense(xt))))
        ctx.state = (xt, vals, pattern, plan, kept, columns)
        ctx.save_for_backward(x, values)
        return _add_bias(y, bias).t()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        xt, vals, pattern, plan, kept, columns = ctx.state
        x, _ = ctx.saved_tensors
        gt = dense(feature_major(grad, plan.dtype))
        grad_x = grad_values = grad_bias = None
        if ctx.needs_input_grad[0]:
            levels, perm = columns
            cvals = np.append(vals, vals.dtype.type(0))[perm]
            w = trusted(pattern.shape, plan.columns, levels, cvals, pattern.index_dtype)
            grad_x = torch.from_numpy(np.asarray(plan.grad_x(grad_Y=gt, W=w))).t()
        if ctx.needs_input_grad[1]:
            activations = dense(token_major(x, plan.dtype)) if plan.rows else dense(xt)
            got = plan.grad_w(pattern_W=pattern, grad_Y=gt, X=activations)
            g = on_pattern(pattern, got)
            grad_values = torch.from_numpy(g if kept is None else g * kept.numpy())
        if ctx.needs_input_grad[2]:
            grad_bias = grad.sum(0)
        return grad_x, grad_values, grad_bias, None, None, None, None


class DynamicLinear(torch.autograd.Function):
    """``DynamicSparseLinear``: a dense weight under a boolean mask of its shape."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        mask: torch.Tensor,
        plan: DynamicPlan,
    ) -> torch.Tensor:
        dt = plan.dtype
        xt = feature_major(x, dt)
        w = token_major(weight, dt)
        m = mask.numpy()
        y = torch.from_numpy(np.asarray(plan.forward(W=w, X=xt, masks={"W": m})))
        ctx.state = (xt, w, m, plan)
        ctx.save_for_backward(x, weight)
        return _add_bias(y, bias).t()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        xt, w, m, plan = ctx.state
        gt = feature_major(grad, plan.dtype)
        grad_x = grad_w = grad_bias = None
        if ctx.needs_input_grad[0]:
            if plan.transposed:
                wt, mt = np.ascontiguousarray(w.T), np.ascontiguousarray(m.T)
                got = plan.grad_x(W=wt, grad_Y=gt, masks={"W": mt})
            else:
                got = plan.grad_x(grad_Y=gt, W=w, masks={"W": m})
            grad_x = torch.from_numpy(np.asarray(got)).t()
        if ctx.needs_input_grad[1]:
            grad_w = torch.from_numpy(_weight_gradient(plan, xt, gt, m))
        if ctx.needs_input_grad[2]:
            grad_bias = grad.sum(0)
        return grad_x, grad_w, grad_bias, None, None


def _weight_gradient(plan: DynamicPlan, xt: np.ndarray, gt: np.ndarray, m: np.ndarray) -> Any:
    """The weight's gradient in its live tiles, zero elsewhere (and where the mask is)."""
    gh, gw = plan.tile
    out, tokens = gt.shape
    if plan.rows_of_tiles and out % gh == 0:
        rows = out // gh
        live = m.reshape(rows, gh, -1).any(axis=1).astype(plan.dtype)  # R(e, i)
        g3 = np.ascontiguousarray(gt.reshape(rows, gh, tokens).transpose(0, 2, 1))
        c = np.asarray(plan.grad_w_rows(R=live, X=xt, G=g3))  # C(e, i, n)
        full = c.transpose(0, 2, 1).reshape(out, -1)
        return np.where(m, full, 0).astype(plan.dtype)
    ones = np.ones(m.shape, dtype=plan.dtype)
    return np.asarray(plan.grad_w(pattern_W=ones, grad_Y=gt, X=xt, masks={"pattern_W": m}))
