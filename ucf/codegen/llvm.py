"""LLVM IR from LLIR, built with llvmlite.

Every LLIR variable becomes an entry-block alloca; the O3 pipeline promotes
them to registers.  Array parameters carry ``noalias``, which is what lets
LLVM hoist bounds and vectorize the inner loops, like ``restrict`` in the C
target.  Floating point stays strict, and a fused
multiply-add (``ir.FMA``) is the exactly rounded ``llvm.fma`` intrinsic, so both
targets round identically.
"""

from __future__ import annotations

import sys
from functools import cache

from llvmlite import ir as ll

from ucf.codegen import llvm_loops
from ucf.codegen.llvm_openmp import OpenMPLoops
from ucf.codegen.llvm_types import FLOAT_WIDTH, I8P, I32, SIZES, TYPES, is_float, ll_type
from ucf.ir import nodes as ir
from ucf.ir.visit import Visitor, handles
from ucf.ir.walk import nodes
from ucf.passes import pairs

#: libm functions LLVM has no intrinsic for: called by name (``tanhf``, ``erf``).
LIBM_ONLY = ("tanh", "erf")


def module(
    fns: list[ir.Function], name: str = "ucf", openmp: bool = True, features: str | None = None
) -> str:
    """LLVM IR text; ``openmp=False`` emits CPUThread loops serially (no libgomp here).
    ``features`` are those of the CPU the IR is for, as LLVM spells them (the host's by
    default, which the JIT compiles for): they decide whether ``ir.QuadDot`` is VNNI's
    instruction or its expansion."""
    mod = ll.Module(name=name)
    features = pairs.host_features() if features is None else features
    vnni = (pairs.vnni(features), pairs.vnni512(features))
    for fn in fns:
        _FunctionBuilder(mod, fn, openmp, vnni).build()
    return llvm_loops.rewrite(str(mod))


@cache
def _x86() -> bool:
    """Whether the process the JIT compiles for is x86 (``ucf.toolchain.jit`` gives each
    module the process's triple)."""
    import llvmlite.binding as llvm

    return llvm.get_process_triple().split("-")[0] in ("x86_64", "i386", "i486", "i586", "i686")


