"""A concrete index notation with a schedule applied: the schedule's commands checked
against the loop nest, the statement concretized again in the order they ask for, and
notes that say what each command did (``ucf.pipeline`` calls this for the user's
schedule and for each the default models propose)."""

from __future__ import annotations

from ucf.cin.concretize import appended_vars, concretize, level_vars
from ucf.cin.notation import CIN
from ucf.errors import ScheduleError
from ucf.format.format import Format
from ucf.lang.ast import accesses
from ucf.schedule import own_order
from ucf.schedule.apply import Applied, apply_schedule
from ucf.schedule.nest_state import Command
from ucf.schedule.requests import Convert


def scheduled(
    cin: CIN,
    commands: list[Command],
    fmts: dict[str, Format],
    computed: Format,
    default: bool = False,
    static: frozenset[str] = frozenset(),
    shown: dict[str, str] | None = None,
) -> tuple[CIN, Applied]:
    """Re-concretize with the loop order the schedule asks for, after checking it.

    The order must walk every sparse operand read as stored in the order of its
    levels. An operand ``cin`` reads converted (no order it could take follows its
    storage) binds no order: the new order picks its storage anew, as stored when
    the order follows that. Errors name an operand's format as ``shown`` (the user's
    spelling, by tensor) gives it."""
    stmt = cin.statement
    free = _freed(commands, fmts)
    chains = {}
    tensors: dict[str, tuple[list[str], Format]] = {}
    for n, a in enumerate(accesses(stmt.rhs)):
        slot = cin.slots[n]
        lv = level_vars(a, slot.format, cin.order)
        tensors.setdefault(a.tensor, (lv, slot.format))
        # An affine level's base moves with the order; concretize checks those.
        as_stored = slot.name == slot.tensor
        if a.tensor in free:
            continue
        if as_stored and not slot.format.is_dense and all(i.single_variable for i in a.indices):
            spelled = (shown or {}).get(a.tensor, str(slot.format))
            chains[f"operand {a.tensor} ('{spelled}')"] = lv
    if not computed.is_dense:
        chains[f"output {stmt.lhs.tensor} ('{computed}')"] = level_vars(
            stmt.lhs, computed, cin.order
        )
    output = (stmt.lhs.tensor, not computed.is_dense)
    applied = apply_schedule(commands, cin.order, chains, tensors, output, static)
    order = applied.order
    if not computed.is_dense and not applied.precompute:
        out = appended_vars(stmt.lhs, computed)
        for k, v in enumerate(order):
            later = [w for w in order[k + 1 :] if w in out]
            if v not in out and v not in cin.nested_vars and later:
                raise ScheduleError(
                    f"reorder: reduction variable {v} would enclose output variable "
                    f"{later[0]}, which a sparse output cannot be appended in; precompute "
                    "into a workspace instead"
                )
    prov = applied.provenance
    gathered = [
        (frozenset(str(a) for a in accesses(pc.statement.rhs)), v)
        for pc in applied.precompute
        for v in (prov.origins(pc.var)[0], *pc.more)
    ]
    # A dense operand convert copies is laid out as the loops walk it: each variable
    # where its innermost loop runs (a register tile's k_b_r inside j: j, k).
    walk: list[str] = []
    for loop in applied.loops:
        for v in prov.origins(loop):
            walk = [*(w for w in walk if w != v), v]
    apart = own_order.walked(stmt, applied.precompute, prov, order, fmts, computed.is_dense)
    new = concretize(
        stmt,
        fmts,
        computed,
        order=order,
        gathered=gathered,
        freed=frozenset(free),
        walk=walk,
        walked=apart,
    )
    new.loops = list(applied.loops)
    new.origins = {v: applied.provenance.origins(v) for v in applied.loops}
    new.parallel = dict(applied.parallel)
    new.bounds = dict(applied.bounds)
    new.blocks = dict(cin.blocks)
    new.diagonals = dict(cin.diagonals)
    text = "; ".join(map(str, commands))
    new.notes[0] += " (default schedule)" if default else f" (from schedule: {text})"
    for v in applied.loops:
        if v in prov.rel:
            new.notes.append(prov.describe(v))
    for pc in applied.precompute:
        at = ", ".join((pc.wvar, *pc.more))
        new.notes.append(f"{pc.expr} is precomputed into workspace {pc.name}({at})")
    for v, par in applied.parallel.items():
        new.notes.append(f"loop {v} runs in parallel ({par})")
    if applied.assemble is not None:
        a = applied.assemble
        how = {
            "Insert": "a query pass counts its entries, then they are inserted",
            "Append": "a query pass counts its entries, then they are appended in loop order",
        }[a.strategy]
        new.notes.append(f"output {a.tensor} is assembled by {a.strategy}: {how}")
    if applied.query is not None:
        for v, par in applied.query[1].items():
            new.notes.append(f"query loop q{v} runs in parallel ({par})")
    if applied.dismantle is not None:
        d = applied.dismantle
        how = "their values embedded" if d.values else "their values read at call time"
        new.notes.append(
            f"dismantle: {d.var} and the loops around it are unrolled over the patterns of "
            f"{', '.join(sorted(static))}, {how}"
        )
    return new, applied


def _freed(commands: list[Command], fmts: dict[str, Format]) -> set[str]:
    """The operands ``convert`` names, each once: sparse ones it frees from binding
    the loop order, dense ones it has read in the order the loops walk them."""
    free: set[str] = set()
    for c in commands:
        if not isinstance(c, Convert):
            continue
        if c.tensor in free:
            raise ScheduleError(f"{c}: {c.tensor} is converted already by an earlier convert")
        free.add(c.tensor)
    return free
