"""The formats a tuner may try for each input (``tune(search_formats=True)``): a sparse
input's level kinds and mode orders, the blocked and fixed-width formats its fill says
can pay, and a dense input's mode order as the default's loops walk it. Each choice of
formats has a schedule space of its own (``ucf.tuning.space``)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from ucf.errors import UcfError
from ucf.format.format import Format
from ucf.format.tensor import Tensor
from ucf.lang.ast import Access, accesses
from ucf.lang.parser import parse_statement
from ucf.tuning.search_problem import problem
from ucf.tuning.structure import offers


def structured(fmt: Format) -> bool:
    """Whether a format has blocks or fixed-width levels (``bcsr``, ``ell``): storage
    that ``format_choices`` offers only where the operand's structure fills it."""
    return fmt.blocked or fmt.fixed_width


def format_choices(
    statement: str, formats: dict[str, Format], operands: Mapping[str, Tensor] | None = None
) -> dict[str, tuple[Format, ...]]:
    """Formats to try for each input, the given one first.

    A sparse input gets its level kinds, all dense-then-compressed and all compressed,
    in every mode order (up to order 3); and for a matrix among ``operands``, the blocked
    (``bcsr``) and fixed-width (``ell``) formats whose fill on it says they can pay
    (``ucf.tuning.structure``). Inputs given in a blocked format, and inputs indexed by
    affine expressions, keep their format. A dense input of order 2 or 3 gets the mode
    order in which ucf's default loop order walks it (``dense_order``), where that is
    not the given one. A choice in which no loop order walks every operand in its
    storage (a ``bcsr`` input beside a ``csr`` output over the same variables) would
    convert an operand in every call, and is left out."""
    stmt = parse_statement(statement)
    found = {}
    walked: tuple[str, ...] | None = None
    for a in accesses(stmt.rhs):
        n = len(a.indices)
        given = formats.get(a.tensor) or Format.dense(n)
        if n > 3 or any(i.single_variable is None for i in a.indices):
            continue
        if given.is_dense:
            if walked is None:
                walked = _default_order(statement, formats)
            option = dense_order(a, walked)
            if n > 1 and option is not None and option != given:
                found[a.tensor] = (given, option)
            continue
        if given.blocked or given.fixed_width or given.values is not None:
            continue  # kept as given: the options below are plain levels of plain values
        options = [given]
        kinds = [given.levels, Format.compressed(n, 1).levels, Format.compressed(n).levels]
        for levels in dict.fromkeys(kinds):
            for perm in itertools.permutations(range(n)):
                options.append(Format(levels, perm))
        if operands is not None and a.tensor in operands:
            for offer in offers(operands[a.tensor]):
                options.append(offer.format)
        kept = [
            o
            for o in dict.fromkeys(options)
            if o == given or _walkable(statement, formats, a.tensor, o)
        ]
        found[a.tensor] = tuple(kept)
    return {t: options for t, options in found.items() if len(options) > 1}


def _default_order(statement: str, formats: dict[str, Format]) -> tuple[str, ...]:
    """ucf's default loop order for ``formats`` (a blocked format's split variables
    included)."""
    return problem(statement, formats, {}).base[0]


def dense_order(access: Access, order: tuple[str, ...]) -> Format | None:
    """The dense format that stores ``access``'s modes in the order loop ``order`` visits
    their variables (``UU:1,0`` for ``D(k,j)`` under loops ``i, j, k``), so the innermost
    loop walks contiguous memory; None when a variable is not one of the loops."""
    variables = [i.single_variable for i in access.indices]
    if any(v not in order for v in variables):
        return None
    perm = sorted(range(len(variables)), key=lambda m: order.index(variables[m]))
    return Format.dense(len(perm), perm)


def _walkable(statement: str, formats: dict[str, Format], tensor: str, option: Format) -> bool:
    """Whether, with ``tensor`` stored in ``option``, some loop order walks every sparse
    operand in its storage (else every call would convert one); False where ucf refuses
    the formats."""
    try:
        p = problem(statement, {**formats, tensor: option}, {})
    except UcfError:
        return False
    return not p.converts or len(p.orders) > 1
