"""Execution plans (SparTA §3.3, Algorithm 3): a program rewritten over split operands.

Each sparse input of a statement is split into parts that one simple kernel
computes well: its widths rounded to the hardware's (``bit_rounding``), then per
width a weighted block cover (``block_cover``) whose blocks of one shape form
one part, stored in the format of that shape (CSR for single elements, BCSR for
blocks) with values of that width (``VALUES``: 8 and 4 bits quantized, 16 bits
half precision). Of the operands one statement reads, only the sparsest is split (a
product of two operands split into blocks of different orders has no loop order that
follows both); the others are read whole. A statement linear in a split operand
becomes one sub-statement per part, added up; any other statement reads the sum of
the parts in place of the operand.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from itertools import product
from typing import TYPE_CHECKING, Any

import numpy as np

from ucf.cin.blocking import unblock
from ucf.errors import OperandError, ScheduleError, UnsupportedError, boundary
from ucf.format.format import parse_format
from ucf.lang.affine import Affine
from ucf.lang.ast import (
    Access,
    Binary,
    Call,
    Expr,
    Neg,
    Statement,
    Sum,
    accesses,
    children,
    index_variables,
    text,
    with_children,
)
from ucf.lang.parser import parse_statement
from ucf.lang.reductions import free_variables, sums
from ucf.tesa.cover import block_cover
from ucf.tesa.rounding import bit_rounding
from ucf.tesa.rules import fresh, map_accesses

if TYPE_CHECKING:
    from ucf.tesa.program import Program


# The value suffix a part of each width is stored with; 32 and 64 bits are the plan's
# dtype. A blocked part has a scale per block; a CSR part one per tensor, so that a
# statement reading the sum of an operand's parts never has a per-row scale beside
# blocks over the same rows (which a blocked kernel refuses, docs/formats.md).
VALUES = {4: "@qint4", 8: "@qint8", 16: "@float16", 32: "", 64: ""}


class Policy:
    """What the hardware offers: the widths it computes in and the cost of a block of
    each shape (a dict from block shape to cost per block, or ``"measure"`` for the
    costs of ucf's blocked kernels on this machine). Inputs at least
    ``min_sparsity`` sparse are split; the others are read dense."""

    @boundary
    def __init__(self, bits: Iterable[int] = (32,), blocks: Any = None, min_sparsity: float = 0.5):
        self.bits = frozenset(_whole(b, "bits") for b in _items(bits, "bits"))
        self.min_sparsity = _fraction(min_sparsity)
        if not self.bits or min(self.bits) < 1:
            raise OperandError(f"Policy: bits must be positive widths, got {sorted(self.bits)}")
        unstored = sorted(self.bits - VALUES.keys())
        if unstored:
            raise OperandError(
                f"Policy: ucf has no storage for {unstored[0]}-bit values; the widths it "
                f"stores are {sorted(VALUES)} (4 and 8 quantized, 16 half precision)"
            )
        if isinstance(blocks, str):
            if blocks != "measure":
                raise OperandError(
                    f"Policy: blocks is a dict from block shape to cost per block, or "
                    f"'measure', not {blocks!r}"
                )
            from ucf.tesa.costs import measured_costs

            blocks = measured_costs()
        if not isinstance(blocks, Mapping | None):
            raise OperandError(
                f"Policy: blocks is a dict from block shape to cost per block, "
                f"not {type(blocks).__name__}"
            )
        self.blocks = {
            tuple(_whole(b, "a block shape") for b in _items(s, "a block shape")): _cost(c)
            for s, c in (blocks or {(1, 1): 1}).items()
        }
        if not self.blocks:
            raise OperandError("Policy: blocks must give at least one block shape")
        bad = [s for s in self.blocks if len(s) != 2 or min(s) < 1]
        if bad:
            raise OperandError(f"Policy: a block shape is two positive sizes, got {bad[0]}")

    def __repr__(self) -> str:
        return (
            f"Policy(bits={sorted(self.bits)}, blocks={self.blocks}, "
            f"min_sparsity={self.min_sparsity})"
        )


def _items(value: Any, what: str) -> list[Any]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise OperandError(f"Policy: {what} must be a collection of integers, got {value!r}")
    return list(value)


def _number(value: Any) -> bool:
    """A real number given as one (not a bool, not a string)."""
    return not isinstance(value, bool) and isinstance(value, int | float | np.number)


def _whole(value: Any, what: str) -> int:
    """An integer given as any number with no fraction: 8 or 8.0, not 8.5 or "8"."""
    if not _number(value):
        raise OperandError(f"Policy: {what} must be integers, got {value!r}")
    if not np.isfinite(value) or value != int(value):
        raise OperandError(f"Policy: {what} must be integers, got {value!r}")
    return int(value)


def _fraction(value: Any) -> float:
    if not _number(value):
        raise OperandError(f"Policy: min_sparsity must be a number in [0, 1], got {value!r}")
    if not 0 <= value <= 1:
        raise OperandError(f"Policy: min_sparsity must be in [0, 1], got {value!r}")
    return float(value)


def _cost(value: Any) -> float:
    if not _number(value):
        raise OperandError(f"Policy: a block's cost must be a number, got {value!r}")
    if not (np.isfinite(value) and value > 0):
        raise OperandError(f"Policy: a block's cost must be positive and finite, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Part:
    """One part of a split operand: its elements of one width in blocks of one shape."""

    name: str
    tensor: str
    bits: int
    block: tuple[int, ...]
    mask: np.ndarray
    columns: bool = False  # blocks stored by column: every read sums the rows away
    transposed: bool = False  # read only by products computed transposed

    @property
    def format(self) -> str:
        """The part's storage: its block shape's format, with values of its width. Blocks
        of an operand whose rows every statement sums away (``W`` of ``X·W``) are stored
        by column, so a kernel can walk each column of blocks in a thread of its own and
        apply each block to every row of the other factor while it is in cache. Blocks
        read only by products computed transposed (``_Transposed``) also store each
        block's places column by column (``W``'s transpose in BCSR), so that the
        register tiles run over a block's columns with its rows summed inside."""
        values = VALUES[self.bits]
        if self.block == (1, 1):
            return f"{'csc' if self.columns else 'csr'}{values}"
        per_block = ":1" if values.startswith("@q") else ""
        bh, bw = self.block
        if self.transposed:
            return f"UCUU:1/{bw},0/{bh},1%{bw},0%{bh}{values}{per_block}"
        name = "bcsc" if self.columns else "bcsr"
        return f"{name}({bh},{bw}){values}{per_block}"


