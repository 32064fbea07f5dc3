"""What a kernel call binds, worked out once per plan instead of on every call.

A call maps operands to the compiled function's parameters: which index
variable each operand mode fixes, which storage slot each operand fills, and
where each parameter's value comes from.  All of that depends on the plan
only, so it is derived the first time a plan is called and kept beside it
(keyed by the plan's identity, dropped when the plan is).  The per-call work
that is left is a few dictionary lookups per parameter.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ucf.cin.notation import Slot
from ucf.codegen.kernel_plan import Plan
from ucf.errors import ArgumentError, OperandError
from ucf.exec.order_free import order_free, tail_free
from ucf.format.format import Format
from ucf.lang.ast import accesses

# Where a parameter's value comes from (the first field of an argument spec).
EXTENT, COUNTS, DIM, VALS, LEVEL, SCALES = range(6)


@dataclass(frozen=True)
class Binding:
    """A plan's call-time facts, for the fast path of ``Kernel.__call__``."""

    plain: tuple[tuple[str, str, int], ...]  # (variable, tensor, mode) of each plain index
    closed: bool  # the plain indices fix every variable: no extent needs inferring
    lhs: tuple[str, ...]  # the output's index variables
    out_vars: tuple[str, ...]  # the computed output's, in the kernel's (maybe blocked) statement
    # Each slot once: (slot, its format's structure (the canonical object if dense), dense,
    # whether the slot is the operand itself rather than a copy in a second format, and
    # the dtype its values are held in when its format states one, else None).
    slots: tuple[tuple[Slot, Format, bool, bool, np.dtype | None], ...]
    dense_output: bool  # the kernel writes a dense output
    out_vals_at: int  # the output's values among the compute function's arguments
    params: dict[str, tuple[tuple[int, Any, Any], ...]]  # function -> argument specs
    # The operands it reads correctly in any order, repeats summed, and the structure it
    # reads each in (ucf.exec.order_free)
    order_free: Mapping[str, Format] = field(default_factory=dict)
    # Those it reads correctly with the first stored level as its format says and the
    # others in any order (ucf.exec.order_free.tail_free)
    tail_free: Mapping[str, Format] = field(default_factory=dict)
    # The structure the kernel reads each operand in, where it reads the operand itself
    reads: Mapping[str, Format] = field(default_factory=dict)


_BINDINGS: dict[int, Binding] = {}


def binding(plan: Plan) -> Binding:
    """The plan's Binding, made on first use and forgotten when the plan is freed."""
    found = _BINDINGS.get(id(plan))
    if found is None:
        found = _BINDINGS[id(plan)] = _derive(plan)
        weakref.finalize(plan, _BINDINGS.pop, id(plan), None)
    return found


def _derive(plan: Plan) -> Binding:
    stmt = plan.statement
    plain = tuple(
        (idx.single_variable, a.tensor, m)
        for a in accesses(stmt.rhs)
        for m, idx in enumerate(a.indices)
        if idx.single_variable is not None
    )
    closed = set(plan.variables) <= {v for v, _, _ in plain}
    lhs = tuple(idx.single_variable for idx in stmt.lhs.indices)
    slots: dict[str, tuple[Slot, Format, bool, bool, np.dtype | None]] = {}
    for slot in plan.cin.slots.values():
        if slot.name not in slots:
            fmt, own = slot.format.structure, slot.name == slot.tensor
            held = slot.format.values.dtype if slot.format.values else None
            dense = Format.dense(fmt.order)
            fmt, is_dense = (dense, True) if fmt == dense else (fmt, False)
            slots[slot.name] = (slot, fmt, is_dense, own, held)
    functions = [f for f in (plan.assemble, plan.compute) if f is not None]
    params = {f.name: tuple(_spec(p.role) for p in f.params) for f in functions}
    return Binding(
        plain=plain,
        closed=closed,
        lhs=lhs,
        out_vars=tuple(plan.cin.output_vars),
        slots=tuple(slots.values()),
        dense_output=plan.computed_format.is_dense,
        out_vals_at=next(
            k for k, p in enumerate(plan.compute.params) if p.role == ("vals", stmt.lhs.tensor)
        ),
        params=params,
        order_free=order_free(plan),
        tail_free=tail_free(plan),
        reads={s.tensor: fmt for s, fmt, _, own, _ in slots.values() if own},
    )


def _spec(role: tuple) -> tuple[int, Any, Any]:
    if role[0] == "extent":
        return (EXTENT, role[1], None)
    if role[0] == "counts":
        return (COUNTS, None, None)
    if role[0] == "dim":
        return (DIM, role[1], role[2])
    if role[0] == "vals":
        return (VALS, role[1], None)
    if role[0] in ("scale", "zero"):  # a quantized operand's (Tensor.scales)
        return (SCALES, role[1], "scale" if role[0] == "scale" else "zero_point")
    return (LEVEL, role[1], (role[2], role[0]))


