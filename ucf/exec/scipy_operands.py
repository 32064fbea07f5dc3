"""scipy matrices passed to a kernel call: checked on every call, for what the kernel
relies on, and read in place.

A scipy CSR or CSC matrix is how most users hand ucf a sparse operand, and nothing
stops its arrays changing between two calls (``A.indices[3] = 7`` in place). So a
call checks it every time, and checks only what the kernel relies on:

- always, what keeps every read in memory: ``indptr`` starts at 0, never decreases
  and ends within ``indices`` and ``data``, and every index it covers is below the
  other dimension (``ucf.format.scipy_layouts.in_place``: one pass over the indices,
  read as unsigned, and one over ``indptr``);
- only where the kernel relies on it, that each row's indices are sorted and unique
  (``in_place_canonical``). A kernel that walks a row's entries, loads at their
  columns and adds what it computes (SpMV, ``A^T x``, SpMM, ``x' A y``, a Gustavson
  product's left operand) gives scipy's answer in any order, repeats summed as
  scipy sums them: ``ucf.exec.order_free`` reads that off the kernel's code. A matrix
  a kernel needs canonical and that is not is repacked (sorted, repeats summed) for
  the call, as ``ucf.from_scipy`` does.

scipy's own ``has_sorted_indices`` and ``has_canonical_format`` are neither read nor
set: they are flags cached on the object, which an in-place change leaves stale, and
the check of ``in_place_canonical`` (a vectorized compare of neighbours) costs less
than scipy's scalar loop computing them. Nothing is cached between calls: a call
that repeats with the very same matrix (``ucf.exec.replay``) runs the same checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ucf.errors import FormatError
from ucf.format.format import Format
from ucf.format.interop import as_tensor
from ucf.format.scipy_layouts import in_place, in_place_canonical, is_scipy
from ucf.format.tensor import Tensor


def bind(value: Any, name: str) -> Tensor | None:
    """A scipy CSR or CSC operand as a Tensor on its own arrays, its bounds checked and
    its order not (see :func:`settle`); None for anything else, which ``as_tensor``
    converts."""
    if not is_scipy(value):
        return None
    return in_place(value, f"operand {name}")


def settle(
    given: dict[str, Tensor],
    operands: dict[str, Any],
    bound: list[str],
    free: Mapping[str, Format],
) -> frozenset[str]:
    """Check the order of each operand of ``bound`` (bound in place by :func:`bind`)
    unless the kernel reads it correctly in any order, in the structure it comes in
    (``free``: ``ucf.exec.order_free``; a CSC read as CSR is converted first, and a
    conversion may rely on the order), and repack one that is not canonical, as
    ``ucf.from_scipy`` would. The operands left unchecked are returned: a replay of
    the call leaves them so."""
    unchecked = []
    for name in bound:
        if free.get(name) == given[name].format.structure:
            unchecked.append(name)
        elif not in_place_canonical(given[name]):
            given[name] = as_tensor(operands[name], name=name)
    return frozenset(unchecked)


def recheck(value: Any, name: str, ordered: bool) -> bool:
    """A replayed call's checks of a scipy operand it bound in place: its bounds (an
    error if they fail, as on the first call), and its order where the kernel relies
    on it (``ordered``); False when the call must take the whole path (an order that
    the first call found canonical is not now: it is repacked there)."""
    t = in_place(value, f"operand {name}")
    if t is None:
        raise FormatError(f"operand {name}: its arrays changed kind since the last call")
    return not ordered or in_place_canonical(t)
