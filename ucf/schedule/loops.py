"""The commands that reshape loops: reorder, split and divide, fuse, pos, bound,
unroll, branchless and streams (and ``arrange``, the final order the checker appends).
The lowerer applies them to the labelled LLIR loops (``ucf.lower.transforms``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from ucf.errors import ScheduleError
from ucf.schedule.provenance import Provenance, Relation
from ucf.schedule.records import Bound, Split

if TYPE_CHECKING:
    pass
from ucf.schedule.nest_state import (
    BOUND_KINDS,
    Command,
    NestState,
    closest,
    first_reason,
    positive,
    spelled,
)


@dataclass(frozen=True)
class Arrange(Command):
    """The final loop order: appended by the checker after the user's commands."""

    order: tuple[str, ...]
    name: ClassVar[str] = "arrange"

    @property
    def args(self) -> tuple[str, ...]:
        return self.order


@dataclass(frozen=True)
class Reorder(Command):
    """``reorder(j, i, ...)``: the named loops take each other's places."""

    order: tuple[str, ...]
    name: ClassVar[str] = "reorder"

    @classmethod
    def converted(cls, name: str, args: tuple[str, ...]) -> Command:
        return cls(tuple(args))

    @property
    def args(self) -> tuple[str, ...]:
        return self.order

    @property
    def variables(self) -> tuple[str, ...]:
        return self.order

    def check(self, nest: NestState) -> str | None:
        reason = first_reason(*(self.unknown(v, nest.loops) for v in self.order))
        if reason is None and len(set(self.order)) != len(self.order):
            reason = f"reorder: a variable is repeated in {self}"
        return reason

    def record(self, nest: NestState) -> None:
        slots = sorted(nest.loops.index(v) for v in self.order)
        for slot, v in zip(slots, self.order, strict=True):
            nest.loops[slot] = v
        nest.steps.append(Arrange(tuple(nest.loops)))


@dataclass(frozen=True)
class SplitCommand(Command):
    """``split(i, i0, i1, factor)`` and ``divide(i, i0, i1, parts)``."""

    var: str
    outer: str
    inner: str
    amount: int
    mode: str = "split"  # or "divide"
    arity: ClassVar[tuple[int, ...] | None] = (4,)

    @classmethod
    def converted(cls, name: str, args: tuple[str, ...]) -> Command:
        var, outer, inner, amount = args
        what = "the factor" if name == "split" else "the number of parts"
        return cls(var, outer, inner, positive(amount, what, spelled(name, args)), name)

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.mode

    @property
    def args(self) -> tuple[str, ...]:
        return (self.var, self.outer, self.inner, str(self.amount))

    @property
    def variables(self) -> tuple[str, ...]:
        return (self.var, self.outer, self.inner)

    @property
    def split(self) -> Split:
        return Split(self.var, self.outer, self.inner, self.amount, self.mode)

    def check(self, nest: NestState) -> str | None:
        reason = first_reason(
            self.unknown(self.var, nest.loops),
            self.taken(self.outer, nest.loops),
            self.taken(self.inner, nest.loops),
        )
        if reason is None and self.outer == self.inner:
            reason = f"{self}: the two new variables must differ"
        return reason

    def record(self, nest: NestState) -> None:
        k = nest.loops.index(self.var)
        nest.loops[k : k + 1] = [self.outer, self.inner]
        for new, role in ((self.outer, "outer"), (self.inner, "inner")):
            nest.prov.add(new, Relation(self.mode, (self.var,), self.amount, role=role))
        nest.steps.append(self)


@dataclass(frozen=True)
class Fuse(Command):
    """``fuse(i, j, f)``: loop ``j`` directly inside ``i`` and ``i`` become one loop."""

    outer: str
    inner: str
    fused: str
    name: ClassVar[str] = "fuse"
    arity: ClassVar[tuple[int, ...] | None] = (3,)

    @property
    def args(self) -> tuple[str, ...]:
        return (self.outer, self.inner, self.fused)

    variables = args

    def check(self, nest: NestState) -> str | None:
        loops = nest.loops
        reason = first_reason(
            self.unknown(self.outer, loops),
            self.unknown(self.inner, loops),
            self.taken(self.fused, loops),
        )
        if reason is not None:
            return reason
        k = loops.index(self.outer)
        if k + 1 >= len(loops) or loops[k + 1] != self.inner:
            return (
                f"{self}: {self.inner} must be the loop directly inside {self.outer} (the "
                f"loop order is {', '.join(loops)}); reorder them first"
            )
        return None

    def record(self, nest: NestState) -> None:
        k = nest.loops.index(self.outer)
        nest.loops[k : k + 2] = [self.fused]
        nest.prov.add(self.fused, Relation("fuse", (self.outer, self.inner)))
        nest.steps.append(self)


