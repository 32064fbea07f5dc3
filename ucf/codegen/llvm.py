"""LLVM IR from LLIR, built with llvmlite.

Every LLIR variable becomes an entry-block alloca; the O3 pipeline promotes
them to registers.  Array parameters carry ``noalias``, which is what lets
LLVM hoist bounds and vectorize the inner loops, like ``restrict`` in the C
target.  Floating point stays strict, and a fused
multiply-add (``ir.FMA``) is the exactly rounded ``llvm.fma`` intrinsic, so both
targets round identically.
"""

from __future__ import annotations

import re

from llvmlite import ir as ll

from ucf.codegen import llvm_team
from ucf.ir import nodes as ir
from ucf.ir.walk import declared, nodes, reads
from ucf.passes import pairs

_TYPES = {
    "i1": ll.IntType(1),
    "i32": ll.IntType(32),
    "i64": ll.IntType(64),
    "f32": ll.FloatType(),
    "f64": ll.DoubleType(),
    "f16": ll.HalfType(),
    "bf16": ll.IntType(16),  # the top half of a float's bits: cast() shifts them back
    "i8": ll.IntType(8),
    "u8": ll.IntType(8),  # LLVM's integers have no sign; casts from it zero-extend
}
_FLOAT_WIDTH = {"f16": 16, "f32": 32, "f64": 64}
#: libm functions LLVM has no intrinsic for: called by name (``tanhf``, ``erf``).
LIBM_ONLY = ("tanh", "erf")


def _type(ty: str) -> ll.Type:
    """The LLVM type of an LLIR scalar or vector type."""
    n = ir.lanes(ty)
    return _TYPES[ty] if n == 1 else ll.VectorType(_TYPES[ir.element(ty)], n)


def _signature(t: ll.FunctionType) -> tuple[ll.Type, list[ll.Type]]:
    return t.return_type, list(t.args)


def _is_float(ty: str) -> bool:
    return ir.element(ty) in _FLOAT_WIDTH


_SIZES = {"i1": 1, "i32": 4, "i64": 8, "f32": 4, "f64": 8, "f16": 2, "bf16": 2, "i8": 1, "u8": 1}
_I8P = ll.PointerType(ll.IntType(8))
_I32 = ll.IntType(32)


def module(
    fns: list[ir.Function], name: str = "ucf", openmp: bool = True, features: str | None = None
) -> str:
    """LLVM IR text; ``openmp=False`` emits CPUThread loops serially (no libgomp here).
    ``features`` are those of the CPU the IR is for, as LLVM spells them (the host's by
    default, which the JIT compiles for): they decide whether ``ir.QuadDot`` is VNNI's
    instruction or its expansion."""
    mod = ll.Module(name=name)
    vnni = pairs.vnni(pairs.host_features() if features is None else features)
    for fn in fns:
        _FunctionBuilder(mod, fn, openmp, vnni).build()
    return _loop_metadata(str(mod))


_LOOP_HINT = re.compile(r'^(!\d+) = !\{ !"ucf\.loop\.(\w+)\.(\d+)\.(\d+)" \}$', re.M)


def _loop_metadata(text: str) -> str:
    """Turn placeholder nodes into LLVM's self-referential loop metadata.

    llvmlite cannot build a ``distinct`` node that names itself, which is what
    ``!llvm.loop`` requires, so loops carry a placeholder string node that is
    rewritten here into unroll-count or vectorize-enable hints.
    """
    extra: list[str] = []

    def rewrite(m: re.Match) -> str:
        node, kind, serial, amount = m.groups()
        hint = f"!{900000 + int(serial)}"
        if kind == "unroll":
            extra.append(f'{hint} = !{{!"llvm.loop.unroll.count", i32 {amount}}}')
        else:
            extra.append(f'{hint} = !{{!"llvm.loop.vectorize.enable", i1 true}}')
        return f"{node} = distinct !{{{node}, {hint}}}"

    text = _LOOP_HINT.sub(rewrite, text)
    return text.rstrip("\n") + "\n" + "".join(line + "\n" for line in extra)