class _FunctionBuilder(OpenMPLoops, Visitor):
    """One LLIR function as LLVM IR, one handler per node class."""

    refusal = "no LLVM for"
    #: Emit a statement (``stmt(s)``), or build an expression's value (``expr(e)``).
    stmt = expr = Visitor.visit

    def __init__(
        self,
        mod: ll.Module,
        fn: ir.Function | None,
        openmp: bool = True,
        vnni: tuple[bool, bool] = (False, False),
    ):
        self.mod = mod
        self.openmp = openmp
        # the CPU runs vpdpbusd on 256-bit vectors, and on 512-bit ones (ucf.passes.pairs)
        self.vnni, self.vnni512 = vnni
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
            ll.PointerType(TYPES[p.type]) if p.is_array else TYPES[p.type] for p in fn.params
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

    def slot(self, var: ir.Var) -> ll.AllocaInstr:
        if var.name not in self.slots:
            self.slots[var.name] = self.alloca_builder.alloca(ll_type(var.type), name=var.name)
        return self.slots[var.name]

    # statements
    def block(self, stmts: list[ir.Stmt]) -> None:
        for s in stmts:
            self.stmt(s)

    @handles(ir.Decl)
    def decl(self, s: ir.Decl) -> None:
        self.b.store(self.expr(s.init), self.slot(s.var))

    @handles(ir.Assign)
    def assign(self, s: ir.Assign) -> None:
        self.b.store(self.expr(s.value), self.slot(s.var))

    @handles(ir.Store)
    def store(self, s: ir.Store) -> None:
        b = self.b
        ptr = self.element_ptr(s.array, s.index, ir.lanes(s.value.type))
        value = self.expr(s.value)
        align = SIZES[s.array.elem]
        if s.release:
            b.store_atomic(value, ptr, "release", align)
            return
        if s.atomic:
            op = "fadd" if is_float(s.array.elem) else "add"
            b.atomic_rmw(op, ptr, value, "monotonic")
            return
        if s.accumulate:
            old = b.load(ptr, align=align)
            value = b.fadd(old, value) if is_float(s.array.elem) else b.add(old, value)
        b.store(value, ptr, align=align)

    @handles(ir.For)
    def loop(self, s: ir.For) -> None:
        if s.parallel == "CPUThread" and self.openmp:
            self.parallel_for(s)
        else:
            self.block(s.prologue)
            self.for_loop(s)
            self.block(s.epilogue)

    @handles(ir.Alloc)
    def alloc(self, s: ir.Alloc) -> None:
        b = self.b
        t = TYPES[s.array.elem]
        size = b.select(
            b.icmp_signed(">", self.expr(s.size), ll.Constant(TYPES["i64"], 0)),
            self.expr(s.size),
            ll.Constant(TYPES["i64"], 1),
        )
        i64, elem = TYPES["i64"], SIZES[s.array.elem]
        # ir.ALIGN bytes more than asked (calloc aligns to 16 only), the array from
        # the first boundary on (a GEP, so the pointer keeps calloc's provenance).
        size = b.add(size, ll.Constant(i64, ir.ALIGN // elem))
        nbytes, mask = b.mul(size, ll.Constant(i64, elem)), ll.Constant(i64, ir.ALIGN - 1)
        if s.zeroed:
            calloc = self._extern("calloc", I8P, [i64, i64])
            raw = b.call(calloc, [size, ll.Constant(i64, elem)])
        elif s.huge:  # a huge page more where it takes one, the array from its boundary
            big = b.icmp_signed(">=", nbytes, ll.Constant(i64, ir.HUGE_BYTES))
            pad = b.select(big, ll.Constant(i64, ir.HUGE_BYTES), ll.Constant(i64, 0))
            raw = b.call(self._extern("malloc", I8P, [i64]), [b.add(nbytes, pad)])
            mask = b.select(big, ll.Constant(i64, ir.HUGE_BYTES - 1), mask)
        else:
            raw = b.call(self._extern("malloc", I8P, [i64]), [nbytes])
        self.raw[s.array.name] = raw
        start = b.gep(raw, [b.and_(b.neg(b.ptrtoint(raw, i64)), mask)])
        if s.huge and not s.zeroed and sys.platform.startswith("linux"):
            self.advise_huge(start, nbytes)
        self.args[s.array.name] = b.bitcast(start, ll.PointerType(t), name=s.array.name)

    def advise_huge(self, start: ll.Value, nbytes: ll.Value) -> None:
        """The whole huge pages of ``nbytes`` from ``start`` made transparent huge pages
        (``ir.Alloc.huge``): marked so (``MADV_HUGEPAGE``), and collapsed now
        (``MADV_COLLAPSE``: malloc reuses memory already mapped in small pages, which
        the mark alone leaves so until the OS's background scan). An OS without either
        refuses it, and the array stays as it is."""
        b, i64 = self.b, TYPES["i64"]
        whole = b.and_(nbytes, ll.Constant(i64, ~(ir.HUGE_BYTES - 1)))
        madvise = self._extern("madvise", I32, [I8P, i64, I32])
        with b.if_then(b.icmp_signed(">", whole, ll.Constant(i64, 0))):
            for advice in (ir.MADV_HUGEPAGE, ir.MADV_COLLAPSE):
                b.call(madvise, [start, whole, ll.Constant(I32, advice)])

    @handles(ir.Pick)
    def pick(self, s: ir.Pick) -> None:
        first, second = self.args[s.first.name], self.args[s.second.name]
        self.args[s.array.name] = self.b.select(self.expr(s.cond), first, second)

    @handles(ir.FetchAdd)
    def fetch_add(self, s: ir.FetchAdd) -> None:
        ptr = self.element_ptr(s.array, s.index, 1)
        old = self.b.atomic_rmw("add", ptr, self.expr(s.value), "acq_rel")
        self.b.store(old, self.slot(s.var))

    @handles(ir.Free)
    def free(self, s: ir.Free) -> None:
        free = self._extern("free", ll.VoidType(), [I8P])
        self.b.call(free, [self.raw[s.array.name]])

    @handles(ir.Prefetch)
    def prefetch(self, s: ir.Prefetch) -> None:
        """``llvm.prefetch`` for reading, into the cache level asked for, of data (as
        C's ``__builtin_prefetch(p, 0, locality)``). The address is not ``inbounds``: a prefetch may
        point past the array (``ucf.passes.streams``), which an ``inbounds`` address
        would make poison."""
        i32 = ll.IntType(32)
        f = self._extern("llvm.prefetch.p0", ll.VoidType(), [I8P, i32, i32, i32])
        at = self.b.bitcast(self.b.gep(self.args[s.array.name], [self.expr(s.index)]), I8P)
        self.b.call(f, [at, ll.Constant(i32, 0), ll.Constant(i32, s.locality), ll.Constant(i32, 1)])

    @handles(ir.Pause)
    def pause(self, s: ir.Pause) -> None:
        """x86's ``pause`` where the JIT compiles for x86 (the process's triple); no
        instruction elsewhere, where the intrinsic does not exist."""
        if _x86():
            self.b.call(self._extern("llvm.x86.sse2.pause", ll.VoidType(), []), [])

    @handles(ir.Yield)
    def yield_(self, s: ir.Yield) -> None:
        self.b.call(self._extern("sched_yield", I32, []), [])

    @handles(ir.Call)
    def call(self, s: ir.Call) -> None:
        callee = self.mod.globals[s.name]
        args = [self.args[a.name] if isinstance(a, ir.Array) else self.expr(a) for a in s.args]
        self.b.call(callee, args)

    @handles(ir.Comment)
    def comment(self, s: ir.Comment) -> None:
        pass

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
        b.store(b.add(b.load(var), ll.Constant(TYPES["i64"], 1)), var)
        self.hint(s, b.branch(cond))
        b.position_at_end(exit_)

    def hint(self, s: ir.For, latch: ll.Instruction) -> None:
        """Give the loop ``s``, whose latch is ``latch``, its hints (``llvm_loops``)."""
        found = llvm_loops.hints(s)
        if found:
            tag = llvm_loops.tag(len(self.mod.metadata), found)
            latch.set_metadata(
                "llvm.loop", self.mod.add_metadata([ll.MetaDataString(self.mod, tag)])
            )

    @handles(ir.While)
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

    @handles(ir.If)
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
    @handles(ir.Var)
    def var(self, e: ir.Var) -> ll.Value:
        if e.name in self.args:
            return self.args[e.name]
        if e.name not in self.slots:
            raise ValueError(f"LLIR reads variable {e.name} before declaring it")
        return self.b.load(self.slots[e.name])

    @handles(ir.Const)
    def const(self, e: ir.Const) -> ll.Value:
        value = bool(e.value) if e.type == "i1" else e.value
        if is_float(e.type):
            value = float(value)
        return ll.Constant(TYPES[e.type], value)

    @handles(ir.Load)
    def load(self, e: ir.Load) -> ll.Value:
        ptr = self.b.gep(self.args[e.array.name], [self.expr(e.index)], inbounds=True)
        if e.acquire:
            return self.b.load_atomic(ptr, "acquire", SIZES[e.array.elem])
        return self.b.load(ptr)

    @handles(ir.VLoad)
    def vload(self, e: ir.VLoad) -> ll.Value:
        ptr = self.element_ptr(e.array, e.index, e.lanes)
        return self.b.load(ptr, align=SIZES[e.array.elem])

    @handles(ir.Splat)
    def splat(self, e: ir.Splat) -> ll.Value:
        b, t = self.b, ll_type(e.type)
        one = b.insert_element(ll.Constant(t, ll.Undefined), self.expr(e.operand), I32(0))
        return b.shuffle_vector(
            one,
            ll.Constant(t, ll.Undefined),
            ll.Constant(ll.VectorType(I32, e.lanes), [0] * e.lanes),
        )

    @handles(ir.Lane)
    def lane(self, e: ir.Lane) -> ll.Value:
        return self.b.extract_element(self.expr(e.operand), I32(e.index))

    @handles(ir.Neg)
    def neg(self, e: ir.Neg) -> ll.Value:
        x = self.expr(e.operand)
        return self.b.fneg(x) if is_float(e.type) else self.b.neg(x)

    @handles(ir.Cmp)
    def compare(self, e: ir.Cmp) -> ll.Value:
        left, right = self.expr(e.left), self.expr(e.right)
        if is_float(e.left.type):
            # C's != is true when either side is NaN (unordered); its other
            # comparisons are false then (ordered): the C target's answers.
            if e.op == "!=":
                return self.b.fcmp_unordered(e.op, left, right)
            return self.b.fcmp_ordered(e.op, left, right)
        return self.b.icmp_signed(e.op, left, right)

    @handles(ir.Cast)
    def conversion(self, e: ir.Cast) -> ll.Value:
        return self.cast(self.expr(e.operand), e.operand.type, e.type)

    @handles(ir.Select)
    def select(self, e: ir.Select) -> ll.Value:
        if _loads(e.if_true) or _loads(e.if_false):
            return self.guarded_select(e)
        return self.b.select(self.expr(e.cond), self.expr(e.if_true), self.expr(e.if_false))

    def element_ptr(self, array: ir.Array, index: ir.Expr, lanes: int) -> ll.Value:
        """The address of ``array[index]``, typed for ``lanes`` elements from there on."""
        ptr = self.b.gep(self.args[array.name], [self.expr(index)], inbounds=True)
        if lanes == 1:
            return ptr
        return self.b.bitcast(ptr, ll.PointerType(ll_type(ir.vector(array.elem, lanes))))

    @handles(ir.Math)
    def math(self, e: ir.Math) -> ll.Value:
        """LLVM's intrinsic where it has one (it can vectorize or fold it); else libm's
        function, which the JIT finds in the process and a C program links with -lm."""
        t = TYPES[e.type]
        if e.fn in LIBM_ONLY:
            name = f"{e.fn}f" if e.type == "f32" else e.fn
        else:
            name = f"llvm.{e.fn}.{e.type}"
        return self.b.call(self._extern(name, t, [t]), [self.expr(e.operand)])

    @handles(ir.Bits)
    def bits(self, e: ir.Bits) -> ll.Value:
        """``llvm.cttz`` with zero defined (64: one ``tzcnt``), ``llvm.ctpop``, ``x & (x -
        1)`` (one ``blsr``), ``1 << n``; LLVM's integers wrap, so none is undefined."""
        t = TYPES[e.type]
        x = self.expr(e.operand)
        if e.fn == "ctz":
            fn = self._extern(f"llvm.cttz.{e.type}", t, [t, ll.IntType(1)])
            return self.b.call(fn, [x, ll.Constant(ll.IntType(1), 0)])
        if e.fn == "popcount":
            return self.b.call(self._extern(f"llvm.ctpop.{e.type}", t, [t]), [x])
        if e.fn == "blsr":
            return self.b.and_(x, self.b.sub(x, ll.Constant(t, 1)))
        return self.b.shl(ll.Constant(t, 1), x)

    @handles(ir.FMA)
    def fma(self, e: ir.FMA) -> ll.Value:
        """LLVM's ``llvm.fma`` intrinsic, exactly rounded as C's ``fma``: one ``vfmadd``
        on a host with FMA3, for a scalar or a vector."""
        n, t = ir.lanes(e.type), ll_type(e.type)
        name = f"llvm.fma.{ir.element(e.type) if n == 1 else f'v{n}{ir.element(e.type)}'}"
        args = [self.expr(e.left), self.expr(e.right), self.expr(e.addend)]
        return self.b.call(self._extern(name, t, [t, t, t]), args)

    @handles(ir.PairDot)
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
        pmaddwd = self._extern("llvm.x86.avx2.pmadd.wd", ll_type(e.type), [halves, halves])
        return self.b.call(pmaddwd, [left, right])

    @handles(ir.QuadDot)
    def quad_dot(self, e: ir.QuadDot) -> ll.Value:
        """VNNI's ``vpdpbusd`` intrinsic on a CPU that has it: ``llvm.x86.avx512.vpdpbusd.512``
        for 16 lanes on AVX-512 VNNI, ``.256`` for 8 (which LLVM selects as AVX-VNNI's VEX
        form when the CPU has only that), and 16 lanes as two of 8 on a CPU with only the
        256-bit form (a kernel for another CPU than the host that cut the tile); elsewhere
        the definition, which LLVM 22 does not fold back into ``vpdpbusd``: the bytes
        widened (zero- and sign-), multiplied, the products of each lane's four bytes
        summed and added to the accumulator, the same values in int32."""
        n = ir.lanes(e.type)
        acc = self.expr(e.addend)
        u, s = self.expr(e.unsigned), self.expr(e.signed)
        if self.vnni512 and n == 16:
            return self._vpdpbusd(acc, u, s, 16)
        if self.vnni and n in (8, 16):
            halves = [self._half(x, h, n) for x in (acc, u, s) for h in range(n // 8)]
            sums = [self._vpdpbusd(*halves[h :: n // 8], 8) for h in range(n // 8)]
            if n == 8:
                return sums[0]
            whole = ll.Constant(ll.VectorType(I32, n), list(range(n)))
            return self.b.shuffle_vector(sums[0], sums[1], whole)
        nbytes = ll.VectorType(ll.IntType(8), 4 * n)
        unsigned, signed = self.b.bitcast(u, nbytes), self.b.bitcast(s, nbytes)
        wide = ll.VectorType(I32, 4 * n)
        products = self.b.mul(self.b.zext(unsigned, wide), self.b.sext(signed, wide))
        for part in range(4):
            lanes = ll.Constant(ll.VectorType(I32, n), [4 * lane + part for lane in range(n)])
            acc = self.b.add(acc, self.b.shuffle_vector(products, products, lanes))
        return acc

    def _vpdpbusd(self, acc: ll.Value, u: ll.Value, s: ll.Value, n: int) -> ll.Value:
        """The ``vpdpbusd`` intrinsic on ``n`` int32 lanes."""
        nbytes, lanes = ll.VectorType(ll.IntType(8), 4 * n), ll.VectorType(I32, n)
        name = f"llvm.x86.avx512.vpdpbusd.{32 * n}"
        fn = self._extern(name, lanes, [lanes, nbytes, nbytes])
        return self.b.call(fn, [acc, self.b.bitcast(u, nbytes), self.b.bitcast(s, nbytes)])

    def _half(self, x: ll.Value, h: int, n: int) -> ll.Value:
        """Lanes ``8h .. 8h + 7`` of an int32 vector of ``n`` lanes (the vector itself if 8)."""
        if n == 8:
            return x
        lanes = ll.Constant(ll.VectorType(I32, 8), [8 * h + i for i in range(8)])
        return self.b.shuffle_vector(x, x, lanes)

    @handles(ir.Bin)
    def binary(self, e: ir.Bin) -> ll.Value:
        b = self.b
        left, right = self.expr(e.left), self.expr(e.right)
        if e.op in ("min", "max"):
            if is_float(e.type):
                cmp = b.fcmp_ordered("<" if e.op == "min" else ">", left, right)
            else:
                cmp = b.icmp_signed("<" if e.op == "min" else ">", left, right)
            return b.select(cmp, left, right)
        if is_float(e.type):
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

    @handles(ir.Logic)
    def short_circuit(self, e: ir.Logic) -> ll.Value:
        """``and``/``or`` evaluate a right side that may read past an end only when needed;
        one that reads nothing and cannot trap (a merge's match flags) always: one branch."""
        b = self.b
        left = self.expr(e.left)
        if not _loads(e.right) and not _divides(e.right):
            return (b.and_ if e.op == "and" else b.or_)(left, self.expr(e.right))
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
        phi = b.phi(TYPES["i1"])
        phi.add_incoming(ll.Constant(TYPES["i1"], e.op == "or"), start)
        phi.add_incoming(right, rhs_end)
        return phi

    def cast(self, x: ll.Value, src: str, dst: str) -> ll.Value:
        b = self.b
        if src == dst:
            return x
        t = ll_type(dst)
        src, dst = ir.element(src), ir.element(dst)
        if src == "bf16":  # exact: bfloat16 is a float32 with its low 16 bits zero
            bits = b.shl(b.zext(x, I32), ll.Constant(I32, 16))
            return self.cast(b.bitcast(bits, TYPES["f32"]), "f32", dst)
        unsigned = src in ("i1", "u8")
        if is_float(src) and is_float(dst):
            widen = FLOAT_WIDTH[dst] > FLOAT_WIDTH[src]
            return b.fpext(x, t) if widen else b.fptrunc(x, t)
        if is_float(src):
            return b.fptosi(x, t)
        if is_float(dst):
            return b.uitofp(x, t) if unsigned else b.sitofp(x, t)
        if unsigned:
            return b.zext(x, t)
        if TYPES[dst].width > TYPES[src].width:
            return b.sext(x, t)
        return b.trunc(x, t)


def _loads(e: ir.Expr) -> bool:
    return any(isinstance(n, ir.Load) for n in nodes(e))


def _divides(e: ir.Expr) -> bool:
    """Whether ``e`` divides by something (an integer division by zero traps)."""
    return any(isinstance(n, ir.Bin) and n.op in "/%" for n in nodes(e))
