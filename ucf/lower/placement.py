"""Where each precompute goes: which part of the nest its workspace splits, and how deep.

The first precompute splits the statement; each later one splits a side of an
earlier where (a *scope*) that holds its whole expression. The expression is
either some factors of a product (MTTKRP's ``B*D`` of ``B*C*D``), or whole terms
of a sum. A sum's terms go into the workspace one after the other, each with its
own reduction: ``sum(k, A*B + D*E)`` is ``sum(k, A*B) + sum(k, D*E)``, and
``sum(k, A*B) + sum(l, D*E)`` fills one row workspace from both products. That is
Gustavson's algorithm for a sum of products: each product scatters its rows into
the workspace, instead of a loop co-iterating every output entry with both sums.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ucf.errors import ScheduleError, UnsupportedError
from ucf.format.format import Format
from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Array, Const, Var
from ucf.lang import ast
from ucf.lang.affine import Affine
from ucf.lang.reductions import peel, temporary
from ucf.lower.lattice import Func, Lit, Negate, Op, Opnd, Reduce, Temp, Term, operands, reduces
from ucf.lower.state import Operand, Scope, SlotParams, Where, Workspace
from ucf.schedule import own_order
from ucf.schedule.commands import BoundCommand, SplitCommand


@dataclass
class Match:
    """How a precompute's expression lies in a scope: ``factor`` (some factors of its
    product) or whole terms of its sum; each producer's ``(sign, product, the variables
    it sums)``; and the scope's term with the workspace in their place."""

    factor: bool
    parts: list[tuple[int, Term, tuple[str, ...]]]
    rest: Term


