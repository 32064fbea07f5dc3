"""Products a plan computes transposed, so that a blocked operand's register tiles run
over its columns (see ``Transposed``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ucf.lang.affine import Affine
from ucf.lang.ast import (
    Access,
    Binary,
    Expr,
    Sum,
    accesses,
    text,
)
from ucf.lang.reductions import sums
from ucf.lang.rewrite import map_accesses
from ucf.schedule.commands import Command, Parallelize, Reorder, SplitCommand
from ucf.schedule.records import Parallel
from ucf.tesa.plan import Part
from ucf.tesa.terms import added_terms, fused_operand, sum_of, take_fresh


class Transposed:
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
        self.schedules: dict[str, list[Command]] = {}

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
            if (a := fused_operand(side)) is not None and len(a.indices) == 2
        }
        x, p = found.get(False), found.get(True)
        if x is None or not isinstance(p, Access):
            return None
        t, h = (i.single_variable for i in lhs.indices)
        d = term.vars[0]
        want = ((t, d), (d, h))
        got = tuple(tuple(i.single_variable for i in a.indices) for a in (fused_operand(x), p))
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
        out = take_fresh(f"{lhs.tensor}_t", self.taken)
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
        for e in added_terms(rhs):
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
        out = take_fresh(f"{lhs.tensor}_t", self.taken)
        steps = self._products(out, products, t, h)
        if rest:

            def flip(a: Access) -> Access:
                if len(a.indices) < 2:
                    return a
                return Access(self.transposed[a.tensor], a.indices[::-1])

            op = "+=" if products else "="
            steps.append(f"{out}({h}, {t}) {op} {text(map_accesses(sum_of(rest), flip))}")
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
        a = fused_operand(x)
        d = a.indices[1].single_variable
        steps = []
        xt = self.transposed.get(a.tensor)
        if xt is None:
            xt = self.transposed[a.tensor] = take_fresh(f"{a.tensor}_t", self.taken)
            steps.append(self._tiled(f"{xt}({d}, {t}) = {a.tensor}({t}, {d})", d, t))
        read = text(map_accesses(x, lambda _: Access(xt, (a.indices[1], a.indices[0]))))
        steps.append(f"{out}({h}, {t}) {op} sum({d}, {p.tensor}({d}, {h}) * {read})")
        return steps

    def _tiled(self, step: str, split: str, rows: str) -> str:
        """``step``, a transpose, with its schedule: ``split`` in blocks of TILE, the
        rows ``rows`` inside each block, the places in the block innermost."""
        outer, inner = take_fresh(f"{split}_blk", self.taken), take_fresh(f"{split}_in", self.taken)
        self.schedules[step] = [
            SplitCommand(split, outer, inner, self.TILE),
            Reorder((outer, rows, inner)),
            Parallelize(outer, Parallel("CPUThread", "NoRaces")),
        ]
        return step
