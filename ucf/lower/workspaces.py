"""precompute: a where whose producer fills a workspace the consumer reads."""

from __future__ import annotations

from ucf.errors import ScheduleError
from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.walk import loops as walk_loops
from ucf.lower import sort
from ucf.lower.lattice import Term, operands, restrict
from ucf.lower.state import (
    BITS_SLACK,
    State,
    Where,
    Workspace,
)

# The epoch at which a listed workspace's flags are cleared and the count restarts.
EPOCH_WRAP = 2**31 - 1
#: A use reads every word of its bitmap instead of sorting its list when the bitmap has
#: at most this many words per coordinate touched, and the words its summary marks when
#: it has at most ``MARKED_WORDS``. Gustavson SpGEMM of 10 a row, one thread (a C model
#: of the compute pass, bench/README.md), against the sort: 4000 columns (63 words for
#: ~100 coordinates) 0.61x every word, 0.75x the marked ones; 20,000 (313 words) 1.14x
#: every word, 0.81x the marked ones; 200,000 columns 1.49x the marked ones.
EVERY_WORD = 2
MARKED_WORDS = 4
#: How a use of a listed workspace keeps its coordinates, as the use before it chose
#: (the flags' last entry): a list to sort; the bitmap and its summary; the bitmap alone
#: (every word is read: keeping the summary cost 0.15x of the 4000-column pass).
SORTED, MARKED, EVERY = 0, 1, 2


