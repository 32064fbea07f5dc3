"""Parallel loops in LLVM IR: a ``CPUThread`` loop outlined into a function that
libgomp's ``GOMP_parallel`` runs on every thread (through ``ucf_parallel``, the
adaptive team of ``ucf.codegen.llvm_team``), in chunks from ``GOMP_loop_dynamic_*``:
a few even ones per thread for a ``static`` loop, the schedule's for a ``dynamic``
one. ``OpenMPLoops`` is part of the LLVM code generator's function builder
(``ucf.codegen.llvm``).
"""

from __future__ import annotations

from llvmlite import ir as ll

from ucf.codegen import llvm_team
from ucf.codegen.llvm_types import I8P, I32, TYPES, is_float
from ucf.ir import nodes as ir
from ucf.ir.walk import declared, reads

#: The chunks per thread a statically shared loop is cut into (``static_block``).
CHUNKS_PER_THREAD = 4


class OpenMPLoops:
    """Part of the LLVM function builder: its parallel loops."""

    def parallel_for(self, s: ir.For) -> None:
        """Outline the loop into a function that libgomp runs on every thread.

        Everything the body reads from outside - parameters and enclosing
        locals - travels by value in a struct; the body writes no enclosing
        variable (the scheduler checks that before it marks a loop parallel)
        except the loop's reduction scalars, which travel by pointer: each
        thread sums into a private copy and adds it atomically at the end.
        A ``static`` loop is cut into a few even chunks per thread, a
        ``dynamic`` one into the schedule's; threads take them in turn
        through ``GOMP_loop_dynamic_*``.
        """
        b = self.b
        reduced = [r.name for r in s.reduction]
        body_reads = _free_reads(s, set(self.slots) - set(self.args))
        names = sorted(self.args) + [n for n in body_reads if n not in reduced]
        values = [self.args[n] if n in self.args else b.load(self.slots[n]) for n in names]
        values += [self.slot(r) for r in s.reduction]
        start, end = self.expr(s.start), self.expr(s.end)
        types = [v.type for v in values] + [TYPES["i64"], TYPES["i64"]]
        struct_t = ll.LiteralStructType(types)
        data = self.alloca_builder.alloca(struct_t, name="omp.data")
        for k, v in enumerate([*values, start, end]):
            b.store(v, b.gep(data, [I32(0), I32(k)], inbounds=True))
        self.outlined += 1
        fn_t = ll.FunctionType(ll.VoidType(), [I8P])
        name = f"{self.func.name}.omp{self.outlined}"
        outlined = ll.Function(self.mod, fn_t, name=name)
        outlined.linkage = "internal"
        # The body is its own function so that the arrays arrive as noalias arguments:
        # loaded from the struct they would lose the kernel's no-alias contract, and with
        # it vectorization and hoisting (about 3x per thread on gather-GEMM bodies).
        # Inlined into the entry at O3, the arguments become scoped no-alias metadata.
        body_fn = ll.Function(self.mod, ll.FunctionType(ll.VoidType(), types), name=f"{name}.body")
        body_fn.linkage = "internal"
        for n, arg in zip(names, body_fn.args, strict=False):
            arg.name = n
            if n in self.restrict:
                arg.add_attribute("noalias")
        entry = ll.IRBuilder(outlined.append_basic_block("entry"))
        ptr = entry.bitcast(outlined.args[0], ll.PointerType(struct_t))
        fields = [
            entry.load(entry.gep(ptr, [I32(0), I32(k)], inbounds=True)) for k in range(len(types))
        ]
        entry.call(body_fn, fields)
        entry.ret_void()
        inner = type(self)(self.mod, None, self.openmp, (self.vnni, self.vnni512))
        inner.func = body_fn
        inner.restrict = self.restrict
        inner._start_blocks()
        params = list(body_fn.args)
        inner.args = dict(zip(names, params[: len(names)], strict=True))
        shared = dict(zip(reduced, params[len(names) : -2], strict=True))
        lo_all, hi_all = params[-2], params[-1]
        for r in s.reduction:
            inner.b.store(ll.Constant(TYPES[r.type], 0.0 if is_float(r.type) else 0), inner.slot(r))
        inner.block(s.prologue)
        if s.schedule[0] == "dynamic":
            inner.dynamic_chunks(s, lo_all, hi_all)
        else:
            inner.static_block(s, lo_all, hi_all, 1 if s.schedule[0] == "blocks" else None)
        inner.block(s.epilogue)
        for r in s.reduction:
            op = "fadd" if is_float(r.type) else "add"
            inner.b.atomic_rmw(op, shared[r.name], inner.b.load(inner.slot(r)), "monotonic")
        inner.finish()
        # libgomp's GOMP_parallel behind ucf_parallel, which shrinks the team while the
        # machine is too busy for it (ucf.codegen.llvm_team); the loop keeps its state.
        entry_t = llvm_team.entry_type()
        team = self._extern(llvm_team.ENTRY, entry_t.return_type, list(entry_t.args))
        state_name = llvm_team.state_name(self.func.name, self.outlined)
        state = ll.GlobalVariable(self.mod, llvm_team.STATE, state_name)
        state.linkage = "internal"
        state.initializer = ll.Constant(llvm_team.STATE, None)
        threads = I32(0)  # libgomp's default team
        if s.parallel_if is not None:  # as C's if clause: a team of one below the threshold
            threads = b.select(self.expr(s.parallel_if), I32(0), I32(1))
        b.call(team, [outlined, b.bitcast(data, I8P), threads, I32(0), state])

    def _serial_part(self, s: ir.For, lo: ll.Value, hi: ll.Value) -> None:
        self.args["omp.lo"], self.args["omp.hi"] = lo, hi
        i64 = "i64"
        self.for_loop(
            ir.For(s.var, ir.Var("omp.lo", i64), ir.Var("omp.hi", i64), s.body, unroll=s.unroll)
        )

    def static_block(
        self, s: ir.For, lo_all: ll.Value, hi_all: ll.Value, per_thread: int | None = None
    ) -> None:
        """Even shares of the range, handed out as ``CHUNKS_PER_THREAD`` chunks per thread
        from one counter rather than one block per thread: a thread that starts late (the
        OS woke it late, or another process holds its core) leaves its chunks to the
        threads already running, so the region waits for it about one chunk, not half
        the loop (issue 34: a busy machine; the wake-up after the bounded spin too).
        A ``blocks`` loop (``per_thread`` 1) gets one block per thread from the counter:
        each thread's iterations follow each other, as the rows of a one-pass output's
        chunks want (``ucf.lower.row_chunks``), and a thread that finds the next block
        still there takes it too, right after its own."""
        ib = self.b
        i64 = TYPES["i64"]
        nth = ib.sext(ib.call(self._extern("omp_get_num_threads", I32, []), []), i64)
        pieces = ib.mul(nth, ll.Constant(i64, per_thread or CHUNKS_PER_THREAD))
        count = ib.sub(hi_all, lo_all)
        one = ll.Constant(i64, 1)
        chunk = ib.sdiv(ib.sub(ib.add(count, pieces), one), pieces)
        chunk = ib.select(ib.icmp_signed("<", chunk, one), one, chunk)
        self._chunks(s, lo_all, hi_all, chunk)

    def dynamic_chunks(self, s: ir.For, lo_all: ll.Value, hi_all: ll.Value) -> None:
        self._chunks(s, lo_all, hi_all, ll.Constant(TYPES["i64"], s.schedule[1]))

    def _chunks(self, s: ir.For, lo_all: ll.Value, hi_all: ll.Value, chunk: ll.Value) -> None:
        """The range in chunks from ``GOMP_loop_dynamic_*``; a team of one (a loop below
        its work threshold, or a team the machine shrank) runs it whole, without the
        work share's setup."""
        b = self.b
        i64 = TYPES["i64"]
        p64 = ll.PointerType(i64)
        start = self._extern("GOMP_loop_dynamic_start", ll.IntType(8), [i64] * 4 + [p64, p64])
        nxt = self._extern("GOMP_loop_dynamic_next", ll.IntType(8), [p64, p64])
        done = self._extern("GOMP_loop_end_nowait", ll.VoidType(), [])
        lo_p = self.alloca_builder.alloca(i64, name="omp.chunk.lo")
        hi_p = self.alloca_builder.alloca(i64, name="omp.chunk.hi")
        nth = b.call(self._extern("omp_get_num_threads", I32, []), [])
        alone = b.icmp_signed("==", nth, I32(1))
        blocks = [
            self.func.append_basic_block(f"omp.{k}")
            for k in ("alone", "shared", "chunk", "next", "done", "end")
        ]
        single, shared, work, next_, exit_, end = blocks
        b.cbranch(alone, single, shared)
        b.position_at_end(single)
        b.store(lo_all, lo_p)
        b.store(hi_all, hi_p)
        b.branch(work)
        b.position_at_end(shared)
        got = b.call(start, [lo_all, hi_all, ll.Constant(i64, 1), chunk, lo_p, hi_p])
        zero = ll.Constant(ll.IntType(8), 0)
        b.cbranch(b.icmp_unsigned("!=", got, zero), work, exit_)
        b.position_at_end(work)
        self._serial_part(s, b.load(lo_p), b.load(hi_p))
        b.cbranch(alone, end, next_)
        b.position_at_end(next_)
        more = b.call(nxt, [lo_p, hi_p])
        b.cbranch(b.icmp_unsigned("!=", more, zero), work, exit_)
        b.position_at_end(exit_)
        b.call(done, [])
        b.branch(end)
        b.position_at_end(end)


def _free_reads(s: ir.For, outer: set[str]) -> list[str]:
    """Names the loop reads that are defined outside it, in a stable order."""
    names: set[str] = set()
    reads([s.body, s.start, s.end], names)
    local = declared(s.body) | {s.var.name}
    return sorted(n for n in names if n in outer and n not in local)
