"""The GPU loops of one nest and what the mapping decides for each (``ucf.lower.gpu_grid``)."""

from __future__ import annotations

from dataclasses import dataclass

from ucf.errors import ScheduleError
from ucf.ir import nodes as ir
from ucf.ir.walk import walk
from ucf.schedule import Parallel

GPU_UNITS = ("GPUBlock", "GPUWarp", "GPUThread", "GPUGroup")
REDUCING = ("ParallelReduction", "Temporary", "Segment")
MAX_THREADS = 1024
WARP = 32


@dataclass(eq=False)
class GpuLoop:
    """A GPU loop of one nest, with what the mapping decided for it."""

    loop: ir.For
    par: Parallel
    path: tuple  # enclosing statements, outermost first
    radix: int = 0
    stride: int = 0
    modulus: int = 0  # the lane index is (tid % modulus) / stride; 0 means no modulus
    dim: str = ""  # x, y or z for GPUBlock loops
    group: int = 0  # lanes of the tile when this loop is the nest's group
    width: int = 0  # the group loop's iterations, which may be more than its lanes
    shared: bool = False  # the group's lanes run the loop's iterations themselves

    @property
    def label(self) -> str:
        return self.loop.label or self.loop.var.name

    @property
    def unit(self) -> str:
        return self.par.unit

    @property
    def cmd(self) -> str:
        return f"parallelize({self.label}, {self.par})"


def is_gpu(s) -> bool:
    return isinstance(s, ir.For) and s.parallel in GPU_UNITS


def has_gpu(stmts) -> bool:
    return any(is_gpu(s) for s, _ in walk(stmts))


def several_entries(group: GpuLoop) -> ScheduleError:
    return ScheduleError(
        f"{group.cmd}: the lanes of a group add into different entries here; "
        "ParallelReduction needs one entry per group, use Segment"
    )
