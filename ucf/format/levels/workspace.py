"""Workspace lists (W): the coordinates a listed workspace was touched at, sorted, in
``crd[0:count)``, so the consumer of a ``precompute`` walks them like a compressed
level. A kernel holds one while it runs; no tensor is stored so (``stored`` is False:
format strings do not take its letter).
"""

from __future__ import annotations

from typing import ClassVar

from ucf.format.levels.base import LevelKind


class WorkspaceList(LevelKind):
    """The lowerer's view of a listed workspace."""

    stored: ClassVar[bool] = False
    coordinate_array: ClassVar[str | None] = "crd"

    def bounds(self, arrays, parent, segment_end, dim):
        from ucf.ir.nodes import I64, Const

        return Const(0, I64), arrays["count"]

    def coordinate(self, arrays, pos, parent=None, dim=None):
        from ucf.ir.nodes import Load

        return Load(arrays["crd"], pos)


WORKSPACE_LIST = WorkspaceList("W", "workspace list", ("crd",), full=False, can_locate=False)
