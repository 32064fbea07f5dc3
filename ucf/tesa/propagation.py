"""Attribute propagation to a fixpoint (SparTA's Algorithm 1) with exact or scrambled rules.

Every tensor's widths only ever decrease: forward, an output keeps at most what
its inputs can reach; backward, an input keeps at most what some consumer still
needs (a program output needs all of itself). Each rule is monotone, so any
order of the worklist reaches the same greatest fixpoint below the initial
attributes, and propagating that again changes nothing.

The rules run as ucf kernels: the exact ones are the mask statements of
``ucf.tesa.rules`` in int32 (int64 where the counts could overflow it); the
scrambled ones (SparTA's Tensor Scrambling) run the statement itself on random
values over the kept elements, one batch of samples per kernel call: forward,
the output elements ever non-zero are kept; backward, the input elements whose
change ever changed a kept output element.
"""

from __future__ import annotations

import random
import warnings
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from ucf.errors import ConversionWarning, UnsupportedError
from ucf.lang.affine import Affine
from ucf.lang.ast import Access, Expr, text
from ucf.lang.reductions import free_variables
from ucf.lang.rewrite import fresh, map_accesses, plain
from ucf.tesa import rules
from ucf.tesa.attribute import BITS_DTYPE, TeSA
from ucf.tesa.graph import Graph, Node
from ucf.tesa.rules import Const, MaskExpr

if TYPE_CHECKING:
    from ucf.exec.kernel import Kernel

#: A width no rule lowers: what a demand or bound says where it does not prune.
_ANY = np.iinfo(BITS_DTYPE).max
#: Elements per batch of scrambling samples, so large tensors do not exhaust memory.
_BATCH_ELEMENTS = 1 << 22
_kernels: dict[tuple[str, str], Kernel] = {}


def propagate(
    program: Graph, method: str, samples: int, seed: int, shuffle: int | None
) -> dict[str, TeSA]:
    state = _State(program, method, samples, seed)
    consumers: dict[str, list[int]] = {}
    adjacent: dict[str, list[int]] = {}
    for k, node in enumerate(program.nodes):
        adjacent.setdefault(node.output, []).append(k)
        for t in node.inputs:
            consumers.setdefault(t, []).append(k)
            adjacent.setdefault(t, []).append(k)
    order = random.Random(shuffle) if shuffle is not None else None
    work = list(range(len(program.nodes)))
    if order:
        order.shuffle(work)
    queue, waiting = deque(work), set(work)
    demands: dict[tuple[int, str], np.ndarray] = {}
    while queue:
        if order:
            queue.rotate(-order.randrange(len(queue)))
        k = queue.popleft()
        waiting.discard(k)
        changed = _visit(k, program, state, consumers, demands)
        for t in changed:
            for j in adjacent[t]:
                if j != k and j not in waiting:
                    queue.append(j)
                    waiting.add(j)
    return {
        name: TeSA(state.bits[name], block=program.attrs[name].block) for name in program.shapes
    }


def _visit(
    k: int,
    program: Graph,
    state: _State,
    consumers: dict[str, list[int]],
    demands: dict[tuple[int, str], np.ndarray],
) -> list[str]:
    """Apply statement ``k``'s rules: forward to its output, then backward to each
    input (bounded by every consumer's demand). Returns the tensors that changed."""
    node = program.nodes[k]
    through = rules.passthrough(node.statement.rhs, node.out_vars)
    changed = []
    bound = np.where(state.forward(node), _ANY, 0).astype(BITS_DTYPE)
    if through:
        bound = np.minimum(bound, np.transpose(state.bits[through[0]], through[1]))
    if state.lower(node.output, bound):
        changed.append(node.output)
    for x in node.inputs:
        demands[(k, x)] = np.where(state.demand(node, x), _ANY, 0).astype(BITS_DTYPE)
        if through:
            widths = np.transpose(state.bits[node.output], np.argsort(through[1]))
            demands[(k, x)] = np.minimum(demands[(k, x)], widths)
        if x in program.outputs or any((j, x) not in demands for j in consumers[x]):
            continue  # an output needs all of itself; an unvisited consumer may need all
        need = np.maximum.reduce([demands[(j, x)] for j in consumers[x]])
        if state.lower(x, need):
            changed.append(x)
    return changed


