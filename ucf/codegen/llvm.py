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
from ucf.codegen.llvm_expressions import Expressions
from ucf.codegen.llvm_openmp import OpenMPLoops
from ucf.codegen.llvm_types import I8P, I32, SIZES, TYPES, is_float, ll_type
from ucf.ir import nodes as ir
from ucf.ir.visit import Visitor, handles
from ucf.passes import pairs


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


class _FunctionBuilder(OpenMPLoops, Expressions, Visitor):
    """One LLIR function as LLVM IR, one handler per node class: the statements here,
    the expressions in ``Expressions``, the parallel loops in ``OpenMPLoops``."""

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
