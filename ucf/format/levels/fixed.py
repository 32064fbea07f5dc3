"""Fixed-width (``F<w>``) levels: exactly w positions per parent position, no pos array.

ELL stores every row in the same number of slots, and N:M sparsity stores n places
of every group of m; both are this level (``ell(w)`` and ``nm(n, m)`` in
:mod:`ucf.format.format`). Parent position ``p`` owns positions ``p*w .. p*w+w-1``
and ``crd`` holds each slot's coordinate, so nothing is loaded to find a segment and
every loop over one has the constant trip count w.

Segments with fewer than w entries are padded with explicit zeros. The padding takes
the smallest coordinates its segment does not use, merged in order, so every segment
stays strictly increasing: the level is ``ordered`` and unique, so it co-iterates
with other sparse operands (an SDDMM with a CSR mask, a sum with a CSR matrix) and
is searched like a compressed level, where an unordered kind would refuse both. The
price: a segment holds w distinct coordinates, so the width cannot exceed the
level's dimension (packing refuses it), and the padding shows in ``to_coo`` and
``to_scipy`` as explicit zeros.

It is never an output level: which w coordinates an output segment stores is not
known before the kernel runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from ucf.errors import FormatError
from ucf.format.levels import checks
from ucf.format.levels.base import LevelKind


@dataclass(frozen=True)
class FixedWidth(LevelKind):
    width: int = 0  # 0 in the registered kind: a format string gives the width (F4)

    parameter: ClassVar[str | None] = "width"
    coordinate_array: ClassVar[str | None] = "crd"

    def with_parameter(self, value):
        if value < 1:
            raise FormatError(f"a {self.name} level needs a width of at least 1, got {value}")
        return replace(self, width=value, name=f"fixed-width {value}")

    @property
    def segment_width(self) -> int:
        return self.width

    @property
    def spelling(self) -> str:
        return f"{self.letter}{self.width}"

    def split(self, unique):
        """Cut into blocks, a segment's w coordinates fall into any number of blocks, so
        the block and the place in it are stored compressed (a tensor re-packed for a
        statement whose other tensors block the variable)."""
        from ucf.format.levels.compressed import COMPRESSED, SINGLETON

        return (COMPRESSED, COMPRESSED) if unique else (COMPRESSED, SINGLETON)

    def reordered(self):
        """In another mode order, a segment holds any number of coordinates."""
        from ucf.format.levels.compressed import COMPRESSED

        return COMPRESSED

    def as_output(self):
        raise FormatError(
            f"a {self.name} level cannot be an output level (which {self.width} coordinates "
            "each segment stores is not known before the kernel runs); compute the output "
            "as 'csr' or 'dense' and convert it"
        )

    # ----------------------------------------------------------- iteration (LLIR)
    def bounds(self, arrays, parent, segment_end, dim):
        from ucf.ir.nodes import add, const_like, mul

        if segment_end is not None:
            raise TypeError("a fixed-width level cannot sit below a non-unique level")
        w = const_like(parent, self.width)
        begin = mul(parent, w)
        return begin, add(begin, w)

    def coordinate(self, arrays, pos, parent=None, dim=None):
        from ucf.ir.nodes import Load

        return Load(arrays["crd"], pos)

    def child_range(self, arrays, lo, hi, dim):
        from ucf.ir.nodes import const_like, mul

        return mul(lo, const_like(lo, self.width)), mul(hi, const_like(hi, self.width))

    def parent_walk(self, arrays, dim, child, first, rng, parent):
        from ucf.ir import nodes as ir

        w = ir.Const(self.width, ir.I64)
        at_first = ir.Var(f"{parent.name}_first", ir.I64)
        return (
            [ir.Decl(at_first, ir.Bin("/", first, w))],
            [ir.Decl(parent, ir.Bin("/", child, w))],
            at_first,
        )

    # ----------------------------------------------------------- storage (numpy)
    def size(self, arrays, parent_count, dim):
        return parent_count * self.width

    def check(self, where, arrays, dim, unique, state):
        crd, w = arrays["crd"], self.width
        n = state.count * w
        if len(crd) != n:
            raise FormatError(
                f"{where}: crd has length {len(crd)}, expected the width {w} per parent "
                f"position = {n}"
            )
        if not unique:
            raise FormatError(f"{where}: a {self.name} level cannot hold a singleton level below")
        checks.in_range(where, crd, dim)
        if w > 1 and n:
            q = checks.first_true((np.diff(crd.reshape(-1, w), axis=1) <= 0).reshape(-1))
            if q is not None:
                p, k = divmod(q, w - 1)
                at = p * w + k + 1
                raise FormatError(
                    f"{where}: crd not strictly sorted within segment of parent position {p} "
                    f"at position {at} (crd {int(crd[at])} after {int(crd[at - 1])})"
                )
        state.count = n

    def pack(self, lvl, run_end, state):
        """Each parent's distinct coordinates, padded to w with the smallest coordinates
        the parent does not use (among 0..w-1 at most k are used, so w - k are free)."""
        w, lc, parent, count = self.width, state.lc, state.parent, state.count
        dim = state.dims[lvl]
        if run_end > lvl + 1:
            raise FormatError(f"{state.where(lvl)}: a {self.name} level cannot hold a singleton")
        if w > dim:
            raise FormatError(
                f"{state.where(lvl)}: the width {w} exceeds the level's dimension {dim} (a "
                "segment stores w distinct coordinates)"
            )
        new = np.ones(len(parent), dtype=bool)
        new[1:] = (parent[1:] != parent[:-1]) | (lc[1:, lvl] != lc[:-1, lvl])
        first = np.flatnonzero(new)
        seg, crd = parent[first], lc[first, lvl]
        used = np.bincount(seg, minlength=count)
        over = checks.first_true(used > w)
        if over is not None:
            entry = int(first[np.searchsorted(seg, over)])
            raise FormatError(
                f"{state.where(lvl)}: {state.owner(lvl, entry)} has {int(used[over])} "
                f"entries, more than the width {w}"
            )
        taken = np.zeros((count, w), dtype=bool)
        low = crd < w
        taken[seg[low], crd[low]] = True
        free = ~taken
        pad_seg, pad_crd = np.nonzero(free & (np.cumsum(free, axis=1) <= (w - used)[:, None]))
        all_seg = np.concatenate([seg, pad_seg])
        all_crd = np.concatenate([crd, pad_crd])
        order = np.lexsort((all_crd, all_seg))
        slot = np.empty(len(order), dtype=np.int64)
        slot[order] = np.arange(len(order), dtype=np.int64)
        state.parent = slot[: len(first)][np.cumsum(new) - 1]
        state.first = first
        state.count = count * w
        return {"crd": all_crd[order].astype(state.idt)}

    def unpack(self, arrays, dim, cols, count):
        cols = [np.repeat(c, self.width) for c in cols]
        cols.append(arrays["crd"].astype(np.int64))
        return cols, count * self.width


FIXED_WIDTH = FixedWidth("F", "fixed-width", ("crd",), full=False, can_locate=False)
