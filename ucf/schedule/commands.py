"""The scheduling commands: one small class each, which checks its arguments once
and then checks its preconditions against the loop nest and applies itself.

A command keeps its text (``name`` and ``args``), so it prints as written and
the lowerer's loop transformations read the same object. ``command(name, args)``
builds the right class; the text parser and the fluent ``Schedule`` both go
through it.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, ClassVar

from ucf.errors import ScheduleError, UcfError, UnsupportedError
from ucf.schedule.provenance import Provenance, Relation
from ucf.schedule.records import Bound, Dismantle, Parallel, Precompute, Split

if TYPE_CHECKING:
    from ucf.format.format import Format

UNITS = ("CPUThread", "CPUVector", "GPUBlock", "GPUWarp", "GPUThread", "GPUGroup")
STRATEGIES = ("NoRaces", "IgnoreRaces", "Atomics", "Temporary", "ParallelReduction", "Segment")
BOUND_KINDS = ("MaxExact",)
ASSEMBLE_STRATEGIES = ("Insert", "Append")


def closest(name: str, choices) -> str:
    match = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean '{match[0]}'?)" if match else ""


@dataclass
class NestState:
    """The loop nest as the commands so far have left it, and what they recorded."""

    order: list[str]  # the original variables, in the unscheduled order
    tensors: dict[str, tuple[list[str], Format]]  # operand -> variables by level, format
    output: str
    loops: list[str] = field(default_factory=list)
    prov: Provenance | None = None
    steps: list[Command] = field(default_factory=list)
    parallel: dict[str, Parallel] = field(default_factory=dict)
    pos: dict[str, tuple[str, str]] = field(default_factory=dict)
    fused: list[tuple[tuple[str, ...], str, str]] = field(default_factory=list)
    precompute: list[Precompute] = field(default_factory=list)
    bounds: dict[str, Bound] = field(default_factory=dict)
    static: frozenset[str] = frozenset()  # operands whose pattern is known when compiling
    dismantle: Dismantle | None = None

    def __post_init__(self) -> None:
        self.loops = list(self.order)
        self.prov = Provenance(self.order)


@dataclass(frozen=True)
class Command:
    """One scheduling command as written; subclasses check and apply it."""

    name: str
    args: tuple[str, ...]
    #: The accepted argument counts (None: any number), and how to spell them.
    arity: ClassVar[tuple[int, ...] | None] = None
    forms: ClassVar[str] = ""

    def __post_init__(self) -> None:
        if self.arity is not None and len(self.args) not in self.arity:
            forms = self.forms or f"{' or '.join(map(str, self.arity))} arguments"
            raise ScheduleError(f"{self.name} takes {forms}, got {len(self.args)}: {self}")

    def __str__(self) -> str:
        return f"{self.name}({', '.join(self.args)})"

    def apply(self, nest: NestState) -> None:
        """Check the preconditions against ``nest`` and record the command in it."""
        nest.steps.append(self)

    # ------------------------------------------------------------ checks
    def known(self, v: str, loops: list[str]) -> None:
        if v not in loops:
            raise ScheduleError(
                f"{self}: unknown index variable '{v}'{closest(v, loops)}; "
                f"the loop variables are {', '.join(loops)}"
            )

    def fresh(self, v: str, loops: list[str]) -> None:
        if v in loops:
            raise ScheduleError(f"{self}: the new variable '{v}' is already a loop variable")
        if not v.isidentifier():
            raise ScheduleError(f"{self}: '{v}' is not a valid index variable name")

    def positive(self, text: str, what: str) -> int:
        # ASCII digits only: str.isdigit also takes '²' (which int() refuses) and other
        # scripts' digits, which the fluent Schedule API would let through.
        if not (text.isascii() and text.isdigit()) or int(text) < 1:
            raise ScheduleError(f"{self}: {what} must be a positive integer, got '{text}'")
        return int(text)


class Arrange(Command):
    """The final loop order: appended by the checker after the user's commands."""


class Reorder(Command):
    def apply(self, nest: NestState) -> None:
        for v in self.args:
            self.known(v, nest.loops)
        if len(set(self.args)) != len(self.args):
            raise ScheduleError(f"reorder: a variable is repeated in {self}")
        slots = sorted(nest.loops.index(v) for v in self.args)
        for slot, v in zip(slots, self.args, strict=True):
            nest.loops[slot] = v
        nest.steps.append(command("arrange", tuple(nest.loops)))


