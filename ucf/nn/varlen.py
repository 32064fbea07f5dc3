"""Variable sequence lengths: a padded batch whose layers compute its valid tokens only.

Batching sequences of different lengths pads them to the longest; the padding is
dynamic sparsity over token rows (SparDA section 5.1.2). ``packed(x, lengths)`` pairs
a padded batch ``(B, S, ...)`` with each sequence's length; the layers here take it
(or ``lengths=``) and return the padded layout, with zeros in the padding:

- :class:`PackedLinear`, a ``torch.nn.Linear`` whose product over the valid rows is
  one ucf kernel with the rows as a dynamic operand (``C(e,t,n) = R(e,t) * X(t,d) *
  W(e,d,n)`` with one ``e``): every call builds the STile index of the valid rows,
  gathers them into dense compute tiles and writes their rows of the output
  (docs/stile.md, "Gathered compute tiles"). When nearly every row is valid
  (``DENSE_FROM``) the padding saves nothing and torch's dense product runs;
- :func:`ucf.attention` and ``SparseAttention`` take ``lengths=``: no tile past a
  sequence's length is computed.

This linear layer is the minimal one varlen needs (inference: under autograd it runs
torch's product on every row, so gradients flow); ``ucf.nn``'s dynamic linear layers
are where the training story lives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ucf import api
from ucf.errors import OperandError
from ucf.format.torch_layouts import need_torch
from ucf.nn.attention_masks import check_lengths

torch = need_torch("ucf.nn.varlen")

#: The share of valid rows from which torch's dense product runs instead, since the
#: padding left to skip no longer pays for building the index and gathering. On this
#: machine (one thread, CPU time, BERT-base's four shapes, 4096 rows) the gathered
#: kernel took 0.35-0.39x torch's time at 40 % valid rows, 0.61-0.65x at 70 % and
#: 0.85-0.95x at 100 %.
DENSE_FROM = 0.9
STATEMENT = "C(e,t,n) = R(e,t) * X(t,d) * W(e,d,n)"


@dataclass
class Packed:
    """A padded batch ``data`` (B, S, ...) and each sequence's valid length (B,)."""

    data: Any
    lengths: Any

    def rows(self) -> Any:
        """The valid tokens as booleans (B, S)."""
        s = self.data.shape[1]
        return torch.arange(s, device=self.data.device)[None, :] < self.lengths[:, None]

    def with_data(self, data: Any) -> Packed:
        return Packed(data, self.lengths)


def packed(x: Any, lengths: Any) -> Packed:
    """``x`` (B, S, ...) padded, sequence b valid up to ``lengths[b]``."""
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise OperandError("ucf.nn.packed takes a padded batch: a torch.Tensor (B, S, ...)")
    b, s = x.shape[:2]
    valid = check_lengths(lengths, (b, 1, s, s))
    return Packed(x, torch.from_numpy(valid))


def unpacked(x: Any, lengths: Any = None) -> tuple[Any, Any]:
    """A layer's input as (padded data, lengths or None)."""
    if isinstance(x, Packed):
        return x.data, x.lengths
    if lengths is None:
        return x, None
    b, s = x.shape[:2]
    return x, torch.from_numpy(check_lengths(lengths, (b, 1, s, s)))


_KERNELS: dict[tuple, Any] = {}


def _kernel(dtype: str, target: str) -> Any:
    key = (dtype, target)
    if key not in _KERNELS:
        _KERNELS[key] = api.compile(STATEMENT, dynamic={"R": (1, 1)}, dtype=dtype, target=target)
    return _KERNELS[key]


class PackedLinear(torch.nn.Linear):
    """``torch.nn.Linear`` over the valid tokens of a padded batch: ``forward(x,
    lengths=None)`` with x (B, S, in) (or a :class:`Packed`, returned as one) computes
    the rows of the sequences' valid tokens and leaves the padding 0."""

    def __init__(self, *args: Any, target: str = "llvm", **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.target = target
        self._transposed: tuple | None = None

    def _weight(self) -> np.ndarray:
        """W(d, n) for the kernel: the weight transposed, kept until the weight changes."""
        w = self.weight
        key = (w.data_ptr(), w._version)
        if self._transposed is None or self._transposed[0] != key:
            self._transposed = (key, w.detach().t().contiguous().numpy()[None])
        return self._transposed[1]

    def forward(self, x: Any, lengths: Any = None) -> Any:
        data, n = unpacked(x, lengths)
        result = self._padded(data, n)
        return Packed(result, n) if isinstance(x, Packed) else result

    def _padded(self, x: Any, lengths: Any) -> Any:
        if lengths is None:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        b, s = x.shape[:2]
        rows = torch.arange(s)[None, :] < lengths[:, None]
        share = float(lengths.sum()) / max(b * s, 1)
        dtype = {torch.float32: "float32", torch.float64: "float64"}.get(x.dtype)
        grad = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
        if grad or share >= DENSE_FROM or dtype is None:
            out = torch.nn.functional.linear(x, self.weight, self.bias)
            return out if share == 1 else out * rows[..., None].to(out.dtype)
        flat = x.detach().reshape(b * s, -1).contiguous().numpy()
        gate = rows.reshape(1, b * s).to(x.dtype).numpy()
        c = _kernel(dtype, self.target)(R=gate, X=flat, W=self._weight())
        out = torch.from_numpy(np.asarray(c)).view(b, s, -1)
        if self.bias is not None:
            valid = rows.reshape(-1).nonzero().squeeze(1)
            out.view(b * s, -1).index_add_(0, valid, self.bias.detach().expand(len(valid), -1))
        return out
