"""numpy's einsum subscripts (``"ij,j->i"``) as a ucf statement.

Users arriving from numpy or torch write ``ucf.einsum("ij,j->i", A, x)``. That
is a product of the operands summed over every index missing from the output,
which is exactly what the index-notation statement ``out(i) = T0(i,j) *
T1(j)`` means, so the subscripts are translated to it and compiled as usual.
"""

from __future__ import annotations

import re

from ucf.errors import ParseError, ShapeError, UnsupportedError

#: The tensor names the translated statement gives the operands, by position.
OPERAND = "T{}"
OUTPUT = "out"

_SPEC = re.compile(r"[A-Za-z]*")


def is_subscripts(text: str) -> bool:
    """Whether ``text`` is numpy-style subscripts rather than a ucf statement."""
    return "=" not in text and "(" not in text


def statement(subscripts: str, ndims: list[int]) -> str:
    """The ucf statement for ``subscripts`` over operands of ``ndims`` dimensions."""
    text = "".join(subscripts.split())
    if "..." in text:
        raise UnsupportedError(
            f"einsum subscripts '{subscripts}': ellipsis ('...') is not supported; name every index"
        )
    inputs, arrow, output = text.partition("->")
    specs = inputs.split(",")
    for spec in [*specs, output]:
        if not _SPEC.fullmatch(spec):
            bad = next(c for c in spec if not c.isalpha())
            at = subscripts.find(bad)
            raise ParseError(
                f"einsum subscripts: '{bad}' is not an index letter", subscripts, 1, at + 1
            )
    if len(specs) != len(ndims):
        raise ShapeError(
            f"einsum subscripts '{subscripts}' name {len(specs)} operands but "
            f"{len(ndims)} were given"
        )
    for k, (spec, n) in enumerate(zip(specs, ndims, strict=True)):
        if len(spec) != n:
            raise ShapeError(
                f"einsum subscripts '{subscripts}': operand {k} has {n} dimensions but "
                f"'{spec}' names {len(spec)}"
            )
    if not arrow:
        letters = "".join(specs)
        output = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    missing = [c for c in output if c not in "".join(specs)]
    if missing or len(set(output)) != len(output):
        what = f"'{missing[0]}' is in no operand" if missing else "an index repeats"
        raise ShapeError(f"einsum subscripts '{subscripts}': in the output, {what}")
    terms = [
        f"{OPERAND.format(k)}({','.join(spec)})" if spec else OPERAND.format(k)
        for k, spec in enumerate(specs)
    ]
    lhs = f"{OUTPUT}({','.join(output)})" if output else OUTPUT
    return f"{lhs} = {' * '.join(terms)}"