class SplitCommand(Command):
    """``split(i, i0, i1, factor)`` and ``divide(i, i0, i1, parts)``."""

    arity = (4,)

    @cached_property
    def split(self) -> Split:
        var, outer, inner, amount = self.args
        what = "the factor" if self.name == "split" else "the number of parts"
        return Split(var, outer, inner, self.positive(amount, what), self.name)

    def apply(self, nest: NestState) -> None:
        sp = self.split
        self.known(sp.var, nest.loops)
        for new in (sp.outer, sp.inner):
            self.fresh(new, nest.loops)
        if sp.outer == sp.inner:
            raise ScheduleError(f"{self}: the two new variables must differ")
        k = nest.loops.index(sp.var)
        nest.loops[k : k + 1] = [sp.outer, sp.inner]
        for new, role in ((sp.outer, "outer"), (sp.inner, "inner")):
            nest.prov.add(new, Relation(self.name, (sp.var,), sp.amount, role=role))
        nest.steps.append(self)


class Fuse(Command):
    arity = (3,)

    def apply(self, nest: NestState) -> None:
        i, j, f = self.args
        self.known(i, nest.loops)
        self.known(j, nest.loops)
        self.fresh(f, nest.loops)
        k = nest.loops.index(i)
        if k + 1 >= len(nest.loops) or nest.loops[k + 1] != j:
            raise ScheduleError(
                f"{self}: {j} must be the loop directly inside {i} (the loop order is "
                f"{', '.join(nest.loops)}); reorder them first"
            )
        nest.loops[k : k + 2] = [f]
        nest.prov.add(f, Relation("fuse", (i, j)))
        nest.steps.append(self)


class Pos(Command):
    arity = (3,)

    def apply(self, nest: NestState) -> None:
        v, vpos, tensor = self.args
        prov, loops = nest.prov, nest.loops
        self.known(v, loops)
        self.fresh(vpos, loops)
        origins = prov.origins(v)
        if v in prov.rel and prov.rel[v].kind != "fuse":
            raise ScheduleError(
                f"{self}: {prov.describe(v)}; pos applies to an index variable or a fuse of them"
            )
        if tensor not in nest.tensors:
            raise ScheduleError(
                f"{self}: unknown tensor '{tensor}'{closest(tensor, nest.tensors)}; the "
                f"operands are {', '.join(nest.tensors)}"
            )
        tvars, fmt = nest.tensors[tensor]
        if any(o not in tvars for o in origins):
            missing = next(o for o in origins if o not in tvars)
            raise ScheduleError(
                f"{self}: tensor {tensor} is not indexed by {missing} (it is "
                f"{tensor}({', '.join(tvars)})), so it has no positions to walk for {missing}"
            )
        levels = [tvars.index(o) for o in origins]
        if levels != list(range(levels[0], levels[0] + len(levels))):
            raise ScheduleError(
                f"{self}: {', '.join(origins)} are not consecutive levels of {tensor}"
            )
        kind = fmt.levels[levels[-1]]
        if kind.full:
            raise ScheduleError(
                f"{self}: {tensor} stores {origins[-1]} in a {kind.name} ({kind.letter}) level, "
                "which has no position space; pos needs a level that stores its "
                "coordinates, such as compressed (C) or singleton (S)"
            )
        loops[loops.index(v)] = vpos
        prov.add(vpos, Relation("pos", (v,), tensor=tensor))
        if len(origins) == 1:
            nest.pos[v] = (vpos, tensor)
        else:
            nest.fused.append((tuple(origins), vpos, tensor))
            covered = prov.fuses(v)
            nest.steps = [c for c in nest.steps if not (c.name == "fuse" and c.args[2] in covered)]