class _State:
    """The widths of every tensor as propagation lowers them, and the rules' evaluation."""

    def __init__(self, program: Graph, method: str, samples: int, seed: int):
        self.bits = {name: np.array(a.bits) for name, a in program.attrs.items()}
        self.version = dict.fromkeys(self.bits, 0)
        self.scramble = method == "scramble"
        self.samples = samples
        self.rng = np.random.default_rng(seed)
        self._memo: dict[tuple, np.ndarray] = {}

    def lower(self, name: str, bound: np.ndarray) -> bool:
        """Lower ``name``'s widths to at most ``bound``; True if any changed."""
        new = np.minimum(self.bits[name], bound)
        if np.array_equal(new, self.bits[name]):
            return False
        self.bits[name] = new
        self.version[name] += 1
        return True

    def _key(self, *names: str) -> tuple:
        return tuple((n, self.version[n]) for n in names)

    def forward(self, node: Node) -> np.ndarray:
        """Where the output may be non-zero given the kept inputs."""
        key = ("forward", node.output, self._key(*node.inputs))
        if key not in self._memo:
            if self.scramble:
                self._memo[key] = self._scrambled(node)
            else:
                rhs = rules.mask_expr(node.statement.rhs, self._known)
                self._memo[key] = self._exact(node.out_vars, rhs, node)
        return self._memo[key]

    def demand(self, node: Node, tensor: str) -> np.ndarray:
        """Where some kept element of the output depends on ``tensor``."""
        key = ("demand", node.output, tensor, self._key(node.output, *node.inputs))
        if key not in self._memo:
            if self.scramble:
                self._memo[key] = self._perturbed(node, tensor)
            else:
                self._memo[key] = self._adjoint(node, tensor)
        return self._memo[key]

    def _adjoint(self, node: Node, tensor: str) -> np.ndarray:
        out = Access(node.output, tuple(Affine.var(v) for v in node.out_vars))
        need = np.zeros(self.bits[tensor].shape, dtype=bool)
        taken = set(self.bits)
        for access, factors in rules.occurrences(node.statement.rhs, tensor):
            masks = [rules.mask_expr(f, self._known) for f in factors]
            output = rules.mask_expr(out, self._known)
            found = rules.adjoint(output, access, masks, node.extents, taken)
            if found is None:  # a constant or repeated index: nothing is pruned through it
                return np.ones_like(need)
            lhs, rhs, ranges = found
            extents = {**node.extents, **dict(zip(lhs, need.shape, strict=True))}
            need |= self._exact(lhs, rhs, node, extents, ranges)
        return need

    def _known(self, access: Access) -> Const | None:
        bits = self.bits[access.tensor]
        if not bits.any():
            return Const.ZERO
        if plain(access) and bits.all():
            return Const.FULL
        return None

    def _exact(
        self,
        lhs: tuple[str, ...],
        rhs: MaskExpr,
        node: Node,
        extents: dict[str, int] | None = None,
        ranges: dict[str, int] | None = None,
    ) -> np.ndarray:
        """``lhs = rhs`` over the masks as a boolean array; ``extents`` (the node's by
        default) sizes ``lhs``, and ``ranges`` names vectors of ones ``rhs`` reads."""
        extents = extents or node.extents
        shape = tuple(extents[v] for v in lhs)
        if isinstance(rhs, Const):
            return np.full(shape, rhs is Const.FULL)
        used = tuple(v for v in lhs if v in free_variables(rhs))
        dtype = np.int32 if _most_paths(rhs, used, extents) <= np.iinfo(np.int32).max else np.int64
        masks = {
            a.tensor: np.ones(ranges[a.tensor], dtype=dtype)
            if a.tensor in (ranges or {})
            else (self.bits[a.tensor] > 0).astype(dtype)
            for a in rhs._accesses
        }
        result = _call(used, rhs, masks, extents, np.dtype(dtype).name) > 0
        return _broadcast(result, used, lhs, shape)

    def _scrambled(self, node: Node) -> np.ndarray:
        """Where the statement was non-zero in any of ``samples`` runs on random kept
        values (SparTA's Tensor Scrambling)."""
        seen = np.zeros(self.bits[node.output].shape, dtype=bool)
        for n in self._batches(node, 1):
            seen |= (self._run(node, self._random(node, n), n) != 0).any(axis=0)
        return seen

    def _perturbed(self, node: Node, tensor: str) -> np.ndarray:
        """Where changing one element of ``tensor`` changed a kept output element, in any
        of ``samples`` random points: each point is run once as drawn and once per
        element of ``tensor`` with that element moved (one batch entry each)."""
        size = self.bits[tensor].size
        largest = max(self.bits[t].size for t in (node.output, *node.inputs))
        if (size + 1) * largest > _BATCH_ELEMENTS * 16:
            raise UnsupportedError(
                f"scrambling moves one element of {tensor} at a time, and its {size} elements "
                f"are too many for that; propagate with method='exact'"
            )
        kept = (self.bits[node.output] > 0).reshape(-1)
        need = np.zeros(size, dtype=bool)
        for n in self._batches(node, size + 1):
            values = {t: np.repeat(v, size + 1, axis=0) for t, v in self._random(node, n).items()}
            moved = values[tensor].reshape(n, size + 1, size)
            moved[:, np.arange(1, size + 1), np.arange(size)] += self.rng.standard_normal((n, size))
            out = self._run(node, values, n * (size + 1)).reshape(n, size + 1, -1)
            need |= ((out[:, 1:] != out[:, :1]) & kept).any(axis=(0, 2))
        return need.reshape(self.bits[tensor].shape)

    def _batches(self, node: Node, copies: int) -> list[int]:
        """The samples split into batches that keep each kernel call's arrays bounded."""
        largest = max(self.bits[t].size for t in (node.output, *node.inputs)) * copies
        batch = max(1, min(self.samples, _BATCH_ELEMENTS // max(largest, 1)))
        return [min(batch, self.samples - done) for done in range(0, self.samples, batch)]

    def _random(self, node: Node, n: int) -> dict[str, np.ndarray]:
        """``n`` draws of every input: standard normal where kept, zero where pruned."""
        return {
            t: self.rng.standard_normal((n, *self.bits[t].shape)) * (self.bits[t] > 0)
            for t in node.inputs
        }

    def _run(self, node: Node, values: dict[str, np.ndarray], n: int) -> np.ndarray:
        """The statement on a batch of ``n`` values (leading axis): one kernel call."""
        rhs = node.statement.rhs
        sample = fresh("s", {v for a in rhs._accesses for i in a.indices for v in i.variables})
        sizes = {**node.extents, sample: n}
        lhs = (sample, *node.out_vars)
        return _call(
            lhs,
            map_accesses(rhs, lambda a: Access(a.tensor, (Affine.var(sample), *a.indices))),
            values,
            sizes,
            "float64",
        )


def _call(
    lhs: tuple[str, ...],
    rhs: Expr,
    operands: dict[str, np.ndarray],
    sizes: dict[str, int],
    dtype: str,
) -> np.ndarray:
    """Run ``out(lhs) = rhs`` as a ucf kernel (``sizes`` gives the extents of ``lhs``)
    and return the output as an array."""
    from ucf.exec.kernel import Kernel

    variables = {v for a in rhs._accesses for i in a.indices for v in i.variables}
    name = fresh("out", set(operands) | variables)
    statement = f"{name}({', '.join(lhs)}) = {text(rhs)}" if lhs else f"{name} = {text(rhs)}"
    key = (statement, dtype)
    if key not in _kernels:
        _kernels[key] = Kernel(statement, dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConversionWarning)
        out = _kernels[key](shapes={name: tuple(sizes[v] for v in lhs)}, **operands)
    return out.to_numpy()


def _most_paths(rhs: Expr, lhs: tuple[str, ...], extents: dict[str, int]) -> int:
    """A bound on the count a mask statement can reach: the number of terms of its
    unions times the points of its sums (a variable only affine indices reach is
    bounded by the largest extent of the statement)."""
    largest = max(extents.values(), default=1)
    points = 1
    for v in {v for a in rhs._accesses for i in a.indices for v in i.variables} - set(lhs):
        points *= extents.get(v, largest)
    return points * max(len(rhs._accesses), 1)


def _broadcast(
    result: np.ndarray, used: tuple[str, ...], lhs: tuple[str, ...], shape: tuple[int, ...]
) -> np.ndarray:
    """``result`` over the variables ``used`` as an array over all of ``lhs``."""
    expanded = result.reshape([shape[k] if v in used else 1 for k, v in enumerate(lhs)])
    return np.broadcast_to(expanded, shape)
