"""What one call of a contender costs besides its wall time, for bench/peers.py: the
cores it kept busy, and the memory it met fresh.

Fresh memory is what decided SpGEMM's two-thread row in the peer run of issue 38: on
the 2-core VM it ran on, 120 MB allocated and written right after 120 MB was freed
took 9 ms of system time, and 74-165 ms after a pause of 3 s (the guest reports freed
memory to its host, which maps it afresh). A contender whose calls page-fault their
output anew pays that in every interleaved run, by what ran before it; the minor
faults and system time of its calls say whether it does.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def cpu_over_wall(fn: Callable[[], Any], calls: int = 3) -> float:
    """The median over ``calls`` of a call's process CPU time over its wall time: about
    the threads it kept busy (below 1 where another process held the core)."""
    ratios = []
    for _ in range(calls):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        ratios.append((time.process_time() - c0) / max(time.perf_counter() - w0, 1e-9))
    return float(np.median(ratios))


def memory_per_call(fn: Callable[[], Any], calls: int = 3) -> tuple[float, float]:
    """The medians over ``calls`` of a call's minor page faults and system time (ms),
    each call the second of two back to back (as peers.py times them), its result
    dropped before the next."""
    faults, system = [], []
    for _ in range(calls):
        fn()
        before = resource.getrusage(resource.RUSAGE_SELF)
        fn()
        after = resource.getrusage(resource.RUSAGE_SELF)
        faults.append(after.ru_minflt - before.ru_minflt)
        system.append((after.ru_stime - before.ru_stime) * 1e3)
    return float(np.median(faults)), float(np.median(system))