class BoundCommand(Command):
    arity = (4,)

    def apply(self, nest: NestState) -> None:
        v, vb, n, kind = self.args
        self.known(v, nest.loops)
        self.fresh(vb, nest.loops)
        if kind not in BOUND_KINDS:
            raise ScheduleError(
                f"{self}: unknown bound kind '{kind}'{closest(kind, BOUND_KINDS)}; "
                f"the kinds are {', '.join(BOUND_KINDS)}"
            )
        origin, divisor = self._origin(v, nest.prov)
        nest.bounds[v] = Bound(v, self.positive(n, "the bound"), kind, origin, divisor)
        nest.loops[nest.loops.index(v)] = vb
        nest.prov.add(vb, Relation("bound", (v,), nest.bounds[v].amount))
        nest.steps.append(self)

    def _origin(self, v: str, prov: Provenance) -> tuple[str, int]:
        """The index variable that ``bound`` on ``v`` constrains, and the product of the
        split factors between them; a ScheduleError where the trip count is not one
        number for every run of the loop."""
        divisor = 1
        var = v
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
                raise ScheduleError(
                    f"{self}: {what}; {why}, so {v} cannot be bounded (bound applies to index "
                    "variables and to the outer loops of their splits)"
                )
            divisor *= rel.amount
            var = rel.parents[0]
        return var, divisor


class Unroll(Command):
    arity = (2,)

    def apply(self, nest: NestState) -> None:
        v, factor = self.args
        self.known(v, nest.loops)
        self.positive(factor, "the unroll factor")
        if not nest.prov.bounded(v):
            raise ScheduleError(
                f"{self}: {v} is not bounded, so its trip count is unknown when the kernel is "
                f"compiled; unroll the inner loop of a split, or bound({v}, ...) first"
            )
        nest.steps.append(self)


class PrecomputeCommand(Command):
    """``precompute(expr, i, iw, w)``, or TACO's ``precompute(expr, i, iw)`` naming ``w``."""

    arity = (3, 4)
    forms = "(expr, i, iw) or (expr, i, iw, w)"

    def apply(self, nest: NestState) -> None:
        loops = nest.loops
        expr, v, vw = self.args[:3]
        taken = {*nest.tensors, nest.output, *loops, *nest.order}
        taken |= {p.name for p in nest.precompute}
        ws = self.args[3] if len(self.args) == 4 else _workspace_name(taken)
        self.known(v, loops)
        if vw != v:
            self.fresh(vw, loops)
            loops[loops.index(v)] = vw
            nest.prov.add(vw, Relation("workspace", (v,)))
        if ws in nest.tensors or ws == nest.output:
            raise ScheduleError(f"{self}: the workspace name {ws} is already a tensor")
        if any(p.name == ws for p in nest.precompute):
            raise ScheduleError(f"{self}: an earlier precompute already names its workspace {ws}")
        origins = nest.prov.origins(v)
        if len(origins) != 1:
            raise ScheduleError(f"{self}: {v} iterates several variables; use one")
        from ucf.lang.parser import parse_statement  # lark: not on a cached kernel's path

        try:
            statement = parse_statement(f"{ws}({origins[0]}) = {expr}")
        except UcfError as e:
            raise ScheduleError(f"{self}: the expression does not parse: {e}") from None
        nest.precompute.append(Precompute(expr, v, vw, ws, statement))


class Parallelize(Command):
    """``parallelize(i, unit, strategy)`` or ``parallelize(i, GPUGroup, size, strategy)``."""

    arity = (3, 4)
    forms = "(i, unit, strategy) or (i, GPUGroup, size, strategy)"

    @cached_property
    def request(self) -> Parallel:
        unit, strategy = self.args[1], self.args[-1]
        v = self.args[0]
        if unit not in UNITS:
            raise ScheduleError(f"{self}: unknown unit '{unit}'{closest(unit, UNITS)}")
        if strategy not in STRATEGIES:
            raise ScheduleError(
                f"{self}: unknown strategy '{strategy}'{closest(strategy, STRATEGIES)}"
            )
        size = 0
        if unit == "GPUGroup":
            if len(self.args) != 4:
                raise ScheduleError(
                    f"{self}: GPUGroup takes a group size: parallelize(i, GPUGroup, 8, …)"
                )
            size = self.positive(self.args[2], "the group size")
            if size > 32 or size & (size - 1):
                raise ScheduleError(
                    f"{self}: the group size of {v} must be a power of two no larger than 32, "
                    f"got {size}"
                )
        elif len(self.args) == 4:
            raise ScheduleError(f"{self}: only GPUGroup takes a size")
        if strategy == "Segment" and unit != "GPUGroup":
            raise ScheduleError(f"{self}: the Segment strategy needs a GPUGroup unit")
        return Parallel(unit, strategy, size)

    def apply(self, nest: NestState) -> None:
        self.known(self.args[0], nest.loops)
        nest.parallel[self.args[0]] = self.request