@dataclass(frozen=True)
class Pos(Command):
    """``pos(i, ipos, A)``: loop over A's positions for ``i`` (a variable or a fuse of
    them) instead of its coordinates."""

    var: str
    pos_var: str
    tensor: str
    name: ClassVar[str] = "pos"
    arity: ClassVar[tuple[int, ...] | None] = (3,)

    @property
    def args(self) -> tuple[str, ...]:
        return (self.var, self.pos_var, self.tensor)

    @property
    def variables(self) -> tuple[str, ...]:
        return (self.var, self.pos_var)

    def check(self, nest: NestState) -> str | None:
        prov, loops = nest.prov, nest.loops
        reason = first_reason(self.unknown(self.var, loops), self.taken(self.pos_var, loops))
        if reason is not None:
            return reason
        v, tensor = self.var, self.tensor
        origins = prov.origins(v)
        if v in prov.rel and prov.rel[v].kind != "fuse":
            return f"{self}: {prov.describe(v)}; pos applies to an index variable or a fuse of them"
        if tensor not in nest.tensors:
            return (
                f"{self}: unknown tensor '{tensor}'{closest(tensor, nest.tensors)}; the "
                f"operands are {', '.join(nest.tensors)}"
            )
        tvars, fmt = nest.tensors[tensor]
        if any(o not in tvars for o in origins):
            missing = next(o for o in origins if o not in tvars)
            return (
                f"{self}: tensor {tensor} is not indexed by {missing} (it is "
                f"{tensor}({', '.join(tvars)})), so it has no positions to walk for {missing}"
            )
        levels = [tvars.index(o) for o in origins]
        if levels != list(range(levels[0], levels[0] + len(levels))):
            return f"{self}: {', '.join(origins)} are not consecutive levels of {tensor}"
        kind = fmt.levels[levels[-1]]
        if kind.full:
            return (
                f"{self}: {tensor} stores {origins[-1]} in a {kind.name} ({kind.letter}) "
                "level, which has no position space; pos needs a level that stores its "
                "coordinates, such as compressed (C) or singleton (S)"
            )
        return None

    def record(self, nest: NestState) -> None:
        prov, loops = nest.prov, nest.loops
        origins = prov.origins(self.var)
        loops[loops.index(self.var)] = self.pos_var
        prov.add(self.pos_var, Relation("pos", (self.var,), tensor=self.tensor))
        if len(origins) == 1:
            nest.pos[self.var] = (self.pos_var, self.tensor)
        else:
            nest.fused.append((tuple(origins), self.pos_var, self.tensor))
            covered = prov.fuses(self.var)
            nest.steps = [c for c in nest.steps if not (isinstance(c, Fuse) and c.fused in covered)]


@dataclass(frozen=True)
class BoundCommand(Command):
    """``bound(i, ib, n, MaxExact)``: loop ``i`` runs exactly ``n`` times."""

    var: str
    bound_var: str
    amount: int
    kind: str = "MaxExact"
    name: ClassVar[str] = "bound"
    arity: ClassVar[tuple[int, ...] | None] = (4,)

    @classmethod
    def converted(cls, name: str, args: tuple[str, ...]) -> Command:
        v, vb, n, kind = args
        shown = spelled(name, args)
        amount = positive(n, "the bound", shown)
        if kind not in BOUND_KINDS:
            raise ScheduleError(
                f"{shown}: unknown bound kind '{kind}'{closest(kind, BOUND_KINDS)}; "
                f"the kinds are {', '.join(BOUND_KINDS)}"
            )
        return cls(v, vb, amount, kind)

    @property
    def args(self) -> tuple[str, ...]:
        return (self.var, self.bound_var, str(self.amount), self.kind)

    @property
    def variables(self) -> tuple[str, ...]:
        return (self.var, self.bound_var)

    def check(self, nest: NestState) -> str | None:
        return first_reason(
            self.unknown(self.var, nest.loops),
            self.taken(self.bound_var, nest.loops),
            self._origin(nest.prov)[2],
        )

    def record(self, nest: NestState) -> None:
        origin, divisor, _ = self._origin(nest.prov)
        nest.bounds[self.var] = Bound(self.var, self.amount, self.kind, origin, divisor)
        nest.loops[nest.loops.index(self.var)] = self.bound_var
        nest.prov.add(self.bound_var, Relation("bound", (self.var,), self.amount))
        nest.steps.append(self)

    def _origin(self, prov: Provenance) -> tuple[str, int, str | None]:
        """The index variable that the bound constrains, and the product of the split
        factors between them; or why the trip count is not one number for every run of
        the loop."""
        divisor = 1
        var = self.var
        while var in prov.rel:
            rel = prov.rel[var]
            if (rel.kind, rel.role) != ("split", "outer"):
                what = prov.describe(var)
                if rel.kind == "pos":
                    why = "its trip count is a number of nonzeros, which only the data gives"
                elif prov.bounded(var):
                    why = "its trip count is already known when the kernel is compiled"
                elif (rel.kind, rel.role) == ("divide", "inner"):
                    why = "its last part may be shorter than the others"
                else:
                    why = "its trip count is not a function of one extent"
                return (
                    var,
                    divisor,
                    (
                        f"{self}: {what}; {why}, so {self.var} cannot be bounded (bound applies "
                        "to index variables and to the outer loops of their splits)"
                    ),
                )
            divisor *= rel.amount
            var = rel.parents[0]
        return var, divisor, None