class WorkspacesMixin:
    """Part of :class:`ucf.lower.lowerer.Lowerer`; see its docstring for the shared state."""

    def _where(self, wh: Where, st: State) -> list[ir.Stmt]:
        ws = wh.ws
        k = self.wheres.index(wh)
        start: list[ir.Stmt] = []
        if ws.list is None:
            z = Var(f"{ws.name}_z", I64)
            if not self.assembling:
                start.append(
                    ir.For(z, Const(0, I64), ws.size, [ir.Store(ws.vals, z, Const(0, self.vt))])
                )
        else:
            start += self._ws_epoch(ws, not self.assembling and ws.bits is not None)
        produce: list[ir.Stmt] = []
        for m, (part, order) in enumerate(wh.parts):
            # a part of an operand a branch around found absent adds nothing to the
            # workspace (its positions there are not the operand's: a wrong answer and a
            # stray read, statement fuzzer seed 45 case 1926)
            term = restrict(part, st.absent, self._fill)
            if term is None:
                continue
            prod = st.copy()
            prod.order = order
            prod.ws = ws
            prod.scope = (*st.scope, (k, f"prod{m}"))
            built = self._at_depth(term, prod)
            if any(n in self.cin.walked for n in operands(part)):
                # loops in an order of their own (``_own_order``), which the schedule's
                # final arrangement of the nest's loops must leave alone
                for _, loop in walk_loops(built):
                    loop.label = ""
            produce += built
        if ws.sort_tmp is not None and (not self.assembling or ws.merged):
            produce += self._in_order(ws)
        cons = st.copy()
        cons.order = wh.cons_order
        cons.scope = (*st.scope, (k, "cons"))
        cons_term = restrict(wh.cons_term, st.absent, self._fill, st.target)
        consume = [] if cons_term is None else self._at_depth(cons_term, cons)
        if wh.split is None:
            return start + produce + consume
        outer, inner, factor, extent = wh.split
        base = Var(f"{ws.var}_base", I64)
        f = Const(factor, I64)

        def tile(stmts: list[ir.Stmt]) -> list[ir.Stmt]:
            if not stmts:  # a side folded away under operands absent around it
                return []
            loop = stmts[-1]
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

    def _in_order(self, ws: Workspace) -> list[ir.Stmt]:
        """Put the list of touched coordinates in order: sort it, or, where this use set
        the bitmap and the list is long beside its words, read the bitmap's set bits.

        A row whose coordinates number at least half the bitmap's words reads every word;
        one with at least a quarter reads the words its summary marks (a word holds a
        bit or two there: 20,000 columns, 100 a row); a sparser one is sorted. A use sets
        the bitmap (and the summary) when the use before it would have read it (the
        marked words), so rows too sparse for it pay nothing for it; the choice for the
        next use is kept in the flags' last entry, per thread as they are."""
        sort_call = ir.Call(sort.NAME, [ws.list, ws.count, ws.sort_tmp, ws.sort_buckets])
        if self.assembling or ws.bits is None:
            return [sort_call]
        name = ws.name
        words, summary, q = (Var(f"{name}_{v}", I64) for v in ("words", "swords", "qb"))
        every, marked = Var(f"{name}_every", I64), Var(f"{name}_marked", I64)
        word_of = ir.Bin(">>", ir.Load(ws.list, q), Const(6, I64))
        clear = ir.For(
            q,
            Const(0, I64),
            ws.count,
            [
                ir.Store(ws.bits, word_of, Const(0, I64)),
                ir.Store(ws.summary, ir.Bin(">>", word_of, Const(6, I64)), Const(0, I64)),
            ],
        )
        mode = ws.use_bits

        def is_mode(m: int) -> ir.Expr:
            return ir.Cmp("==", mode, Const(m, "i32"))

        def at_least(per: int, var: Var) -> ir.Stmt:
            many = ir.Cmp(">=", ir.mul(ws.count, Const(per, I64)), words)
            return ir.Decl(var, ir.Select(many, Const(1, I64), Const(0, I64)))

        def yes(var: Var) -> ir.Expr:
            return ir.Cmp("!=", var, Const(0, I64))

        # a row set with no summary (the row before read every word) reads every word
        # wherever the summary would have served
        read_every = ir.land(
            ir.Cmp("!=", mode, Const(SORTED, "i32")),
            ir.lor(yes(every), ir.land(is_mode(EVERY), yes(marked))),
        )
        next_mode = ir.Select(
            yes(every),
            Const(EVERY, "i32"),
            ir.Select(yes(marked), Const(MARKED, "i32"), Const(SORTED, "i32")),
        )
        return [
            ir.Decl(words, ir.add(ir.Bin(">>", ws.size, Const(6, I64)), Const(1, I64))),
            ir.Decl(summary, ir.add(ir.Bin(">>", ws.size, Const(12, I64)), Const(1, I64))),
            at_least(EVERY_WORD, every),
            at_least(MARKED_WORDS, marked),
            ir.If(
                read_every,
                self._read_every_word(ws, words, summary),
                [
                    ir.If(
                        ir.land(is_mode(MARKED), yes(marked)),
                        self._read_marked_words(ws, summary),
                        [ir.If(ir.Cmp("!=", mode, Const(SORTED, "i32")), [clear]), sort_call],
                    )
                ],
            ),
            ir.Store(ws.flags, ir.add(ws.size, Const(1, I64)), next_mode),
        ]

    @staticmethod
    def _read_word(ws: Workspace, w: ir.Expr, at: Var) -> list[ir.Stmt]:
        """Append word ``w``'s set bits to the list at ``at``, in order, and clear it.

        Its first four set bits are written without a branch, to the next four places,
        and the place moves on by the word's count of bits (a word holds one or two on
        average where this runs; a loop over them, or a test of each, mispredicts often:
        gcc made such tests branches, 1.1x the sorting kernel's time at 4000 columns).
        A word with more loops over the rest."""
        name = ws.name
        x, base, q = (Var(f"{name}_{v}", I64) for v in ("xb", "base", "qx"))

        def put(where: ir.Expr) -> list[ir.Stmt]:
            return [
                ir.Store(ws.list, where, ir.add(base, ir.Bits("ctz", x))),
                ir.Assign(x, ir.Bits("blsr", x)),
            ]

        return [
            ir.Decl(x, ir.Load(ws.bits, w)),
            ir.Store(ws.bits, w, Const(0, I64)),
            ir.Decl(base, ir.Bin("<<", w, Const(6, I64))),
            ir.Decl(q, ir.add(at, ir.Bits("popcount", x))),
            *[s for m in range(BITS_SLACK) for s in put(ir.add(at, Const(m, I64)))],
            ir.Assign(at, ir.add(at, Const(BITS_SLACK, I64))),
            ir.While(
                ir.Cmp("!=", x, Const(0, I64)),
                [*put(at), ir.Assign(at, ir.add(at, Const(1, I64)))],
            ),
            ir.Assign(at, q),
        ]

    def _read_every_word(self, ws: Workspace, words: Var, summary: Var) -> list[ir.Stmt]:
        """The list rewritten from every word of the bitmap, the summary cleared after."""
        w, s, at = (Var(f"{ws.name}_{v}", I64) for v in ("wb", "sb", "at"))
        return [
            ir.Decl(at, Const(0, I64)),
            ir.For(w, Const(0, I64), words, self._read_word(ws, w, at)),
            ir.For(s, Const(0, I64), summary, [ir.Store(ws.summary, s, Const(0, I64))]),
        ]

    def _read_marked_words(self, ws: Workspace, summary: Var) -> list[ir.Stmt]:
        """The list rewritten from the words the summary marks, each summary word cleared
        as it is read."""
        name = ws.name
        s, y, w, at = (Var(f"{name}_{v}", I64) for v in ("sb", "yb", "wm", "at"))
        marked = [
            ir.Decl(w, ir.add(ir.Bin("<<", s, Const(6, I64)), ir.Bits("ctz", y))),
            ir.Assign(y, ir.Bits("blsr", y)),
            *self._read_word(ws, w, at),
        ]
        body = [
            ir.Decl(y, ir.Load(ws.summary, s)),
            ir.Store(ws.summary, s, Const(0, I64)),
            ir.While(ir.Cmp("!=", y, Const(0, I64)), marked),
        ]
        return [ir.Decl(at, Const(0, I64)), ir.For(s, Const(0, I64), summary, body)]

    @staticmethod
    def _ws_epoch(ws: Workspace, bits: bool) -> list[ir.Stmt]:
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
        start = [
            ir.Decl(ws.count, Const(0, I64)),
            ir.Decl(ws.epoch, ir.add(ir.Load(ws.flags, ws.size), Const(1, i32))),
            ir.If(ir.Cmp("==", ws.epoch, last), wrap),
            ir.Store(ws.flags, ws.size, ws.epoch),
        ]
        if bits:
            start.append(ir.Decl(ws.use_bits, ir.Load(ws.flags, ir.add(ws.size, Const(1, I64)))))
        return start

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
            if not self.assembling and ws.bits is not None:
                first.append(ir.If(ir.Cmp("!=", ws.use_bits, Const(SORTED, "i32")), self._mark(ws)))
            stmts.append(ir.If(ir.Cmp("!=", ir.Load(ws.flags, idx), ws.epoch), first))
        if not self.assembling:
            stmts.append(ir.Store(ws.vals, idx, self._value(term, st), accumulate=True))
        return stmts

    @staticmethod
    def _mark(ws: Workspace) -> list[ir.Stmt]:
        """Set a first-touched coordinate's bit (it is unset: a first touch), and, where
        this use keeps the summary, its word's bit there where the word was empty."""
        idx, old = ws.index, Var(f"{ws.name}_old", I64)
        word = ir.Bin(">>", idx, Const(6, I64))
        in_summary = ir.Bits("bit", ir.Bin("&", word, Const(63, I64)))
        summarize = ir.Store(
            ws.summary,
            ir.Bin(">>", idx, Const(12, I64)),
            ir.Select(ir.Cmp("==", old, Const(0, I64)), in_summary, Const(0, I64)),
            accumulate=True,
        )
        return [
            ir.Decl(old, ir.Load(ws.bits, word)),
            ir.Store(ws.bits, word, ir.add(old, ir.Bits("bit", ir.Bin("&", idx, Const(63, I64))))),
            ir.If(ir.Cmp("==", ws.use_bits, Const(MARKED, "i32")), [summarize]),
        ]
