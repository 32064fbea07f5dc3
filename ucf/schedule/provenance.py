"""Where each loop variable comes from: the provenance graph a schedule builds.

Every derived variable (split, divide, fuse, pos, bound, a workspace's loop)
records its relation to its parents, so later commands and the lowerer can
recover coordinates and trip counts through any chain of commands.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Relation:
    """How a derived index variable relates to its parents (one provenance edge)."""

    kind: str  # split, divide, fuse, pos, bound, workspace
    parents: tuple[str, ...]
    amount: int = 0
    tensor: str = ""
    role: str = ""  # "outer" or "inner" for split and divide


class Provenance:
    """Derived index variables and the original variables they come from."""

    def __init__(self, originals: list[str]):
        self.originals = list(originals)
        self.rel: dict[str, Relation] = {}

    def add(self, name: str, rel: Relation) -> None:
        self.rel[name] = rel

    def origins(self, v: str) -> list[str]:
        """The original variables a loop variable iterates, outer to inner."""
        if v not in self.rel:
            return [v]
        out: list[str] = []
        for p in self.rel[v].parents:
            out += [o for o in self.origins(p) if o not in out]
        return out

    def bounded(self, v: str) -> bool:
        """Whether the loop's trip count is known when the kernel is compiled."""
        rel = self.rel.get(v)
        if rel is None:
            return False
        if rel.kind == "bound":
            return True
        return (rel.kind, rel.role) in (("split", "inner"), ("divide", "outer"))

    def fuses(self, v: str) -> set[str]:
        """``v`` and the fused variables it is made of (a fuse of a fuse)."""
        rel = self.rel.get(v)
        if rel is None or rel.kind != "fuse":
            return {v}
        return {v}.union(*(self.fuses(p) for p in rel.parents))

    def lowering_order(self, loops: list[str]) -> list[str]:
        """The original variables in the order the final loops visit them."""
        order: list[str] = []
        for v in loops:
            order += [o for o in self.origins(v) if o not in order]
        return order

    def describe(self, v: str) -> str:
        rel = self.rel[v]
        parents = ", ".join(rel.parents)
        if rel.kind in ("split", "divide"):
            return f"{v} is the {rel.role} loop of {rel.kind}({parents}, {rel.amount})"
        if rel.kind == "pos":
            return f"{v} walks the positions of {rel.tensor} for {parents}"
        if rel.kind == "bound":
            return f"{v} is {parents} bounded to {rel.amount}"
        if rel.kind == "workspace":
            return f"{v} walks the workspace of {parents}"
        return f"{v} fuses {parents}"