class PlacementMixin:
    """Part of :class:`ucf.lower.lowerer.Lowerer`; see its docstring for the shared state."""

    def _plan_wheres(self) -> list[Where]:
        """Place every precompute, in the order the schedule gives them. The nest's own
        loops are the statement's, and those of the nested sums a precompute gathers
        (their loops run in its producer); the other nested sums stay temporaries."""
        precomputes = self.applied.precompute
        mentioned = {
            v
            for pc in precomputes
            for a in ast.accesses(pc.statement.rhs)
            for idx in a.indices
            for v in idx.variables
        }
        nested = self.cin.nested_vars - mentioned
        self.outer_order = tuple(v for v in self.cin.order if v not in nested)
        scopes: dict = {
            None: Scope(
                self.term,
                self.outer_order,
                0,
                list(self.out_vars),
                True,
                tuple(self.cin.reduction_vars),
            )
        }
        wheres = [self._plan_where(k, pc, scopes) for k, pc in enumerate(precomputes)]
        for scope in scopes.values():
            self._check_left(scope)
            listed = [
                n
                for n in operands(scope.term)
                if n >= len(self.rhs_accesses)
                and wheres[n - len(self.rhs_accesses)].ws.list is not None
            ]
            if listed and len(operands(scope.term)) > 1:
                for n in listed:
                    wheres[n - len(self.rhs_accesses)].ws.merged = True
        return wheres

    def _plan_where(self, k: int, pc, scopes: dict) -> Where:
        """Place precompute ``k`` as high in its scope's nest as its workspace allows.

        Below the where, the producers and the consumer may share no variable but
        the workspace's, or the workspace would need more dimensions. A producer's
        own sums run below it. A sparse output needs every reduction variable inside
        the producer, so the consumer writes each output entry once.
        """
        prov = self.applied.provenance
        at, wat = (f"{{{','.join((v, *pc.more))}}}" if pc.more else v for v in (pc.var, pc.wvar))
        cmd = f"precompute({pc.expr}, {at}, {wat}, {pc.name})"
        i = prov.origins(pc.var)[0]
        split = None
        rel = prov.rel.get(pc.var)
        if rel is not None and (rel.kind, rel.role) == ("split", "inner"):
            if len(self.applied.precompute) > 1:
                raise ScheduleError(
                    f"{cmd}: a workspace over a split's inner loop tiles the whole nest, so "
                    "it must be the kernel's only precompute"
                )
            split = self._ws_split(cmd, pc.var, i)
        elif rel is not None:
            raise ScheduleError(
                f"{cmd}: {prov.describe(pc.var)}; precompute over an index variable or the "
                "inner loop of a split"
            )
        W = len(self.rhs_accesses) + k
        key, match = self._scope_of(cmd, _ast_terms(peel(pc.statement.rhs)[1]), scopes, W, i)
        scope = scopes.pop(key)
        if split is not None and len(match.parts) > 1:
            raise ScheduleError(
                f"{cmd}: a workspace over a split's inner loop gathers one product; precompute "
                f"the terms of {pc.expr} over {i} itself"
            )
        dims = (i, *pc.more)
        sparse = self.sparse_out and scope.output
        if pc.more and sparse:
            raise UnsupportedError(
                f"{cmd}: a workspace over several variables is dense, and the sparse "
                f"output {self.cin.statement.lhs.tensor} is appended to from a "
                f"workspace over one; precompute over {i} alone"
            )
        ws = self._workspace(pc, dims, split)
        if sparse:
            fmt = self._listed(ws)
            arrays = [{"crd": ws.list, "count": ws.count}]
        else:
            fmt, arrays = Format.dense(len(dims)), [{} for _ in dims]
        sizes = [self.extents[v] for v in dims] if pc.more else [ws.size]
        params = SlotParams(sizes, arrays, ws.vals)
        self.operands[W] = Operand(
            W, pc.name, fmt, list(dims), params, [Affine.var(v) for v in dims]
        )
        part_vars = [self._term_vars(t) for _, t, _ in match.parts]
        for (_, t, _), used in zip(match.parts, part_vars, strict=True):
            unused = [v for v in dims if v not in used]
            if unused:
                what = pc.expr if len(match.parts) == 1 else self._term_text(t)
                raise ScheduleError(f"{cmd}: {what} does not use {unused[0]}")
        prod_vars = set().union(*part_vars)
        owned = {v for _, _, summed in match.parts for v in summed}
        cons_vars = set(scope.out_vars) | set(dims) | self._free_vars(match.rest)
        order = scope.order
        reductions = set(self.cin.reduction_vars)
        depth = None
        for d in range(scope.start, len(order)):
            below = set(order[d:])
            if not set(dims) <= below or not (prod_vars & cons_vars & below) <= set(dims):
                continue
            if match.factor and sparse and reductions & set(order[:d]):
                continue
            if not owned <= below:
                continue
            if split is not None and order[d] != i:
                continue
            depth = d
            break
        if depth is None:
            named = " and ".join(dims)
            raise ScheduleError(
                f"{cmd}: with the loop order {', '.join(order)} the producer and the consumer "
                f"would share variables other than {named} below any placement; reorder the "
                f"loops so that {named} and the variables only {pc.expr} uses are innermost"
            )
        if sparse:
            below = [v for v in order[depth:] if v in cons_vars]
            if below != [i]:
                raise ScheduleError(
                    f"{cmd}: the consumer would loop over {', '.join(below)}; with a sparse "
                    f"output it must loop over {i} only"
                )

        def side(vs: set[str]) -> tuple[str, ...]:
            return order[:depth] + tuple(v for v in order[depth:] if v in vs)

        parts = []
        for m, ((_, t, summed), used) in enumerate(zip(match.parts, part_vars, strict=True)):
            # A term that does not read a variable the statement sums it over is added
            # once per value of it (``3*A(k)`` in ``X(k) = A(k) + B(i,k,j)`` over 3 j's),
            # so its producer loops over those variables too (statement fuzzer, seed 71
            # case 311: A(k) gathered into w(k) once lost the j loop).
            loops = self._own_order(cmd, t, side(used | set(summed)), depth)
            parts.append((t, loops))
            scopes[(k, f"prod{m}")] = Scope(t, loops, depth, [i], False)
        # A later precompute may gather a sum the consumer still holds, whose loops then
        # run in its producer: the consumer's scope keeps them, ``_check_left`` the rest.
        cons_order = side(cons_vars | self._term_vars(match.rest))
        summed = scope.summed if match.factor else ()
        scopes[(k, "cons")] = Scope(
            match.rest, cons_order, depth, scope.out_vars, scope.output, summed
        )
        return Where(depth, parts, match.rest, cons_order, ws, split, W, key, pc.wvar)

    def _own_order(self, cmd: str, t: Term, loops: tuple[str, ...], depth: int) -> tuple:
        """A producer's loops, those below the where ordered to walk the sparse accesses
        it reads as stored in an order of its own (``cin.walked``: the loop order does
        not bind them, ``ucf.schedule.own_order``); refused where the loops it shares
        with the rest of the nest, above the where, already walk one out of order."""
        walked = [n for n in operands(t) if n in self.cin.walked]
        if not walked:
            return loops
        slots = self.cin.slots
        sparse = [self.rhs_accesses[n] for n in walked]
        fmts = {self.rhs_accesses[n].tensor: slots[n].format for n in walked}
        below = own_order.follows(sparse, fmts, loops[depth:])
        whole = None if below is None else (*loops[:depth], *below)
        if whole is None or own_order.follows(sparse, fmts, whole) != whole:
            raise ScheduleError(
                f"{cmd}: its producer would walk {sparse[0]} out of its storage order "
                f"below the loops {', '.join(loops[:depth]) or '(none)'} it shares with the "
                "rest of the nest; precompute every term that reads it in another order"
            )
        return whole

    def _workspace(self, pc, dims: tuple[str, ...], split) -> Workspace:
        """The dense workspace of ``pc`` over ``dims``: as long as the variable's extent
        (a split's inner size), or, over several variables, their extents' product,
        indexed row-major."""
        i = dims[0]
        if not pc.more:
            size: ir.Expr = self.extents[i] if split is None else Const(split[2], I64)
            index = Var(i if split is None else pc.var, I64)
            return Workspace(pc.name, i, index, size, Array(pc.name, self.vt, True))
        size = index = None
        for v in dims:
            size = self.extents[v] if size is None else ir.mul(size, self.extents[v])
            at = Var(v, I64)
            index = at if index is None else ir.add(ir.mul(index, self.extents[v]), at)
        vals = Array(pc.name, self.vt, True)
        return Workspace(pc.name, i, index, size, vals, more=pc.more)

    def _listed(self, ws: Workspace) -> Format:
        """A sparse output's workspace: flags and the list of touched coordinates, sorted
        when the output level keeps its coordinates in order."""
        name = ws.name
        ws.flags = Array(f"{name}_seen", "i32", True)
        ws.list = Array(f"{name}_list", I64, True)
        ws.count = Var(f"{name}_count", I64)
        ws.epoch = Var(f"{name}_epoch", "i32")
        if self._appends_in_order(ws.var):
            ws.sort_tmp = Array(f"{name}_tmp", I64, True)
            ws.sort_buckets = Array(f"{name}_buckets", I64, True)
            ws.bits = Array(f"{name}_bits", I64, True)
            ws.summary = Array(f"{name}_summary", I64, True)
            ws.use_bits = Var(f"{name}_usebits", "i32")
        return Format.workspace_list()

    def _scope_of(
        self, cmd: str, wanted: list, scopes: dict, W: int, var: str
    ) -> tuple[object, Match]:
        """The scope that holds every access of a precompute's expression, and how. An
        earlier workspace counts as an access by its name (``w(j)``)."""
        need = Counter(str(a) for _, factors in wanted for a in factors)
        held: dict = {}
        for key, scope in scopes.items():
            have = Counter(self._access_text(n) for n in operands(scope.term))
            if not need - have:
                return key, self._match(cmd, wanted, scope, W, var)
            held[key] = sum((need & have).values())
        rhs = self.cin.statement.rhs
        everywhere = Counter(
            self._access_text(n) for s in scopes.values() for n in operands(s.term)
        )
        missing = need - everywhere
        if not missing and len(scopes) > 1:
            raise ScheduleError(
                f"{cmd}: its factors lie on both sides of an earlier precompute's where "
                "(some in the producer, some in the consumer); precompute a product that "
                "one side holds"
            )
        first = next(str(a) for _, fs in wanted for a in fs if str(a) in missing)
        raise ScheduleError(
            f"{cmd}: {first} is not a factor of the right-hand side {rhs}; precompute a "
            "product of its factors"
        )

    def _match(self, cmd: str, wanted: list, scope: Scope, W: int, var: str) -> Match:
        """Some factors of the scope's product, or whole terms of its sum (over ``var``,
        the workspace's variable)."""
        terms = _terms(scope.term)
        rhs = self.cin.statement.rhs
        if len(terms) == 1 and len(wanted) == 1:
            if terms[0][0] < 0 or wanted[0][0] < 0:
                raise ScheduleError(
                    f"{cmd}: precompute a product with its sign as the statement has it"
                )
            factors = _factors(terms[0][1])
            nested = self._nested_factor(factors, wanted[0][1])
            if nested is not None:
                rest = [t for t in factors if t is not nested]
                summed, body = _stripped(nested)
                return Match(True, [(1, body, summed)], _product([*rest, Opnd(W)]))
            taken: list[int] = []
            for a in wanted[0][1]:
                n = next(
                    (
                        t.n
                        for t in factors
                        if isinstance(t, Opnd)
                        and t.n not in taken
                        and self._access_text(t.n) == str(a)
                    ),
                    None,
                )
                if n is None:
                    raise ScheduleError(
                        f"{cmd}: {a} is not a factor of the right-hand side {rhs}; precompute "
                        "a product of its factors"
                    )
                taken.append(n)
            rest = [t for t in factors if not (isinstance(t, Opnd) and t.n in taken)]
            taken_term = _product([Opnd(n) for n in taken])
            return Match(True, [(1, taken_term, ())], _product([*rest, Opnd(W)]))
        if len(terms) == 1:
            raise ScheduleError(
                f"{cmd}: the expression is a sum of {len(wanted)} terms, but what holds its "
                f"factors is one product ({self._term_text(scope.term)}); precompute a product "
                "of its factors"
            )
        free = list(range(len(terms)))
        parts = []
        signs = set()  # the workspace's sign in the sum: the same for each of its terms
        for sign, factors in wanted:
            want = sorted(str(a) for a in factors)
            m = next((m for m in free if self._texts(terms[m][1]) == want), None)
            if m is None:
                shown = " * ".join(map(str, factors))
                raise ScheduleError(
                    f"{cmd}: {shown} is not a whole term of the sum {rhs}; precompute whole "
                    "terms of a sum (each into a workspace of its own, or several into one)"
                )
            free.remove(m)
            signs.add(sign * terms[m][0])
            summed, body = _stripped(terms[m][1])
            if var in self._written_sums(terms[m][1]):
                # the workspace would hold the term per value of var, and the consumer's
                # loop over var would then sum the other terms with it (x(i) added once per
                # j in y(i) = A(i,j)*x(j) + x(i): the schedule fuzzer, seed 45 case 7529)
                raise ScheduleError(
                    f"{cmd}: the statement sums {' * '.join(map(str, factors))} over {var} "
                    f"on its own, not the other terms of {rhs}; precompute it over a "
                    f"variable it keeps, or write the sum around the whole right-hand side"
                )
            part = body if sign > 0 else Negate(body)
            parts.append((sign, part, tuple(dict.fromkeys((*scope.summed, *summed)))))
        if len(signs) > 1:
            raise ScheduleError(
                f"{cmd}: the statement adds some of its terms and subtracts others than the "
                "expression does; precompute them with the signs the statement gives them"
            )
        rest: Term = Opnd(W) if signs == {1} else Negate(Opnd(W))
        for m in free:
            sign, t = terms[m]
            if scope.summed:  # the outer sum distributes over the terms it leaves
                t = self._new_reduce(scope.summed, t)
            rest = Op("+" if sign > 0 else "-", rest, t)
        return Match(False, parts, rest)

    def _check_left(self, scope: Scope) -> None:
        """Refuse a sum left in a scope whose loops run outside it: a term of a sum that
        another term's workspace gathered, while it was not gathered itself."""
        for r in reduces(scope.term):
            clash = [v for v in r.vars if v in scope.order]
            if clash:
                raise ScheduleError(
                    f"precompute: the rest of the statement still sums "
                    f"{self._term_text(r.body)} over {clash[0]}, whose loop the workspaces "
                    "run outside their variable; precompute that term too (into a workspace "
                    "of its own, or with the others into one)"
                )

    def _new_reduce(self, variables: tuple[str, ...], body: Term) -> Reduce:
        """A sum the lowerer makes (an outer sum distributed over a term), with its
        temporary."""
        rid = max(self.reduces, default=-1) + 1
        r = Reduce(variables, body, rid)
        self.reduces[rid] = r
        self.distributed.add(rid)
        taken = {t.name for t in self.temps.values()}
        name = temporary(variables)
        while name in taken:
            name += "_"
        self.temps[rid] = Var(name, self.vt)
        return r

    def _nested_factor(self, factors: list[Term], wanted: list) -> Term | None:
        """The factor that is a nested sum of exactly the ``wanted`` accesses
        (``sum(k, B(j,k)*x(k))`` in ``A(i,j)*sum(k, B(j,k)*x(k))``): its sum is the
        producer's, formed once over the workspace's variable instead of a temporary
        per step of the loops outside it."""
        want = sorted(str(a) for a in wanted)
        for t in factors:
            if isinstance(t, Reduce) and t.op == "sum" and self._texts(t) == want:
                return t
        return None

    def _written_sums(self, t: Term) -> set[str]:
        """The variables the statement itself sums a term over (not the sums distributed
        over the terms an earlier precompute left, which still span the whole sum)."""
        found: set[str] = set()
        while isinstance(t, Reduce):
            if t.id not in self.distributed:
                found |= set(t.vars)
            t = t.body
        return found

    def _texts(self, t: Term) -> list[str] | None:
        """The sorted access texts of a term that is a product of accesses under its sums."""
        factors = _factors(_stripped(t)[1])
        if not all(isinstance(f, Opnd) for f in factors):
            return None
        return sorted(self._access_text(f.n) for f in factors)

    def _term_vars(self, t: Term) -> set[str]:
        """Every variable a term's accesses use, its sums' included."""
        return {v for n in operands(t) for v in self._operand_vars(n)}

    def _free_vars(self, t: Term) -> set[str]:
        """The variables a term's value depends on: those of its accesses that no sum
        inside it binds."""
        if isinstance(t, Opnd):
            return self._operand_vars(t.n)
        if isinstance(t, Reduce):
            return self._free_vars(t.body) - set(t.vars)
        if isinstance(t, Negate):
            return self._free_vars(t.operand)
        if isinstance(t, Op):
            return self._free_vars(t.left) | self._free_vars(t.right)
        if isinstance(t, Func):
            return set().union(*(self._free_vars(a) for a in t.args))
        return set()

    def _term_text(self, t: Term) -> str:
        """A term as the statement writes it, for messages."""
        if isinstance(t, Opnd):
            return self._access_text(t.n)
        if isinstance(t, Lit):
            return str(t.value)
        if isinstance(t, Temp):
            return self.temps[t.id].name
        if isinstance(t, Negate):
            return f"-{self._term_text(t.operand)}"
        if isinstance(t, Reduce):
            return f"sum({', '.join(t.vars)}, {self._term_text(t.body)})"
        if isinstance(t, Func):
            return f"{t.fn}({', '.join(self._term_text(a) for a in t.args)})"
        assert isinstance(t, Op)
        left, right = self._term_text(t.left), self._term_text(t.right)
        if t.op == "*":
            return f"{left}*{right}"
        return f"{left} {t.op} {right}"

    def _access_text(self, n: int) -> str:
        """How an operand is written: its access, or ``w(j)`` for a workspace."""
        if n < len(self.rhs_accesses):
            return str(self.rhs_accesses[n])
        op = self.operands[n]
        return f"{op.name}({', '.join(op.level_vars)})"

    def _appends_in_order(self, var: str) -> bool:
        """Whether the output level a workspace over ``var`` appends to keeps its
        coordinates sorted; an unordered one (``Q``) takes them as they arrived, unsorted."""
        if var not in self.out_level_vars:
            return True
        return self.out_fmt.levels[self.out_level_vars.index(var)].ordered

    def _operand_vars(self, n: int) -> set[str]:
        return {v for idx in self.operands[n].level_idx for v in idx.variables}

    def _ws_split(self, cmd: str, var: str, i: str) -> tuple:
        """The (outer, inner, factor, extent) of a workspace over a split's inner loop."""
        prov = self.applied.provenance
        rel = prov.rel[var]
        parent = rel.parents[0]
        outer = next(
            v
            for v, r in prov.rel.items()
            if r.kind == "split" and r.parents == rel.parents and r.role == "outer"
        )
        prel = prov.rel.get(parent)
        if parent == i:
            extent: ir.Expr = self.extents[i]
        elif prel is not None and prel.kind == "bound" and prel.parents == (i,):
            extent = Const(prel.amount, I64)
        else:
            raise ScheduleError(f"{cmd}: {prov.describe(parent)}; split {i} or its bound")
        self.steps = [
            c
            for c in self.steps
            if not (isinstance(c, SplitCommand) and c.mode == "split" and c.var == parent)
            and not (isinstance(c, BoundCommand) and c.bound_var == parent)
        ]
        return outer, var, rel.amount, extent