@dataclass(frozen=True)
class Unroll(Command):
    """``unroll(i, factor)``: a hint to the backend for a loop of known trip count."""

    var: str
    factor: int
    name: ClassVar[str] = "unroll"
    arity: ClassVar[tuple[int, ...] | None] = (2,)

    @classmethod
    def converted(cls, name: str, args: tuple[str, ...]) -> Command:
        return cls(args[0], positive(args[1], "the unroll factor", spelled(name, args)))

    @property
    def args(self) -> tuple[str, ...]:
        return (self.var, str(self.factor))

    @property
    def variables(self) -> tuple[str, ...]:
        return (self.var,)

    def check(self, nest: NestState) -> str | None:
        reason = self.unknown(self.var, nest.loops)
        if reason is None and not nest.prov.bounded(self.var):
            reason = (
                f"{self}: {self.var} is not bounded, so its trip count is unknown when the "
                f"kernel is compiled; unroll the inner loop of a split, or "
                f"bound({self.var}, ...) first"
            )
        return reason

    def record(self, nest: NestState) -> None:
        nest.steps.append(self)


#: The widest ``branchless`` loop: every step of it runs for a loop of one term.
MAX_BRANCHLESS = 8


@dataclass(frozen=True)
class Branchless(Command):
    """``branchless(k, width)``: where the loop over ``k`` sums 1 to ``width`` terms into
    a scalar, it runs ``width`` steps with no branch on its trip count
    (``ucf.passes.short_sums``); other trip counts, and loops that are not such sums,
    run as they are."""

    var: str
    width: int
    name: ClassVar[str] = "branchless"
    arity: ClassVar[tuple[int, ...] | None] = (2,)

    @classmethod
    def converted(cls, name: str, args: tuple[str, ...]) -> Command:
        width = positive(args[1], "the width", spelled(name, args))
        if not 2 <= width <= MAX_BRANCHLESS:
            raise ScheduleError(
                f"{spelled(name, args)}: the width is 2 to {MAX_BRANCHLESS} steps, got {width}"
            )
        return cls(args[0], width)

    @property
    def args(self) -> tuple[str, ...]:
        return (self.var, str(self.width))

    @property
    def variables(self) -> tuple[str, ...]:
        return (self.var,)

    def check(self, nest: NestState) -> str | None:
        return self.unknown(self.var, nest.loops)


#: The cache levels ``streams`` fetches into: 1, the L1 and beyond (x86's
#: ``prefetcht0``); 2, the L2 and beyond (``prefetcht1``).
STREAM_LEVELS = (1, 2)


@dataclass(frozen=True)
class Streams(Command):
    """``streams(j, level)``: the position streams that the walk over ``j`` reads (a
    row's coordinates and values, fetched ahead row after row by
    ``ucf.passes.streams``) go into cache ``level`` (1, every level, as without the
    command; 2, the L2 but not the L1); a loop with no such streams is left as it is."""

    var: str
    level: int
    name: ClassVar[str] = "streams"
    arity: ClassVar[tuple[int, ...] | None] = (2,)

    @classmethod
    def converted(cls, name: str, args: tuple[str, ...]) -> Command:
        level = positive(args[1], "the cache level", spelled(name, args))
        if level not in STREAM_LEVELS:
            raise ScheduleError(
                f"{spelled(name, args)}: the cache level is 1 (the L1 and beyond) or 2 "
                f"(the L2 and beyond), got {level}"
            )
        return cls(args[0], level)

    @property
    def args(self) -> tuple[str, ...]:
        return (self.var, str(self.level))

    @property
    def variables(self) -> tuple[str, ...]:
        return (self.var,)

    def check(self, nest: NestState) -> str | None:
        return self.unknown(self.var, nest.loops)
