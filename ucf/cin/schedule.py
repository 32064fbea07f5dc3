"""Schedule text and the fluent ``ucf.Schedule()`` chain, parsed into commands.

Every command of DESIGN section 2 parses; a command is checked against the
statement before anything is compiled, so a typo or an illegal request is a
``ScheduleError`` that names the variable and suggests the closest name.
The provenance graph records how each derived variable (split, divide, fuse,
pos, bound) relates to the original ones, so later commands and the lowerer
can recover coordinates and bounds through any chain.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import lark

from ucf.errors import ParseError, ScheduleError, ShapeError

if TYPE_CHECKING:
    from ucf.format.format import Format

COMMANDS = {
    "reorder": None,  # any number of variables
    "split": 4,
    "divide": 4,
    "fuse": 3,
    "pos": 3,
    "bound": 4,
    "unroll": 2,
    "precompute": None,  # (expr, i, iw, w), or TACO's (expr, i, iw) naming w itself
    "parallelize": None,  # 3, or 4 for GPUGroup
    "assemble": None,  # (T, Insert|Append) or (T, Insert|Append, true|false)
}
ASSEMBLE_STRATEGIES = ("Insert", "Append")
#: Commands that may name a query loop (``qi``) after ``assemble(T, ..., true)``.
QUERY_COMMANDS = ("split", "divide", "unroll", "parallelize")
UNITS = ("CPUThread", "CPUVector", "GPUBlock", "GPUWarp", "GPUThread", "GPUGroup")
STRATEGIES = ("NoRaces", "IgnoreRaces", "Atomics", "Temporary", "ParallelReduction", "Segment")


@dataclass(frozen=True)
class Command:
    name: str
    args: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.name}({', '.join(self.args)})"


def closest(name: str, choices) -> str:
    match = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean '{match[0]}'?)" if match else ""


def parse_schedule(text: str) -> list[Command]:
    from ucf.lang.parser import _describe, _parser

    try:
        tree = _parser("schedule.lark").parse(text)
    except lark.exceptions.UnexpectedInput as e:
        raise ParseError("schedule: " + _describe(e), text, e.line, e.column) from None
    commands = []
    for node in tree.children:
        if node is None:
            continue
        name = str(node.children[0])
        args = tuple(_text(text, a) for a in node.children[1:] if a is not None)
        if name not in COMMANDS:
            raise ScheduleError(f"unknown schedule command '{name}'{closest(name, COMMANDS)}")
        arity = COMMANDS[name]
        if arity is not None and len(args) != arity:
            raise ScheduleError(
                f"{name} takes {arity} arguments, got {len(args)}: {name}({', '.join(args)})"
            )
        commands.append(Command(name, args))
    return commands


def _text(source: str, node) -> str:
    if isinstance(node, lark.Token):
        return str(node)
    meta = node.meta
    return source[meta.start_pos : meta.end_pos]


@dataclass(frozen=True)
class Split:
    """``split`` (fixed inner size) or ``divide`` (fixed number of outer parts) of a loop."""

    var: str
    outer: str
    inner: str
    amount: int
    mode: str  # "split" or "divide"


@dataclass(frozen=True)
class Precompute:
    """``precompute(expr, i, iw, w)``: ``expr`` goes through a dense workspace ``w`` over ``iw``."""

    expr: str
    var: str
    wvar: str
    name: str


@dataclass(frozen=True)
class Parallel:
    unit: str
    strategy: str
    size: int = 0  # GPUGroup size

    def __str__(self) -> str:
        size = f", {self.size}" if self.size else ""
        return f"{self.unit}{size}, {self.strategy}"


@dataclass(frozen=True)
class Assemble:
    """``assemble(T, strategy[, separately])``: how the sparse output T is built.

    ucf always counts the output's entries in a query pass before it fills them,
    so arrays are exactly sized.  ``Insert`` (TACO's name) lets rows be filled in
    parallel once each row's count is known; ``Append`` appends in loop order.
    ``separately`` gives the query pass loops of its own, named ``q`` + the
    loop's name (``qi``), scheduled apart from the compute pass's.
    """

    tensor: str
    strategy: str
    separately: bool


@dataclass
class Applied:
    """A schedule checked against the statement, ready for the lowerer.

    ``order`` is the loop order of the original index variables that the
    lowerer builds; ``steps`` are the loop transformations applied to the built
    nest, in the user's order; ``pos``/``fused`` and ``precompute`` change what
    the lowerer builds in the first place.
    """

    order: list[str]
    loops: list[str]  # the final loop variables, outer to inner
    provenance: Provenance
    steps: list[Command]
    parallel: dict[str, Parallel]
    pos: dict[str, tuple[str, str]]  # original variable -> (position variable, tensor)
    fused: list[tuple[tuple[str, ...], str, str]]  # (original variables, pos variable, tensor)
    precompute: list[Precompute]
    bounds: dict[str, Bound]  # bounded loop variable -> its bound
    assemble: Assemble | None = None
    # With assemble(T, ..., true): the query pass's own steps and parallel loops.
    query: tuple[list[Command], dict[str, Parallel]] | None = None


@dataclass(frozen=True)
class Relation:
    """How a derived index variable relates to its parents (one provenance edge)."""

    kind: str  # split, divide, fuse, pos, bound, workspace
    parents: tuple[str, ...]
    amount: int = 0
    tensor: str = ""
    role: str = ""  # "outer" or "inner" for split and divide


class Provenance:
    """Derived index variables and the original variables they come from."""

    def __init__(self, originals: list[str]):
        self.originals = list(originals)
        self.rel: dict[str, Relation] = {}

    def add(self, name: str, rel: Relation) -> None:
        self.rel[name] = rel

    def origins(self, v: str) -> list[str]:
        """The original variables a loop variable iterates, outer to inner."""
        if v not in self.rel:
            return [v]
        out: list[str] = []
        for p in self.rel[v].parents:
            out += [o for o in self.origins(p) if o not in out]
        return out

    def bounded(self, v: str) -> bool:
        """Whether the loop's trip count is known when the kernel is compiled."""
        rel = self.rel.get(v)
        if rel is None:
            return False
        if rel.kind == "bound":
            return True
        return (rel.kind, rel.role) in (("split", "inner"), ("divide", "outer"))

    def describe(self, v: str) -> str:
        rel = self.rel[v]
        parents = ", ".join(rel.parents)
        if rel.kind in ("split", "divide"):
            return f"{v} is the {rel.role} loop of {rel.kind}({parents}, {rel.amount})"
        if rel.kind == "pos":
            return f"{v} walks the positions of {rel.tensor} for {parents}"
        if rel.kind == "bound":
            return f"{v} is {parents} bounded to {rel.amount}"
        if rel.kind == "workspace":
            return f"{v} walks the workspace of {parents}"
        return f"{v} fuses {parents}"


def apply_schedule(
    commands: list[Command],
    order: list[str],
    chains: dict[str, list[str]],
    tensors: dict[str, tuple[list[str], Format]],
    output: tuple[str, bool] = ("", False),
) -> Applied:
    """Check every command against the loop nest as it stands and record it.

    ``chains`` maps each sparse operand (or the sparse output) to its index
    variables in level order, so a loop order that walks one out of order is
    refused.  ``tensors`` maps each operand name to its variables in level
    order and its format, for ``pos``.  ``output`` is the output's name
    and whether it is sparse, for ``assemble``.
    """
    assemble: Assemble | None = None
    query: _Query | None = None
    rest = list(commands)
    for k, cmd in enumerate(commands):
        if cmd.name == "assemble":
            assemble = _assemble(cmd, output, assemble)
            if assemble.separately:
                at = _apply(commands[:k], order, {}, tensors).loops
                query = _Query(commands[k + 1 :], at)
                rest = [*commands[:k], *query.compute]
    applied = _apply(rest, order, chains, tensors, output[0])
    applied.assemble = assemble
    if query is not None:
        applied.query = query.apply(applied)
    if assemble is not None and assemble.strategy == "Append":
        for v in applied.parallel:
            appended = [o for o in applied.provenance.origins(v) if o in output_vars(chains)]
            if appended:
                raise ScheduleError(
                    f"parallelize({v}, {applied.parallel[v]}): assemble({assemble.tensor}, "
                    f"Append) appends {assemble.tensor}'s entries in loop order, so the loop "
                    f"over {appended[0]} cannot run in parallel; use Insert"
                )
    return applied


def output_vars(chains: dict[str, list[str]]) -> set[str]:
    return {v for who, chain in chains.items() if who.startswith("output") for v in chain}


def _assemble(cmd: Command, output: tuple[str, bool], earlier: Assemble | None) -> Assemble:
    name, sparse = output
    if len(cmd.args) not in (2, 3):
        raise ScheduleError(f"{cmd}: assemble takes (T, Insert|Append) or (T, Insert|Append, true)")
    tensor, strategy = cmd.args[0], cmd.args[1]
    separately = cmd.args[2] if len(cmd.args) == 3 else "false"
    if earlier is not None:
        raise ScheduleError(f"{cmd}: the output's assembly is already chosen")
    if tensor != name:
        raise ScheduleError(f"{cmd}: {tensor} is not the output; the output is {name}")
    if not sparse:
        raise ScheduleError(
            f"{cmd}: output {name} is dense; assemble chooses how a sparse output is built"
        )
    if strategy not in ASSEMBLE_STRATEGIES:
        raise ScheduleError(
            f"{cmd}: unknown strategy '{strategy}'{closest(strategy, ASSEMBLE_STRATEGIES)}; "
            "the strategies are Insert and Append"
        )
    if separately not in ("true", "false"):
        raise ScheduleError(f"{cmd}: the third argument is true or false, got '{separately}'")
    return Assemble(tensor, strategy, separately == "true")


class _Query:
    """Commands after ``assemble(T, ..., true)``: those naming a query loop (``qi``)
    schedule the query pass, the others the compute pass only."""

    def __init__(self, commands: list[Command], loops: list[str]):
        self.loops = loops  # the loops when the assemble command was given
        names = {f"q{v}" for v in loops} - set(loops)
        self.query: list[Command] = []
        self.compute: list[Command] = []
        for c in commands:
            if c.args and c.args[0] in names:
                self.query.append(c)
                if c.name in ("split", "divide"):
                    names |= {c.args[1], c.args[2]}
            else:
                self.compute.append(c)

    def apply(self, applied: Applied) -> tuple[list[Command], dict[str, Parallel]]:
        """The query pass's steps and parallel loops: those before the assemble command
        (they shape both passes) and the query commands, with ``q`` names mapped to the
        query pass's loops (which carry the compute pass's labels)."""
        both = set(self.compute)
        steps = [c for c in applied.steps if c not in both and c.name != "arrange"]
        parallel = {v: p for v, p in applied.parallel.items() if not self._compute_only(v)}
        loops = {f"q{v}": v for v in self.loops}
        final = list(self.loops)
        for cmd in self.query:
            if cmd.name not in QUERY_COMMANDS:
                raise ScheduleError(
                    f"{cmd}: the query loops of assemble(..., true) take "
                    f"{', '.join(QUERY_COMMANDS)}; {cmd.name} shapes both passes, so put it "
                    "before the assemble command"
                )
            v = cmd.args[0]
            if v not in loops:
                raise ScheduleError(
                    f"{cmd}: unknown query loop '{v}'{closest(v, loops)}; the query loops are "
                    f"{', '.join(loops)}"
                )
            label = loops[v]
            renamed = Command(cmd.name, (label, *cmd.args[1:]))
            if cmd.name == "parallelize":
                parallel[label] = _parallelize(renamed, [label])[1]
                continue
            steps.append(renamed)
            if cmd.name in ("split", "divide"):
                _, outer, inner, _ = cmd.args
                for new, role in ((outer, "outer"), (inner, "inner")):
                    if new in loops or new in self.loops:
                        raise ScheduleError(f"{cmd}: the new variable '{new}' is already a loop")
                    loops[new] = new
                    amount = _positive(cmd, cmd.args[3], "the factor")
                    applied.provenance.add(new, Relation(cmd.name, (label,), amount, role=role))
                k = final.index(label)
                final[k : k + 1] = [outer, inner]
        steps.append(Command("arrange", tuple(final)))
        return steps, parallel

    def _compute_only(self, v: str) -> bool:
        return any(c.name == "parallelize" and c.args[0] == v for c in self.compute)


def _apply(
    commands: list[Command],
    order: list[str],
    chains: dict[str, list[str]],
    tensors: dict[str, tuple[list[str], Format]],
    output: str = "",
) -> Applied:
    loops = list(order)
    prov = Provenance(order)
    steps: list[Command] = []
    parallel: dict[str, Parallel] = {}
    pos: dict[str, tuple[str, str]] = {}
    fused: list[tuple[tuple[str, ...], str, str]] = []
    precompute: list[Precompute] = []
    bounds: dict[str, Bound] = {}
    for cmd in commands:
        name = cmd.name
        if name == "reorder":
            _reorder(cmd, loops)
            steps.append(Command("arrange", tuple(loops)))
        elif name in ("split", "divide"):
            sp = _split(cmd, loops)
            k = loops.index(sp.var)
            loops[k : k + 1] = [sp.outer, sp.inner]
            for new, role in ((sp.outer, "outer"), (sp.inner, "inner")):
                prov.add(new, Relation(name, (sp.var,), sp.amount, role=role))
            steps.append(cmd)
        elif name == "fuse":
            i, j, f = cmd.args
            _known(cmd, i, loops)
            _known(cmd, j, loops)
            _fresh(cmd, f, loops)
            k = loops.index(i)
            if k + 1 >= len(loops) or loops[k + 1] != j:
                raise ScheduleError(
                    f"{cmd}: {j} must be the loop directly inside {i} (the loop order is "
                    f"{', '.join(loops)}); reorder them first"
                )
            loops[k : k + 2] = [f]
            prov.add(f, Relation("fuse", (i, j)))
            steps.append(cmd)
        elif name == "pos":
            v, vpos, tensor = cmd.args
            _known(cmd, v, loops)
            _fresh(cmd, vpos, loops)
            origins = prov.origins(v)
            if v in prov.rel and prov.rel[v].kind != "fuse":
                raise ScheduleError(
                    f"{cmd}: {prov.describe(v)}; pos applies to an index variable or a fuse of them"
                )
            if tensor not in tensors:
                raise ScheduleError(
                    f"{cmd}: unknown tensor '{tensor}'{closest(tensor, tensors)}; the operands "
                    f"are {', '.join(tensors)}"
                )
            tvars, fmt = tensors[tensor]
            if any(o not in tvars for o in origins):
                missing = next(o for o in origins if o not in tvars)
                raise ScheduleError(
                    f"{cmd}: tensor {tensor} is not indexed by {missing} (it is "
                    f"{tensor}({', '.join(tvars)})), so it has no positions to walk for {missing}"
                )
            levels = [tvars.index(o) for o in origins]
            if levels != list(range(levels[0], levels[0] + len(levels))):
                raise ScheduleError(
                    f"{cmd}: {', '.join(origins)} are not consecutive levels of {tensor}"
                )
            kind = fmt.levels[levels[-1]]
            if kind.full:
                raise ScheduleError(
                    f"{cmd}: {tensor} stores {origins[-1]} in a {kind.name} ({kind.letter}) level, "
                    "which has no position space; pos needs a level that stores its "
                    "coordinates, such as compressed (C) or singleton (S)"
                )
            loops[loops.index(v)] = vpos
            prov.add(vpos, Relation("pos", (v,), tensor=tensor))
            if len(origins) == 1:
                pos[v] = (vpos, tensor)
            else:
                fused.append((tuple(origins), vpos, tensor))
                covered = _fuses(v, prov)
                steps = [c for c in steps if not (c.name == "fuse" and c.args[2] in covered)]
        elif name == "bound":
            v, vb, n, kind = cmd.args
            _known(cmd, v, loops)
            _fresh(cmd, vb, loops)
            if kind not in BOUND_KINDS:
                raise ScheduleError(
                    f"{cmd}: unknown bound kind '{kind}'{closest(kind, BOUND_KINDS)}; "
                    f"the kinds are {', '.join(BOUND_KINDS)}"
                )
            origin, divisor = _bound_origin(cmd, v, prov)
            bounds[v] = Bound(v, _positive(cmd, n, "the bound"), kind, origin, divisor)
            loops[loops.index(v)] = vb
            prov.add(vb, Relation("bound", (v,), bounds[v].amount))
            steps.append(cmd)
        elif name == "unroll":
            v, factor = cmd.args
            _known(cmd, v, loops)
            _positive(cmd, factor, "the unroll factor")
            if not prov.bounded(v):
                raise ScheduleError(
                    f"{cmd}: {v} is not bounded, so its trip count is unknown when the kernel is "
                    f"compiled; unroll the inner loop of a split, or bound({v}, ...) first"
                )
            steps.append(cmd)
        elif name == "precompute":
            if len(cmd.args) not in (3, 4):
                raise ScheduleError(
                    f"precompute takes (expr, i, iw) or (expr, i, iw, w), got {len(cmd.args)} "
                    f"arguments: {cmd}"
                )
            taken = {*tensors, output, *loops, *order, *(p.name for p in precompute)}
            expr, v, vw = cmd.args[:3]
            ws = cmd.args[3] if len(cmd.args) == 4 else _workspace_name(taken)
            _known(cmd, v, loops)
            if vw != v:
                _fresh(cmd, vw, loops)
                loops[loops.index(v)] = vw
                prov.add(vw, Relation("workspace", (v,)))
            if ws in tensors or ws == output:
                raise ScheduleError(f"{cmd}: the workspace name {ws} is already a tensor")
            if precompute:
                raise ScheduleError(f"{cmd}: one precompute per kernel is supported")
            precompute.append(Precompute(expr, v, vw, ws))
        elif name == "parallelize":
            v, par = _parallelize(cmd, loops)
            parallel[v] = par
        elif name == "assemble":
            continue  # recorded by apply_schedule
        else:  # pragma: no cover - parse_schedule only lets known commands through
            raise ScheduleError(f"unknown schedule command '{name}'")
    steps.append(Command("arrange", tuple(loops)))
    lowering = _lowering_order(loops, prov)
    _check_chains(lowering, chains)
    return Applied(lowering, loops, prov, steps, parallel, pos, fused, precompute, bounds)


BOUND_KINDS = ("MaxExact",)


def _workspace_name(taken: set[str]) -> str:
    """TACO's three-argument precompute names its workspace: ``w``, else ``w1``, ..."""
    return next(n for n in ("w", *(f"w{k}" for k in range(1, len(taken) + 2))) if n not in taken)


@dataclass(frozen=True)
class Bound:
    """``bound(var, ..., amount, kind)``: loop ``var`` runs exactly ``amount`` times.

    ``var`` is an index variable, or the outer loop of a ``split`` of one (through
    any number of splits: TACO's ``split(k, kv, thread, 32); bound(kv, ...)``),
    which runs ``ceil(|origin| / divisor)`` times. The trip count depends on an
    extent only known when the kernel is called, so each call checks it.
    """

    var: str
    amount: int
    kind: str
    origin: str
    divisor: int = 1

    def check(self, extents: dict[str, int]) -> None:
        trips = -(-extents[self.origin] // self.divisor)
        if trips == self.amount:
            return
        if self.divisor == 1:
            raise ShapeError(
                f"the schedule bounds index variable {self.var} to exactly {self.amount} "
                f"({self.kind}), but this call has extent {trips} for {self.var}"
            )
        raise ShapeError(
            f"the schedule bounds loop {self.var} to exactly {self.amount} ({self.kind}); it "
            f"runs ceil({self.origin} / {self.divisor}) times, which is {trips} for this "
            f"call's extent {extents[self.origin]} of {self.origin}"
        )


def _bound_origin(cmd: Command, v: str, prov: Provenance) -> tuple[str, int]:
    """The index variable that ``bound`` on ``v`` constrains, and the product of the split
    factors between them; a ScheduleError where the trip count is not one number for
    every run of the loop."""
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
                f"{cmd}: {what}; {why}, so {v} cannot be bounded (bound applies to index "
                "variables and to the outer loops of their splits)"
            )
        divisor *= rel.amount
        var = rel.parents[0]
    return var, divisor


def _fuses(v: str, prov: Provenance) -> set[str]:
    """``v`` and the fused variables it is made of (a fuse of a fuse)."""
    rel = prov.rel.get(v)
    if rel is None or rel.kind != "fuse":
        return {v}
    return {v}.union(*(_fuses(p, prov) for p in rel.parents))


def _lowering_order(loops: list[str], prov: Provenance) -> list[str]:
    order: list[str] = []
    for v in loops:
        order += [o for o in prov.origins(v) if o not in order]
    return order


def _check_chains(order: list[str], chains: dict[str, list[str]]) -> None:
    pos = {v: k for k, v in enumerate(order)}
    for who, chain in chains.items():
        for a, b in zip(chain, chain[1:], strict=False):
            if pos[a] > pos[b]:
                raise ScheduleError(
                    f"reorder: loop order {', '.join(order)} visits {b} before {a}, but "
                    f"{who} stores {a} above {b}; reorder the loops or store {who} "
                    "in another mode order"
                )


def _known(cmd: Command, v: str, loops: list[str]) -> None:
    if v not in loops:
        raise ScheduleError(
            f"{cmd}: unknown index variable '{v}'{closest(v, loops)}; "
            f"the loop variables are {', '.join(loops)}"
        )


def _fresh(cmd: Command, v: str, loops: list[str]) -> None:
    if v in loops:
        raise ScheduleError(f"{cmd}: the new variable '{v}' is already a loop variable")
    if not v.isidentifier():
        raise ScheduleError(f"{cmd}: '{v}' is not a valid index variable name")


def _positive(cmd: Command, text: str, what: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ScheduleError(f"{cmd}: {what} must be a positive integer, got '{text}'")
    return int(text)


def _reorder(cmd: Command, loops: list[str]) -> None:
    for v in cmd.args:
        _known(cmd, v, loops)
    if len(set(cmd.args)) != len(cmd.args):
        raise ScheduleError(f"reorder: a variable is repeated in {cmd}")
    slots = sorted(loops.index(v) for v in cmd.args)
    for slot, v in zip(slots, cmd.args, strict=True):
        loops[slot] = v


def _split(cmd: Command, loops: list[str]) -> Split:
    var, outer, inner, amount = cmd.args
    _known(cmd, var, loops)
    for new in (outer, inner):
        _fresh(cmd, new, loops)
    if outer == inner:
        raise ScheduleError(f"{cmd}: the two new variables must differ")
    what = "the factor" if cmd.name == "split" else "the number of parts"
    return Split(var, outer, inner, _positive(cmd, amount, what), cmd.name)


def _parallelize(cmd: Command, loops: list[str]) -> tuple[str, Parallel]:
    if len(cmd.args) not in (3, 4):
        raise ScheduleError(
            f"{cmd}: parallelize takes (i, unit, strategy) or (i, GPUGroup, size, strategy)"
        )
    v, unit, strategy = cmd.args[0], cmd.args[1], cmd.args[-1]
    _known(cmd, v, loops)
    if unit not in UNITS:
        raise ScheduleError(f"{cmd}: unknown unit '{unit}'{closest(unit, UNITS)}")
    if strategy not in STRATEGIES:
        raise ScheduleError(f"{cmd}: unknown strategy '{strategy}'{closest(strategy, STRATEGIES)}")
    size = 0
    if unit == "GPUGroup":
        if len(cmd.args) != 4:
            raise ScheduleError(
                f"{cmd}: GPUGroup takes a group size: parallelize(i, GPUGroup, 8, …)"
            )
        size = _positive(cmd, cmd.args[2], "the group size")
        if size > 32 or size & (size - 1):
            raise ScheduleError(
                f"{cmd}: the group size of {v} must be a power of two no larger than 32, got {size}"
            )
    elif len(cmd.args) == 4:
        raise ScheduleError(f"{cmd}: only GPUGroup takes a size")
    if strategy == "Segment" and unit != "GPUGroup":
        raise ScheduleError(f"{cmd}: the Segment strategy needs a GPUGroup unit")
    return v, Parallel(unit, strategy, size)


class Schedule:
    """A fluent schedule: ``ucf.Schedule().reorder("j", "i")``; ``str()`` gives the text."""

    def __init__(self, commands: tuple[Command, ...] = ()):
        self.commands = commands

    def _add(self, name: str, *args) -> Schedule:
        return Schedule((*self.commands, Command(name, tuple(str(a) for a in args))))

    def reorder(self, *variables: str) -> Schedule:
        return self._add("reorder", *variables)

    def split(self, i: str, outer: str, inner: str, factor: int) -> Schedule:
        return self._add("split", i, outer, inner, factor)

    def divide(self, i: str, outer: str, inner: str, parts: int) -> Schedule:
        return self._add("divide", i, outer, inner, parts)

    def fuse(self, i: str, j: str, fused: str) -> Schedule:
        return self._add("fuse", i, j, fused)

    def pos(self, i: str, ipos: str, tensor: str) -> Schedule:
        return self._add("pos", i, ipos, tensor)

    def bound(self, i: str, ib: str, n: int, kind: str = "MaxExact") -> Schedule:
        return self._add("bound", i, ib, n, kind)

    def unroll(self, i: str, factor: int) -> Schedule:
        return self._add("unroll", i, factor)

    def precompute(self, expr: str, i: str, iw: str, name: str | None = None) -> Schedule:
        """``name`` None: ucf names the workspace (``w``, or ``w1``... if taken)."""
        return self._add("precompute", expr, i, iw, *([name] if name else []))

    def parallelize(self, i: str, unit: str, *rest) -> Schedule:
        return self._add("parallelize", i, unit, *rest)

    def assemble(self, tensor: str, strategy: str, separately: bool = False) -> Schedule:
        return self._add("assemble", tensor, strategy, "true" if separately else "false")

    def __str__(self) -> str:
        return "; ".join(map(str, self.commands))

    def __repr__(self) -> str:
        return f"Schedule('{self}')"
