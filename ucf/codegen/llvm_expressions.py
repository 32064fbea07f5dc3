"""LLVM IR for LLIR's expressions: one handler per expression node, part of the LLVM
code generator's function builder (``ucf.codegen.llvm``) as ``OpenMPLoops`` is.

Split out of the builder, which keeps the function, its blocks and the statements:
an expression is built where the builder stands (``self.b``) and gives its value.
Strict floating point, C's answers on NaN, a fused multiply-add exactly rounded, and
the instructions a host has (``pmaddwd``, ``vpdpbusd``) as their intrinsics; loads
that may read past an end are evaluated only on the side that is taken.
"""

from __future__ import annotations

from llvmlite import ir as ll

from ucf.codegen.llvm_types import FLOAT_WIDTH, I32, SIZES, TYPES, is_float, ll_type
from ucf.ir import nodes as ir
from ucf.ir.visit import handles
from ucf.ir.walk import nodes
from ucf.passes import pairs

#: libm functions LLVM has no intrinsic for: called by name (``tanhf``, ``erf``).
LIBM_ONLY = ("tanh", "erf")


class Expressions:
    """Part of the LLVM function builder: its expressions. The builder provides the
    instruction builder (``b``), the function (``func``), the arguments and variables'
    slots (``args``, ``slots``), ``expr`` and ``_extern``, and whether the CPU has VNNI
    (``vnni``, ``vnni512``)."""

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
        value_true, then_end = self._arm(then, e.if_true, merge)
        value_false, orelse_end = self._arm(orelse, e.if_false, merge)
        b.position_at_end(merge)
        phi = b.phi(value_true.type)
        phi.add_incoming(value_true, then_end)
        phi.add_incoming(value_false, orelse_end)
        return phi

    def _arm(self, block: ll.Block, e: ir.Expr, merge: ll.Block) -> tuple[ll.Value, ll.Block]:
        """``e``'s value built in ``block`` (one side of a branch), which then goes on to
        ``merge``, and the block it ends in (``e``'s own branches may leave ``block``)."""
        self.b.position_at_end(block)
        value = self.expr(e)
        end = self.b.block
        self.b.branch(merge)
        return value, end

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
        right, rhs_end = self._arm(rhs, e.right, merge)
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
