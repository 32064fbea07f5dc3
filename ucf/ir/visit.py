"""Dispatch on the class of an LLIR node, for the printers and code generators.

Each of them handles every node class one way, so each is a :class:`Visitor`: one
method per node class, marked with ``@handles(ir.X)``, and ``self.visit(node, ...)``
to reach it. A subclass (the CUDA printer over the C one) overrides a handler by
defining a method of the same name, and adds node classes by marking new ones.

``functools.singledispatchmethod`` does the same, but costs about 20 times an
``isinstance`` test per call (it builds a bound function on every access); a
table of method names by class, looked up with ``getattr``, costs about what a
short chain of ``isinstance`` tests did, and a code generator visits every node of
every kernel it prints.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def handles(*types: type) -> Callable[[Callable], Callable]:
    """Mark a method as the handler of nodes of ``types``."""

    def mark(method: Callable) -> Callable:
        method.handles = types  # type: ignore[attr-defined]
        return method

    return mark


class Visitor:
    """A printer or code generator over LLIR nodes; see the module docstring."""

    #: The handler's method name by node class, gathered from the class and its bases.
    handlers: dict[type, str] = {}
    #: What a node nobody handles is refused with: ``"no C for"``.
    refusal = "cannot handle"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        table: dict[type, str] = {}
        for klass in reversed(cls.__mro__):
            for name, member in vars(klass).items():
                for t in getattr(member, "handles", ()):
                    table[t] = name
        cls.handlers = table

    def visit(self, node: Any, *args: Any) -> Any:
        """The handler of ``node``'s class, called with ``node`` and ``args``."""
        name = self.handlers.get(type(node))
        if name is None:
            raise TypeError(f"{self.refusal} {type(node).__name__}")
        return getattr(self, name)(node, *args)
