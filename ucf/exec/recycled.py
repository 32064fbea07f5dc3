"""Large output arrays recycled between calls of a kernel.

A new output of tens of MB is a fresh mapping from the operating system: every page of
it faults the first time it is written, and the kernel zeroes the page then (glibc maps
anew every allocation of 32 MB or more, and unmaps it when freed). On a kernel that
writes a quarter of its output's rows (MoE with 8 experts, top-2 routing) those faults
cost as much as zeroing the whole array from user space. Here an output whose array
(and every view of it) is gone goes back to a small pool instead, still mapped, and the
next call of the same size takes it with the old values in it: the caller zeroes what
it does not write, which runs at memory speed. A kernel that writes every element of its
dense output (``ucf.lower.zeroing``) takes its output from here too, and zeroes nothing,
and so do a sparse output's positions, coordinates and a one-pass output's values
(``ucf.exec.outputs.sparse_output``), which the kernel writes as far as it keeps them.

Fresh memory can cost far more than its faults: on the 2-core VM of issue 38, whose
guest reports freed memory to its host, 120 MB allocated and written right after the
last 120 MB was freed took 9 ms of system time, and 74-165 ms after a pause of 3 s
(the host maps the pages afresh); SpGEMM 100k, whose output is that size, takes
about 80 ms on one thread. What ran before a call decided its time; from the pool it
does not.
"""

from __future__ import annotations

import math
import threading
import weakref

import numpy as np

#: Outputs smaller than this are allocated as usual (glibc's heap reuses them already).
MIN_BYTES = 1 << 22
#: The most bytes of outputs the pool keeps while nobody uses them (the sizes given back
#: least recently go first).
IDLE_BYTES = 1 << 27

_idle: dict[int, list[np.ndarray]] = {}
_lock = threading.Lock()


class _Lease:
    """The owner of an output's memory while the output (or a view of it) lives: numpy
    takes the array from ``__array_interface__`` and keeps this object as its base."""

    def __init__(self, buffer: np.ndarray, shape: tuple[int, ...], dtype: np.dtype):
        self.nbytes = buffer.nbytes  # what a view's owner holds (``outputs._pruned``)
        self.__array_interface__ = {
            "shape": shape,
            "typestr": dtype.str,
            "data": (buffer.ctypes.data, False),
            "version": 3,
        }
        weakref.finalize(self, _give_back, buffer)


def _give_back(buffer: np.ndarray) -> None:
    """Keep ``buffer`` for the next output of its size, giving up the sizes given back
    least recently where the pool is full: a program moves on from its earlier shapes,
    and a pool that kept them refused every later size (the peer run's SpMV and SpMM
    outputs filled it, and each SpGEMM output took fresh memory: 618 faults a call, two
    threads 112 ms against 37 with the pool serving it)."""
    if buffer.nbytes > IDLE_BYTES:
        return
    with _lock:
        same = _idle.pop(buffer.nbytes, [])  # re-inserted last: the newest size
        held = sum(b.nbytes for bs in _idle.values() for b in bs)
        held += sum(b.nbytes for b in same)
        for size in list(_idle):  # oldest first (a dict keeps insertion order)
            if held + buffer.nbytes <= IDLE_BYTES:
                break
            held -= sum(b.nbytes for b in _idle.pop(size))
        if held + buffer.nbytes <= IDLE_BYTES:
            same.append(buffer)
        if same:
            _idle[buffer.nbytes] = same


def array(shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, bool]:
    """A C-contiguous array of ``shape`` and ``dtype``, and whether it is zeros (a new
    one) rather than a recycled one holding whatever its last user left in it."""
    return _taken(shape, np.dtype(dtype), np.zeros)


def uninitialized(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A C-contiguous array of ``shape`` and ``dtype`` holding anything, for a kernel
    that writes every element (``Plan.writes_all``)."""
    return _taken(shape, np.dtype(dtype), np.empty)[0]


def _taken(shape: tuple[int, ...], dtype: np.dtype, new) -> tuple[np.ndarray, bool]:
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < MIN_BYTES:
        return new(shape, dtype), True
    with _lock:
        spare = _idle.get(nbytes)
        buffer = spare.pop() if spare else None
    fresh = buffer is None
    if fresh:
        buffer = new(nbytes, np.uint8)
    return np.asarray(_Lease(buffer, shape, dtype)), fresh