class Plan:
    """The program as statements over parts; ``compile`` returns a callable that takes
    the original operands, splits them and returns the outputs. ``masks`` holds the
    attributes of the inputs read whole and of the outputs, where they prune: those
    elements are zeroed, as in the parts, so every tensor honours its attribute."""

    def __init__(
        self,
        steps: list[str],
        parts: list[Part],
        outputs: tuple[str, ...],
        masks: dict[str, np.ndarray],
        schedules: Mapping[str, str] | None = None,
    ):
        self.steps = steps
        self.parts = parts
        self.outputs = outputs
        self.masks = masks
        self.schedules = dict(schedules or {})  # by step: the transposes' tiles

    @cached_property
    def inputs(self) -> frozenset[str]:
        """The program's inputs the plan reads: the operands the steps read that no step
        writes, with each split operand in place of its parts. Worked out once: every call
        of a compiled plan checks its operands against it."""
        parts = {p.name: p.tensor for p in self.parts}
        read, written = set(), set()
        for step in self.steps:
            stmt = parse_statement(step)
            read |= {parts.get(a.tensor, a.tensor) for a in accesses(stmt.rhs)}
            written.add(stmt.lhs.tensor)
        return frozenset(read - written)

    def _check_inputs(self, names: Iterable[str]) -> None:
        unknown = sorted(set(names) - self.inputs)
        if unknown:
            raise OperandError(
                f"{unknown[0]} is not an input of the plan; its inputs are "
                f"{', '.join(sorted(self.inputs))}"
            )

    def __str__(self) -> str:
        legend = [
            f"# {p.name}: {p.tensor}'s {p.bits}-bit elements in {p.block[0]}x{p.block[1]} "
            f"blocks, {int(p.mask.sum())} elements, {p.format}"
            for p in self.parts
        ]
        return "\n".join(self.steps + legend)

    @boundary
    def compile(
        self,
        target: str = "llvm",
        dtype: Any = "float32",
        static: Mapping[str, Any] | None = None,
        dismantle: bool = False,
    ) -> Callable[..., dict[str, np.ndarray]]:
        """Compile every step. The callable takes the program's inputs by name and
        returns its outputs as a dict of numpy arrays. Inputs given in ``static`` (the
        weights, say) are split into their parts once, here, and the callable takes
        only the others. With ``dismantle``, a step over one part of a static input is
        specialized to the part's pattern (``dismantle`` over its blocks, see
        docs/tesa.md); a step that cannot be (too many live blocks, say) is compiled
        as usual, and the callable's ``notes`` say why."""
        import ucf

        self._check_inputs(static or {})
        formats = {p.name: p.format for p in self.parts}
        fixed = {n: self._masked(n, np.asarray(v, dtype=dtype)) for n, v in (static or {}).items()}
        fixed.update(self._split(fixed))
        kernels = []
        notes: list[str] = []
        for step in self.steps:
            stmt = parse_statement(step)
            names = {a.tensor for a in stmt.rhs._accesses}
            used = {n: f for n, f in formats.items() if n in names}
            kernel = None
            if dismantle:
                kernel = self._dismantled(step, used, fixed, target, dtype, notes)
            if kernel is None and len(used) == 1 and target != "cuda":
                outside = _blocks_outside(stmt, used, next(iter(used)))
                try:
                    if outside is not None:
                        kernel = ucf.compile(step, used, outside, target=target, dtype=dtype)
                except (ScheduleError, UnsupportedError):
                    kernel = None
            if kernel is None:
                schedule = self.schedules.get(step) if target != "cuda" else None
                kernel = ucf.compile(step, used, schedule, target=target, dtype=dtype)
            kernels.append((stmt.lhs.tensor, names, stmt.op == "+=", kernel))

        held = _Held()

        @boundary
        def run(**operands: Any) -> dict[str, np.ndarray]:
            self._check_inputs(operands)
            values = {n: self._masked(n, np.asarray(v, dtype=dtype)) for n, v in operands.items()}
            values.update(self._split(values))
            shapes = tuple(sorted((n, np.shape(v)) for n, v in values.items()))
            reused = held.arrays if held.shapes == shapes else {}
            values.update(fixed)
            made = {}
            for out, names, adds, kernel in kernels:
                missing = sorted(names - set(values))
                if missing:
                    raise OperandError(f"missing operand {missing[0]}")
                given = {n: values[n] for n in names}
                if adds:  # into the output an earlier step made here, in place
                    given["out"] = values[out]
                elif out in reused:
                    given["out"] = reused[out]
                result = kernel(**given)
                if adds:
                    continue
                if out in self.outputs:
                    values[out] = np.asarray(result)
                else:
                    # The intermediate itself, not a view of it, so that the steps
                    # reading it, given the very arrays of the last call, replay it.
                    values[out] = made[out] = given["out"] if "out" in given else np.asarray(result)
            held.shapes, held.arrays = shapes, made
            return {n: self._masked(n, np.asarray(values[n])) for n in self.outputs}

        run.notes = notes
        return run

    def _dismantled(
        self,
        step: str,
        formats: dict[str, str],
        fixed: Mapping[str, Any],
        target: str,
        dtype: Any,
        notes: list[str],
    ) -> Any:
        """The step's kernel dismantled over its one static part, or None (with a
        note saying why) when the step reads no single static part or the kernel
        cannot be dismantled."""
        import ucf

        stmt = parse_statement(step)
        static = [n for n in formats if n in fixed]
        if len(static) != 1:
            return None
        schedule = _dismantle_schedule(stmt, formats, static[0])
        if schedule is None:
            notes.append(f"{stmt.lhs.tensor}: not dismantled ({static[0]} has an affine index)")
            return None
        try:
            kernel = ucf.compile(
                step,
                formats=formats,
                schedule=schedule,
                target=target,
                dtype=dtype,
                static={static[0]: fixed[static[0]]},
            )
        except (ScheduleError, UnsupportedError) as e:
            notes.append(f"{stmt.lhs.tensor}: not dismantled ({e})")
            return None
        notes.append(f"{stmt.lhs.tensor}: dismantled over {static[0]} ({schedule})")
        return kernel

    @boundary
    def stored(self, name: str, value: Any, dtype: Any = "float32") -> np.ndarray:
        """``value`` of input ``name`` as the plan computes with it: its kept elements,
        with each part's values as stored (8- and 4-bit parts quantized, 16-bit ones
        in half precision), for checking a plan's result against a dense reference."""
        self._check_inputs([name])
        value = np.asarray(value, dtype=dtype)
        parts = [p for p in self.parts if p.tensor == name]
        if not parts:
            return self._masked(name, value)
        split = self._split({name: value})  # dequantized in dtype, as a kernel computes
        return sum(split[p.name].astype(dtype).to_numpy() for p in parts)

    def _masked(self, name: str, value: np.ndarray) -> np.ndarray:
        if name not in self.masks:
            return value
        mask = self.masks[name]
        if value.shape != mask.shape:
            raise OperandError(
                f"{name} has shape {value.shape}, but its attribute, which prunes some of "
                f"its elements, is of shape {mask.shape}"
            )
        return np.where(mask, value, 0)

    def _split(self, values: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """The parts of the operands in ``values``, each in its part's format."""
        from ucf.format.tensor import from_numpy

        return {
            p.name: from_numpy(np.where(p.mask, values[p.tensor], 0), format=p.format)
            for p in self.parts
            if p.tensor in values
        }


class _Held(threading.local):
    """A compiled plan's intermediates from its last call in this thread, kept for the
    next call with operands of the same shapes, which writes into them again. Fresh
    arrays each call cost their allocation and the page faults of first writing them,
    and steps reading new arrays cannot replay their last call (``ucf.exec.replay``):
    the BERT MLP plan of bench/tesa_program.py took 4.7 ms a call with fresh arrays and
    3.6 ms with kept ones, on one thread. The outputs are never kept: the caller owns
    them."""

    def __init__(self) -> None:
        self.shapes: tuple = ()
        self.arrays: dict[str, np.ndarray] = {}


def transform(program: Program, policy: Policy) -> Plan:
    taken = set(program.shapes)
    splits: dict[str, list[Part]] = {}
    # A wholly pruned operand has no part to split into: it is read whole, zeroed.
    candidates = [
        name
        for name in program.inputs
        if 0 < program.attrs[name].sparsity < 1
        and program.attrs[name].sparsity >= policy.min_sparsity
        and len(program.attrs[name].shape) == 2
    ]
    for name in candidates:
        bits = program.attrs[name].bits
        if bits.max() > max(policy.bits):
            raise OperandError(
                f"tensor {name} has {bits.max()}-bit elements, wider than any width of "
                f"the policy ({sorted(policy.bits)})"
            )
    # The sparsest first: an operand read by a statement beside one already split is read
    # whole (X of X·W when propagation pruned X's columns too), since a product of two
    # operands split into blocks of different orders has no loop order that follows both.
    for name in sorted(candidates, key=lambda n: -program.attrs[n].sparsity):
        if any(name in node.inputs and splits.keys() & set(node.inputs) for node in program.nodes):
            continue
        attr = program.attrs[name]
        rounded = bit_rounding(attr, policy.bits)[0]
        costs = {s: c for s, c in policy.blocks.items() if len(s) == 2}
        if not costs:
            continue
        parts = _parts(name, rounded.bits, costs, taken)
        columns = _rows_summed(program, name)
        splits[name] = [replace(p, columns=columns) for p in parts]
    steps: list[str] = []
    flips = _Transposed({p.name: p for ps in splits.values() for p in ps}, taken)
    fused = _fused(program)
    for node in program.nodes:
        if node.output in fused:
            continue
        made: dict[str, tuple[tuple[str, ...], Expr]] = {}

        def piece(indices: tuple[str, ...], term: Expr, node=node, made=made) -> Access:
            name = _fresh(f"{node.output}_{len(made)}", taken)
            made[name] = (indices, term)
            return Access(name, tuple(Affine.var(v) for v in indices))

        rhs = _distribute(_inlined(node.statement.rhs, fused), node.out_vars, splits, piece)
        steps.extend(_node_steps(node.statement.lhs, rhs, made, flips))
    masks = {
        name: program.attrs[name].mask
        for name in (*program.inputs, *program.outputs)
        if name not in splits and program.attrs[name].sparsity > 0
    }
    steps.extend(flips.restore(program.outputs))
    readers: dict[str, list[str]] = {}
    for step in steps:
        for a in accesses(parse_statement(step).rhs):
            readers.setdefault(a.tensor, []).append(step)
    parts = [
        replace(p, transposed=set(readers.get(p.name, ())) <= flips.products)
        if p.block != (1, 1)
        else p
        for ps in splits.values()
        for p in ps
    ]
    return Plan(steps, parts, program.outputs, masks, flips.schedules)


def _distribute(
    e: Expr,
    out_vars: tuple[str, ...],
    splits: dict[str, list[Part]],
    piece: Callable[[tuple[str, ...], Expr], Access],
) -> Expr:
    """``e`` over the parts of its split operands. Each top-level additive term that is
    linear in a split operand becomes one sub-statement per part (``piece`` emits it
    and returns its access), a single part included: a blocked part's loops can then
    come first in a step of its own, where beside a bias ``+ B(h)`` its sum would have
    to run inside each output element. A term that is not linear is searched the same
    way for the largest parts that are and whose values the output's variables fix
    (``sum(j, W(i,j) * x(j))`` inside ``relu``): each becomes sub-statements whose sum
    the term reads. Other reads of a split operand read the sum of its parts (one
    kernel then co-iterates the parts, whose blocks no one loop order may follow)."""
    if isinstance(e, Binary) and e.op in "+-":
        return Binary(
            e.op,
            _distribute(e.left, out_vars, splits, piece),
            _distribute(e.right, out_vars, splits, piece),
        )
    names = [n for n in dict.fromkeys(a.tensor for a in e._accesses) if n in splits]
    free = free_variables(e)
    linear = [n for n in names if _linear(e, n)] if free <= set(out_vars) else []
    if names and not linear and not isinstance(e, Access):
        kids = [_distribute(c, out_vars, splits, piece) for c in children(e)]
        return with_children(e, kids)
    for n in names:
        if n not in linear:
            e = _replace(e, n, tuple(p.name for p in splits[n]))
    terms = [e]
    for n in linear:
        terms = [_replace(t, n, (p.name,)) for t, p in product(terms, splits[n])]
    if not linear:
        return e
    indices = tuple(v for v in out_vars if v in free)
    return _sum([piece(indices, t) for t in terms])


def _node_steps(
    lhs: Access, rhs: Expr, made: Mapping[str, tuple[tuple[str, ...], Expr]], flips: _Transposed
) -> list[str]:
    """The steps of one statement whose ``rhs`` reads the sub-statements ``made``.

    Sub-statements added up at the top of ``rhs`` over all of ``lhs``'s indices
    accumulate into the output (``T(t,h) = X·W_0``, then ``T(t,h) += X·W_1``) rather
    than into outputs of their own that one more pass adds: that pass read and wrote
    every element of the output again, and each sub-statement's output was zeroed
    first. Those over single elements that ``flips`` computes transposed come last;
    the other terms follow in one ``+=`` of their sum."""
    whole = flips.node(lhs, rhs, made)
    if whole is not None:
        return whole
    reads = [a.tensor for e in (rhs, *(term for _, term in made.values())) for a in accesses(e)]
    steps = flips.restore(reads)
    own = tuple(i.single_variable for i in lhs.indices)
    terms = _added(rhs)
    into = [
        t for t in terms if isinstance(t, Access) and t.tensor in made and made[t.tensor][0] == own
    ]
    if None in own or len(set(own)) < len(own):
        into = []
    alone = [n for n in made if n not in {t.tensor for t in into}]
    steps += [f"{_lhs(n, made[n][0])} = {text(made[n][1])}" for n in alone]
    if not into:
        return [*steps, f"{lhs} = {text(rhs)}"]
    flipped = {t.tensor: flips.flipped(lhs, made[t.tensor][1]) for t in into}
    plain = [t for t in into if flipped[t.tensor] is None]
    for k, t in enumerate(plain):
        steps.append(f"{lhs} {'+=' if k else '='} {text(made[t.tensor][1])}")
    products = [flipped[t.tensor] for t in into if flipped[t.tensor] is not None]
    if products:
        steps.extend(flips.steps(lhs, "+=" if plain else "=", products))
    rest = [t for t in terms if not any(t is u for u in into)]
    if rest:
        steps.append(f"{lhs} += {text(_sum(rest))}")
    return steps


class _Transposed:
    """Products of a dense matrix with a part stored by column, ``T(t,h) = sum(d,
    X(t,d) * P(d,h))``, computed transposed so that the innermost loop runs over the
    rows ``t`` of ``X`` in vectors: ``X_t(d,t) = X(t,d)``, then ``T_t(h,t) = sum(d,
    P(d,h) * X_t(d,t))`` over ``P``'s columns (for a blocked part, the register-tiled
    SpMM of a sparse matrix times a dense one).

    A statement whose every term is such a product, or an element-wise statement
    over tensors held transposed, is computed transposed whole (``node``), and its
    output is kept only as ``T_t``: the next layer reads it as it is, and a transpose
    back, ``T(t,h) = T_t(h,t)``, runs only where a statement computed the plain way or
    the program's output needs ``T`` (``restore``). An MLP block then transposes its
    input and its output once. Where a statement mixes such products with other terms,
    only its products with parts of single elements run transposed (``flipped``,
    ``steps``), added back by ``T(t,h) += T_t(h,t)``: done the plain way, each stored
    element of ``P`` is a scalar multiply-add per row of ``X`` into a scattered
    element of ``T`` (about 1 ns); transposed, 8 rows share one.

    The transposes walk blocks of ``TILE`` columns so that reads and writes both stay
    in few cache lines (8 measured faster than 4, 16 or 32); ``schedules`` holds them
    by step. A matrix is transposed once for every step that reads it."""

    TILE = 8

    def __init__(self, parts: Mapping[str, Part], taken: set[str]):
        self.parts = parts
        self.taken = taken
        self.transposed: dict[str, str] = {}  # a tensor -> its transposed copy
        self.only: dict[str, tuple[str, str]] = {}  # held only transposed -> its indices
        self.products: set[str] = set()  # the steps of the products computed transposed
        self.schedules: dict[str, str] = {}

    def product(self, lhs: Access, term: Expr) -> tuple[Expr, Access] | None:
        """``(X, P)`` of a term ``sum(d, X(t,d) * P(d,h))`` into ``lhs`` ``T(t,h)``,
        where ``P`` is a part stored by column and ``X`` a plain matrix or a ``FUSED``
        function of one (``relu(T(t,d))``); None for any other term."""
        if not (isinstance(term, Sum) and len(term.vars) == 1 and len(lhs.indices) == 2):
            return None
        body = term.body
        if not (isinstance(body, Binary) and body.op == "*"):
            return None
        found = {
            a.tensor in self.parts: side
            for side in (body.left, body.right)
            if (a := _operand(side)) is not None and len(a.indices) == 2
        }
        x, p = found.get(False), found.get(True)
        if x is None or not isinstance(p, Access):
            return None
        t, h = (i.single_variable for i in lhs.indices)
        d = term.vars[0]
        want = ((t, d), (d, h))
        got = tuple(tuple(i.single_variable for i in a.indices) for a in (_operand(x), p))
        if got != want or not self.parts[p.tensor].columns or len({t, d, h}) < 3:
            return None
        return x, p

    def flipped(self, lhs: Access, term: Expr) -> tuple[Expr, Access] | None:
        """``product`` for a part of single elements, which pays transposed even when
        the result is added back into ``T``."""
        found = self.product(lhs, term)
        return found if found and self.parts[found[1].tensor].block == (1, 1) else None

    def steps(self, lhs: Access, op: str, products: list[tuple[Expr, Access]]) -> list[str]:
        """The transposed steps of ``lhs op`` the sum of ``sum(d, x(t,d) * p(d,h))`` over
        ``products``: each into one ``T_t``, added back once."""
        t, h = (i.single_variable for i in lhs.indices)
        out = _fresh(f"{lhs.tensor}_t", self.taken)
        steps = self._products(out, products, t, h)
        steps.append(self._tiled(f"{lhs.tensor}({t}, {h}) {op} {out}({h}, {t})", h, t))
        return steps

    def node(
        self, lhs: Access, rhs: Expr, made: Mapping[str, tuple[tuple[str, ...], Expr]]
    ) -> list[str] | None:
        """The steps of a whole statement computed transposed, its output then held
        only transposed; None where it cannot be (see the class). Its terms are
        products of column parts (the sub-statements ``made``) and element-wise terms
        (``_plain``), a bias ``B(h)`` say; with no product, one of the tensors it reads
        must be held only transposed, else it pays to stay plain."""
        own = tuple(i.single_variable for i in lhs.indices)
        if len(own) != 2 or None in own or own[0] == own[1]:
            return None
        t, h = own
        products, rest = [], []
        for e in _added(rhs):
            piece = made.get(e.tensor) if isinstance(e, Access) else None
            found = self.product(lhs, piece[1]) if piece and piece[0] == own else None
            if found:
                products.append(found)
            elif self._plain(e, lhs.indices):
                rest.append(e)
            else:
                return None
        reads = {a.tensor for e in rest for a in accesses(e)}
        if len(products) != len(made) or not (products or reads & set(self.only)):
            return None
        out = _fresh(f"{lhs.tensor}_t", self.taken)
        steps = self._products(out, products, t, h)
        if rest:

            def flip(a: Access) -> Access:
                if len(a.indices) < 2:
                    return a
                return Access(self.transposed[a.tensor], a.indices[::-1])

            op = "+=" if products else "="
            steps.append(f"{out}({h}, {t}) {op} {text(map_accesses(_sum(rest), flip))}")
        self.transposed[lhs.tensor] = out
        self.only[lhs.tensor] = own
        return steps

    def _plain(self, e: Expr, indices: tuple[Affine, ...]) -> bool:
        """Whether ``e`` is element-wise over the output's indices: no sum, and each
        tensor it reads is held transposed and read at those indices, or reads at most
        one of them (a bias)."""
        own = {i.single_variable for i in indices}
        return not sums(e) and all(
            (a.indices == indices and a.tensor in self.transposed)
            or (len(a.indices) < 2 and {i.single_variable for i in a.indices} <= own)
            for a in accesses(e)
        )

    def restore(self, names: Iterable[str]) -> list[str]:
        """The transposes back of those of ``names`` held only transposed."""
        steps = []
        for name in dict.fromkeys(names):
            if name in self.only:
                t, h = self.only.pop(name)
                flipped = self.transposed[name]
                steps.append(self._tiled(f"{name}({t}, {h}) = {flipped}({h}, {t})", h, t))
        return steps

    def _products(self, out: str, products: list[tuple[Expr, Access]], t: str, h: str) -> list[str]:
        """``out(h,t)`` as the sum of ``sum(d, p(d,h) * x_t(d,t))`` over ``products``, the
        first into it and the others added; each product's step is kept in
        ``self.products``."""
        steps: list[str] = []
        for k, (x, p) in enumerate(products):
            steps.extend(self._product(out, "+=" if k else "=", x, p, t, h))
            self.products.add(steps[-1])
        return steps

    def _product(self, out: str, op: str, x: Expr, p: Access, t: str, h: str) -> list[str]:
        """``out(h,t) op sum(d, p(d,h) * x_t(d,t))``, after the transpose of ``x``'s
        tensor if it is not held transposed yet; a ``FUSED`` function of ``x`` is
        applied to ``x_t`` as it is read."""
        a = _operand(x)
        d = a.indices[1].single_variable
        steps = []
        xt = self.transposed.get(a.tensor)
        if xt is None:
            xt = self.transposed[a.tensor] = _fresh(f"{a.tensor}_t", self.taken)
            steps.append(self._tiled(f"{xt}({d}, {t}) = {a.tensor}({t}, {d})", d, t))
        read = text(map_accesses(x, lambda _: Access(xt, (a.indices[1], a.indices[0]))))
        steps.append(f"{out}({h}, {t}) {op} sum({d}, {p.tensor}({d}, {h}) * {read})")
        return steps

    def _tiled(self, step: str, split: str, rows: str) -> str:
        """``step``, a transpose, with its schedule: ``split`` in blocks of TILE, the
        rows ``rows`` inside each block, the places in the block innermost."""
        outer, inner = _fresh(f"{split}_blk", self.taken), _fresh(f"{split}_in", self.taken)
        self.schedules[step] = (
            f"split({split}, {outer}, {inner}, {self.TILE}); reorder({outer}, {rows}, {inner}); "
            f"parallelize({outer}, CPUThread, NoRaces)"
        )
        return step


def _added(e: Expr, ops: str = "+") -> list[Expr]:
    """The terms that ``e`` joins by ``ops`` at its top (``a + b + c``: a, b, c; with
    ``"+-"``, ``a - b + c`` too)."""
    if isinstance(e, Binary) and e.op in ops:
        return [*_added(e.left, ops), *_added(e.right, ops)]
    return [e]


def _sum(terms: list[Expr]) -> Expr:
    out = terms[0]
    for t in terms[1:]:
        out = Binary("+", out, t)
    return out


#: Element-wise functions a plan computes in the statement that reads their result
#: (``_fused``): zero-preserving, so ``relu(T)`` is zero wherever ``T`` is, as the
#: attribute propagation gave ``U = relu(T)``, and lowered to a compare-and-pick
#: (``ucf.lower.functions``), which the register tiles compute on the vectors they load
#: (``ucf.lower.registers``): cheaper than writing ``U`` and reading it back, a pass
#: over it (0.17 of 5.5 ms on one thread in bench/tesa_program.py).
FUSED = frozenset({"relu"})


def _operand(e: Expr) -> Access | None:
    """The access ``e`` reads: ``e`` itself, or the argument of a ``FUSED`` function
    of one access; None for anything else."""
    if isinstance(e, Call) and e.fn in FUSED and len(e.args) == 1:
        e = e.args[0]
    return e if isinstance(e, Access) else None


def _fused(program: Program) -> dict[str, tuple[Access, Expr]]:
    """The statements ``U(t,h) = f(T(t,h))`` with ``f`` in ``FUSED`` that the one statement
    reading ``U`` computes in place of reading it, by ``U``: their left side and ``f(T)``.
    Only where each term the reader adds up that reads ``U`` is linear in it (``Y = U · W
    + B``: each element of ``U`` read once per product, as ``U`` itself would be) and
    ``U`` is not an output."""
    fused = {}
    for node in program.nodes:
        rhs, lhs = node.statement.rhs, node.statement.lhs
        arg = _operand(rhs)
        if arg is None or arg is rhs or node.output in program.outputs:
            continue
        if any(i.single_variable not in node.out_vars for i in arg.indices):
            continue
        readers = [n for n in program.nodes if node.output in n.inputs]
        if len(readers) == 1 and all(
            _linear(term, node.output)
            for term in _added(readers[0].statement.rhs, "+-")
            if any(a.tensor == node.output for a in accesses(term))
        ):
            fused[node.output] = (lhs, rhs)
    return fused


def _inlined(e: Expr, fused: Mapping[str, tuple[Access, Expr]]) -> Expr:
    """``e`` with each read of a ``fused`` tensor replaced by the function it holds, its
    indices renamed to the read's."""

    def read(a: Access) -> Expr:
        if a.tensor not in fused:
            return a
        lhs, rhs = fused[a.tensor]
        at = dict(zip((i.single_variable for i in lhs.indices), a.indices, strict=True))
        inner = _operand(rhs)
        moved = Access(inner.tensor, tuple(at[i.single_variable] for i in inner.indices))
        return replace(rhs, args=(moved,))

    return map_accesses(e, read)


def _lhs(name: str, indices: tuple[str, ...]) -> str:
    return f"{name}({', '.join(indices)})" if indices else name


def _rows_summed(program: Program, name: str) -> bool:
    """Whether every read of ``name`` sums its first index away and keeps its second
    (``W(d,h)`` in ``T(t,h) = X(t,d) * W(d,h)``)."""
    reads = [
        (a, node.out_vars)
        for node in program.nodes
        for a in node.statement.rhs._accesses
        if a.tensor == name
    ]
    return bool(reads) and all(
        a.indices[0].single_variable not in out and a.indices[1].single_variable in out
        for a, out in reads
    )


def _parts(
    name: str, bits: np.ndarray, costs: Mapping[tuple[int, ...], float], taken: set[str]
) -> list[Part]:
    """The parts of one operand: per width, the blocks of each shape its cover chose.
    An element that blocks of two shapes cover goes to the block chosen first."""
    parts = []
    for width in np.unique(bits[bits > 0]):
        left = bits == width
        blocks, _ = block_cover(left, costs)
        masks: dict[tuple[int, ...], np.ndarray] = {}
        for shape, origin in blocks:
            window = tuple(slice(o, o + b) for o, b in zip(origin, shape, strict=True))
            mask = masks.setdefault(shape, np.zeros_like(left))
            mask[window] |= left[window]
            left[window] = False
        for shape, mask in masks.items():
            part = _fresh(f"{name}_{width}b_{shape[0]}x{shape[1]}", taken)
            parts.append(Part(part, name, int(width), shape, mask))
    return parts


def _linear(rhs: Expr, name: str) -> bool:
    """``rhs`` is linear in ``name``: one access, reached through sums, products,
    negations and numerators only, so that it distributes over a split of it."""
    found = [a for a in rhs._accesses if a.tensor == name]
    if len(found) != 1:
        return False

    def reaches(e: Expr) -> bool:
        if isinstance(e, Access):
            return e.tensor == name
        if isinstance(e, Sum | Neg):
            return reaches(e.body if isinstance(e, Sum) else e.operand)
        if isinstance(e, Binary) and e.op == "*":
            return reaches(e.left) or reaches(e.right)
        if isinstance(e, Binary) and e.op == "/":
            return reaches(e.left) and not any(a.tensor == name for a in e.right._accesses)
        return False

    return reaches(rhs)


def _replace(e: Expr, name: str, parts: tuple[str, ...]) -> Expr:
    """``e`` with every access of ``name`` read as the sum of ``parts``."""

    def read(a: Access) -> Expr:
        return a if a.tensor != name else _sum([Access(p, a.indices) for p in parts])

    return map_accesses(e, read)


def _part_loops(
    stmt: Statement, formats: Mapping[str, str], part: str
) -> tuple[list[str], list[str]] | None:
    """The loop variables of ``part``'s levels in storage order (the split ones for a
    blocked part: blocks, then places) and every loop variable of the statement; None
    where the part is read through an affine or repeated index."""
    access = next(a for a in stmt.rhs._accesses if a.tensor == part)
    rows, cols = (i.single_variable for i in access.indices)
    if rows is None or cols is None or rows == cols:
        return None
    fmts = {
        a.tensor: parse_format(formats.get(a.tensor, "dense"), order=len(a.indices))
        for a in (stmt.lhs, *stmt.rhs._accesses)
    }
    blocking = unblock(stmt, fmts)
    if blocking is None:
        own = [access.indices[m].single_variable for m in fmts[part].mode_order]
        return own, index_variables(stmt.rhs)
    split = next(a for a in blocking.statement.rhs._accesses if a.tensor == part)
    own = [split.indices[m].single_variable for m in blocking.formats[part].mode_order]
    return own, index_variables(blocking.statement.rhs)


def _dismantle_schedule(stmt: Statement, formats: Mapping[str, str], part: str) -> str | None:
    """``reorder`` putting the part's levels outermost (block loops, then the places in
    a block), and ``dismantle`` of its second level's loop (the last block loop, or the
    columns); None where the part is read through an affine index."""
    found = _part_loops(stmt, formats, part)
    if found is None:
        return None
    own, loops = found
    order = own + [v for v in loops if v not in own]
    return f"reorder({', '.join(order)}); dismantle({own[1]})"


def _blocks_outside(stmt: Statement, formats: Mapping[str, str], part: str) -> str | None:
    """For a part stored in column blocks whose columns run along the output's rows
    (``T(t,h) = X(t,d) * P(d,h)``): its block loops outermost, the first in parallel,
    then the other factor's loops, then the places in a block, so each block is read
    once and applied to every row of the other factor (register tiles over the places);
    None for any other part, and for the transposed product ``T_t(h,t) = P(d,h) *
    X_t(d,t)``, a plain blocked SpMM whose default keeps ``t`` innermost in vectors."""
    access = next(a for a in stmt.rhs._accesses if a.tensor == part)
    if not formats[part].startswith("bcsc") or access.indices[-1] != stmt.lhs.indices[-1]:
        return None
    found = _part_loops(stmt, formats, part)
    if found is None:
        return None
    own, loops = found
    order = own[:2] + [v for v in loops if v not in own] + own[2:]
    return f"reorder({', '.join(order)}); parallelize({own[0]}, CPUThread, NoRaces)"


def _fresh(stem: str, taken: set[str]) -> str:
    """A new name, kept in ``taken`` so that the next one differs."""
    name = fresh(stem, taken)
    taken.add(name)
    return name
