"""Convolutions run on a zero-padded, flattened copy of their input: the default's
answer to small images.

A convolution ``O(n,m,p,q) = I(n,c,p+r-1,q+s-1) * F(m,c,r,s)`` lowered directly runs,
for every stored weight, a loop over the rows ``p`` and inside it a loop over the
columns ``q``, each clipped at the image border. On a 7x7 image that is seven loops of
at most seven iterations per weight, and the loop overhead costs more than the
multiply-adds. Copied into a buffer with the padding written as zeros and rows of
``Wp = |q| + |s| - 1`` columns, laid out one plane after another, the input is read at
``x + Wp*r + s`` for ``x = p*Wp + q``: one loop over the whole plane per weight, with
no bounds to test. The output is computed on the same row pitch (the ``|s| - 1``
extra columns of each row are computed and dropped), and cropped to the user's.

``find`` recognizes the statement once, when the kernel is built; ``Conv.at`` gives the
flattened statement for one call's extents (its row pitch is a constant of the
kernel, so each image width compiles its own).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ucf.format.format import Format
from ucf.lang.affine import Affine
from ucf.lang.ast import Access, Binary, Statement
from ucf.lang.reductions import peel

#: Output rows at least this wide keep the direct kernel. Measured with one thread (CPU
#: time) on bench/conv.py's layers: flattening gains 1.3x to 2.2x at 28, 14 and 7 columns
#: (C11, C17, C23 at 91 % sparsity), nothing at 56 (C3, 91 %), and at 98 % C3 lost 1.9x
#: to the copies into the padded buffer and out of the flattened output.
MAX_WIDTH = 32


@dataclass(frozen=True)
class Conv:
    """A 2-D convolution of a dense input ``inp`` by ``weight`` into a dense output:
    the output's last two variables ``p, q`` read the input's last two modes at
    ``p + r + shift[0]`` and ``q + s + shift[1]``, with ``r, s`` variables of the
    weight only."""

    stmt: Statement
    inp: str
    p: str
    q: str
    r: str
    s: str
    shift: tuple[int, int]

    def formats(self, given: Mapping[str, Format]) -> dict[str, Format]:
        """The formats of the flattened statement: the weight's as given; the input and
        the output are plain dense ones (``find`` checked), of other orders there."""
        return {n: f for n, f in given.items() if n not in (self.inp, self.stmt.lhs.tensor)}

    def at(self, extents: dict[str, int]) -> Flat | None:
        """The flattened statement for a call with ``extents``; None when a loop is empty
        or the rows are long enough already (``MAX_WIDTH``)."""
        p, q, r, s = (extents.get(v, 0) for v in (self.p, self.q, self.r, self.s))
        if min(p, q, r, s) < 1 or q >= MAX_WIDTH:
            return None
        return Flat(self, q + s - 1, p + r - 1, s - 1)


@dataclass(frozen=True)
class Flat:
    """The convolution on rows of ``wp`` columns, ``hp`` rows per plane of the padded
    input, and ``slack`` zeros after each plane for the last row's taps."""

    conv: Conv
    wp: int
    hp: int
    slack: int

    @cached_property
    def x(self) -> str:
        """The flattened pixel variable: a name the statement does not use (worked out
        once: every call's extents name it)."""
        used = {v for a in (self.conv.stmt.lhs, *_factors(self.conv.stmt)) for v in _vars(a)}
        name = "x"
        while name in used:
            name += "_"
        return name

    @property
    def plane(self) -> int:
        return self.hp * self.wp + self.slack

    @cached_property
    def expr(self) -> str:
        c = self.conv
        x = Affine.var(self.x)
        lhs = Access(c.stmt.lhs.tensor, (*c.stmt.lhs.indices[:-2], x))
        at = x + Affine.var(c.r).scale(self.wp) + Affine.var(c.s)
        factors = [
            Access(a.tensor, (*a.indices[:-2], at)) if a.tensor == c.inp else a
            for a in _factors(c.stmt)
        ]
        return str(Statement(lhs, "=", Binary("*", *factors)))

    @property
    def why(self) -> str:
        c = self.conv
        return (
            f"default: {c.inp} is copied into zero-padded planes of {self.hp} rows of "
            f"{self.wp} columns and {c.p}, {c.q} flattened into {self.x} = {c.p}*{self.wp} + "
            f"{c.q}, so each weight runs one loop over a whole output plane with no border "
            "tests (ucf.exec.padded_conv); the extra columns are computed and dropped"
        )

    def extents(self, extents: dict[str, int]) -> dict[str, int]:
        """The flattened statement's extents: ``p, q`` replaced by the plane's pixels."""
        c = self.conv
        new = {v: n for v, n in extents.items() if v not in (c.p, c.q)}
        new[self.x] = extents[c.p] * self.wp
        return new

    def pad(self, a: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """``a`` (the input, any leading modes) in its padded planes, flattened."""
        buf = np.zeros((*a.shape[:-2], self.plane), dtype)
        self.fill(buf, a)
        return buf

    def fill(self, buf: np.ndarray, a: np.ndarray) -> None:
        """Copy ``a`` into ``buf``'s planes, leaving the padding as it is (zero): a
        replayed call refills the buffer of the call it replays."""
        lead, (h, w) = a.shape[:-2], a.shape[-2:]
        planes = buf[..., : self.hp * self.wp].reshape(*lead, self.hp, self.wp)
        sh, sw = self.conv.shift
        # Padded row i holds input row i + sh, when that is a row of the input.
        i0, i1 = max(0, -sh), min(self.hp, h - sh)
        j0, j1 = max(0, -sw), min(self.wp, w - sw)
        if i0 < i1 and j0 < j1:
            planes[..., i0:i1, j0:j1] = a[..., i0 + sh : i1 + sh, j0 + sw : j1 + sw]

    def crop(self, vals: np.ndarray, shape: tuple[int, ...], extents: dict[str, int]):
        """The user's output from the flattened one's values (of ``shape``): rows of
        ``wp`` columns cut to ``|q|``."""
        c = self.conv
        p, q = extents[c.p], extents[c.q]
        return vals.reshape(*shape[:-1], p, self.wp)[..., :q]


def _factors(stmt: Statement) -> tuple[Access, Access]:
    body = peel(stmt.rhs)[1]
    return body.left, body.right


def _vars(a: Access) -> set[str]:
    return {v for i in a.indices for v in i.variables}


def _plain_dense(fmt: Format | None, order: int) -> bool:
    """Dense levels in mode order holding plain values: the layout ``pad`` reads and
    the crop writes."""
    if fmt is None:
        return True
    return (
        fmt.is_dense
        and fmt.values is None
        and not fmt.blocked
        and fmt.structure == Format.dense(order).structure
    )


def find(stmt: Statement, formats: Mapping[str, Format]) -> Conv | None:
    """The convolution ``stmt`` is, if it is one ``Conv`` describes with a dense input
    and output (any weight format); None otherwise. It takes the parsed statement (a
    kernel's plan holds it), so that a kernel loaded from the cache parses nothing."""
    rhs, lhs = peel(stmt.rhs)[1], stmt.lhs
    if stmt.op != "=" or not (
        isinstance(rhs, Binary)
        and rhs.op == "*"
        and isinstance(rhs.left, Access)
        and isinstance(rhs.right, Access)
    ):
        return None
    out_vars = [i.single_variable for i in lhs.indices]
    if len(out_vars) < 3 or None in out_vars or len(set(out_vars)) != len(out_vars):
        return None
    p, q = out_vars[-2:]
    for inp, weight in ((rhs.left, rhs.right), (rhs.right, rhs.left)):
        found = _match(stmt, inp, weight, p, q)
        if found is None:
            continue
        names = {lhs.tensor, inp.tensor, weight.tensor}
        if len(names) == 3 and all(
            _plain_dense(formats.get(a.tensor), len(a.indices)) for a in (lhs, inp)
        ):
            return found
    return None


def _match(stmt: Statement, inp: Access, weight: Access, p: str, q: str) -> Conv | None:
    """``inp`` read at ``p + r + a, q + s + b`` in its last two modes, plain variables
    elsewhere, with ``r, s`` plain indices of ``weight`` only."""
    if len(inp.indices) < 3 or any(i.single_variable is None for i in weight.indices):
        return None
    taps = []
    for idx, v in zip(inp.indices[-2:], (p, q), strict=True):
        others = [w for w in idx.variables if w != v]
        if idx.coefficient(v) != 1 or len(others) != 1 or idx.coefficient(others[0]) != 1:
            return None
        taps.append((others[0], idx.const))
    (r, sh), (s, sw) = taps
    spatial = {p, q, r, s}
    if len(spatial) != 4:
        return None
    lead = [i.single_variable for i in inp.indices[:-2]]
    out_lead = {i.single_variable for i in stmt.lhs.indices[:-2]}
    weight_vars = _vars(weight)
    if None in lead or spatial & (set(lead) | out_lead) or {p, q} & weight_vars:
        return None
    if not {r, s} <= weight_vars:
        return None
    return Conv(stmt, inp.tensor, p, q, r, s, (sh, sw))
