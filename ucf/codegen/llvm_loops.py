"""The hints a loop's latch carries into LLVM (``!llvm.loop``): an unroll count, the
vectorizer's go-ahead, and the alignment of an innermost loop's first instruction.

**Alignment.** LLVM places an innermost loop at a 16-byte boundary on x86, so a loop
of 17 to 64 bytes may straddle a 64-byte line of code, and where it does, each of
its iterations takes two fetches of the front end instead of one. Banded SpMV (2M
rows of 15, ucf's default kernel, one Zen 4 thread, process CPU time, load 8-9) runs
its rows in a loop of 24 bytes that LLVM put at 48 bytes into a line: 19.1-19.7 ms,
the same assembly moved to a line's start 16.4-17.1 ms, GCC's kernel for the same
code (its loop inside a line by chance) 17.3-18.1 (bench/README.md, "Banded SpMV
and where its row loop lies"). So every innermost loop starts a line (``ALIGN``);
the padding before it runs once per entry, a few no-ops.

llvmlite cannot build the ``distinct`` node naming itself that ``!llvm.loop``
requires, so a latch carries a placeholder string node (``tag``), rewritten in the
module's text (``rewrite``).
"""

from __future__ import annotations

import re

from ucf.ir import nodes as ir
from ucf.ir.walk import statements

#: The bytes an innermost loop's start is aligned to: a line of code (x86-64's 64).
ALIGN = 64

_HINT = {
    "unroll": '!"llvm.loop.unroll.count", i32 {}',
    "vectorize": '!"llvm.loop.vectorize.enable", i1 true',
    "align": '!"llvm.loop.align", i32 {}',
}
_PLACEHOLDER = re.compile(r'^(!\d+) = !\{ !"ucf\.loop\.(\d+)\.([\w=,]+)" \}$', re.M)


def hints(s: ir.For | ir.While) -> dict[str, int]:
    """The hints of loop ``s``: its ``unroll`` count, ``vectorize`` for a
    ``CPUVector`` loop (an unrolled loop is not vectorized), ``align`` for a loop with
    no loop inside it."""
    out: dict[str, int] = {}
    if isinstance(s, ir.For) and s.unroll:
        out["unroll"] = s.unroll
    elif isinstance(s, ir.For) and s.parallel == "CPUVector":
        out["vectorize"] = 1
    if not any(isinstance(t, ir.For | ir.While) for t in statements(s.body)):
        out["align"] = ALIGN
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
