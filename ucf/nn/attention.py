"""Dynamic sparse attention: ``ucf.attention`` and ``ucf.nn.SparseAttention``.

``softmax(Q K^T * scale on the mask) V`` per batch and head, over the live elements of
a mask that may change every call (SparDA's Longformer and Museformer scenarios). The
mask is exact at element level; ``granularity`` is the compute tile, whose STile index
is built every call (``ucf.nn.attention_masks``). The computation is ucf statements
(``ucf.nn.attention_statements``): scores into the mask's pattern, a row softmax over
the live entries with the ``max`` reduction and ``-inf`` fills, and the product with
the values; on the CPU targets a fused kernel per block of query rows runs them
together where it is faster (``ucf.nn.attention_fused``). ``SparseAttention(...).cin``
shows the plan. torch tensors in, torch tensors out; gradients flow to q, k and v.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ucf.errors import OperandError, UnsupportedError, boundary
from ucf.format.torch_layouts import need_torch
from ucf.nn import attention_fused as fused
from ucf.nn import attention_statements as statements
from ucf.nn.attention_masks import AttentionMask, resolve

#: Where attention runs: the CPU code generators, and CUDA (a GPU or its emulator).
TARGETS = ("llvm", "c", "cuda")


def _checked(q: Any, k: Any, v: Any) -> tuple[Any, Any, Any]:
    torch = need_torch("ucf.attention")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise OperandError(
                f"ucf.attention: {name} must be a torch.Tensor, got {type(t).__name__}"
            )
        if t.dim() != 4:
            raise OperandError(
                f"ucf.attention: {name} has shape {tuple(t.shape)}; it must be (batch, heads, "
                "sequence, features)"
            )
        if t.dtype not in (torch.float32, torch.float64) or t.dtype != q.dtype:
            raise OperandError(
                f"ucf.attention: q, k and v must all be float32 or all float64, got "
                f"{q.dtype}, {k.dtype}, {v.dtype}"
            )
        if t.device.type != "cpu":
            raise OperandError(f"ucf.attention: {name} is on {t.device}; pass tensors on the CPU")
    (b, h, _, d), (bk, hk, sk, dk), (bv, hv, sv, _) = q.shape, k.shape, v.shape
    if (bk, hk, dk) != (b, h, d) or (bv, hv, sv) != (b, h, sk):
        raise OperandError(
            f"ucf.attention: q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} "
            "must agree: q (B, H, Sq, D), k (B, H, Sk, D), v (B, H, Sk, Dv)"
        )
    return q, k, v


def _granularity(granularity: Any) -> tuple[int, int]:
    g = tuple(granularity) if isinstance(granularity, tuple | list) else ()
    if len(g) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in g):
        raise OperandError(
            f"ucf.attention: granularity must be two positive ints (query rows, keys) of "
            f"the compute tile, got {granularity!r}"
        )
    return g[0], g[1]


class AttentionPlan:
    """How one target computes attention: the statements, each one's kernel plan (its
    ``cin``), or the fused kernels that run them together per block of query rows
    (the CPU targets' default; ``fused=False`` runs the statements)."""

    def __init__(self, target: str, emulate: bool, dtype: str, fused: bool | None):
        if target not in TARGETS:
            raise UnsupportedError(f"ucf.attention runs on {', '.join(TARGETS)}, not {target!r}")
        if emulate and target != "cuda":
            raise UnsupportedError("emulate=True runs generated CUDA and needs target='cuda'")
        if fused and target == "cuda":
            raise UnsupportedError(
                "the fused attention kernels run on the CPU targets (llvm, c); on cuda the "
                "statements run (fused=None or False)"
            )
        self.target, self.emulate, self.dtype = target, emulate, dtype
        self.fused = target != "cuda" if fused is None else fused

    def setup(self, amask: AttentionMask) -> statements.Setup:
        b, h, *_ = amask.shape
        bm, hm = amask.broadcast
        by_batch = (bm == b and bm > 1) or (amask.lengths is not None and b > 1)
        return statements.Setup(self.target, self.emulate, self.dtype, by_batch, hm == h and hm > 1)

    def forward(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, amask: AttentionMask, scale):
        if self.fused:
            return fused.forward(self.target, q, k, v, amask, scale)
        setup = self.setup(amask)
        M = statements.mask_tensor(amask, setup)
        out, saved = statements.forward(setup, q, k, v, M, scale)
        return out, (setup, saved)

    def backward(self, saved: Any, q, k, v, dO: np.ndarray, scale):
        if self.fused:
            return fused.backward(self.target, saved, q, k, v, dO, scale)
        setup, kept = saved
        return statements.backward(setup, kept, q, k, v, dO, scale)

    def describe(self, amask: AttentionMask) -> str:
        """The statements in order with each kernel's plan, as ``k.cin`` shows one, and
        the fused kernels where they run instead."""
        setup = self.setup(amask)
        gq, gk = amask.granularity
        if self.fused:
            lines = [
                f"# attention on {self.target}: fused kernels over {gq} x {gk} tiles "
                "(ucf.lower.attention_forward, attention_backward), which run these "
                f"statements together per block of {gq} query rows:",
                "#   forward: scores, rowmax, exp, rowsum and values in one pass over the "
                "block's live tiles (scores of a row's tiles in a workspace)",
                "#   backward: per batch and head, the weights recomputed tile by tile, "
                "then dvalues, dscores, dqueries and dkeys",
            ]
        else:
            lines = [f"# attention on {self.target}: the statements, one kernel each"]
        for step, (stmt, formats) in setup.statements().items():
            spelled = ", ".join(f"{n}: {f}" for n, f in sorted(formats.items()))
            lines.append(f"{step}: {stmt}" + (f"    [{spelled}]" if spelled else ""))
            if not self.fused:
                lines += ["    " + x for x in statements.kernel(setup, step).cin.splitlines()]
        return "\n".join(lines)


_PLANS: dict[tuple, AttentionPlan] = {}


def plan(target: str, emulate: bool, dtype: str, fused: bool | None) -> AttentionPlan:
    key = (target, emulate, dtype, fused)
    if key not in _PLANS:
        _PLANS[key] = AttentionPlan(target, emulate, dtype, fused)
    return _PLANS[key]


def _function():
    """The torch.autograd.Function of attention, made once (torch is imported on use)."""
    torch = need_torch("ucf.attention")

    class Attention(torch.autograd.Function):
        """Forward and backward through a :class:`AttentionPlan`; the mask is not differentiated."""

        @staticmethod
        def forward(ctx, q, k, v, chosen, amask, scale):
            arrays = [t.detach().contiguous().numpy() for t in (q, k, v)]
            out, saved = chosen.forward(*arrays, amask, scale)
            ctx.chosen, ctx.saved, ctx.arrays, ctx.scale = chosen, saved, arrays, scale
            return torch.from_numpy(out)

        @staticmethod
        def backward(ctx, grad):
            dO = grad.detach().contiguous().numpy()
            dq, dk, dv = ctx.chosen.backward(ctx.saved, *ctx.arrays, dO, ctx.scale)
            return (
                torch.from_numpy(dq),
                torch.from_numpy(dk),
                torch.from_numpy(dv),
                None,
                None,
                None,
            )

    return Attention


_FUNCTION: list = []


@boundary
def attention(
    q: Any,
    k: Any,
    v: Any,
    mask: Any = None,
    granularity: tuple[int, int] = (64, 64),
    scale: float | None = None,
    *,
    target: str = "llvm",
    emulate: bool = False,
    fused: bool | None = None,
    lengths: Any = None,
) -> Any:
    """``softmax(q k^T * scale, masked) v`` per batch and head, for torch tensors
    ``q`` (B, H, Sq, D), ``k`` (B, H, Sk, D), ``v`` (B, H, Sk, Dv).

    ``mask``: a boolean tensor, True where a query attends to a key, of shape (Sq, Sk)
    (shared by batch and heads) or (B or 1, H or 1, Sq, Sk); a function of
    ``(b, h, q_idx, kv_idx)`` (FlexAttention's ``mask_mod``; see ``ucf.nn.causal``,
    ``local``, ``longformer``); FlexAttention's ``BlockMask``; or None (every key).
    The mask is exact at element level; ``granularity`` (query rows, keys) is the
    compute tile (a BlockMask's own block size replaces it). ``scale`` defaults to
    1/sqrt(D). A query row with no live key returns 0. Gradients reach q, k and v.
    ``lengths`` (one per sequence; self-attention) makes the queries and keys past each
    sequence's length dead too: their rows return 0 and no tile past them is computed.
    """
    torch = need_torch("ucf.attention")
    q, k, v = _checked(q, k, v)
    g = _granularity(granularity)
    b, h, sq, d = q.shape
    sk = k.shape[2]
    s = 1.0 / math.sqrt(d) if scale is None else float(scale)
    dtype = "float64" if q.dtype == torch.float64 else "float32"
    chosen = plan(target, emulate, dtype, fused)
    amask = resolve(mask, (b, h, sq, sk), g, target, emulate, lengths)
    if not _FUNCTION:
        _FUNCTION.append(_function())
    return _FUNCTION[0].apply(q, k, v, chosen, amask, s)


_torch = need_torch("ucf.nn.SparseAttention")


class SparseAttention(_torch.nn.Module):
    """Attention over a mask given with each call, as a module: ``forward(q, k, v,
    mask=None, lengths=None)`` is :func:`attention` with this module's granularity,
    scale and target. ``cin`` shows the plan it runs (the statements and their kernels)."""

    def __init__(
        self,
        granularity: tuple[int, int] = (64, 64),
        scale: float | None = None,
        *,
        target: str = "llvm",
        emulate: bool = False,
        fused: bool | None = None,
    ):
        super().__init__()
        self.granularity = _granularity(granularity)
        self.scale, self.target, self.emulate, self.fused = scale, target, emulate, fused
        plan(target, emulate, "float32", fused)  # refuse a bad target now

    def forward(self, q: Any, k: Any, v: Any, mask: Any = None, lengths: Any = None) -> Any:
        return attention(
            q,
            k,
            v,
            mask,
            self.granularity,
            self.scale,
            target=self.target,
            emulate=self.emulate,
            fused=self.fused,
            lengths=lengths,
        )

    def plan(self, shape: tuple[int, int, int, int], mask: Any = None, dtype: str = "float32"):
        """The plan for scores of ``shape`` (B, H, Sq, Sk) under ``mask``, as text."""
        chosen = plan(self.target, self.emulate, dtype, self.fused)
        return chosen.describe(resolve(mask, shape, self.granularity, self.target, self.emulate))

    @property
    def cin(self) -> str:
        """The plan for one batch, one head and a mask shared by both."""
        return self.plan((1, 1, 1, 1))

    def extra_repr(self) -> str:
        return f"granularity={self.granularity}, scale={self.scale}, target={self.target!r}"
