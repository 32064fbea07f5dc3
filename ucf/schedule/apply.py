"""A schedule checked command by command against the loop nest, into an ``Applied``."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ucf.cin.blocking import Blocking
from ucf.errors import ScheduleError
from ucf.lang.ast import Statement, accesses
from ucf.schedule.commands import (
    Arrange,
    AssembleCommand,
    Command,
    NestState,
    Parallelize,
    PrecomputeCommand,
    Reorder,
    SplitCommand,
    Unroll,
    closest,
    renamed,
)
from ucf.schedule.provenance import Provenance, Relation
from ucf.schedule.records import Assemble, Bound, Dismantle, Parallel, Precompute
from ucf.schedule.storage_order import misordered

if TYPE_CHECKING:
    from ucf.format.format import Format

#: Commands that may name a query loop (``qi``) after ``assemble(T, ..., true)``.
QUERY_COMMANDS = (SplitCommand, Unroll, Parallelize)


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
    dismantle: Dismantle | None = None


def apply_schedule(
    commands: list[Command],
    order: list[str],
    chains: dict[str, list[str]],
    tensors: dict[str, tuple[list[str], Format]],
    output: tuple[str, bool] = ("", False),
    static: frozenset[str] = frozenset(),
) -> Applied:
    """Check every command against the loop nest as it stands and record it.

    ``chains`` maps each sparse operand (or the sparse output) to its index
    variables in level order, so a loop order that walks one out of order is
    refused.  ``tensors`` maps each operand name to its variables in level
    order and its format, for ``pos``.  ``output`` is the output's name
    and whether it is sparse, for ``assemble``; ``static`` names the operands whose
    pattern is known when compiling, for ``dismantle``.
    """
    assemble: Assemble | None = None
    query: _Query | None = None
    rest = list(commands)
    for k, cmd in enumerate(commands):
        if isinstance(cmd, AssembleCommand):
            assemble = _assemble(cmd, output, assemble)
            if assemble.separately:
                at = _apply(commands[:k], order, {}, tensors, output[0], static).loops
                query = _Query(commands[k + 1 :], at)
                rest = [*commands[:k], *query.compute]
    applied = _apply(rest, order, chains, tensors, output[0], static)
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
    if applied.dismantle is not None:
        _check_dismantle(applied)
    return applied


def check_statement(
    commands: list[Command], stmt: Statement, blocking: Blocking | None = None
) -> None:
    """Check each command against the statement as the user wrote it, before any loop
    exists: ``condense`` needs a variable that can be condensed, and a variable that a
    blocked format stores in blocks runs as two loops, which a command must name."""
    for cmd in commands:
        reason = cmd.check_statement(stmt)
        if reason is not None:
            raise ScheduleError(reason)
    for k, cmd in enumerate(commands):
        if isinstance(cmd, Reorder):
            for pc in commands[:k]:
                if isinstance(pc, PrecomputeCommand):
                    _check_producer_reorder(cmd, pc, stmt)
    if blocking is None:
        return
    for cmd in commands:
        for v in cmd.variables:
            if v in blocking.sizes:
                outer, inner = blocking.names[v]
                raise ScheduleError(
                    f"{cmd}: {v} is stored in blocks of {blocking.sizes[v]}, so its loops are "
                    f"{outer} (the block) and {inner} (the place in it); schedule those"
                )


def _check_producer_reorder(cmd: Reorder, pc: PrecomputeCommand, stmt: Statement) -> None:
    """TACO's ``precompute(e, i, iw, w); reorder(j, iw)`` reorders the loops of ``w``'s
    producer only. ucf's ``iw`` takes ``i``'s place in the whole nest (a renamed
    workspace variable is what a split's inner loop tiles), so the same reorder moves
    every term's loops: refused where the two differ, a loop it moves being one the
    rest of the statement runs too, with the spellings that say either meaning."""
    if pc.wvar == pc.var or pc.wvar not in cmd.order:
        return
    read = pc.read()
    if read is None:
        return  # the precompute's own check says why
    own = Counter(str(a) for a in read)
    rest = []
    for a in (stmt.lhs, *accesses(stmt.rhs)):
        if own[str(a)] > 0:
            own[str(a)] -= 1
        else:
            rest.append(a)
    if +own:
        return  # not the statement's accesses: the precompute's own check says so
    moved = [
        (v, a)
        for v in cmd.order
        if v != pc.wvar
        for a in rest
        if any(v in i.variables for i in a.indices)
    ]
    if not moved:
        return
    v, other = moved[0]
    ws = pc.workspace or "the workspace"
    kept = PrecomputeCommand(pc.expr, pc.var, pc.var, pc.workspace)
    whole = Reorder(tuple(pc.var if u == pc.wvar else u for u in cmd.order))
    raise ScheduleError(
        f"{cmd} after {pc}: {pc.wvar} takes {pc.var}'s place in the whole loop nest, so "
        f"the reorder would move the loop over {v} of {other} too, where TACO's moves "
        f"only the loops of {ws}'s producer. To run that producer in an order of its own, "
        f"write {kept} and no reorder: a producer over the whole of {pc.var} walks its "
        "operands as stored by itself where it shares no other loop with the rest of the "
        "statement (precompute the rest too; k.cin says so). ucf's reading, the whole "
        f"nest reordered, is spelled {whole} before the precompute"
    )


def _check_dismantle(applied: Applied) -> None:
    """The loops dismantle unrolls are straight-line code, so none of them runs in
    parallel."""
    v = applied.dismantle.var
    for loop in applied.loops[: applied.loops.index(v) + 1]:
        if loop in applied.parallel:
            raise ScheduleError(
                f"parallelize({loop}, {applied.parallel[loop]}): dismantle({v}) unrolls "
                f"{loop} into straight-line code, which has no loop to run in parallel; "
                "parallelize a loop inside it"
            )


def _apply(
    commands: list[Command],
    order: list[str],
    chains: dict[str, list[str]],
    tensors: dict[str, tuple[list[str], Format]],
    output: str,
    static: frozenset[str] = frozenset(),
) -> Applied:
    nest = NestState(list(order), tensors, output, static=static)
    for cmd in commands:
        nest = cmd.apply(nest)
    nest.steps.append(Arrange(tuple(nest.loops)))
    lowering = nest.prov.lowering_order(nest.loops)
    _check_chains(lowering, chains)
    return Applied(
        lowering,
        nest.loops,
        nest.prov,
        nest.steps,
        nest.parallel,
        nest.pos,
        nest.fused,
        nest.precompute,
        nest.bounds,
        dismantle=nest.dismantle,
    )


def output_vars(chains: dict[str, list[str]]) -> set[str]:
    return {v for who, chain in chains.items() if who.startswith("output") for v in chain}


def _assemble(cmd: AssembleCommand, output: tuple[str, bool], earlier: Assemble | None) -> Assemble:
    name, sparse = output
    tensor = cmd.tensor
    if earlier is not None:
        raise ScheduleError(f"{cmd}: the output's assembly is already chosen")
    if tensor != name:
        raise ScheduleError(f"{cmd}: {tensor} is not the output; the output is {name}")
    if not sparse:
        raise ScheduleError(
            f"{cmd}: output {name} is dense; assemble chooses how a sparse output is built"
        )
    return Assemble(tensor, cmd.strategy, bool(cmd.separately))


def _check_chains(order: list[str], chains: dict[str, list[str]]) -> None:
    """Refuses a loop order that does not walk a tensor the kernel reads as stored in
    its levels' order (``ucf.schedule.storage_order``), naming the two levels."""
    for who, chain in chains.items():
        pair = misordered(order, chain)
        if pair is not None:
            a, b = pair
            raise ScheduleError(
                f"reorder: loop order {', '.join(order)} visits {b} before {a}, but "
                f"{who} stores {a} above {b}; reorder the loops or store {who} "
                "in another mode order"
            )


class _Query:
    """Commands after ``assemble(T, ..., true)``: those naming a query loop (``qi``)
    schedule the query pass, the others the compute pass only."""

    def __init__(self, commands: list[Command], loops: list[str]):
        self.loops = loops  # the loops when the assemble command was given
        names = {f"q{v}" for v in loops} - set(loops)
        self.query: list[Command] = []
        self.compute: list[Command] = []
        for c in commands:
            if c.variables and c.variables[0] in names:
                self.query.append(c)
                if isinstance(c, SplitCommand):
                    names |= {c.outer, c.inner}
            else:
                self.compute.append(c)

    def apply(self, applied: Applied) -> tuple[list[Command], dict[str, Parallel]]:
        """The query pass's steps and parallel loops: those before the assemble command
        (they shape both passes) and the query commands, with ``q`` names mapped to the
        query pass's loops (which carry the compute pass's labels)."""
        both = set(self.compute)
        steps = [c for c in applied.steps if c not in both and not isinstance(c, Arrange)]
        parallel = {v: p for v, p in applied.parallel.items() if not self._compute_only(v)}
        loops = {f"q{v}": v for v in self.loops}
        final = list(self.loops)
        for cmd in self.query:
            if not isinstance(cmd, QUERY_COMMANDS):
                raise ScheduleError(
                    f"{cmd}: the query loops of assemble(..., true) take split, divide, "
                    f"unroll, parallelize; {cmd.name} shapes both passes, so put it before "
                    "the assemble command"
                )
            v = cmd.var
            if v not in loops:
                raise ScheduleError(
                    f"{cmd}: unknown query loop '{v}'{closest(v, loops)}; the query loops are "
                    f"{', '.join(loops)}"
                )
            label = loops[v]
            if isinstance(cmd, Parallelize):
                parallel[label] = cmd.request
                continue
            steps.append(renamed(cmd, label))
            if isinstance(cmd, SplitCommand):
                for new, role in ((cmd.outer, "outer"), (cmd.inner, "inner")):
                    if new in loops or new in self.loops:
                        raise ScheduleError(f"{cmd}: the new variable '{new}' is already a loop")
                    loops[new] = new
                    relation = Relation(cmd.mode, (label,), cmd.amount, role=role)
                    applied.provenance.add(new, relation)
                k = final.index(label)
                final[k : k + 1] = [cmd.outer, cmd.inner]
        steps.append(Arrange(tuple(final)))
        return steps, parallel

    def _compute_only(self, v: str) -> bool:
        return any(isinstance(c, Parallelize) and c.var == v for c in self.compute)
