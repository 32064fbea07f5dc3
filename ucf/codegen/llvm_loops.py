"""The hints a loop's latch carries into LLVM (``!llvm.loop``): an unroll count, the
vectorizer's go-ahead, and the alignment of the loop's first instruction
(``ir.For.align``, which ``ucf.passes.streams`` sets on a row walk whose streams go
into the L1: a line of code, where LLVM would place it at 16 bytes).

llvmlite cannot build the ``distinct`` node naming itself that ``!llvm.loop``
requires, so a latch carries a placeholder string node (``tag``), rewritten in the
module's text (``rewrite``).
"""

from __future__ import annotations

import re

from ucf.ir import nodes as ir

_HINT = {
    "unroll": '!"llvm.loop.unroll.count", i32 {}',
    "vectorize": '!"llvm.loop.vectorize.enable", i1 true',
    "align": '!"llvm.loop.align", i32 {}',
}
_PLACEHOLDER = re.compile(r'^(!\d+) = !\{ !"ucf\.loop\.(\d+)\.([\w=,]+)" \}$', re.M)


def hints(s: ir.For) -> dict[str, int]:
    """The hints of loop ``s``: its ``unroll`` count, ``vectorize`` for a
    ``CPUVector`` loop (an unrolled loop is not vectorized), its ``align``ment."""
    out: dict[str, int] = {}
    if s.unroll:
        out["unroll"] = s.unroll
    elif s.parallel == "CPUVector":
        out["vectorize"] = 1
    if s.align:
        out["align"] = s.align
    return out


def tag(serial: int, found: dict[str, int]) -> str:
    """The placeholder string of a loop's hints, ``serial`` unique in the module."""
    return f"ucf.loop.{serial}." + ",".join(f"{k}={v}" for k, v in found.items())


def rewrite(text: str) -> str:
    """The module's text with each placeholder node made LLVM's self-referential loop
    node, its hints appended."""
    extra: list[str] = []

    def node(m: re.Match) -> str:
        name, serial, found = m.groups()
        refs = []
        for i, item in enumerate(found.split(",")):
            kind, amount = item.split("=")
            ref = f"!{900000 + 8 * int(serial) + i}"
            extra.append(f"{ref} = !{{{_HINT[kind].format(amount)}}}")
            refs.append(ref)
        return f"{name} = distinct !{{{', '.join([name, *refs])}}}"

    text = _PLACEHOLDER.sub(node, text)
    return text.rstrip("\n") + "\n" + "".join(line + "\n" for line in extra)