def arguments(
    specs: tuple[tuple[int, Any, Any], ...],
    extents: dict[str, int],
    tensors: dict[str, Any],
    counts: np.ndarray | None,
    addresses: bool,
) -> list[Any]:
    """The call's arguments: ints for scalars, and for arrays their addresses (the
    caller keeps ``tensors`` alive across the call) or, with ``addresses`` false,
    the arrays themselves."""
    args: list[Any] = []
    for kind, name, where in specs:
        if kind == EXTENT:
            args.append(extents[name])
            continue
        if kind == DIM:
            args.append(tensors[name].shape[where])
            continue
        if kind == COUNTS:
            arr = counts
        elif kind == VALS:
            arr = tensors[name].vals
        elif kind == SCALES:
            arr = getattr(tensors[name].scales, where)
        else:
            arr = tensors[name].levels[where[0]][where[1]]
        args.append(address(arr) if addresses else arr)
    return args


_ADDRESSES: dict[int, tuple[weakref.ref, int, int]] = {}


def address(arr: np.ndarray) -> int:
    """``arr.ctypes.data``, remembered for arrays that come back call after call (a
    sparse operand's arrays, a dense vector): asking numpy costs a microsecond or two
    each time. The entry goes when the array does. numpy moves an array's buffer only
    in ``resize``, which it refuses for an array with a weak reference (this cache's),
    so an address cannot go stale; the byte count check guards that assumption."""
    key = id(arr)
    hit = _ADDRESSES.get(key)
    if hit is not None and hit[0]() is arr and hit[2] == arr.nbytes:
        return hit[1]
    addr = arr.ctypes.data
    _ADDRESSES[key] = (
        weakref.ref(arr, lambda _, key=key: _ADDRESSES.pop(key, None)),
        addr,
        arr.nbytes,
    )
    return addr


_EQUAL: dict[tuple[int, int], tuple[Format, Format]] = {}


def same_format(a: Format, b: Format) -> bool:
    """``a == b``, remembered for pairs of objects found equal: comparing two formats
    field by field costs more than a whole call of a small kernel."""
    if a is b or (id(a), id(b)) in _EQUAL:
        return True
    if a != b:
        return False
    if len(_EQUAL) > 256:
        _EQUAL.clear()
    _EQUAL[id(a), id(b)] = (a, b)  # held, so the ids stay theirs
    return True


def check_output(out: Any, reads: dict[str, Any], outname: str) -> None:
    """Refuse an output the kernel cannot write: a read-only array, or one that overlaps
    an operand of the call (a kernel zeroes, for ``=``, and writes the output while it
    still reads the operands, so the result would be wrong). ``reads`` maps each
    operand's name to its Tensor or array."""
    if hasattr(out, "vals"):
        target = out.vals
    else:
        target = np.asarray(out)
        if target is not out and target.flags.owndata:
            raise OperandError(
                f"out= for {outname} must be an array the kernel can write into (a numpy "
                f"array or ucf.Tensor); a {type(out).__name__} would be copied and the result lost"
            )
    if not target.flags.writeable:
        raise OperandError(f"out= for {outname} is read-only: pass a writeable array")
    for name, t in reads.items():
        arrays = t.arrays if hasattr(t, "levels") else [t]
        if any(isinstance(a, np.ndarray) and np.may_share_memory(target, a) for a in arrays):
            raise OperandError(
                f"out= shares memory with operand {name}, which the kernel reads while it "
                f"writes {outname}: pass a separate output array"
            )


def check_mappings(**given: Any) -> None:
    """Refuse a keyword argument that must map names (``shapes=``, ``masks=``) but is
    something else, before anything indexes it by name."""
    for what, value in given.items():
        if value is not None and not isinstance(value, Mapping):
            raise ArgumentError(f"{what}= takes a dict by name, got {type(value).__name__}")


def unknown_operand(name: str, stmt: Any, keywords: tuple[str, ...]) -> str:
    """What to say of a keyword argument that names no operand: the operands, and the
    call's own keyword it may be a misspelling of (``format=`` for ``formats=``)."""
    import difflib

    reads = sorted({a.tensor for a in accesses(stmt.rhs)})
    close = difflib.get_close_matches(name, keywords, n=1, cutoff=0.7)
    hint = f"; did you mean {close[0]}=?" if close else ""
    return f"unknown operand {name}: the statement reads {', '.join(reads)}{hint}"


def refuse_positional(stmt: Any, positional: tuple) -> None:
    """Operands are passed by name: which is which by position would depend on the order
    tensors appear in the statement, which a reader of the call cannot see."""
    if positional:
        names = sorted({a.tensor for a in accesses(stmt.rhs)})
        raise ArgumentError(
            f"operands are passed by name, as in k({', '.join(f'{n}=...' for n in names)}); "
            f"this call passes {len(positional)} by position"
        )
