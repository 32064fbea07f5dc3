"""Sparse drop-ins for ``torch.nn.Linear``: a static TeSA weight, and a dynamic one whose
mask moves every step (SparDA's pruning loop). See docs/training.md."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ucf.errors import OperandError, boundary
from ucf.format.construction import from_numpy, trusted
from ucf.format.format import parse_format
from ucf.format.tensor import Tensor
from ucf.nn import autograd, masks
from ucf.nn.plans import DynamicPlan, StaticPlan
from ucf.tesa.policy import VALUES, with_width  # how bits store values, as TeSA's plans do


class SparseLinear(torch.nn.Module):
    """``y = x W^T + b`` with ``W`` stored sparse: its trainable parameter ``values`` holds
    the values of its format (one per stored entry) and its pattern is a buffer, so its
    gradient has as many entries as it stores, never a dense matrix.

    The weight is given as a ``mask`` of kept entries, a ``format`` (``"bcsr(32,64)"``,
    ``"nm(2,4)"``, ``"csr"``), or both: a format alone keeps what it can store of the
    initial weight (N:M its largest entries per group), a mask alone takes the format
    ``ucf.Policy`` finds cheapest among those storing it exactly. ``bits`` (8, 4, 16)
    quantizes the values the products read (the gradient passes through as for the
    float values); without it they stay in the layer's dtype."""

    @boundary
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        mask: Any = None,
        format: Any = None,
        bits: int | None = None,
        dtype: Any = None,
    ):
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        dtype = dtype or torch.get_default_dtype()
        dense = torch.empty(out_features, in_features, dtype=dtype)
        torch.nn.init.kaiming_uniform_(dense, a=math.sqrt(5))
        self.bias = torch.nn.Parameter(torch.empty(out_features, dtype=dtype)) if bias else None
        if self.bias is not None:
            bound = 1 / math.sqrt(in_features) if in_features else 0
            torch.nn.init.uniform_(self.bias, -bound, bound)
        self._build(dense.numpy(), mask, format, bits)

    @classmethod
    @boundary
    def from_dense(
        cls, linear: torch.nn.Linear, mask: Any = None, format: Any = None, bits: int | None = None
    ) -> SparseLinear:
        """The layer holding ``linear``'s weight (where kept) and bias."""
        if not isinstance(linear, torch.nn.Linear):
            raise OperandError(f"from_dense takes a torch.nn.Linear, got {type(linear).__name__}")
        w = linear.weight.detach()
        layer = cls.__new__(cls)
        torch.nn.Module.__init__(layer)
        layer.in_features, layer.out_features = linear.in_features, linear.out_features
        layer.bias = None
        if linear.bias is not None:
            layer.bias = torch.nn.Parameter(linear.bias.detach().clone())
        layer._build(w.numpy(), mask, format, bits)
        return layer

    def _build(self, dense: np.ndarray, mask: Any, fmt: Any, bits: int | None) -> None:
        shape = (self.out_features, self.in_features)
        if mask is None and fmt is None:
            raise OperandError("SparseLinear needs a mask, a format or both to know its pattern")
        if mask is not None:
            mask = np.asarray(mask.detach() if isinstance(mask, torch.Tensor) else mask) != 0
            if mask.shape != shape:
                raise OperandError(f"the mask has shape {mask.shape}, the weight {shape}")
        chosen = masks.choose_format(mask) if fmt is None else parse_format(fmt, order=2)
        if mask is None:
            mask = masks.storable(dense, chosen)
        pattern = from_numpy(mask.astype(np.float64), format=chosen, index_dtype=np.int64)
        coords = pattern.format.mode_coords(*pattern.columns())
        inside = np.all(coords < np.asarray(shape), axis=1)
        keep = inside & (pattern.vals != 0)
        values = np.zeros(len(pattern.vals), dtype=dense.dtype)
        values[inside] = dense[coords[inside, 0], coords[inside, 1]]
        values *= keep
        self.format = chosen
        self.bits = bits
        if bits is not None and bits not in VALUES:
            raise OperandError(f"bits is one of {sorted(VALUES)}, got {bits!r}")
        self.values = torch.nn.Parameter(torch.from_numpy(values))
        for lvl, arrays in enumerate(pattern.levels):
            for name, a in arrays.items():
                self.register_buffer(f"pattern_{lvl}_{name}", torch.from_numpy(a))
        self.register_buffer("kept", None if keep.all() else torch.from_numpy(keep))

    def _pattern(self) -> Tensor:
        """The weight's pattern (ones at its stored positions) on the buffers' arrays."""
        levels = [
            {name: getattr(self, f"pattern_{lvl}_{name}").numpy() for name in names}
            for lvl, names in enumerate(self._arrays())
        ]
        ones = np.ones(self.values.shape[0], dtype=self._dtype())
        shape = (self.out_features, self.in_features)
        return trusted(shape, self.format.structure, levels, ones, np.dtype(np.int64))

    def _arrays(self) -> list[list[str]]:
        found: dict[int, list[str]] = {k: [] for k in range(len(self.format.levels))}
        for key in self._buffers:
            if key.startswith("pattern_"):
                _, lvl, name = key.split("_", 2)
                found[int(lvl)].append(name)
        return [found[k] for k in range(len(self.format.levels))]

    def _dtype(self) -> np.dtype:
        return np.dtype(str(self.values.dtype).removeprefix("torch."))

    @property
    def weight(self) -> torch.Tensor:
        """The weight as a dense matrix (a copy, outside autograd), for inspection."""
        p = self._pattern()
        t = trusted(p.shape, p.format, p.levels, self.values.detach().numpy(), p.index_dtype)
        return torch.from_numpy(t.to_numpy())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pattern = self._pattern()
        fmt = pattern.format
        if self.bits is not None:
            fmt = with_width(fmt, self.bits)
        plan = StaticPlan.get(fmt, self._dtype(), np.dtype(np.int64))
        lead = x.shape[:-1]
        args = (pattern, plan, self.kept, self._columns(pattern, plan))
        y = autograd.StaticLinear.apply(
            x.reshape(-1, self.in_features), self.values, self.bias, *args
        )
        return y.reshape(*lead, self.out_features)

    def _columns(self, pattern: Tensor, plan: StaticPlan) -> tuple[list[dict], np.ndarray]:
        """The column-major pattern the input's gradient reads, made once per pattern."""
        key = tuple(b.data_ptr() for k, b in self._buffers.items() if k.startswith("pattern_"))
        if getattr(self, "_transposed", (None,))[0] != key:
            self._transposed = (key, autograd.transposer(pattern, plan.columns))
        return self._transposed[1]

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, format={self.format}, nnz={self.values.shape[0]}"
        )


