"""Calling a kernel: operands checked and converted once per call where they must be,
extents found, the output allocated (or recycled, or the caller's), the plan chosen,
and the compiled function invoked with its arguments, replaying the last call's
argument list where the operands are the very same (``ucf.exec.replay``).

``Calling`` is part of :class:`ucf.exec.kernel.Kernel`; the building half (compiling,
the cache, the default model's plans) is there. How an operand is taken as the user
passed it, and what a call says about converting it, is ``ucf.exec.operand_intake``'s;
the output's memory is ``ucf.exec.outputs``'.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ucf.codegen.kernel_plan import Plan
from ucf.errors import OperandError, boundary
from ucf.exec import blocked_call, operand_structure, padded_conv, recycled, scipy_operands
from ucf.exec.binding import (
    arguments,
    binding,
    check_mappings,
    check_output,
    refuse_positional,
    same_format,
    unknown_operand,
)
from ucf.exec.operand_intake import as_operand, warn_conversion
from ucf.exec.outputs import dense_output, owned, sparse_output, trimmed
from ucf.exec.replay import REMEMBERED, FlatReplay, Replay, replayable
from ucf.exec.shapes import bound_extents, check_orders, plain_extents
from ucf.format.construction import trusted
from ucf.format.format import Format
from ucf.format.quantize import check_sums, held_operand
from ucf.format.relayout import relaid, relayable, same_layout
from ucf.format.tensor import Tensor
from ucf.format.values import check_lossless
from ucf.ir import nodes as ir
from ucf.lang.ast import accesses
from ucf.toolchain.jit import apply_num_threads, num_threads
from ucf.toolchain.team import SOLO, TIMED


class Calling:
    """The call path of :class:`ucf.exec.kernel.Kernel`; see its docstring for the state."""

    @boundary
    def __call__(
        self,
        *positional: Any,
        out: Any = None,
        shapes: Mapping[str, Any] | None = None,
        masks: Mapping[str, Any] | None = None,
        **operands: Any,
    ) -> Tensor:
        local = self._local
        if local.built is not None and local.built.flat is not None:
            local.built = None  # the user's statement binds the operands; _choose comes back
        asked = None  # the plan a remembered call asked its team states for
        if local.replays and shapes is None and masks is None and not positional:
            threads = num_threads()
            for replay in local.replays:
                if replay.matches(operands, out, threads):
                    teams = replay.teams
                    if teams is not None and (plan := teams.plan()):
                        result = _replayed(local, teams, plan, operands, out, replay)
                        if result is not None:
                            return result
                        asked = plan  # _choose runs the plan for one thread
                        break
                    local.built = replay.built
                    apply_num_threads()
                    return replay.run(out)
        refuse_positional(self._plan.statement, positional)
        check_mappings(shapes=shapes, masks=masks)
        if masks:  # only a kernel compiled with dynamic= takes masks (ucf.stile.dynamic)
            raise OperandError(
                f"masks= gives a mask for {next(iter(masks))}, which is not a dynamic operand "
                "of this kernel; compile with dynamic={name: micro-tile shape}"
            )
        plan = self._plan
        stmt = plan.statement
        names = {a.tensor for a in accesses(stmt.rhs)}
        unknown = sorted(set(operands) - names)
        if unknown:
            raise OperandError(unknown_operand(unknown[0], stmt, ("out", "shapes", "masks")))
        missing = sorted(names - set(operands))
        if missing:
            raise OperandError(f"missing operand {missing[0]} for {stmt}")
        given: dict[str, Tensor] = {}
        in_place: list[str] = []  # scipy operands read on their own arrays, order unchecked
        falls: dict[str, int] = {}  # their falling neighbours, counted with their bounds
        for n in names:
            # A static operand is compared with the compiled one as it comes: canonical.
            t = None if self._statics else scipy_operands.bind(operands[n], n, falls)
            if t is None:
                t = as_operand(operands[n], n, self.dtype)
            else:
                in_place.append(n)
            given[n] = t
        if out is not None:
            check_output(out, given, stmt.lhs.tensor)
        check_orders(plan.orders, given)
        for n, st in self._statics.items():
            st.check(given[n], self.index_dtype)
        extents = self._extents(given, out, shapes)
        if self._adaptive:
            self._choose(given, extents, asked)
            plan = self._plan
        free = frozenset()
        if in_place:
            free = scipy_operands.settle(given, operands, in_place, falls, *self._order_free(plan))
        if plan.blocking is not None:
            result = blocked_call.run(self._run, plan, given, extents, out, self.dtype)
        elif self._built.flat is not None:
            plain = shapes is None and not self._statics and not plan.integer_sums
            result = self._run_flat(
                self._built.flat, given, extents, out, operands if plain else None
            )
            _clock(local)
            return result
        else:
            result = self._run(given, extents, out)
        _clock(local)
        call, local.call = local.call, None  # held no longer than this call
        if (
            call is not None
            and shapes is None
            and not self._statics  # each call compares a static operand with the compiled one
            and not plan.integer_sums  # each call bounds the sums by the zero points' values
            and (out is None or isinstance(out, np.ndarray))
            and replayable(operands, call[3], out, result, call[1][call[2]])
        ):
            built = local.built
            threads = local.stats[1] if self._adaptive else num_threads()  # as _choose chose
            teams = self._watched(built, threads)
            new = Replay(
                operands,
                out,
                call[:3],
                threads,
                built,
                result,
                plan.call_zeroes,
                teams,
                free,
                call[4],
            )
            local.replays = (new, *local.replays[: REMEMBERED - 1])
        return result

    def _order_free(self, plan: Plan) -> tuple[Mapping[str, Format], ...]:
        """The operands this call's kernel reads correctly in any order, those it reads
        so past their first stored level (``ucf.exec.order_free``), and the structure
        it reads each in; none where they go through a blocked, flattened or static
        call."""
        if plan.blocking is not None or self._built.flat is not None or self._statics:
            return {}, {}, {}
        b = binding(plan)
        return b.order_free, b.tail_free, b.reads

    def _run(self, given: dict[str, Tensor], extents: dict[str, int], out: Any) -> Tensor:
        """Convert the operands to the kernel's formats, call it, and finish the output
        (in the split shapes of a blocked statement: see ``ucf.exec.blocked_call``)."""
        plan = self._plan
        stmt = plan.blocking.statement if plan.blocking else plan.statement
        if plan.cin.diagonals:  # the offsets of repeated variables (ucf.cin.diagonals)
            extents = {**extents, **dict.fromkeys(plan.cin.diagonals, 1)}
        for bound in plan.cin.bounds.values():
            bound.check(extents)
        b = binding(plan)
        if plan.copied is not None and out is None:
            return self._relabelled(given[plan.copied.tensor], plan, b.out_vars, extents)
        slots: dict[str, Tensor] = {}
        for slot, fmt, dense, own, held in b.slots:
            t = given[slot.tensor]
            if slot.format.values is not None and not slot.format.values.plain:
                slots[slot.name] = held_operand(
                    t, slot.format, self.index_dtype, slot.tensor, self._warned
                )
                continue
            held = held or self.dtype
            if (
                own
                and t.vals.dtype == held
                and same_format(t.format.structure, fmt)
                and (dense or t.index_dtype == self.index_dtype)
            ):
                slots[slot.name] = t  # already the kernel's format and dtypes
                continue
            relayout = relayable(t.format, slot.format)
            if relayout and t.vals.dtype == held and same_layout(t.format, slot.format, t.shape):
                slots[slot.name] = trusted(t.shape, slot.format, [{}] * t.order, t.vals)
                continue  # the modes that differ in order have extent 1: no copy
            check_lossless(t.vals, held, slot.tensor)
            warn_conversion(slot, t, held, self.index_dtype, self._warned)
            if relayout:  # a transposed copy, on the kernel's threads
                buf = recycled.uninitialized(t.vals.shape, np.dtype(held))
                vals = relaid(t.vals, t.shape, t.format, slot.format, held, num_threads(), buf)
                slots[slot.name] = trusted(t.shape, slot.format, [{}] * t.order, vals)
                continue
            slots[slot.name] = t.convert(slot.format, index_dtype=self.index_dtype, dtype=held)
        check_sums(plan.integer_sums, extents, slots)
        out_shape = tuple([extents[v] for v in b.out_vars])
        outname = stmt.lhs.tensor
        if b.dense_output:
            result = dense_output(plan, self.dtype, out, out_shape)
            fn, args = self._invoke(plan.compute, extents, slots, result)
            if self.target != "cuda":  # replayable: see __call__
                self._local.call = (fn, args, b.out_vals_at, slots, None)
            return result
        if out is not None or stmt.op == "+=":
            why = (
                "'+=' into it is not supported; write the sum as an expression instead"
                if stmt.op == "+="
                else "out= is not supported, since its arrays are sized for each call; "
                "use the returned tensor"
            )
            raise OperandError(f"output {outname} is sparse ('{plan.output_format}'): {why}")
        counts = np.zeros(plan.computed_format.order, dtype=np.int64)
        if plan.same_structure:  # no pass counts what an operand's positions say
            return self._same_structure(plan, extents, slots, out_shape, counts)
        if plan.local_level is None:
            self._invoke(plan.assemble, extents, slots, None, counts=counts)
            result = sparse_output(
                plan, self.dtype, self.index_dtype, out_shape, counts, zeroed=not plan.one_pass
            )
        else:
            # The assemble pass turns its per-segment counts into the level's pos.
            counted = sparse_output(plan, self.dtype, self.index_dtype, out_shape, counts)
            self._invoke(plan.assemble, extents, slots, counted, counts=counts)
            pos = counted.levels[plan.local_level]["pos"]
            result = sparse_output(plan, self.dtype, self.index_dtype, out_shape, counts)
            result.levels[plan.local_level]["pos"] = pos
        self._invoke(plan.compute, extents, slots, result, counts=counts)
        result = trimmed(result)
        if plan.output_format != plan.computed_format:
            # the entries it computed, zeros too, as a CSR output keeps them
            result = result.convert(plan.output_format, keep_zeros=True)
        return result

    def _same_structure(
        self,
        plan: Plan,
        extents: dict[str, int],
        slots: dict[str, Tensor],
        shape: tuple[int, ...],
        counts: np.ndarray,
    ) -> Tensor:
        """The sparse output with an operand's structure (``ucf.exec.operand_structure``):
        its positions copied from the operand's, the compute pass alone run, nothing to
        trim; remembered for a replay where it is the format the user asked for."""
        lvl = plan.local_level
        src = slots[plan.same_structure].levels[lvl]["pos"]
        pos = operand_structure.positions(src)
        counts[lvl] = pos[-1]
        result = sparse_output(plan, self.dtype, self.index_dtype, shape, counts, zeroed=False)
        result.levels[lvl]["pos"] = pos
        fn, args = self._invoke(plan.compute, extents, slots, result, counts=counts)
        if plan.output_format != plan.computed_format:
            # the entries it computed, zeros too, as a CSR output keeps them
            return result.convert(plan.output_format, keep_zeros=True)
        if self.target != "cuda" and operand_structure.rebuilds(result):
            roles = [p.role for p in plan.compute.params]
            rebuilt = operand_structure.Rebuilt(
                src, lvl, counts, roles, result, plan.statement.lhs.tensor
            )
            self._local.call = (fn, args, binding(plan).out_vals_at, slots, rebuilt)
        return result

    def _run_flat(
        self,
        flat: padded_conv.Flat,
        given: dict[str, Tensor],
        extents: dict[str, int],
        out: Any,
        operands: dict[str, Any] | None = None,
    ) -> Tensor:
        """The call on the padded, flattened input (``ucf.exec.padded_conv``), cropped into
        the user's output. With the user's ``operands`` (a call that could replay), the
        call is remembered as a ``FlatReplay`` when the flattened kernel bound its
        operands as they are."""
        name = flat.conv.inp
        x = given[name]
        check_lossless(x.vals, self.dtype, name)
        buf = flat.pad(np.asarray(x), self.dtype)
        padded = trusted(buf.shape, Format.dense(buf.ndim), [{}] * buf.ndim, buf.reshape(-1))
        inner = {**given, name: padded}
        computed = self._run(inner, flat.extents(extents), None)
        call, self._local.call = self._local.call, None
        shape = tuple(extents[i.single_variable] for i in flat.conv.stmt.lhs.indices)
        result = dense_output(self._static.compiled.plan, self.dtype, out, shape)
        result.vals.reshape(shape)[...] = flat.crop(computed.vals, computed.shape, extents)
        if (
            operands is not None
            and call is not None
            and isinstance(operands.get(name), np.ndarray)
            and (out is None or isinstance(out, np.ndarray))
            and replayable(inner, call[3], computed.vals, computed, call[1][call[2]])
        ):
            threads = self._local.stats[1]  # as _choose chose (a flattened plan is a default)
            replay = Replay(
                inner,
                computed.vals,
                call[:3],
                threads,
                self._built,
                computed,
                self._plan.call_zeroes,
                self._watched(self._built, threads),
            )
            again = FlatReplay(
                operands, out, threads, replay, flat, (name, buf), computed, extents, result
            )
            self._local.replays = (again, *self._local.replays[: REMEMBERED - 1])
        return result

    def _relabelled(self, t: Tensor, plan: Plan, out_vars: Any, extents: dict[str, int]) -> Tensor:
        """The output of a copy that is its operand's conversion, relabelled
        (``ucf.cin.relabelled``): ``t`` converted as the kernel would read it, to the
        output's levels over ``t``'s modes, owning its arrays."""
        copied = plan.copied
        check_lossless(t.vals, self.dtype, copied.tensor)
        warn_conversion(plan.cin.slots[0], t, self.dtype, self.index_dtype, self._warned)
        c = t.convert(copied.format, index_dtype=self.index_dtype, dtype=self.dtype)
        mine = t.arrays
        levels = [{k: owned(a, mine) for k, a in lv.items()} for lv in c.levels]
        shape = tuple(extents[v] for v in out_vars)
        return Tensor(
            shape, plan.output_format, levels, owned(c.vals, mine), self.index_dtype, check=False
        )

    def _extents(self, given: dict[str, Tensor], out: Any, shapes: Mapping[str, Any] | None):
        plan = self._plan
        if shapes is None:
            found = plain_extents(binding(plan), given, out)
            if found is not None:
                return found
        return bound_extents(plan.statement, plan.variables, given, out, shapes)

    def _invoke(
        self,
        fn: ir.Function,
        extents: dict[str, int],
        slots: dict[str, Tensor],
        output: Tensor | None,
        counts: np.ndarray | None = None,
    ) -> tuple[Any, list[Any]]:
        """Call ``fn``; the callable and the arguments it got."""
        tensors = dict(slots)
        if output is not None:
            tensors[self._plan.statement.lhs.tensor] = output
        specs = binding(self._plan).params[fn.name]
        cpu = self.target != "cuda"
        args = arguments(specs, extents, tensors, counts, addresses=cpu)
        if cpu:
            apply_num_threads()
        call = self._functions[fn.name]
        call(*args)
        return call, args


def _replayed(local, teams, plan: int, operands: dict[str, Any], out: Any, replay):
    """A remembered call that ``teams`` sends elsewhere (``ucf.toolchain.team.LoopStates.plan``):
    to the plan for one thread, while its loops wait on one thread or after it lost a
    race (None when no call of that plan is remembered: the full path chooses it), and
    timed when it is a call of a race."""
    if plan & SOLO:
        solo = _remembered(local.replays, operands, out, 1)
        if solo is None:
            return None
        plan = teams.stepped(plan, replay.built, solo.built)
        if plan & SOLO:
            replay = solo
    local.built = replay.built
    apply_num_threads()
    if not plan & TIMED:
        return replay.run(out)
    start = time.perf_counter_ns()
    result = replay.run(out)
    teams.clocked(plan, time.perf_counter_ns() - start)
    return result


def _clock(local) -> None:
    """Give a raced call's wall time, from its plan's choice to its result, to the race
    (``ucf.toolchain.team.LoopStates.clocked``)."""
    raced = local.raced
    if raced is not None:
        local.raced = None
        teams, plan, start = raced
        teams.clocked(plan, time.perf_counter_ns() - start)


def _remembered(replays, operands: dict[str, Any], out: Any, threads: int):
    """The remembered call these operands and output replay at ``threads``, if any."""
    for replay in replays:
        if replay.matches(operands, out, threads):
            return replay
    return None


def cfunc(fn: ir.Function, address: int):
    types = [ctypes.c_void_p if p.is_array else ctypes.c_int64 for p in fn.params]
    return ctypes.CFUNCTYPE(None, *types)(address)
