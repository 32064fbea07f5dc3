"""LLIR as text: typed, one statement per line, for `--print llir` and debugging.

Unlike the C printer it shows LLIR's own vocabulary (typed declarations,
``store+=``, ``for ... in [a, b)``), so what you read is what the code
generators receive.
"""

from __future__ import annotations

from ucf.ir import nodes as ir


def format_function(fn: ir.Function) -> str:
    params = ", ".join(
        f"{'out ' if p.output else ''}{p.name}: {p.type}{'[]' if p.is_array else ''}"
        for p in fn.params
    )
    lines = [f"func {fn.name}({params}) {{", *_block(fn.body, 1), "}"]
    return "\n".join(lines)


def format_functions(fns: list[ir.Function]) -> str:
    return "\n\n".join(format_function(f) for f in fns) + "\n"


def _block(stmts: list[ir.Stmt], depth: int) -> list[str]:
    out: list[str] = []
    for s in stmts:
        out += _stmt(s, depth)
    return out


def _stmt(s: ir.Stmt, depth: int) -> list[str]:
    pad = "  " * depth
    if isinstance(s, ir.Decl):
        return [f"{pad}let {s.var.name}: {s.var.type} = {expr(s.init)}"]
    if isinstance(s, ir.Assign):
        return [f"{pad}{s.var.name} = {expr(s.value)}"]
    if isinstance(s, ir.Store):
        op = ("atomic " if s.atomic else "") + ("store+=" if s.accumulate else "store")
        return [f"{pad}{op} {s.array.name}[{expr(s.index)}], {expr(s.value)}"]
    if isinstance(s, ir.For):
        return _for(s, depth)
    if isinstance(s, ir.While):
        label = f"  # {s.label}" if s.label else ""
        return [f"{pad}while {expr(s.cond)} {{{label}", *_block(s.body, depth + 1), f"{pad}}}"]
    if isinstance(s, ir.Alloc):
        return [f"{pad}alloc {s.array.name}: {s.array.elem}[{expr(s.size)}]"]
    if isinstance(s, ir.Free):
        return [f"{pad}free {s.array.name}"]
    if isinstance(s, ir.Call):
        args = ", ".join(a.name if isinstance(a, ir.Array) else expr(a) for a in s.args)
        return [f"{pad}call {s.name}({args})"]
    if isinstance(s, ir.If):
        lines = [f"{pad}if {expr(s.cond)} {{", *_block(s.then, depth + 1)]
        if s.orelse:
            lines += [f"{pad}}} else {{", *_block(s.orelse, depth + 1)]
        return [*lines, f"{pad}}}"]
    if isinstance(s, ir.Comment):
        return [f"{pad}# {s.text}"]
    raise TypeError(f"cannot print {type(s).__name__}")


def _for(s: ir.For, depth: int) -> list[str]:
    pad = "  " * depth
    attrs = []
    if s.parallel:
        attrs.append(f"parallel({s.parallel}, {s.strategy or 'NoRaces'})")
    if s.reduction:
        attrs.append("reduce(" + ", ".join(r.name for r in s.reduction) + ")")
    if s.unroll:
        attrs.append(f"unroll({s.unroll})")
    if s.parallel_if is not None:
        attrs.append(f"if({expr(s.parallel_if)})")
    label = f"  # {s.label}" if s.label and s.label != s.var.name else ""
    head = f"{pad}for{' ' if attrs else ''}{' '.join(attrs)} {s.var.name} in "
    head += f"[{expr(s.start)}, {expr(s.end)}) {{{label}"
    lines = [head, *_block(s.body, depth + 1), f"{pad}}}"]
    if s.prologue or s.epilogue:
        lines = [
            f"{pad}per-thread {{",
            *_block(s.prologue, depth + 1),
            *["  " + line for line in lines],
            *_block(s.epilogue, depth + 1),
            f"{pad}}}",
        ]
    return lines


def expr(e: ir.Expr) -> str:
    if isinstance(e, ir.Var):
        return e.name
    if isinstance(e, ir.Const):
        return f"{e.value}:{e.type}"
    if isinstance(e, ir.Load):
        return f"{e.array.name}[{expr(e.index)}]"
    if isinstance(e, ir.VLoad):
        return f"{e.array.name}[{expr(e.index)} : +{e.lanes}]"
    if isinstance(e, ir.Splat):
        return f"splat{e.lanes}({expr(e.operand)})"
    if isinstance(e, ir.Lane):
        return f"lane({expr(e.operand)}, {e.index})"
    if isinstance(e, ir.PairDot):
        return f"pairdot({expr(e.left)}, {expr(e.right)})"
    if isinstance(e, ir.QuadDot):
        return f"quaddot({expr(e.unsigned)}, {expr(e.signed)}, {expr(e.addend)})"
    if isinstance(e, ir.FMA):
        return f"fma({expr(e.left)}, {expr(e.right)}, {expr(e.addend)})"
    if isinstance(e, ir.Bin):
        if e.op in ("min", "max"):
            return f"{e.op}({expr(e.left)}, {expr(e.right)})"
        return f"({expr(e.left)} {e.op} {expr(e.right)})"
    if isinstance(e, ir.Neg):
        return f"-{expr(e.operand)}"
    if isinstance(e, ir.Cmp | ir.Logic):
        return f"({expr(e.left)} {e.op} {expr(e.right)})"
    if isinstance(e, ir.Cast):
        return f"{e.type}({expr(e.operand)})"
    if isinstance(e, ir.Select):
        return f"select({expr(e.cond)}, {expr(e.if_true)}, {expr(e.if_false)})"
    if isinstance(e, ir.Math):
        return f"{e.fn}({expr(e.operand)})"
    raise TypeError(f"cannot print {type(e).__name__}")