def _terms(t: Term) -> list[tuple[int, Term]]:
    """The terms of a sum with their signs (one term for anything else)."""
    if isinstance(t, Op) and t.op in "+-":
        right = _terms(t.right)
        if t.op == "-":
            right = [(-s, x) for s, x in right]
        return _terms(t.left) + right
    return [(1, t)]


def _stripped(t: Term) -> tuple[tuple[str, ...], Term]:
    """A term's own sums' variables and what they sum."""
    summed: tuple[str, ...] = ()
    while isinstance(t, Reduce):
        summed += t.vars
        t = t.body
    return summed, t


def _factors(t: Term) -> list[Term]:
    if isinstance(t, Op) and t.op == "*":
        return _factors(t.left) + _factors(t.right)
    return [t]


def _ast_terms(e) -> list[tuple[int, list]]:
    """A precompute's expression as signed terms, each the factors of a product (sums
    that the expression itself implies are stripped: the workspace's producers sum)."""
    if isinstance(e, ast.Binary) and e.op in "+-":
        right = _ast_terms(e.right)
        if e.op == "-":
            right = [(-s, f) for s, f in right]
        return _ast_terms(e.left) + right
    while isinstance(e, ast.Sum):
        e = e.body
    return [(1, _ast_factors(e))]


def _ast_factors(e) -> list:
    while isinstance(e, ast.Sum):
        e = e.body
    if isinstance(e, ast.Binary) and e.op == "*":
        return _ast_factors(e.left) + _ast_factors(e.right)
    return [e]


def _product(terms: list[Term]) -> Term:
    out = terms[0]
    for t in terms[1:]:
        out = Op("*", out, t)
    return out
