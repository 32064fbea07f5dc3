"""LLIR as text: typed, one statement per line, for `--print llir` and debugging.

Unlike the C printer it shows LLIR's own vocabulary (typed declarations,
``store+=``, ``for ... in [a, b)``), so what you read is what the code
generators receive.
"""

from __future__ import annotations

from ucf.ir import nodes as ir
from ucf.ir.visit import Visitor, handles


def format_function(fn: ir.Function) -> str:
    params = ", ".join(
        f"{'out ' if p.output else ''}{p.name}: {p.type}{'[]' if p.is_array else ''}"
        for p in fn.params
    )
    lines = [f"func {fn.name}({params}) {{", *_PRINTER.block(fn.body, 1), "}"]
    return "\n".join(lines)


def format_functions(fns: list[ir.Function]) -> str:
    return "\n\n".join(format_function(f) for f in fns) + "\n"


class _Printer(Visitor):
    refusal = "cannot print"

    def block(self, stmts: list[ir.Stmt], depth: int) -> list[str]:
        out: list[str] = []
        for s in stmts:
            out += self.visit(s, depth)
        return out

    # ------------------------------------------------------------- statements

    @handles(ir.Decl)
    def decl(self, s: ir.Decl, depth: int) -> list[str]:
        return [f"{_pad(depth)}let {s.var.name}: {s.var.type} = {expr(s.init)}"]

    @handles(ir.Assign)
    def assign(self, s: ir.Assign, depth: int) -> list[str]:
        return [f"{_pad(depth)}{s.var.name} = {expr(s.value)}"]

    @handles(ir.Store)
    def store(self, s: ir.Store, depth: int) -> list[str]:
        op = ("atomic " if s.atomic else "") + ("store+=" if s.accumulate else "store")
        op = "store release" if s.release else op
        return [f"{_pad(depth)}{op} {s.array.name}[{expr(s.index)}], {expr(s.value)}"]

    @handles(ir.For)
    def for_loop(self, s: ir.For, depth: int) -> list[str]:
        pad = _pad(depth)
        attrs = []
        if s.parallel:
            attrs.append(f"parallel({s.parallel}, {s.strategy or 'NoRaces'})")
        if s.reduction:
            attrs.append("reduce(" + ", ".join(r.name for r in s.reduction) + ")")
        if s.unroll:
            attrs.append(f"unroll({s.unroll})")
        if s.align:
            attrs.append(f"align({s.align})")
        if s.parallel_if is not None:
            attrs.append(f"if({expr(s.parallel_if)})")
        label = f"  # {s.label}" if s.label and s.label != s.var.name else ""
        head = f"{pad}for{' ' if attrs else ''}{' '.join(attrs)} {s.var.name} in "
        head += f"[{expr(s.start)}, {expr(s.end)}) {{{label}"
        lines = [head, *self.block(s.body, depth + 1), f"{pad}}}"]
        if s.prologue or s.epilogue:
            lines = [
                f"{pad}per-thread {{",
                *self.block(s.prologue, depth + 1),
                *["  " + line for line in lines],
                *self.block(s.epilogue, depth + 1),
                f"{pad}}}",
            ]
        return lines

    @handles(ir.While)
    def while_loop(self, s: ir.While, depth: int) -> list[str]:
        pad = _pad(depth)
        label = f"  # {s.label}" if s.label else ""
        return [f"{pad}while {expr(s.cond)} {{{label}", *self.block(s.body, depth + 1), f"{pad}}}"]

    @handles(ir.Alloc)
    def alloc(self, s: ir.Alloc, depth: int) -> list[str]:
        kind = "alloc" if s.zeroed else "alloc uninitialized"
        return [f"{_pad(depth)}{kind} {s.array.name}: {s.array.elem}[{expr(s.size)}]"]

    @handles(ir.Pick)
    def pick(self, s: ir.Pick, depth: int) -> list[str]:
        chosen = f"{expr(s.cond)} ? {s.first.name} : {s.second.name}"
        return [f"{_pad(depth)}let {s.array.name} = {chosen}"]

    @handles(ir.FetchAdd)
    def fetch_add(self, s: ir.FetchAdd, depth: int) -> list[str]:
        add = f"fetch_add {s.array.name}[{expr(s.index)}], {expr(s.value)}"
        return [f"{_pad(depth)}let {s.var.name}: {s.var.type} = {add}"]

    @handles(ir.Free)
    def free(self, s: ir.Free, depth: int) -> list[str]:
        return [f"{_pad(depth)}free {s.array.name}"]

    @handles(ir.Prefetch)
    def prefetch(self, s: ir.Prefetch, depth: int) -> list[str]:
        return [f"{_pad(depth)}prefetch {s.array.name}[{expr(s.index)}]"]

    @handles(ir.Pause)
    def pause(self, s: ir.Pause, depth: int) -> list[str]:
        return [f"{_pad(depth)}pause"]

    @handles(ir.Yield)
    def yield_(self, s: ir.Yield, depth: int) -> list[str]:
        return [f"{_pad(depth)}sched_yield"]

    @handles(ir.Call)
    def call(self, s: ir.Call, depth: int) -> list[str]:
        args = ", ".join(a.name if isinstance(a, ir.Array) else expr(a) for a in s.args)
        return [f"{_pad(depth)}call {s.name}({args})"]

    @handles(ir.If)
    def if_stmt(self, s: ir.If, depth: int) -> list[str]:
        pad = _pad(depth)
        lines = [f"{pad}if {expr(s.cond)} {{", *self.block(s.then, depth + 1)]
        if s.orelse:
            lines += [f"{pad}}} else {{", *self.block(s.orelse, depth + 1)]
        return [*lines, f"{pad}}}"]

    @handles(ir.Comment)
    def comment(self, s: ir.Comment, depth: int) -> list[str]:
        return [f"{_pad(depth)}# {s.text}"]

    # ------------------------------------------------------------ expressions

    @handles(ir.Var)
    def var(self, e: ir.Var) -> str:
        return e.name

    @handles(ir.Const)
    def const(self, e: ir.Const) -> str:
        return f"{e.value}:{e.type}"

    @handles(ir.Load)
    def load(self, e: ir.Load) -> str:
        return f"{'acquire ' if e.acquire else ''}{e.array.name}[{expr(e.index)}]"

    @handles(ir.VLoad)
    def vload(self, e: ir.VLoad) -> str:
        return f"{e.array.name}[{expr(e.index)} : +{e.lanes}]"

    @handles(ir.Splat)
    def splat(self, e: ir.Splat) -> str:
        return f"splat{e.lanes}({expr(e.operand)})"

    @handles(ir.Lane)
    def lane(self, e: ir.Lane) -> str:
        return f"lane({expr(e.operand)}, {e.index})"

    @handles(ir.PairDot)
    def pair_dot(self, e: ir.PairDot) -> str:
        return f"pairdot({expr(e.left)}, {expr(e.right)})"

    @handles(ir.QuadDot)
    def quad_dot(self, e: ir.QuadDot) -> str:
        return f"quaddot({expr(e.unsigned)}, {expr(e.signed)}, {expr(e.addend)})"

    @handles(ir.FMA)
    def fma(self, e: ir.FMA) -> str:
        return f"fma({expr(e.left)}, {expr(e.right)}, {expr(e.addend)})"

    @handles(ir.Bin)
    def binary(self, e: ir.Bin) -> str:
        if e.op in ("min", "max"):
            return f"{e.op}({expr(e.left)}, {expr(e.right)})"
        return f"({expr(e.left)} {e.op} {expr(e.right)})"

    @handles(ir.Neg)
    def neg(self, e: ir.Neg) -> str:
        return f"-{expr(e.operand)}"

    @handles(ir.Cmp, ir.Logic)
    def compare(self, e: ir.Cmp | ir.Logic) -> str:
        return f"({expr(e.left)} {e.op} {expr(e.right)})"

    @handles(ir.Cast)
    def cast(self, e: ir.Cast) -> str:
        return f"{e.type}({expr(e.operand)})"

    @handles(ir.Select)
    def select(self, e: ir.Select) -> str:
        return f"select({expr(e.cond)}, {expr(e.if_true)}, {expr(e.if_false)})"

    @handles(ir.Math)
    def math(self, e: ir.Math) -> str:
        return f"{e.fn}({expr(e.operand)})"

    @handles(ir.Bits)
    def bits(self, e: ir.Bits) -> str:
        return f"{e.fn}({expr(e.operand)})"


def _pad(depth: int) -> str:
    return "  " * depth


_PRINTER = _Printer()


def expr(e: ir.Expr) -> str:
    """One expression as text."""
    return _PRINTER.visit(e)