class DynamicSparseLinear(torch.nn.Module):
    """``y = x (W * mask)^T + b`` with a dense weight and a mask that may change every
    step, at a micro-tile ``granularity`` (SparDA's STile path): each call indexes the
    mask's live tiles and computes over them only, forward and backward. The weight's
    gradient is computed inside the live tiles only and is zero elsewhere.

    Set ``layer.mask = m`` or call ``layer(x, mask=m)``: ``m`` is a boolean tensor of
    the weight's shape, or of its grid of tiles. Without a mask the weight's nonzeros
    are its mask."""

    @boundary
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        granularity: tuple[int, int] = (32, 1),
        dtype: Any = None,
    ):
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        g = tuple(granularity)
        if len(g) != 2 or not all(isinstance(k, int) and k >= 1 for k in g):
            raise OperandError(f"granularity is two positive tile extents, got {granularity!r}")
        self.granularity = g
        dtype = dtype or torch.get_default_dtype()
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=dtype))
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        self.bias = torch.nn.Parameter(torch.empty(out_features, dtype=dtype)) if bias else None
        if self.bias is not None:
            bound = 1 / math.sqrt(in_features) if in_features else 0
            torch.nn.init.uniform_(self.bias, -bound, bound)
        self.register_buffer("_mask", None)

    @property
    def mask(self) -> torch.Tensor | None:
        """The mask of the weight's shape (booleans), or None: the weight's nonzeros."""
        return self._mask

    @mask.setter
    def mask(self, m: Any) -> None:
        self._mask = (
            None
            if m is None
            else masks.element_mask(m, (self.out_features, self.in_features), self.granularity)
        )

    def forward(self, x: torch.Tensor, mask: Any = None) -> torch.Tensor:
        shape = (self.out_features, self.in_features)
        m = self._mask if mask is None else masks.element_mask(mask, shape, self.granularity)
        if m is None:
            m = self.weight.detach() != 0
        dtype = np.dtype(str(self.weight.dtype).removeprefix("torch."))
        plan = DynamicPlan.get(self.granularity, dtype)
        lead = x.shape[:-1]
        y = autograd.DynamicLinear.apply(
            x.reshape(-1, self.in_features), self.weight, self.bias, m, plan
        )
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, granularity={self.granularity}"
        )
