"""Level kinds: the one extension point every storage format goes through.

A level kind says what it stores (its arrays) and what it can do (iterate
coordinates, iterate positions, locate).  The lowerer asks a level kind for
LLIR through :meth:`LevelKind.bounds`, :meth:`LevelKind.coordinate` and
:meth:`LevelKind.locate`; it never tests which kind it holds, so blocked,
N:M, unordered or quantized kinds plug in by subclassing here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ucf.ir.nodes import Expr


@dataclass(frozen=True)
class LevelKind:
    """Capabilities of one level kind; subclasses emit LLIR for them."""

    letter: str
    name: str
    arrays: tuple[str, ...]
    full: bool  # stores every coordinate of its dimension for each parent position
    can_locate: bool  # a coordinate maps to a position without searching
    ordered: bool = True
    branchless: bool = False  # one child position per parent position (singleton)

    def bounds(
        self, arrays: dict[str, Expr], parent: Expr, segment_end: Expr | None, dim: Expr
    ) -> tuple[Expr, Expr]:
        """Position range [begin, end) of the children of parent position ``parent``.

        ``segment_end`` is set when the parent level is non-unique: the parent
        then hands down a run of positions [parent, segment_end).
        """
        raise NotImplementedError

    def coordinate(self, arrays: dict[str, Expr], pos: Expr) -> Expr:
        """The coordinate stored at position ``pos``."""
        raise NotImplementedError

    def locate(self, parent: Expr, coord: Expr, dim: Expr) -> Expr:
        """The position of ``coord`` under parent position ``parent``."""
        raise NotImplementedError

    def count(self, parent_count: int, arrays: dict) -> int:
        """Number of positions this level holds, given its parent's count."""
        raise NotImplementedError

    def child_range(self, arrays: dict[str, Expr], lo: Expr, hi: Expr, dim: Expr):
        """Positions of the children of the parent positions [lo, hi), for ``pos`` over a fuse."""
        raise NotImplementedError

    def search(self, arrays: dict[str, Expr], lo: Expr, hi: Expr, key: Expr, result):
        """Statements setting (the declared) ``result`` to the first position in [lo, hi)
        whose coordinate is at least ``key``: where an affine access's window starts or ends.

        Any kind with ordered coordinates gets this binary search for free.
        """
        from ucf.ir import nodes as ir

        if not self.ordered or self.full:
            raise TypeError(f"a {self.name} level has no ordered coordinates to search")
        i64 = "i64"
        h = ir.Var(f"{result.name}_h", i64)
        m = ir.Var(f"{result.name}_m", i64)
        step = [
            ir.Decl(m, ir.Bin("/", ir.add(result, h), ir.Const(2, i64))),
            ir.If(
                ir.Cmp("<", ir.cast(self.coordinate(arrays, m), i64), key),
                [ir.Assign(result, ir.add(m, ir.Const(1, i64)))],
                [ir.Assign(h, m)],
            ),
        ]
        return [
            ir.Assign(result, lo),
            ir.Decl(h, hi),
            ir.While(ir.Cmp("<", result, h), step),
        ]


class Dense(LevelKind):
    def bounds(self, arrays, parent, segment_end, dim):
        from ucf.ir.nodes import add, mul

        return mul(parent, dim), add(mul(parent, dim), dim)

    def locate(self, parent, coord, dim):
        from ucf.ir.nodes import add, mul

        return add(mul(parent, dim), coord)

    def count(self, parent_count, arrays):
        raise TypeError("dense levels are counted from the dimension")

    def child_range(self, arrays, lo, hi, dim):
        from ucf.ir.nodes import mul

        return mul(lo, dim), mul(hi, dim)


class Compressed(LevelKind):
    def bounds(self, arrays, parent, segment_end, dim):
        from ucf.ir.nodes import Load, add, const_like

        if segment_end is not None:
            raise TypeError("a compressed level cannot sit below a non-unique level")
        return (
            Load(arrays["pos"], parent),
            Load(arrays["pos"], add(parent, const_like(parent, 1))),
        )

    def coordinate(self, arrays, pos):
        from ucf.ir.nodes import Load

        return Load(arrays["crd"], pos)

    def count(self, parent_count, arrays):
        return int(arrays["pos"][parent_count]) if parent_count < len(arrays["pos"]) else -1

    def child_range(self, arrays, lo, hi, dim):
        from ucf.ir.nodes import Load

        return Load(arrays["pos"], lo), Load(arrays["pos"], hi)


class Singleton(LevelKind):
    def bounds(self, arrays, parent, segment_end, dim):
        from ucf.ir.nodes import add, const_like

        end = segment_end if segment_end is not None else add(parent, const_like(parent, 1))
        return parent, end

    def coordinate(self, arrays, pos):
        from ucf.ir.nodes import Load

        return Load(arrays["crd"], pos)

    def count(self, parent_count, arrays):
        return parent_count

    def child_range(self, arrays, lo, hi, dim):
        return lo, hi


class WorkspaceList(LevelKind):
    """The coordinates a precompute workspace was touched at, sorted: ``crd[0:count)``."""

    def bounds(self, arrays, parent, segment_end, dim):
        from ucf.ir.nodes import Const

        return Const(0, "i64"), arrays["count"]

    def coordinate(self, arrays, pos):
        from ucf.ir.nodes import Load

        return Load(arrays["crd"], pos)


DENSE = Dense("U", "dense", (), full=True, can_locate=True)
COMPRESSED = Compressed("C", "compressed", ("pos", "crd"), full=False, can_locate=False)
SINGLETON = Singleton("S", "singleton", ("crd",), full=False, can_locate=False, branchless=True)

# Not a user format: the lowerer's view of a workspace's touched-coordinate list.
WORKSPACE_LIST = WorkspaceList("W", "workspace list", ("crd",), full=False, can_locate=False)

KINDS: dict[str, LevelKind] = {k.letter: k for k in (DENSE, COMPRESSED, SINGLETON)}
