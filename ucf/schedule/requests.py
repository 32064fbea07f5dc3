"""The commands that change what is built rather than how loops nest: precompute into
a workspace, parallelize, assemble a sparse output, condense a dynamic operand's
tiles, dismantle over static operands' patterns, and convert an operand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from ucf.cin.invariance import check_condense
from ucf.errors import ScheduleError, UcfError, UnsupportedError
from ucf.lang.ast import Access, Statement, accesses
from ucf.schedule.provenance import Relation
from ucf.schedule.records import Dismantle, Parallel, Precompute

if TYPE_CHECKING:
    from ucf.cin.concretize import Gathered
from ucf.schedule.nest_state import (
    ASSEMBLE_STRATEGIES,
    STRATEGIES,
    UNITS,
    Command,
    NestState,
    closest,
    positive,
    spelled,
)


@dataclass(frozen=True)
class PrecomputeCommand(Command):
    """``precompute(expr, i, iw, w)``, or TACO's ``precompute(expr, i, iw)`` naming ``w``.

    A workspace over several variables (``B(j,k)*X(k,l)`` of ``A@B@X`` into ``W(j,l)``)
    names them in braces, as TACO's list does: ``precompute(expr, {j,l}, {j,l}, W)``;
    ``more`` holds those after the first. They keep their names (a renamed workspace
    variable is a split's inner loop, which tiles a one-dimensional workspace only)."""

    expr: str
    var: str
    wvar: str
    workspace: str | None = None
    more: tuple[str, ...] = ()
    name: ClassVar[str] = "precompute"
    arity: ClassVar[tuple[int, ...] | None] = (3, 4)
    forms: ClassVar[str] = "(expr, i, iw) or (expr, i, iw, w); several variables: {j,l}"

    @classmethod
    def converted(cls, name: str, args: tuple[str, ...]) -> Command:
        shown = spelled(name, args)
        expr, var, wvar, *rest = args
        names, wnames = _names(var, shown), _names(wvar, shown)
        if names != wnames and (len(names) > 1 or len(wnames) > 1):
            raise ScheduleError(
                f"{shown}: a workspace over several variables keeps their names; write the "
                f"same list twice, {{{','.join(names)}}}"
            )
        if len(set(names)) != len(names):
            raise ScheduleError(f"{shown}: a workspace variable is named twice")
        return cls(expr, names[0], wnames[0], *rest, more=tuple(names[1:]))

    @property
    def args(self) -> tuple[str, ...]:
        named = (self.workspace,) if self.workspace is not None else ()
        if self.more:
            listed = f"{{{','.join((self.var, *self.more))}}}"
            return (self.expr, listed, listed, *named)
        return (self.expr, self.var, self.wvar, *named)

    @property
    def variables(self) -> tuple[str, ...]:
        return (self.var, self.wvar, *self.more)

    def _name(self, nest: NestState) -> str:
        taken = {*nest.tensors, nest.output, *nest.loops, *nest.order}
        taken |= {p.name for p in nest.precompute}
        return self.workspace if self.workspace is not None else _workspace_name(taken)

    def check(self, nest: NestState) -> str | None:
        ws, loops = self._name(nest), nest.loops
        reason = self.unknown(self.var, loops)
        if reason is None and self.wvar != self.var:
            reason = self.taken(self.wvar, loops)
        for v in self.more:
            reason = reason or self.unknown(v, loops)
        if reason is not None:
            return reason
        if ws in nest.tensors or ws == nest.output:
            return f"{self}: the workspace name {ws} is already a tensor"
        if any(p.name == ws for p in nest.precompute):
            return f"{self}: an earlier precompute already names its workspace {ws}"
        if len(nest.prov.origins(self.var)) != 1:
            return f"{self}: {self.var} iterates several variables; use one"
        derived = [v for v in (self.var, *self.more) if self.more and v in nest.prov.rel]
        if derived:
            return (
                f"{self}: {nest.prov.describe(derived[0])}; a workspace over several "
                "variables takes the statement's own index variables"
            )
        try:
            self._statement(ws, nest)
        except UcfError as e:
            return f"{self}: the expression does not parse: {e}"
        return None

    def _statement(self, ws: str, nest: NestState):
        from ucf.lang.parser import parse_statement  # lark: not on a cached kernel's path

        at = ",".join((nest.prov.origins(self.var)[0], *self.more))
        return parse_statement(f"{ws}({at}) = {self.expr}")

    def record(self, nest: NestState) -> None:
        ws = self._name(nest)
        statement = self._statement(ws, nest)
        if self.wvar != self.var:
            nest.loops[nest.loops.index(self.var)] = self.wvar
            nest.prov.add(self.wvar, Relation("workspace", (self.var,)))
        nest.precompute.append(Precompute(self.expr, self.var, self.wvar, ws, statement, self.more))

    @property
    def gathered(self) -> tuple[Gathered, ...]:
        """The texts of the expression's accesses with each of the workspace's variables,
        as the loop order sees them before the schedule is applied
        (``ucf.cin.concretize``); none where the expression does not parse (``check``
        says why)."""
        read = self.read()
        if read is None:
            return ()
        texts = frozenset(str(a) for a in read)
        return tuple((texts, v) for v in (self.var, *self.more))

    def read(self) -> tuple[Access, ...] | None:
        """The expression's accesses, in order (repeats too), before the schedule is
        applied; None where it does not parse (``check`` says why)."""
        from ucf.lang.parser import parse_statement  # lark: not on a cached kernel's path

        at = ",".join((self.var, *self.more))
        try:
            return tuple(accesses(parse_statement(f"w__({at}) = {self.expr}").rhs))
        except UcfError:
            return None


def _names(arg: str, shown: str) -> list[str]:
    """The variables of a precompute's ``{j,l}`` argument, or its one variable."""
    if not arg.startswith("{"):
        return [arg]
    names = [n.strip() for n in arg.strip("{}").split(",")]
    if not all(n.isidentifier() for n in names):
        raise ScheduleError(f"{shown}: {arg} is no list of index variables")
    return names


@dataclass(frozen=True)
class Parallelize(Command):
    """``parallelize(i, unit, strategy)`` or ``parallelize(i, GPUGroup, size, strategy)``."""

    var: str
    request: Parallel
    name: ClassVar[str] = "parallelize"
    arity: ClassVar[tuple[int, ...] | None] = (3, 4)
    forms: ClassVar[str] = "(i, unit, strategy) or (i, GPUGroup, size, strategy)"

    @classmethod
    def converted(cls, name: str, args: tuple[str, ...]) -> Command:
        shown = spelled(name, args)
        v, unit, strategy = args[0], args[1], args[-1]
        if unit not in UNITS:
            raise ScheduleError(f"{shown}: unknown unit '{unit}'{closest(unit, UNITS)}")
        if strategy not in STRATEGIES:
            raise ScheduleError(
                f"{shown}: unknown strategy '{strategy}'{closest(strategy, STRATEGIES)}"
            )
        size = 0
        if unit == "GPUGroup":
            if len(args) != 4:
                raise ScheduleError(
                    f"{shown}: GPUGroup takes a group size: parallelize(i, GPUGroup, 8, …)"
                )
            size = positive(args[2], "the group size", shown)
            if size > 32 or size & (size - 1):
                raise ScheduleError(
                    f"{shown}: the group size of {v} must be a power of two no larger than "
                    f"32, got {size}"
                )
        elif len(args) == 4:
            raise ScheduleError(f"{shown}: only GPUGroup takes a size")
        if strategy == "Segment" and unit != "GPUGroup":
            raise ScheduleError(f"{shown}: the Segment strategy needs a GPUGroup unit")
        return cls(v, Parallel(unit, strategy, size))

    @property
    def args(self) -> tuple[str, ...]:
        r = self.request
        return (self.var, r.unit, *([str(r.size)] if r.size else []), r.strategy)

    @property
    def variables(self) -> tuple[str, ...]:
        return (self.var,)

    def check(self, nest: NestState) -> str | None:
        return self.unknown(self.var, nest.loops)

    def record(self, nest: NestState) -> None:
        nest.parallel[self.var] = self.request


@dataclass(frozen=True)
class AssembleCommand(Command):
    """``assemble(T, Insert|Append[, true])``: recorded by ``apply_schedule``."""

    tensor: str
    strategy: str
    separately: bool | None = None  # None: not given (false)
    name: ClassVar[str] = "assemble"
    arity: ClassVar[tuple[int, ...] | None] = (2, 3)
    forms: ClassVar[str] = "(T, Insert|Append) or (T, Insert|Append, true)"

    @classmethod
    def converted(cls, name: str, args: tuple[str, ...]) -> Command:
        shown = spelled(name, args)
        tensor, strategy = args[0], args[1]
        if strategy not in ASSEMBLE_STRATEGIES:
            raise ScheduleError(
                f"{shown}: unknown strategy '{strategy}'{closest(strategy, ASSEMBLE_STRATEGIES)}"
                "; the strategies are Insert and Append"
            )
        separately = None
        if len(args) == 3:
            if args[2] not in ("true", "false"):
                raise ScheduleError(
                    f"{shown}: the third argument is true or false, got '{args[2]}'"
                )
            separately = args[2] == "true"
        return cls(tensor, strategy, separately)

    @property
    def args(self) -> tuple[str, ...]:
        given = () if self.separately is None else (str(self.separately).lower(),)
        return (self.tensor, self.strategy, *given)


@dataclass(frozen=True)
class Condense(Command):
    """``condense(k, A, depth)``: gather A's live micro-tiles along k into dense compute
    tiles ``depth`` deep. Whether k may be condensed is checked on the statement
    (``check_statement``). Kernels that gather exist only for a dynamic operand
    (``ucf.stile.dynamic``), which handles the command before lowering; reaching it
    here means A is not dynamic."""

    var: str
    tensor: str
    depth: int
    name: ClassVar[str] = "condense"
    arity: ClassVar[tuple[int, ...] | None] = (3,)
    forms: ClassVar[str] = "(k, A, depth)"

    @classmethod
    def converted(cls, name: str, args: tuple[str, ...]) -> Command:
        depth = positive(args[2], "the compute-tile depth", spelled(name, args))
        return cls(args[0], args[1], depth)

    @property
    def args(self) -> tuple[str, ...]:
        return (self.var, self.tensor, str(self.depth))

    @property
    def variables(self) -> tuple[str, ...]:
        return (self.var,)

    def check(self, nest: NestState) -> str | None:
        return self.unknown(self.var, nest.loops)

    def check_statement(self, stmt: Statement) -> str | None:
        """``var`` a variable of the tensor that can be condensed (the command itself then
        refuses to run here: see the class docstring)."""
        held = [a for a in accesses(stmt.rhs) if a.tensor == self.tensor]
        if not held:
            names = sorted({a.tensor for a in accesses(stmt.rhs)})
            return (
                f"{self}: {self.tensor} is not an operand of {stmt} (operands: {', '.join(names)})"
            )
        if not any(self.var in idx.variables for a in held for idx in a.indices):
            return f"{self}: {self.tensor} has no index variable {self.var}"
        check_condense(stmt, [self.var])
        return None

    def record(self, nest: NestState) -> None:
        raise UnsupportedError(
            f"{self}: {self.var} can be condensed, but only a dynamic operand's tiles "
            f"are gathered: compile with dynamic={{'{self.tensor}': <micro-tile shape>}}"
        )


@dataclass(frozen=True)
class DismantleCommand(Command):
    """``dismantle(v)`` or ``dismantle(v, values)``: unroll ``v`` and the loops around it
    over the patterns of the operands given in ``static=`` (see ``ucf.passes.dismantle``).
    Every one of those loops must walk a level of a static operand, whose pattern then
    fixes its trip count."""

    request: Dismantle
    name: ClassVar[str] = "dismantle"
    arity: ClassVar[tuple[int, ...] | None] = (1, 2)
    forms: ClassVar[str] = "(v) or (v, values)"

    @classmethod
    def converted(cls, name: str, args: tuple[str, ...]) -> Command:
        if len(args) == 2 and args[1] != "values":
            raise ScheduleError(
                f"{spelled(name, args)}: the second argument is 'values' (embed the static "
                f"values as constants), got '{args[1]}'"
            )
        return cls(Dismantle(args[0], len(args) == 2))

    @property
    def args(self) -> tuple[str, ...]:
        return (self.request.var, *(["values"] if self.request.values else []))

    @property
    def variables(self) -> tuple[str, ...]:
        return (self.request.var,)

    def check(self, nest: NestState) -> str | None:
        v = self.request.var
        reason = self.unknown(v, nest.loops)
        if reason is not None:
            return reason
        if nest.dismantle is not None:
            return f"{self}: the schedule already dismantles {nest.dismantle.var}"
        if not nest.static:
            return (
                f"{self}: no operand is static; dismantle unrolls over a pattern known when "
                "compiling, given as ucf.compile(..., static={'A': tensor})"
            )
        walked = {o for t in nest.static for o in nest.tensors[t][0]}
        names = ", ".join(f"{t}({', '.join(nest.tensors[t][0])})" for t in sorted(nest.static))
        for loop in nest.loops[: nest.loops.index(v) + 1]:
            outside = [o for o in nest.prov.origins(loop) if o not in walked]
            if outside:
                where = "" if loop == v else f"loop {loop} encloses {v} and "
                return (
                    f"{self}: {where}{loop} iterates {outside[0]}, which no static operand "
                    f"is indexed by ({names}), so its trip count is unknown when compiling "
                    f"and it cannot be unrolled; dismantle a variable of a static operand "
                    "with only such loops around it"
                )
        return None

    def record(self, nest: NestState) -> None:
        nest.dismantle = self.request


@dataclass(frozen=True)
class Convert(Command):
    """``convert(B)``: sparse operand B binds no loop order; an order that walks its
    levels against their storage reads a copy of B converted to that order before each
    call (a ``ConversionWarning``, and a line in ``k.cin``), as an operand no loop order
    can follow is read already. The default uses it where reading a transposed operand
    the other way round makes the work linear (``ucf.schedule.transposed_products``).
    A dense B binds no order either way: ``convert(B)`` reads a copy of it stored in the
    order the loops walk its modes (SDDMM's row-major ``D(k,j)`` under ``i, j, k`` read
    column-major, so the dot product over k is contiguous), made before each call on
    the kernel's threads (``ucf.schedule.strided_operands`` has the default's rule)."""

    tensor: str
    name: ClassVar[str] = "convert"
    arity: ClassVar[tuple[int, ...] | None] = (1,)
    forms: ClassVar[str] = "(A), an operand"

    @property
    def args(self) -> tuple[str, ...]:
        return (self.tensor,)

    def check_statement(self, stmt: Statement) -> str | None:
        names = sorted({a.tensor for a in accesses(stmt.rhs)})
        if self.tensor not in names:
            shown = ", ".join(names)
            return f"{self}: {self.tensor} is not an operand of {stmt} (operands: {shown})"
        return None


def _workspace_name(taken: set[str]) -> str:
    """TACO's three-argument precompute names its workspace: ``w``, else ``w1``, ..."""
    return next(n for n in ("w", *(f"w{k}" for k in range(1, len(taken) + 2))) if n not in taken)
