"""The one driver: statement text to generated code.

parse -> concretize (CIN) -> schedule (the user's or the default) -> lower
(LLIR) -> codegen (C, LLVM IR or CUDA).  Everything here depends only on the
statement, formats, schedule, dtypes and target, never on operand values, so
its result is what the kernel cache keys and stores; ``ucf.exec`` builds,
caches, binds and calls it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ucf.cin import invariance
from ucf.cin.blocking import unblock, user_variables
from ucf.cin.concretize import concretize, nesting_conflict
from ucf.cin.diagonals import describe as describe_diagonals
from ucf.cin.diagonals import diagonals
from ucf.cin.extents import describe as describe_extents
from ucf.cin.notation import CIN
from ucf.cin.relabelled import relabelled
from ucf.cin.scale_groups import group_sums
from ucf.cin.split_operands import split_operands
from ucf.codegen import cuda as cudagen
from ucf.codegen.kernel_plan import Plan
from ucf.errors import (
    ConversionWarning,
    FormatError,
    OperandError,
    ScheduleError,
    UnsupportedError,
)
from ucf.format.format import Format
from ucf.format.values import VALUES, value_dtype
from ucf.ir import nodes as ir
from ucf.ir.simplify import remove_dead_variables
from ucf.lang.ast import accesses, statement_orders
from ucf.lang.parser import parse_statement
from ucf.lower.lowerer import Lowerer
from ucf.lower.state import Lowered
from ucf.passes import dismantle, first_write
from ucf.passes.flat_positions import flatten_rows
from ucf.passes.fma import with_fma
from ucf.passes.held_rows import hold_rows
from ucf.passes.partial_sums import split_sums
from ucf.passes.prefetch import prefetch_rows
from ucf.passes.registers import register_block
from ucf.passes.row_groups import group_rows
from ucf.passes.short_sums import unbranch_short_sums
from ucf.passes.streams import prefetch_streams
from ucf.schedule import Applied, Command
from ucf.schedule.apply import check_statement
from ucf.schedule.candidates import Refused, first_passing, passing
from ucf.schedule.commands import Branchless, PrecomputeCommand, Streams
from ucf.schedule.cpu_model import Choice, propose
from ucf.schedule.gathering import gathering
from ucf.schedule.gpu_model import propose_gpu
from ucf.schedule.scheduled import scheduled
from ucf.schedule.stats import Stats


def plan(
    expr: str,
    formats: Mapping[str, Format],
    schedule: Sequence[Command] | None,
    vt: str,
    it: str,
    target: str = "llvm",
    openmp: bool = True,
    default: bool = False,
    static: dict[str, Any] | None = None,
    shown: Mapping[str, str] | None = None,
    blocks: dict[str, tuple[str, str, int]] | None = None,
) -> Plan:
    """Everything about a kernel that does not depend on operand values, except the
    patterns of the ``static`` operands (name -> ``ucf.Tensor`` in its kernel format),
    which the kernel is specialized to (``ucf.passes.dismantle``). ``formats`` are
    parsed (``parse_formats``, where they were given); ``shown`` spells them as the
    user did, for messages. ``openmp``
    says whether the LLVM target's process has an OpenMP runtime to call (the
    builder knows; without one, parallel loops run serially). ``default`` says
    ``schedule`` is the default model's choice (see ``proposals``), not the user's.

    Without a schedule, the model's proposals for unknown statistics are tried in
    turn, and the kernel says in ``cin`` why it got what it got. ``blocks`` splits of
    variables the statement already holds (``Kernel``'s ``blocks``)."""
    if schedule is None and target != "cuda":
        refused = Refused()

        def attempt(choice: Choice) -> Plan:
            p = plan(
                expr, formats, choice.commands, vt, it, target, openmp, True, static, shown, blocks
            )
            return _with_reasons(p, [*refused, *choice.why])

        choices = proposals(expr, formats, None, threads=2, shown=shown, blocks=blocks)
        return first_passing(choices, attempt, refused, last_raises=True, shown=_text)
    front = _Front(expr, formats, shown, blocks)
    stmt, fmts, computed, requested = front.stmt, front.fmts, front.computed, front.requested
    blocking, out = front.blocking, stmt.lhs.tensor
    commands = list(schedule or [])
    check_statement(commands, front.user_stmt, blocking)
    gathered = [g for c in commands if isinstance(c, PrecomputeCommand) for g in c.gathered]
    base = front.concretized(workspace=_precomputes(commands), gathered=gathered)
    module = None
    fixed = _static_views(front, static or {}, target, vt)
    if target == "cuda":
        cin, lowered, module = _cuda_schedule(
            base, commands, schedule is None, requested, fmts, vt, it, front.shown
        )
    else:
        cin, applied = (
            scheduled(base, commands, fmts, computed, default, frozenset(fixed), front.shown)
            if commands
            else (base, None)
        )
        _check_units(applied, target)
        lowerer = Lowerer(cin, vt, it, applied=applied)
        lowered = lowerer.lower()
        if fixed:
            lowered = _dismantled(cin, applied, lowered, fixed, front, static or {})

    cin.notes += [*describe_extents(stmt, cin.fixed), invariance.describe(front.user_stmt)]
    cin.notes += describe_diagonals(cin.diagonals)
    if blocking is not None:
        cin.notes += blocking.notes()
    variables = (
        tuple(v for v in cin.order if v not in cin.diagonals)
        if blocking is None
        else user_variables(front.user_stmt)
    )
    variables += tuple(dict.fromkeys(v for v, _, _ in (blocks or {}).values()))
    copied = None
    if default and module is None and blocking is None and not fixed:
        copied = relabelled(cin, requested, fmts)
    if copied is not None:
        cin.notes.append(copied.note(out))
    elif computed != requested:
        cin.notes.append(f"output {out} is computed as '{computed}' and converted to '{requested}'")
    if lowered.one_pass:
        cin.notes.append(
            f"output {out} is appended in one pass into {lowered.one_pass}, then trimmed"
        )
    compute = remove_dead_variables(lowered.compute)
    if module is None:
        compute, tiles, claims = register_block(compute)
        cin.notes += tiles
        if any(s.format.fixed_width for s in cin.slots.values()):
            compute, groups = group_rows(compute)
            cin.notes += groups
        elif cin.output_format.is_dense and all(s.format.is_dense for s in cin.slots.values()):
            compute, groups = group_rows(compute, dense=True)
            cin.notes += groups
        compute, writes_all = lowerer.zeroed(compute)
        compute, firsts = first_write.apply(compute, claims)
        if writes_all:
            cin.notes.append(
                f"output {out}: the kernel zeroes each slice ({', '.join(writes_all)}) "
                "itself before computing into it, so the caller need not zero it"
            )
        cin.notes += firsts
        compute, held = hold_rows(compute)  # after the zeroing, which it may start from
        cin.notes += held
        compute, flat = flatten_rows(compute)
        cin.notes += flat
        compute, sums = split_sums(compute)
        cin.notes += sums
        levels = {c.var: c.level for c in commands if isinstance(c, Streams)}
        compute, streams = prefetch_streams(prefetch_rows(with_fma(compute)), levels)
        cin.notes += streams
        widths = {c.var: c.width for c in commands if isinstance(c, Branchless)}
        compute, short = unbranch_short_sums(compute, widths)
        cin.notes += short
    assemble = with_fma(remove_dead_variables(lowered.assemble)) if lowered.assemble else None
    if assemble is not None and module is None:
        assemble = prefetch_rows(assemble)
    if module is not None:
        module = replace(module, kernels=[with_fma(k) for k in module.kernels])
        cuda = cudagen.source(module, str(stmt))
        return Plan(
            front.user_stmt,
            cin,
            front.orders,
            compute,
            None,
            computed,
            requested,
            None,
            cuda,
            module,
            blocking=blocking,
            variables=variables,
            integer_sums=lowered.integer_sums,
        )
    return Plan(
        front.user_stmt,
        cin,
        front.orders,
        compute,
        assemble,
        computed,
        requested,
        lowered.local_level,
        helpers=list(lowered.helpers),
        blocking=blocking,
        variables=variables,
        integer_sums=lowered.integer_sums,
        openmp=_openmp_for(cin, openmp),
        writes_all=bool(writes_all),
        one_pass=bool(lowered.one_pass),
        same_structure=lowered.same_structure,
        copied=copied,
        schedule=None if schedule is None else "; ".join(map(str, commands)),
    )


def _static_views(front: _Front, static: dict[str, Any], target: str, vt: str) -> dict[str, Any]:
    """The static operands as the kernel's statement reads them: in a blocked kernel,
    in the split shape, as a call passes them (``ucf.cin.split_operands``: a blocked
    one on its own arrays, a plain one over a blocked variable re-packed)."""
    if static and target == "cuda":
        raise UnsupportedError("target 'cuda' does not take static operands yet")
    b = front.blocking
    if b is None:
        return dict(static)
    with warnings.catch_warnings():  # a re-packed operand warns on every call instead
        warnings.simplefilter("ignore", ConversionWarning)
        dtype = np.dtype(next(n for n, t in ir.NUMPY_TO_IR.items() if t == vt))
        return split_operands(b, static, dtype)


def _dismantled(
    cin: CIN,
    applied: Applied | None,
    lowered: Lowered,
    fixed: dict[str, Any],
    front: _Front,
    static: dict[str, Any],
) -> Lowered:
    """The lowered functions specialized to the static operands (``dismantle``): the
    extents their shapes fix, in the user's statement and in a blocked one's split."""
    request = applied.dismantle if applied is not None else None
    for n, slot in cin.slots.items():
        if request and slot.tensor in fixed and slot.name != slot.tensor:
            access = accesses(cin.statement.rhs)[n]
            why = nesting_conflict(cin.statement, access, front.fmts[slot.tensor])
            raise ScheduleError(
                f"dismantle({request.var}): static operand {slot.tensor} is read as "
                f"'{slot.format}', since no loop order follows its format; "
                + (why or "choose a loop order that walks its levels in order")
            )
    var = request.var if request else None
    command = f"dismantle({var}{', values' if request and request.values else ''})"
    extents = dismantle.fixed_extents(cin.statement, {n: t.shape for n, t in fixed.items()})
    extents.update(
        dismantle.fixed_extents(front.user_stmt, {n: t.shape for n, t in static.items()})
    )

    def special(fn: ir.Function) -> ir.Function:
        facts = dismantle.known(fn.params, fixed, extents, bool(request and request.values))
        return dismantle.specialize(fn, facts, var, command)

    assemble = special(lowered.assemble) if lowered.assemble else None
    return replace(lowered, compute=special(lowered.compute), assemble=assemble)


class _Front:
    """The statement and formats as the scheduler sees them: parsed, checked, the
    blocked formats split into plain ones, and the output's computed format."""

    def __init__(
        self,
        expr: str,
        formats: Mapping[str, Format],
        shown: Mapping[str, str] | None = None,
        blocks: dict | None = None,
    ):
        stmt = parse_statement(expr)
        self.blocks = dict(blocks or {})
        self.orders = statement_orders(stmt)
        out = stmt.lhs.tensor
        if out in {a.tensor for a in accesses(stmt.rhs)}:
            raise OperandError(
                f"output {out} also appears on the right-hand side; use another name"
            )
        fmts = {n: formats.get(n) or Format.dense(k) for n, k in self.orders.items()}
        for lvl, kind in enumerate(fmts[out].levels):
            try:
                kind.as_output()
            except FormatError as e:
                raise FormatError(f"output {out} ('{fmts[out]}'), level {lvl}: {e}") from None
        self.user_stmt = stmt
        # each operand's format as the user spelled it, for messages
        self.shown = {n: (shown or {}).get(n, str(f)) for n, f in fmts.items()}
        self.blocking = unblock(stmt, fmts)
        if self.blocking is not None:
            stmt, fmts = self.blocking.statement, dict(self.blocking.formats)
        stmt, self.diagonals = diagonals(stmt, fmts)
        self.stmt = group_sums(stmt, fmts)
        self.requested = fmts.pop(out)
        # Levels that cannot be written as outputs (singleton) are computed in the kind they
        # name (compressed), and the result is converted after.
        levels = tuple(k.as_output() for k in self.requested.levels)
        self.computed = self.requested.with_structure(levels, self.requested.mode_order)
        self.fmts = fmts

    def concretized(
        self, workspace: bool = False, order: list[str] | None = None, gathered=()
    ) -> CIN:
        places = {inner: {outer} for inner, (_, outer, _) in self.split_blocks.items()}
        cin = concretize(
            self.stmt,
            self.fmts,
            self.computed,
            order,
            workspace=workspace,
            gathered=gathered,
            before=places,
        )
        cin.diagonals = dict(self.diagonals)
        cin.blocks = self.split_blocks  # a block's size is its places' extent: loops unroll
        return cin

    @property
    def split_blocks(self) -> dict[str, tuple[str, str, int]]:
        """Each place variable of a split -> (the variable, its block's, the size): the
        blocked formats', or the given ``blocks`` (``Kernel(blocks=...)``)."""
        b = self.blocking
        if b is None:
            return dict(self.blocks)
        return {
            inner: (v, outer, size) for v, size in b.sizes.items() for outer, inner in [b.names[v]]
        }


def compute_dtype(expr: str, formats: Mapping[str, Format], dtype: Any = None) -> np.dtype:
    """The type a kernel for ``expr`` computes and writes its output in: ``dtype`` when
    given, else the values the output's format states (``dense@float32``), else float64.

    Operands whose formats state their values are read in place and widened; one
    whose values would change on the way (a float into an integer kernel, int64 into
    int32) is refused here, before anything is compiled."""
    front = _Front(expr, formats)
    out, stated = front.stmt.lhs.tensor, front.requested.values
    if stated and not stated.computes:
        raise FormatError(
            f"output {out} is stored as '{front.requested}': kernels hold {stated} values "
            f"in operands only and write {stated.compute} or wider (state that instead)"
        )
    if dtype is None:
        dt = stated.dtype if stated else np.dtype(np.float64)
    else:
        dt = value_dtype(dtype)
        if not VALUES[dt.name].computes:
            raise OperandError(
                f"dtype {dt} is a storage type: kernels compute in "
                f"{', '.join(v.name for v in VALUES.values() if v.computes)}; hold {dt} "
                f"values in an operand's format instead (e.g. 'csr@{dt}')"
            )
        if stated and stated.dtype != dt:
            raise FormatError(
                f"output {out} is stored as '{front.requested}' but the kernel's dtype is "
                f"{dt}; drop one of them (the output holds what the kernel computes)"
            )
    for name, fmt in front.fmts.items():
        if fmt.values and not fmt.values.readable_as(dt):
            raise FormatError(
                f"operand {name} is stored as '{fmt}', whose {fmt.values} values a kernel "
                f"computing in {dt} cannot read without changing them; compute in a wider "
                "type (dtype=...) or store the operand so"
            )
    return dt


def proposals(
    expr: str,
    formats: Mapping[str, Format],
    stats: Stats | None,
    threads: int,
    shown: Mapping[str, str] | None = None,
    blocks: dict[str, tuple[str, str, int]] | None = None,
) -> list[Choice]:
    """The default model's schedules for ``expr`` (see ``ucf.schedule.cpu_model``), best
    first, each checked against the statement as a user's schedule would be: the
    ones the checker refuses are left out. The last one is always the plain nest.
    ``stats`` are over the statement the kernel runs (a blocked variable's block and
    place loops, see ``Blocking.split_extents``)."""
    front = _Front(expr, formats, shown, blocks)
    base = front.concretized()
    # A workspace pays only where it spares converting a sparse operand (co-iterating
    # every output entry with the reduction); else the plain order follows storage too.
    # A sum of products would gather all its terms into a row workspace.
    gather = gathering(front.stmt, front.computed)
    spared = front.concretized(workspace=True, gathered=[gather] if gather else ())
    storage = spared.order if _converts(base) and not _converts(spared) else base.order
    *candidates, last = propose(base, storage, stats, threads, front.fmts)

    def check(choice: Choice) -> None:
        nest = spared if _precomputes(choice.commands) else base
        scheduled(nest, choice.commands, front.fmts, front.computed, shown=front.shown)

    kept, refused = [], Refused()
    for choice in [*candidates, last]:  # the plain nest is always kept
        if choice is last or passing([choice], check, refused, shown=_text):
            kept.append(replace(choice, why=[*refused, *choice.why]))
            refused = Refused()
    return kept


def _text(choice: Choice) -> str:
    return choice.text


def _precomputes(commands: Sequence[Command]) -> bool:
    return any(isinstance(c, PrecomputeCommand) for c in commands)


def _converts(cin: CIN) -> bool:
    """Whether ``cin`` reads some operand in another format than it is stored in."""
    return any(slot.name != slot.tensor for slot in cin.slots.values())


def _with_reasons(p: Plan, why: list[str]) -> Plan:
    p.cin.notes += why
    return p


def _check_units(applied: Applied | None, target: str) -> None:
    """GPU units are for target cuda only, CPU units for the others."""
    for v, par in (applied.parallel if applied else {}).items():
        gpu_unit = par.unit.startswith("GPU")
        if gpu_unit and target != "cuda":
            raise ScheduleError(f"parallelize({v}, {par}): GPU units need target 'cuda'")
        if not gpu_unit and target == "cuda":
            raise ScheduleError(
                f"parallelize({v}, {par}): CPU units need target 'llvm' or 'c'; on target "
                "'cuda' use GPUBlock, GPUWarp, GPUThread or GPUGroup"
            )


def _cuda_schedule(
    base: CIN, commands, default: bool, requested: Format, fmts, vt: str, it: str, shown: dict
):
    """Schedule, lower and map onto the GPU; without a schedule, try rows over threads."""
    if not requested.is_dense:
        raise UnsupportedError(
            f"target 'cuda' computes dense outputs only; output {base.statement.lhs.tensor} "
            f"is '{requested}'"
        )
    if _precomputes(commands):
        raise UnsupportedError("target 'cuda' does not support precompute yet")
    computed = base.output_format
    if default and base.order:
        v, refused = base.order[0], Refused()

        def attempt(candidate: tuple[list[Command], list[str], bool]):
            tried, reasons, _ = candidate
            cin, applied = scheduled(base, tried, fmts, computed, default=True, shown=shown)
            lowered, module = _lower_cuda(cin, applied, vt, it)
            cin.notes += [*refused, *reasons]
            return cin, lowered, module

        def refuses(candidate: tuple[list[Command], list[str], bool], e: Exception) -> bool:
            optional = candidate[2]  # the plain rows over threads must not be unsupported
            return isinstance(e, ScheduleError) or (optional and isinstance(e, UnsupportedError))

        found = first_passing(propose_gpu(base), attempt, refused, shown=_joined, refuses=refuses)
        if found is not None:
            return found
        errors = [e for e in refused.errors if isinstance(e, ScheduleError)]
        reason = str(errors[0]).split(": ", 1)[-1] if errors else ""
        base.notes.append(
            f"default schedule: no GPU threads, since the outermost loop {v} cannot be "
            f"split over blocks and threads ({reason})"
        )
    applied = None
    if commands:
        base, applied = scheduled(base, commands, fmts, computed, shown=shown)
        _check_units(applied, "cuda")
    lowered, module = _lower_cuda(base, applied, vt, it)
    return base, lowered, module


def _joined(candidate: tuple[list[Command], list[str], bool]) -> str:
    return "; ".join(map(str, candidate[0]))


def _lower_cuda(cin: CIN, applied: Applied | None, vt: str, it: str):
    from ucf.lower import gpu_grid

    lowered = Lowerer(cin, vt, it, applied=applied).lower()
    races: dict[str, list[str]] = {}
    if applied is not None:
        out = set(cin.output_vars)
        prov = applied.provenance
        races = {v: [o for o in prov.origins(v) if o not in out] for v in applied.parallel}
    module = gpu_grid.lower(remove_dead_variables(lowered.compute), cin.parallel, races)
    cin.notes += module.notes
    return lowered, module


def _openmp_for(cin: CIN, available: bool) -> bool:
    if cin.parallel and not available:
        cin.notes.append("llvm target: libgomp not found, parallel loops run serially")
        return False
    return True
