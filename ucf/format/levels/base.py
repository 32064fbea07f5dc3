"""The level protocol: the one extension point every storage format goes through.

A level kind says what it stores (its arrays), what it is (properties) and
what it can do (capabilities), and emits LLIR or numpy code for each.  The
compiler (``ucf.lower``, ``ucf.cin``, ``ucf.exec``, ``ucf.codegen``) asks for
properties and capabilities only and never tests which kind it holds, so a
new kind is one module in this package: blocked, N:M, unordered or quantized
kinds plug in by subclassing :class:`LevelKind`.

Properties, after TACO's mode formats and MLIR's level types:

- ``full``: stores every coordinate of its dimension under each parent;
- ``ordered``: coordinates increase within a parent's segment, so the level
  can be co-iterated with others and searched;
- ``branchless``: exactly one child position per parent position (its parent
  level is then non-unique: the same coordinate may repeat);
- ``compact``: the positions of all parents are contiguous;
- ``can_locate``: a coordinate maps to its position without searching.

Uniqueness is structural: a level is unique unless a branchless level hangs
below it (``Format.unique``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ucf.errors import FormatError

if TYPE_CHECKING:
    import numpy as np

    from ucf.ir.nodes import Expr, Stmt, Var


@dataclass
class Checking:
    """What checking the levels outer to inner has found so far.

    A run of positions shared by a non-unique level and the branchless levels
    below it is checked together: ``run_*`` hold the run's first level, its pos
    array, and for each neighbouring pair whether all coordinates so far agree.
    """

    count: int = 1  # positions at the level above
    level: int = 0  # the level being checked
    run_level: int = -1
    run_pos: np.ndarray | None = None
    run_eq: np.ndarray | None = None


@dataclass
class Packing:
    """Packing sorted, level-ordered coordinates ``lc`` (entries x levels) level by level.

    ``parent[e]`` is the position of entry ``e`` at the level above and ``first``
    the entries that start a position there (for branchless levels below).
    ``where(l)`` names level ``l`` in messages and ``owner(l, e)`` the parent of entry
    ``e`` at level ``l`` (``row 3, group 2 (columns 8..11)``).
    """

    lc: np.ndarray
    dims: list[int]
    idt: np.dtype
    parent: np.ndarray
    count: int = 1
    first: np.ndarray | None = None
    where: Callable[[int], str] = lambda lvl: f"level {lvl}"
    owner: Callable[[int, int], str] = lambda lvl, e: f"the parent of entry {e}"


@dataclass(frozen=True)
class LevelKind:
    """Properties of one level kind; subclasses implement its capabilities."""

    letter: str  # its letter in format strings
    name: str
    arrays: tuple[str, ...]
    full: bool
    can_locate: bool
    ordered: bool = True
    branchless: bool = False
    compact: bool = True

    #: What a number after the kind's letter in format strings sets (``F4``: the
    #: width), or None for a kind that takes none.
    parameter: ClassVar[str | None] = None

    def with_parameter(self, value: int) -> LevelKind:
        """This kind with its parameter set to ``value`` (``F4``: width 4)."""
        raise FormatError(f"a {self.name} level ({self.letter}) takes no number after its letter")

    @property
    def segment_width(self) -> int | None:
        """How many positions every parent position owns, when the format fixes it
        (a fixed-width level's width): a checker then walks segments without ``pos``."""
        return None

    @property
    def spelling(self) -> str:
        """How format strings write this level: its letter, then any parameter."""
        return self.letter

    # ----------------------------------------------------------- iteration (LLIR)
    def bounds(
        self, arrays: dict[str, Expr], parent: Expr, segment_end: Expr | None, dim: Expr
    ) -> tuple[Expr, Expr]:
        """Position range [begin, end) of the children of parent position ``parent``.

        ``segment_end`` is set when the parent level is non-unique: the parent
        then hands down a run of positions [parent, segment_end).
        """
        raise NotImplementedError

    def coordinate(
        self,
        arrays: dict[str, Expr],
        pos: Expr,
        parent: Expr | None = None,
        dim: Expr | None = None,
    ) -> Expr:
        """The coordinate stored at position ``pos`` (under ``parent``, for kinds that
        compute it rather than store it)."""
        raise NotImplementedError

    def locate(self, parent: Expr, coord: Expr, dim: Expr) -> Expr:
        """The position of ``coord`` under parent position ``parent``."""
        raise NotImplementedError

    def child_range(self, arrays: dict[str, Expr], lo: Expr, hi: Expr, dim: Expr):
        """Positions of the children of the parent positions [lo, hi), for ``pos`` over a
        fuse."""
        raise NotImplementedError

    def parent_walk(
        self, arrays: dict[str, Expr], dim: Expr, child: Expr, first: Expr, rng, parent: Var
    ) -> tuple[list[Stmt], list[Stmt], Expr]:
        """Recover parent positions while walking this level's positions in order.

        Returns the statements that find the parent of position ``first`` once,
        at the start of a range (``rng`` bounds the parents), the statements
        that set ``parent`` to the parent of ``child`` inside the walk, and the
        parent of ``first`` for the level above.
        """
        raise NotImplementedError

    def search(self, arrays: dict[str, Expr], lo: Expr, hi: Expr, key: Expr, result: Var):
        """Statements setting (the declared) ``result`` to the first position in [lo, hi)
        whose coordinate is at least ``key``: where an affine access's window starts or
        ends, or a block of a coordinate-space split.

        Any kind with ordered coordinates gets this binary search for free.
        """
        from ucf.ir import nodes as ir

        if not self.ordered or self.full:
            raise FormatError(f"a {self.name} level has no ordered coordinates to search")
        i64 = ir.I64
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

    # ----------------------------------------------------------- output assembly
    #: How an output level is written: "insert" (locate, then store at the position),
    #: "append" (positions handed out in order, coordinates and segment ends written),
    #: or None (the level is computed as :meth:`as_output` and converted afterwards).
    output: ClassVar[str | None] = None
    #: For an appended level: the array the assemble pass may count each parent's
    #: children into (then a prefix sum gives every segment's start, and segments can be
    #: filled in parallel); None if the level cannot be counted per segment.
    segment_array: ClassVar[str | None] = None
    #: The array of the coordinates a level stores, one per position (None: a level
    #: whose coordinates follow from positions, as a dense one's); exported C checks
    #: and the TACO ABI read a level's arrays by what they hold, not by their names.
    coordinate_array: ClassVar[str | None] = None
    #: Whether tensors are stored in the kind (False: a kernel's own, as a workspace's
    #: list; format strings do not take its letter).
    stored: ClassVar[bool] = True

    def split(self, unique: bool) -> tuple[LevelKind, LevelKind]:
        """The two levels that store this level's coordinate cut into blocks: the block,
        then the place in it (``unique``: whether this level is)."""
        return self, self

    def reordered(self) -> LevelKind:
        """The kind this level has once its tensor is converted to another mode order
        (a kernel whose loops cannot follow the stored one): the same, unless what the
        kind promises holds for the stored order only."""
        return self

    def searched(self) -> LevelKind:
        """The kind a converted copy of this level has where an affine index must be
        searched in it (``A(i, i + d)``, what a repeated variable becomes in
        ``ucf.cin.diagonals``): the same when its coordinates are ordered and it never
        repeats its parent's, else one whose are."""
        return self

    def as_output(self) -> LevelKind:
        """The kind that computes this level of an output."""
        if self.output is None:
            raise FormatError(f"a {self.name} level cannot be an output level")
        return self

    def append(self, arrays: dict[str, Any], q: Expr, coord: Expr, index_type: str) -> list[Stmt]:
        """Statements recording ``coord`` at appended position ``q``."""
        raise FormatError(f"a {self.name} level is not appended to")

    def close(self, arrays: dict[str, Any], parent: Expr, end: Expr, index_type: str):
        """Statements recording that parent position ``parent``'s children end at ``end``."""
        raise FormatError(f"a {self.name} level is not appended to")

    def allocate(self, parent_count: int, count: int, dim: int, idt: np.dtype, empty: Callable):
        """Arrays for an output level, and its number of positions (``count`` is what the
        assemble pass counted, or bounded, for an appended level). The kernel writes
        every entry it keeps, so they need not be zeroed: ``empty(shape, dtype)`` makes
        each (``ucf.exec.recycled.uninitialized``: still mapped where it can)."""
        raise NotImplementedError

    def trimmed(self, arrays: dict[str, np.ndarray], parent_count: int) -> dict[str, np.ndarray]:
        """An output level's arrays cut to ``parent_count`` parents and the positions
        they hold (the compute pass may finish with fewer than were allocated)."""
        return arrays

    # ----------------------------------------------------------- storage (numpy)
    def size(self, arrays: dict[str, np.ndarray], parent_count: int, dim: int) -> int:
        """Number of positions this level holds."""
        raise NotImplementedError

    def check(
        self, where: str, arrays: dict[str, np.ndarray], dim: int, unique: bool, state: Checking
    ) -> None:
        """Check user arrays (sortedness only when ordered, uniqueness only when unique);
        update ``state.count`` to this level's number of positions."""
        raise NotImplementedError

    def pack(self, lvl: int, run_end: int, state: Packing) -> dict[str, np.ndarray]:
        """This level's arrays from the sorted coordinates; ``run_end`` is one past the
        last branchless level sharing this level's positions."""
        raise NotImplementedError

    def unpack(
        self, arrays: dict[str, np.ndarray], dim: int, cols: list[np.ndarray], count: int
    ) -> tuple[list[np.ndarray], int]:
        """Extend the coordinate columns of the levels above by this level's; return them
        with this level's number of positions."""
        raise NotImplementedError