class AssembleCommand(Command):
    """``assemble(T, Insert|Append[, true])``: recorded by ``apply_schedule``."""

    arity = (2, 3)
    forms = "(T, Insert|Append) or (T, Insert|Append, true)"

    def apply(self, nest: NestState) -> None:
        pass


class Condense(Command):
    """``condense(k, A, depth)``: gather A's live micro-tiles along k into dense compute
    tiles ``depth`` deep. Whether k may be condensed is checked on the statement
    (``ucf.cin.invariance.check_schedule``). Kernels that gather exist only for a dynamic
    operand (``ucf.stile.dynamic``), which handles the command before lowering; reaching
    it here means A is not dynamic."""

    arity = (3,)
    forms = "(k, A, depth)"

    def apply(self, nest: NestState) -> None:
        self.known(self.args[0], nest.loops)
        self.positive(self.args[2], "the compute-tile depth")
        raise UnsupportedError(
            f"{self}: {self.args[0]} can be condensed, but only a dynamic operand's tiles "
            f"are gathered: compile with dynamic={{'{self.args[1]}': <micro-tile shape>}}"
        )


class DismantleCommand(Command):
    """``dismantle(v)`` or ``dismantle(v, values)``: unroll ``v`` and the loops around it
    over the patterns of the operands given in ``static=`` (see ``ucf.passes.dismantle``).
    Every one of those loops must walk a level of a static operand, whose pattern then
    fixes its trip count."""

    arity = (1, 2)
    forms = "(v) or (v, values)"

    @cached_property
    def request(self) -> Dismantle:
        if len(self.args) == 2 and self.args[1] != "values":
            raise ScheduleError(
                f"{self}: the second argument is 'values' (embed the static values as "
                f"constants), got '{self.args[1]}'"
            )
        return Dismantle(self.args[0], len(self.args) == 2)

    def apply(self, nest: NestState) -> None:
        v = self.request.var
        self.known(v, nest.loops)
        if nest.dismantle is not None:
            raise ScheduleError(f"{self}: the schedule already dismantles {nest.dismantle.var}")
        if not nest.static:
            raise ScheduleError(
                f"{self}: no operand is static; dismantle unrolls over a pattern known when "
                "compiling, given as ucf.compile(..., static={'A': tensor})"
            )
        walked = {o for t in nest.static for o in nest.tensors[t][0]}
        names = ", ".join(f"{t}({', '.join(nest.tensors[t][0])})" for t in sorted(nest.static))
        for loop in nest.loops[: nest.loops.index(v) + 1]:
            outside = [o for o in nest.prov.origins(loop) if o not in walked]
            if outside:
                where = "" if loop == v else f"loop {loop} encloses {v} and "
                raise ScheduleError(
                    f"{self}: {where}{loop} iterates {outside[0]}, which no static operand "
                    f"is indexed by ({names}), so its trip count is unknown when compiling "
                    f"and it cannot be unrolled; dismantle a variable of a static operand "
                    "with only such loops around it"
                )
        nest.dismantle = self.request


def _workspace_name(taken: set[str]) -> str:
    """TACO's three-argument precompute names its workspace: ``w``, else ``w1``, ..."""
    return next(n for n in ("w", *(f"w{k}" for k in range(1, len(taken) + 2))) if n not in taken)


#: Every command the schedule language has, by name.
COMMANDS: dict[str, type[Command]] = {
    "reorder": Reorder,
    "split": SplitCommand,
    "divide": SplitCommand,
    "fuse": Fuse,
    "pos": Pos,
    "bound": BoundCommand,
    "unroll": Unroll,
    "precompute": PrecomputeCommand,
    "parallelize": Parallelize,
    "assemble": AssembleCommand,
    "condense": Condense,
    "dismantle": DismantleCommand,
}


def command(name: str, args: tuple[str, ...]) -> Command:
    """The command ``name(args)``, of its own class (arguments checked)."""
    if name == "arrange":
        return Arrange(name, args)
    if name not in COMMANDS:
        raise ScheduleError(f"unknown schedule command '{name}'{closest(name, COMMANDS)}")
    return COMMANDS[name](name, args)