class _FunctionBuilder:
    def __init__(
        self, mod: ll.Module, fn: ir.Function | None, openmp: bool = True, vnni: bool = False
    ):
        self.mod = mod
        self.openmp = openmp
        self.vnni = vnni  # the CPU runs vpdpbusd (ucf.passes.pairs.vnni)
        self.outlined = 0
        self.slots: dict[str, ll.AllocaInstr] = {}
        self.args: dict[str, ll.Value] = {}
        self.raw: dict[str, ll.Value] = {}  # what calloc gave each workspace, to free
        self.restrict: set[str] = set()  # array parameters that alias nothing else
        if fn is None:
            return
        self.fn = fn
        self.restrict = {p.name for p in fn.params if p.is_array}
        arg_types = [
            ll.PointerType(_TYPES[p.type]) if p.is_array else _TYPES[p.type] for p in fn.params
        ]
        self.func = ll.Function(mod, ll.FunctionType(ll.VoidType(), arg_types), name=fn.name)
        if fn.internal:
            self.func.linkage = "internal"
        for p, arg in zip(fn.params, self.func.args, strict=True):
            arg.name = p.name
            if p.is_array:
                arg.add_attribute("noalias")
            self.args[p.name] = arg
        self._start_blocks()

    def _start_blocks(self) -> None:
        entry = self.func.append_basic_block("entry")
        self.alloca_builder = ll.IRBuilder(entry)
        body = self.func.append_basic_block("body")
        self.b = ll.IRBuilder(body)

    def build(self) -> None:
        self.block(self.fn.body)
        self.finish()

    def finish(self) -> None:
        self.b.ret_void()
        self.alloca_builder.branch(self.func.blocks[1])

    def _extern(self, name: str, ret: ll.Type, args: list[ll.Type]) -> ll.Function:
        if name in self.mod.globals:
            return self.mod.globals[name]
        return ll.Function(self.mod, ll.FunctionType(ret, args), name=name)

    def parallel_for(self, s: ir.For) -> None:
        """Outline the loop into a function that libgomp runs on every thread.

        Everything the body reads from outside - parameters and enclosing
        locals - travels by value in a struct; the body writes no enclosing
        variable (the scheduler checks that before it marks a loop parallel)
        except the loop's reduction scalars, which travel by pointer: each
        thread sums into a private copy and adds it atomically at the end.
        A ``static`` loop gives every thread one contiguous block; a
        ``dynamic`` one hands out chunks through ``GOMP_loop_dynamic_*``.
        """
        b = self.b
        reduced = [r.name for r in s.reduction]
        body_reads = _free_reads(s, set(self.slots) - set(self.args))
        names = sorted(self.args) + [n for n in body_reads if n not in reduced]
        values = [self.args[n] if n in self.args else b.load(self.slots[n]) for n in names]
        values += [self.slot(r) for r in s.reduction]
        start, end = self.expr(s.start), self.expr(s.end)
        types = [v.type for v in values] + [_TYPES["i64"], _TYPES["i64"]]
        struct_t = ll.LiteralStructType(types)
        data = self.alloca_builder.alloca(struct_t, name="omp.data")
        for k, v in enumerate([*values, start, end]):
            b.store(v, b.gep(data, [_I32(0), _I32(k)], inbounds=True))
        self.outlined += 1
        fn_t = ll.FunctionType(ll.VoidType(), [_I8P])
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
            entry.load(entry.gep(ptr, [_I32(0), _I32(k)], inbounds=True)) for k in range(len(types))
        ]
        entry.call(body_fn, fields)
        entry.ret_void()
        inner = _FunctionBuilder(self.mod, None, self.openmp, self.vnni)
        inner.func = body_fn
        inner.restrict = self.restrict
        inner._start_blocks()
        params = list(body_fn.args)
        inner.args = dict(zip(names, params[: len(names)], strict=True))
        shared = dict(zip(reduced, params[len(names) : -2], strict=True))
        lo_all, hi_all = params[-2], params[-1]
        for r in s.reduction:
            inner.b.store(
                ll.Constant(_TYPES[r.type], 0.0 if _is_float(r.type) else 0), inner.slot(r)
            )
        inner.block(s.prologue)
        if s.schedule[0] == "dynamic":
            inner.dynamic_chunks(s, lo_all, hi_all)
        else:
            inner.static_block(s, lo_all, hi_all)
        inner.block(s.epilogue)
        for r in s.reduction:
            op = "fadd" if _is_float(r.type) else "add"
            inner.b.atomic_rmw(op, shared[r.name], inner.b.load(inner.slot(r)), "monotonic")
        inner.finish()
        # libgomp's GOMP_parallel behind ucf_parallel, which shrinks the team while the
        # machine is too busy for it (ucf.codegen.llvm_team); the loop keeps its state.
        team = self._extern(llvm_team.ENTRY, *_signature(llvm_team.entry_type()))
        state = ll.GlobalVariable(self.mod, llvm_team.STATE, f"{name}.team")
        state.linkage = "internal"
        state.initializer = ll.Constant(llvm_team.STATE, None)
        threads = _I32(0)  # libgomp's default team
        if s.parallel_if is not None:  # as C's if clause: a team of one below the threshold
            threads = b.select(self.expr(s.parallel_if), _I32(0), _I32(1))
        b.call(team, [outlined, b.bitcast(data, _I8P), threads, _I32(0), state])

    def _serial_part(self, s: ir.For, lo: ll.Value, hi: ll.Value) -> None:
        self.args["omp.lo"], self.args["omp.hi"] = lo, hi
        i64 = "i64"
        self.for_loop(
            ir.For(s.var, ir.Var("omp.lo", i64), ir.Var("omp.hi", i64), s.body, unroll=s.unroll)
        )

    def static_block(self, s: ir.For, lo_all: ll.Value, hi_all: ll.Value) -> None:
        ib = self.b
        tid = ib.sext(ib.call(self._extern("omp_get_thread_num", _I32, []), []), _TYPES["i64"])
        nth = ib.sext(ib.call(self._extern("omp_get_num_threads", _I32, []), []), _TYPES["i64"])
        one = ll.Constant(_TYPES["i64"], 1)
        count = ib.sub(hi_all, lo_all)
        chunk = ib.sdiv(ib.sub(ib.add(count, nth), one), nth)
        lo = ib.add(lo_all, ib.mul(tid, chunk))
        hi_raw = ib.add(lo, chunk)
        hi = ib.select(ib.icmp_signed("<", hi_raw, hi_all), hi_raw, hi_all)
        self._serial_part(s, lo, hi)

    def dynamic_chunks(self, s: ir.For, lo_all: ll.Value, hi_all: ll.Value) -> None:
        b = self.b
        i64 = _TYPES["i64"]
        p64 = ll.PointerType(i64)
        start = self._extern("GOMP_loop_dynamic_start", ll.IntType(8), [i64] * 4 + [p64, p64])
        nxt = self._extern("GOMP_loop_dynamic_next", ll.IntType(8), [p64, p64])
        done = self._extern("GOMP_loop_end_nowait", ll.VoidType(), [])
        lo_p = self.alloca_builder.alloca(i64, name="omp.chunk.lo")
        hi_p = self.alloca_builder.alloca(i64, name="omp.chunk.hi")
        chunk = ll.Constant(i64, s.schedule[1])
        got = b.call(start, [lo_all, hi_all, ll.Constant(i64, 1), chunk, lo_p, hi_p])
        work = self.func.append_basic_block("omp.chunk")
        exit_ = self.func.append_basic_block("omp.done")
        zero = ll.Constant(ll.IntType(8), 0)
        b.cbranch(b.icmp_unsigned("!=", got, zero), work, exit_)
        b.position_at_end(work)
        self._serial_part(s, b.load(lo_p), b.load(hi_p))
        more = b.call(nxt, [lo_p, hi_p])
        b.cbranch(b.icmp_unsigned("!=", more, zero), work, exit_)
        b.position_at_end(exit_)
        b.call(done, [])

    def slot(self, var: ir.Var) -> ll.AllocaInstr:
        if var.name not in self.slots:
            self.slots[var.name] = self.alloca_builder.alloca(_type(var.type), name=var.name)
        return self.slots[var.name]

    # statements
    def block(self, stmts: list[ir.Stmt]) -> None:
        for s in stmts:
            self.stmt(s)

    def stmt(self, s: ir.Stmt) -> None:
        b = self.b
        if isinstance(s, ir.Decl):
            b.store(self.expr(s.init), self.slot(s.var))
        elif isinstance(s, ir.Assign):
            b.store(self.expr(s.value), self.slot(s.var))
        elif isinstance(s, ir.Store):
            ptr = self.element_ptr(s.array, s.index, ir.lanes(s.value.type))
            value = self.expr(s.value)
            align = _SIZES[s.array.elem]
            if s.atomic:
                op = "fadd" if _is_float(s.array.elem) else "add"
                b.atomic_rmw(op, ptr, value, "monotonic")
                return
            if s.accumulate:
                old = b.load(ptr, align=align)
                value = b.fadd(old, value) if _is_float(s.array.elem) else b.add(old, value)
            b.store(value, ptr, align=align)
        elif isinstance(s, ir.For):
            if s.parallel == "CPUThread" and self.openmp:
                self.parallel_for(s)
            else:
                self.block(s.prologue)
                self.for_loop(s)
                self.block(s.epilogue)
        elif isinstance(s, ir.Alloc):
            t = _TYPES[s.array.elem]
            calloc = self._extern("calloc", _I8P, [_TYPES["i64"], _TYPES["i64"]])
            size = b.select(
                b.icmp_signed(">", self.expr(s.size), ll.Constant(_TYPES["i64"], 0)),
                self.expr(s.size),
                ll.Constant(_TYPES["i64"], 1),
            )
            i64, elem = _TYPES["i64"], _SIZES[s.array.elem]
            # ir.ALIGN bytes more than asked (calloc aligns to 16 only), the array from
            # the first boundary on (a GEP, so the pointer keeps calloc's provenance).
            size = b.add(size, ll.Constant(i64, ir.ALIGN // elem))
            raw = b.call(calloc, [size, ll.Constant(i64, elem)])
            self.raw[s.array.name] = raw
            skip = b.and_(b.neg(b.ptrtoint(raw, i64)), ll.Constant(i64, ir.ALIGN - 1))
            start = b.gep(raw, [skip])
            self.args[s.array.name] = b.bitcast(start, ll.PointerType(t), name=s.array.name)
        elif isinstance(s, ir.Free):
            free = self._extern("free", ll.VoidType(), [_I8P])
            b.call(free, [self.raw[s.array.name]])
        elif isinstance(s, ir.Call):
            callee = self.mod.globals[s.name]
            args = [self.args[a.name] if isinstance(a, ir.Array) else self.expr(a) for a in s.args]
            b.call(callee, args)
        elif isinstance(s, ir.While):
            self.while_loop(s)
        elif isinstance(s, ir.If):
            self.if_stmt(s)
        elif isinstance(s, ir.Comment):
            pass
        else:
            raise TypeError(f"no LLVM for {type(s).__name__}")

    def for_loop(self, s: ir.For) -> None:
        b = self.b
        var = self.slot(s.var)
        b.store(self.expr(s.start), var)
        end = self.expr(s.end)
        cond = self.func.append_basic_block(f"{s.var.name}.cond")
        body = self.func.append_basic_block(f"{s.var.name}.body")
        exit_ = self.func.append_basic_block(f"{s.var.name}.exit")
        b.branch(cond)
        b.position_at_end(cond)
        b.cbranch(b.icmp_signed("<", b.load(var), end), body, exit_)
        b.position_at_end(body)
        self.block(s.body)
        b.store(b.add(b.load(var), ll.Constant(_TYPES["i64"], 1)), var)
        latch = b.branch(cond)
        hint = None
        if s.unroll:
            hint = ("unroll", s.unroll)
        elif s.parallel == "CPUVector":
            hint = ("vectorize", 1)
        if hint:
            serial = len(self.mod.metadata)
            tag = f"ucf.loop.{hint[0]}.{serial}.{hint[1]}"
            latch.set_metadata(
                "llvm.loop", self.mod.add_metadata([ll.MetaDataString(self.mod, tag)])
            )
        b.position_at_end(exit_)

    def while_loop(self, s: ir.While) -> None:
        b = self.b
        cond = self.func.append_basic_block("while.cond")
        body = self.func.append_basic_block("while.body")
        exit_ = self.func.append_basic_block("while.exit")
        b.branch(cond)
        b.position_at_end(cond)
        b.cbranch(self.expr(s.cond), body, exit_)
        b.position_at_end(body)
        self.block(s.body)
        b.branch(cond)
        b.position_at_end(exit_)

    def if_stmt(self, s: ir.If) -> None:
        b = self.b
        then = self.func.append_basic_block("if.then")
        orelse = self.func.append_basic_block("if.else")
        merge = self.func.append_basic_block("if.end")
        b.cbranch(self.expr(s.cond), then, orelse)
        b.position_at_end(then)
        self.block(s.then)
        b.branch(merge)
        b.position_at_end(orelse)
        self.block(s.orelse)
        b.branch(merge)
        b.position_at_end(merge)

    # expressions
    def expr(self, e: ir.Expr) -> ll.Value:
        b = self.b
        if isinstance(e, ir.Var):
            if e.name in self.args:
                return self.args[e.name]
            if e.name not in self.slots:
                raise ValueError(f"LLIR reads variable {e.name} before declaring it")
            return b.load(self.slots[e.name])
        if isinstance(e, ir.Const):
            value = bool(e.value) if e.type == "i1" else e.value
            if _is_float(e.type):
                value = float(value)
            return ll.Constant(_TYPES[e.type], value)
        if isinstance(e, ir.Load):
            ptr = b.gep(self.args[e.array.name], [self.expr(e.index)], inbounds=True)
            return b.load(ptr)
        if isinstance(e, ir.VLoad):
            return b.load(self.element_ptr(e.array, e.index, e.lanes), align=_SIZES[e.array.elem])
        if isinstance(e, ir.Splat):
            t = _type(e.type)
            one = b.insert_element(ll.Constant(t, ll.Undefined), self.expr(e.operand), _I32(0))
            return b.shuffle_vector(
                one,
                ll.Constant(t, ll.Undefined),
                ll.Constant(ll.VectorType(_I32, e.lanes), [0] * e.lanes),
            )
        if isinstance(e, ir.PairDot):
            return self.pair_dot(e)
        if isinstance(e, ir.QuadDot):
            return self.quad_dot(e)
        if isinstance(e, ir.FMA):
            return self.fma(e)
        if isinstance(e, ir.Bin):
            return self.binary(e)
        if isinstance(e, ir.Neg):
            x = self.expr(e.operand)
            return b.fneg(x) if _is_float(e.type) else b.neg(x)
        if isinstance(e, ir.Cmp):
            left, right = self.expr(e.left), self.expr(e.right)
            if _is_float(e.left.type):
                # C's != is true when either side is NaN (unordered); its other
                # comparisons are false then (ordered): the C target's answers.
                if e.op == "!=":
                    return b.fcmp_unordered(e.op, left, right)
                return b.fcmp_ordered(e.op, left, right)
            return b.icmp_signed(e.op, left, right)
        if isinstance(e, ir.Logic):
            return self.short_circuit(e)
        if isinstance(e, ir.Cast):
            return self.cast(self.expr(e.operand), e.operand.type, e.type)
        if isinstance(e, ir.Select):
            if _loads(e.if_true) or _loads(e.if_false):
                return self.guarded_select(e)
            return b.select(self.expr(e.cond), self.expr(e.if_true), self.expr(e.if_false))
        if isinstance(e, ir.Math):
            return self.math(e)
        raise TypeError(f"no LLVM for {type(e).__name__}")

    def element_ptr(self, array: ir.Array, index: ir.Expr, lanes: int) -> ll.Value:
        """The address of ``array[index]``, typed for ``lanes`` elements from there on."""
        ptr = self.b.gep(self.args[array.name], [self.expr(index)], inbounds=True)
        if lanes == 1:
            return ptr
        return self.b.bitcast(ptr, ll.PointerType(_type(ir.vector(array.elem, lanes))))

    def math(self, e: ir.Math) -> ll.Value:
        """LLVM's intrinsic where it has one (it can vectorize or fold it); else libm's
        function, which the JIT finds in the process and a C program links with -lm."""
        t = _TYPES[e.type]
        if e.fn in LIBM_ONLY:
            name = f"{e.fn}f" if e.type == "f32" else e.fn
        else:
            name = f"llvm.{e.fn}.{e.type}"
        return self.b.call(self._extern(name, t, [t]), [self.expr(e.operand)])

    def fma(self, e: ir.FMA) -> ll.Value:
        """LLVM's ``llvm.fma`` intrinsic, exactly rounded as C's ``fma``: one ``vfmadd``
        on a host with FMA3, for a scalar or a vector."""
        n, t = ir.lanes(e.type), _type(e.type)
        name = f"llvm.fma.{ir.element(e.type) if n == 1 else f'v{n}{ir.element(e.type)}'}"
        args = [self.expr(e.left), self.expr(e.right), self.expr(e.addend)]
        return self.b.call(self._extern(name, t, [t, t, t]), args)

    def pair_dot(self, e: ir.PairDot) -> ll.Value:
        """AVX2's ``pmaddwd`` intrinsic: ``ucf.passes.pairs`` makes the node only on a host
        that has it, in vectors of 8 lanes. Plain IR (the halves split into even and odd
        lanes, widened, multiplied and added) is what LLVM's backend folds into
        ``pmaddwd`` on its own, but the optimizer breaks that pattern up in a tile
        (it shares the split of a vector that several products read)."""
        n = ir.lanes(e.type)
        if n != 8 or pairs.PMADDWD not in pairs.available():
            raise TypeError(f"no LLVM for PairDot of {e.type} on this host (AVX2, i32x8)")
        halves = ll.VectorType(ll.IntType(16), 2 * n)
        left = self.b.bitcast(self.expr(e.left), halves)
        right = self.b.bitcast(self.expr(e.right), halves)
        pmaddwd = self._extern("llvm.x86.avx2.pmadd.wd", _type(e.type), [halves, halves])
        return self.b.call(pmaddwd, [left, right])

    def quad_dot(self, e: ir.QuadDot) -> ll.Value:
        """VNNI's ``vpdpbusd`` intrinsic on a CPU that has it (``llvm.x86.avx512.vpdpbusd.256``,
        which LLVM selects as AVX-VNNI's VEX form when the CPU has only that); elsewhere
        the definition, which LLVM 22 does not fold back into ``vpdpbusd``: the bytes
        widened (zero- and sign-), multiplied, the products of each lane's four bytes
        summed and added to the accumulator, the same values in int32."""
        n = ir.lanes(e.type)
        acc = self.expr(e.addend)
        nbytes = ll.VectorType(ll.IntType(8), 4 * n)
        unsigned = self.b.bitcast(self.expr(e.unsigned), nbytes)
        signed = self.b.bitcast(self.expr(e.signed), nbytes)
        if self.vnni and n == 8:
            vpdpbusd = self._extern(
                "llvm.x86.avx512.vpdpbusd.256", _type(e.type), [_type(e.type), nbytes, nbytes]
            )
            return self.b.call(vpdpbusd, [acc, unsigned, signed])
        wide = ll.VectorType(_I32, 4 * n)
        products = self.b.mul(self.b.zext(unsigned, wide), self.b.sext(signed, wide))
        for part in range(4):
            lanes = ll.Constant(ll.VectorType(_I32, n), [4 * lane + part for lane in range(n)])
            acc = self.b.add(acc, self.b.shuffle_vector(products, products, lanes))
        return acc

    def binary(self, e: ir.Bin) -> ll.Value:
        b = self.b
        left, right = self.expr(e.left), self.expr(e.right)
        if e.op in ("min", "max"):
            if _is_float(e.type):
                cmp = b.fcmp_ordered("<" if e.op == "min" else ">", left, right)
            else:
                cmp = b.icmp_signed("<" if e.op == "min" else ">", left, right)
            return b.select(cmp, left, right)
        if _is_float(e.type):
            return {"+": b.fadd, "-": b.fsub, "*": b.fmul, "/": b.fdiv}[e.op](left, right)
        ops = {"+": b.add, "-": b.sub, "*": b.mul, "/": b.sdiv, "%": b.srem}
        ops.update({"<<": b.shl, ">>": b.ashr, "&": b.and_})
        return ops[e.op](left, right)

    def guarded_select(self, e: ir.Select) -> ll.Value:
        """A select that evaluates only the chosen side, as C's ``?:`` does: LLIR guards
        loads with it (an operand that did not match has no valid position to read)."""
        b = self.b
        cond = self.expr(e.cond)
        then = self.func.append_basic_block("select.true")
        orelse = self.func.append_basic_block("select.false")
        merge = self.func.append_basic_block("select.end")
        b.cbranch(cond, then, orelse)
        b.position_at_end(then)
        value_true = self.expr(e.if_true)
        then_end = b.block
        b.branch(merge)
        b.position_at_end(orelse)
        value_false = self.expr(e.if_false)
        orelse_end = b.block
        b.branch(merge)
        b.position_at_end(merge)
        phi = b.phi(value_true.type)
        phi.add_incoming(value_true, then_end)
        phi.add_incoming(value_false, orelse_end)
        return phi

    def short_circuit(self, e: ir.Logic) -> ll.Value:
        """``and``/``or`` must not evaluate their right side needlessly: it may read past an end."""
        b = self.b
        left = self.expr(e.left)
        start = b.block
        rhs = self.func.append_basic_block("logic.rhs")
        merge = self.func.append_basic_block("logic.end")
        if e.op == "and":
            b.cbranch(left, rhs, merge)
        else:
            b.cbranch(left, merge, rhs)
        b.position_at_end(rhs)
        right = self.expr(e.right)
        rhs_end = b.block
        b.branch(merge)
        b.position_at_end(merge)
        phi = b.phi(_TYPES["i1"])
        phi.add_incoming(ll.Constant(_TYPES["i1"], e.op == "or"), start)
        phi.add_incoming(right, rhs_end)
        return phi

    def cast(self, x: ll.Value, src: str, dst: str) -> ll.Value:
        b = self.b
        if src == dst:
            return x
        t = _type(dst)
        src, dst = ir.element(src), ir.element(dst)
        if src == "bf16":  # exact: bfloat16 is a float32 with its low 16 bits zero
            bits = b.shl(b.zext(x, _I32), ll.Constant(_I32, 16))
            return self.cast(b.bitcast(bits, _TYPES["f32"]), "f32", dst)
        unsigned = src in ("i1", "u8")
        if _is_float(src) and _is_float(dst):
            widen = _FLOAT_WIDTH[dst] > _FLOAT_WIDTH[src]
            return b.fpext(x, t) if widen else b.fptrunc(x, t)
        if _is_float(src):
            return b.fptosi(x, t)
        if _is_float(dst):
            return b.uitofp(x, t) if unsigned else b.sitofp(x, t)
        if unsigned:
            return b.zext(x, t)
        if _TYPES[dst].width > _TYPES[src].width:
            return b.sext(x, t)
        return b.trunc(x, t)


def _loads(e: ir.Expr) -> bool:
    return any(isinstance(n, ir.Load) for n in nodes(e))


def _free_reads(s: ir.For, outer: set[str]) -> list[str]:
    """Names the loop reads that are defined outside it, in a stable order."""
    names: set[str] = set()
    reads([s.body, s.start, s.end], names)
    local = declared(s.body) | {s.var.name}
    return sorted(n for n in names if n in outer and n not in local)
