"""A program (``ucf.program``): statements that define each tensor once, read as a
data-flow graph (``ucf.tesa.graph``), with what a user does with it: propagate its
attributes, and turn it into an execution plan.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from ucf.errors import ArgumentError, OperandError, ProgramError, ShapeError, boundary
from ucf.lang.parser import parse_statement
from ucf.tesa.attribute import TeSA
from ucf.tesa.graph import Graph, statement_nodes
from ucf.tesa.plan import ProgramPlan
from ucf.tesa.policy import Policy
from ucf.tesa.propagation import propagate
from ucf.tesa.transform import transform


class Program(Graph):
    """Statements in SSA form with a shape and an attribute for every tensor."""

    def __repr__(self) -> str:
        head = f"Program(inputs {', '.join(self.inputs)}; outputs {', '.join(self.outputs)})"
        return "\n".join([head, *(f"  {n.statement}" for n in self.nodes)])

    @boundary
    def propagate(
        self,
        method: str = "exact",
        samples: int = 256,
        seed: int = 0,
        shuffle: int | None = None,
    ) -> dict[str, TeSA]:
        """Propagate the attributes through the program to their fixpoint.

        ``method="exact"`` applies the boolean-semiring rules to every statement;
        ``"scramble"`` infers each statement's rules from ``samples`` runs on random
        values instead (seeded by ``seed``), so the two can be checked against each
        other. ``shuffle`` pops the worklist in a random order seeded by it: the
        result does not depend on the order, and that is how it is tested. The
        result is also stored as ``self.attrs``, so propagating again starts from it.
        """
        if method not in ("exact", "scramble"):
            raise OperandError(f"propagate: method must be 'exact' or 'scramble', not {method!r}")
        if samples < 1:
            raise OperandError(f"propagate: samples must be positive, got {samples}")
        self.attrs = propagate(self, method, samples, seed, shuffle)
        return dict(self.attrs)

    @boundary
    def transform(self, policy: Policy) -> ProgramPlan:
        """An execution plan: each sparse input split into parts of one width and one
        block shape (see ``ucf.tesa.transform``), with the statements over the parts."""
        return transform(self, policy)


@boundary
def program(
    text: str,
    shapes: Mapping[str, Sequence[int]] | None = None,
    attrs: Mapping[str, TeSA] | None = None,
    outputs: Sequence[str] | None = None,
) -> Program:
    """Parse ``text`` (statements one per line or separated by ``;``) into a Program.

    ``shapes`` gives the shape of every input that ``attrs`` does not (and may
    give others, which are checked); ``attrs`` the initial attributes; tensors
    without one start dense at 32 bits. ``outputs`` defaults to the tensors that
    are defined and never read.
    """
    pieces = [s.strip() for line in text.splitlines() for s in line.split(";")]
    statements = [parse_statement(s) for s in pieces if s]
    if not statements:
        raise ProgramError("a program needs at least one statement")
    attrs = dict(attrs or {})
    for name, attr in attrs.items():
        if not isinstance(attr, TeSA):
            raise OperandError(f"attrs[{name!r}] must be a ucf.TeSA, not {type(attr).__name__}")
    known = {name: _shape(name, shape) for name, shape in (shapes or {}).items()}
    for name, attr in attrs.items():
        if name in known and known[name] != attr.shape:
            raise ShapeError(
                f"tensor {name}: shapes gives {known[name]} but its attribute has shape "
                f"{attr.shape}"
            )
        known.setdefault(name, attr.shape)
    nodes = statement_nodes(statements, known)
    tensors = {n.output for n in nodes} | {t for n in nodes for t in n.inputs}
    for name in sorted(set(known) - tensors):
        what = "an attribute" if name in attrs else "a shape"
        raise ProgramError(f"{what} is given for {name}, which the program does not use")
    read = {t for n in nodes for t in n.inputs}
    if outputs is None:
        outputs = [n.output for n in nodes if n.output not in read]
    for name in outputs:
        if name not in tensors:
            raise ProgramError(
                f"unknown output {name}: the program's tensors are {', '.join(sorted(tensors))}"
            )
    full = {name: attrs[name] if name in attrs else TeSA.dense(known[name]) for name in tensors}
    full = dict(sorted(full.items()))
    return Program(nodes, {t: known[t] for t in sorted(tensors)}, full, tuple(outputs))


def _shape(name: str, shape: Any) -> tuple[int, ...]:
    """A shape ``shapes=`` gives, as a tuple of extents, or an ArgumentError naming it."""
    if isinstance(shape, str | bytes) or not isinstance(shape, Sequence):
        raise ArgumentError(
            f"shapes= gives tensor {name} {shape!r}; a shape is a tuple of extents, as in "
            f"shapes={{{name!r}: (4, 8)}}"
        )
    if not all(isinstance(n, numbers.Integral) and n >= 0 for n in shape):
        raise ArgumentError(
            f"shapes= gives tensor {name} the shape {tuple(shape)!r}; extents are "
            "non-negative integers"
        )
    return tuple(int(n) for n in shape)
