"""What one level of a format stores of a mode's coordinate: the mode itself, the
block the coordinate falls in or its place in the block. Its own module because the
format text (``ucf.format.spelling``) builds level maps and ``Format`` holds them:
both import it, neither the other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LevelMap:
    """What one level stores of mode ``mode``'s coordinate ``i``: ``(i // div) % mod``
    (``mod`` 0: no modulo). Within a mode, the levels' maps form a mixed-radix
    split of ``i``, outer to inner, so ``i`` is the sum of each level's
    coordinate times its ``div``."""

    mode: int
    div: int = 1
    mod: int = 0

    @property
    def plain(self) -> bool:
        return self.div == 1 and self.mod == 0

    def coordinate(self, i):
        """The level coordinate of mode coordinate(s) ``i`` (ints or numpy arrays)."""
        q = i // self.div if self.div != 1 else i
        return q % self.mod if self.mod else q

    def size(self, extent: int) -> int:
        """The level's dimension when its mode has ``extent``: blocks round up."""
        return self.mod if self.mod else -(-extent // self.div)

    def __str__(self) -> str:
        return (
            f"{self.mode}"
            + (f"/{self.div}" if self.div != 1 else "")
            + (f"%{self.mod}" if self.mod else "")
        )
