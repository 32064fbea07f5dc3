"""precompute: a where whose producer fills a workspace the consumer reads."""

from __future__ import annotations

from ucf.errors import ScheduleError
from ucf.format.format import Format, dense_format
from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Array, Const, Var
from ucf.lang import ast
from ucf.lang.affine import Affine
from ucf.lang.reductions import peel
from ucf.lower import sort
from ucf.lower.lattice import (
    Op,
    Opnd,
    Term,
    operands,
)
from ucf.lower.state import (
    Operand,
    Scope,
    SlotParams,
    State,
    Where,
    Workspace,
)
from ucf.schedule.commands import BoundCommand, SplitCommand

# The epoch at which a listed workspace's flags are cleared and the count restarts.
EPOCH_WRAP = 2**31 - 1


class WorkspacesMixin:
    """Part of :class:`ucf.lower.lowerer.Lowerer`; see its docstring for the shared state."""

    def _plan_wheres(self) -> list[Where]:
        """Place every precompute, in the order the schedule gives them.

        Each one splits a *scope*: the whole statement at first, then either side of
        an earlier where.  A precompute's factors must all lie in one scope, and its
        where is placed at or below the depth at which that scope's nest begins.
        """
        scopes: dict = {
            None: Scope(_factors(self.term), tuple(self.cin.order), 0, list(self.out_vars), True)
        }
        wheres: list[Where] = []
        for k, pc in enumerate(self.applied.precompute):
            wheres.append(self._plan_where(k, pc, scopes, wheres))
        return wheres

    def _plan_where(self, k: int, pc, scopes: dict, wheres: list[Where]) -> Where:
        """Place precompute ``k`` as high in its scope's nest as its workspace allows.

        Below the where, the producer and the consumer may share no variable but
        the workspace's, or the workspace would need more dimensions.  A sparse
        output needs every reduction variable inside the producer, so the
        consumer writes each output entry once.
        """
        prov = self.applied.provenance
        cmd = f"precompute({pc.expr}, {pc.var}, {pc.wvar}, {pc.name})"
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
        wanted = _ast_factors(peel(pc.statement.rhs)[1])
        key, taken = self._scope_of(cmd, wanted, scopes, wheres)
        scope = scopes.pop(key)
        rest = [t for t in scope.factors if not (isinstance(t, Opnd) and t.n in taken)]
        if len(scope.factors) == 1 and taken:
            rest = []
        prod_vars = {v for n in taken for v in self._operand_vars(n)}
        if i not in prod_vars:
            raise ScheduleError(f"{cmd}: {pc.expr} does not use {i}")
        cons_vars = set(scope.out_vars) | {i}
        for t in rest:
            for n in operands(t):
                cons_vars |= self._operand_vars(n)
        order = scope.order
        reductions = set(self.cin.reduction_vars)
        sparse = self.sparse_out and scope.output
        depth = None
        for d in range(scope.start, len(order)):
            below = set(order[d:])
            if i not in below or not (prod_vars & cons_vars & below) <= {i}:
                continue
            if sparse and reductions & set(order[:d]):
                continue
            if split is not None and order[d] != i:
                continue
            depth = d
            break
        if depth is None:
            raise ScheduleError(
                f"{cmd}: with the loop order {', '.join(order)} the producer and the consumer "
                f"would share variables other than {i} below any placement; reorder the loops "
                f"so that {i} and the variables only {pc.expr} uses are innermost"
            )
        W = len(self.rhs_accesses) + k
        size: ir.Expr = self.extents[i] if split is None else Const(split[2], I64)
        index = Var(i if split is None else pc.var, I64)
        vals = Array(pc.name, self.vt, True)
        ws = Workspace(pc.name, i, index, size, vals)
        if sparse:
            below = [v for v in order[depth:] if v in cons_vars]
            if below != [i]:
                raise ScheduleError(
                    f"{cmd}: the consumer would loop over {', '.join(below)}; with a sparse "
                    f"output it must loop over {i} only"
                )
            ws.flags = Array(f"{pc.name}_seen", "i32", True)
            ws.list = Array(f"{pc.name}_list", I64, True)
            ws.count = Var(f"{pc.name}_count", I64)
            ws.epoch = Var(f"{pc.name}_epoch", "i32")
            if self._appends_in_order(i):
                ws.sort_tmp = Array(f"{pc.name}_tmp", I64, True)
                ws.sort_buckets = Array(f"{pc.name}_buckets", I64, True)
            fmt = Format.workspace_list()
            params = SlotParams([size], [{"crd": ws.list, "count": ws.count}], vals)
        else:
            fmt = dense_format(1)
            params = SlotParams([size], [{}], vals)
        self.operands[W] = Operand(W, pc.name, fmt, [i], params, [Affine.var(i)])

        def side(vs: set[str]) -> tuple[str, ...]:
            return order[:depth] + tuple(v for v in order[depth:] if v in vs)

        scopes[(k, "prod")] = Scope([Opnd(n) for n in taken], side(prod_vars), depth, [i], False)
        scopes[(k, "cons")] = Scope(
            [*rest, Opnd(W)], side(cons_vars), depth, scope.out_vars, scope.output
        )
        prod = _product([Opnd(n) for n in taken])
        cons = _product([*rest, Opnd(W)])
        return Where(depth, prod, cons, prod_vars, cons_vars, ws, split, W, key, pc.wvar)

    def _scope_of(
        self, cmd: str, wanted: list, scopes: dict, wheres: list[Where]
    ) -> tuple[object, list[int]]:
        """The scope that holds every factor of a precompute's expression, and which of
        its operands they are.  An earlier workspace counts as a factor by its name."""
        found: dict = {}
        for key, scope in scopes.items():
            taken: list[int] = []
            for a in wanted:
                match = next(
                    (
                        t.n
                        for t in scope.factors
                        if isinstance(t, Opnd)
                        and t.n not in taken
                        and isinstance(a, ast.Access)
                        and self._access_text(t.n) == str(a)
                    ),
                    None,
                )
                if match is not None:
                    taken.append(match)
            if len(taken) == len(wanted):
                return key, taken
            found[key] = len(taken)
        if sum(found.values()) >= len(wanted) and len(scopes) > 1:
            raise ScheduleError(
                f"{cmd}: its factors lie on both sides of an earlier precompute's where "
                "(some in the producer, some in the consumer); precompute a product that "
                "one side holds"
            )
        missing = next(
            a
            for a in wanted
            if not any(
                isinstance(t, Opnd) and self._access_text(t.n) == str(a)
                for s in scopes.values()
                for t in s.factors
            )
        )
        raise ScheduleError(
            f"{cmd}: {missing} is not a factor of the right-hand side "
            f"{self.cin.statement.rhs}; precompute a product of its factors"
        )

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

    def _where(self, wh: Where, st: State) -> list[ir.Stmt]:
        ws = wh.ws
        d = st.depth
        k = self.wheres.index(wh)
        prod = st.copy()
        prod.order = st.order[:d] + tuple(v for v in st.order[d:] if v in wh.prod_vars)
        prod.ws = ws
        prod.scope = (*st.scope, (k, "prod"))
        cons = st.copy()
        cons.order = st.order[:d] + tuple(v for v in st.order[d:] if v in wh.cons_vars)
        cons.scope = (*st.scope, (k, "cons"))
        start: list[ir.Stmt] = []
        if ws.list is None:
            z = Var(f"{ws.name}_z", I64)
            if not self.assembling:
                start.append(
                    ir.For(z, Const(0, I64), ws.size, [ir.Store(ws.vals, z, Const(0, self.vt))])
                )
        else:
            start += self._ws_epoch(ws)
        produce = self._at_depth(wh.prod_term, prod)
        if ws.sort_tmp is not None and not self.assembling:
            sort_args = [ws.list, ws.count, ws.sort_tmp, ws.sort_buckets]
            produce.append(ir.Call(sort.NAME, sort_args))
        consume = self._at_depth(wh.cons_term, cons)
        if wh.split is None:
            return start + produce + consume
        outer, inner, factor, extent = wh.split
        base = Var(f"{ws.var}_base", I64)
        f = Const(factor, I64)

        def tile(stmts: list[ir.Stmt]) -> list[ir.Stmt]:
            loop = stmts[-1] if stmts else None
            if any(isinstance(s, ir.For) and s.var.name == ws.var for s in stmts[:-1]):
                raise ScheduleError(
                    f"precompute over {inner}: the rest of the statement sums {ws.name} over "
                    f"{ws.var} into a scalar that is stored once after the loop, so the loop "
                    f"cannot be cut into tiles; precompute over {ws.var} itself"
                )
            if not (isinstance(loop, ir.For) and loop.var.name == ws.var):
                raise ScheduleError(
                    f"precompute over {inner}: the loop over {ws.var} walks a sparse operand; "
                    "a workspace over a split's inner loop needs a dense loop"
                )
            body = [ir.Decl(loop.var, ir.add(base, Var(inner, I64))), *loop.body]
            end = ir.minimum(f, ir.sub(extent, base))
            return [*stmts[:-1], ir.For(Var(inner, I64), Const(0, I64), end, body, label=inner)]

        blocks = ir.Bin("/", ir.add(extent, Const(factor - 1, I64)), f)
        body = [ir.Decl(base, ir.mul(Var(outer, I64), f)), *start, *tile(produce), *tile(consume)]
        return [ir.For(Var(outer, I64), Const(0, I64), blocks, body, label=outer)]

    @staticmethod
    def _ws_epoch(ws: Workspace) -> list[ir.Stmt]:
        """Start a use of a listed workspace by moving to a new epoch.

        An entry is touched in this use when its flag equals the epoch, and a first
        touch zeroes the value, so nothing walks the list afterwards to reset flags and
        values: that second pass of random writes cost a tenth of Gustavson SpGEMM.
        The epoch lives in the flags' extra last entry so it is private to a thread
        exactly when the flags are; when it would overflow, the flags are cleared.
        """
        i32 = "i32"
        last = Const(EPOCH_WRAP, i32)
        z = Var(f"{ws.name}_z", I64)
        wrap = [
            ir.For(z, Const(0, I64), ws.size, [ir.Store(ws.flags, z, Const(0, i32))]),
            ir.Assign(ws.epoch, Const(1, i32)),
        ]
        return [
            ir.Decl(ws.count, Const(0, I64)),
            ir.Decl(ws.epoch, ir.add(ir.Load(ws.flags, ws.size), Const(1, i32))),
            ir.If(ir.Cmp("==", ws.epoch, last), wrap),
            ir.Store(ws.flags, ws.size, ws.epoch),
        ]

    def _ws_leaf(self, term: Term, st: State) -> list[ir.Stmt]:
        ws = st.ws
        idx = ws.index
        stmts: list[ir.Stmt] = []
        if ws.list is not None:
            first = [
                ir.Store(ws.flags, idx, ws.epoch),
                ir.Store(ws.list, ws.count, idx),
                ir.Assign(ws.count, ir.add(ws.count, Const(1, I64))),
            ]
            if not self.assembling:
                first.append(ir.Store(ws.vals, idx, Const(0, self.vt)))
            stmts.append(ir.If(ir.Cmp("!=", ir.Load(ws.flags, idx), ws.epoch), first))
        if not self.assembling:
            stmts.append(ir.Store(ws.vals, idx, self._value(term, st), accumulate=True))
        return stmts


def _factors(t: Term) -> list[Term]:
    if isinstance(t, Op) and t.op == "*":
        return _factors(t.left) + _factors(t.right)
    return [t]


def _ast_factors(e) -> list:
    if isinstance(e, ast.Binary) and e.op == "*":
        return _ast_factors(e.left) + _ast_factors(e.right)
    return [e]


def _product(terms: list[Term]) -> Term:
    out = terms[0]
    for t in terms[1:]:
        out = Op("*", out, t)
    return out
