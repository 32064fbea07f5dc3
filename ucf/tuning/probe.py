"""A trial's first call, in a child process that can be stopped.

A kernel call is native code: nothing in the calling process can interrupt it,
and a schedule that does quadratic work on a large input runs for minutes
(a CSC SpMM with a dense workspace under two loops ran over 20 minutes). So
before a trial's kernel runs in the tuning process, its first call runs in a
child that holds the operands, with a time limit derived from the default
kernel's time (``limit``). A child that overruns is killed, the trial is pruned
with the reason, and the next trial starts a new child. A kernel that crashes
its process is caught the same way. The child loads the kernel from the disk
cache, where the tuning process has just compiled it, so a trial's extra cost is
one call and a load. Only a schedule that changes the loop order or adds a
workspace can do asymptotically more than the default, and only on a problem
whose whole dense iteration space is costlier than the limit (``needed``):
other trials start no child.

The child is started with ``subprocess`` (not ``multiprocessing``): a Dask
worker is a daemonic process, which ``multiprocessing`` refuses children, and a
forked child of a process that has run OpenMP threads can hang.
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ucf.errors import UcfError
from ucf.format.format import Format
from ucf.format.tensor import Tensor
from ucf.schedule.commands import Command, PrecomputeCommand, Reorder

#: A trial's first call may take this many times the default's call ...
LIMIT = 20
#: ... and this many seconds more: its first call's own costs (a fresh process touches
#: its operands' pages once) on a machine that other processes share.
MARGIN = 0.5
#: Seconds the child may take to start and load a kernel before the call starts.
LOAD_SECONDS = 300.0
#: Seconds a point of the statement's dense iteration space (every variable over its
#: extent) costs a schedule at worst: no plan visits a point more than once (a workspace
#: filled under loops it does not use fills at most every point), and a cache miss costs
#: less. A problem whose whole dense space fits the limit needs no child (starting one
#: costs a second or two).
POINT_SECONDS = 1e-7


def clock() -> Callable[[], float]:
    """What a trial is timed by: with one thread, the calling thread's CPU time, which the
    time slices other processes take do not inflate (on a shared machine they decided
    which schedule won), nor trials that other threads of the process run meanwhile (Dask
    workers in one process); a one-thread kernel runs on the calling thread. With more,
    wall time, since CPU time would add the threads up. The child times its first calls
    by it too (``serve``), so they compare with the trials' times."""
    from ucf.toolchain.jit import num_threads

    return time.thread_time if num_threads() == 1 else time.perf_counter


class TrialTimeout(UcfError):
    """A trial's first call ran past its time limit and was stopped."""


def limit(default_seconds: float) -> float:
    """Seconds a trial's first call may take, when the default kernel takes
    ``default_seconds`` a call."""
    return LIMIT * default_seconds + MARGIN


#: The commands that change what a kernel iterates over. The others (``split``,
#: ``bound``, ``parallelize``, ``fuse`` and ``pos`` of the default's loops) reshape the
#: default's loops, whose work the default's time has measured.
RESHAPING = (Reorder, PrecomputeCommand)


def needed(
    commands: list[Command] | None,
    extents: dict[str, int],
    seconds: float,
    default: list[Command] | None = None,
) -> bool:
    """Whether a schedule (``commands``) of a statement over ``extents`` might take
    longer than ``seconds``, so that its first call must run where it can be stopped:
    it changes the loop order or the workspaces of the ``default`` schedule (whose time
    is measured: Gustavson's workspace in parallel chunks iterates what the default
    does, while the plain nest without it co-iterates every output entry), and the
    dense iteration space is that big."""
    shape = normalized(commands, RESHAPING)
    if shape == normalized(default, RESHAPING) or not (shape or default):
        return False
    return math.prod(extents.values()) * POINT_SECONDS > seconds


def normalized(
    commands: list[Command] | None, kinds: tuple[type[Command], ...] | None = None
) -> list[tuple]:
    """The ``commands`` (those of the classes ``kinds``, else all) in a form that compares
    equal where two schedules build one kernel: spaces dropped, a workspace's name left
    out (``precompute(A(i,j)*B(j,k), k, k, w)`` is the default's unnamed)."""
    unnamed = [
        replace(c, workspace=None) if isinstance(c, PrecomputeCommand) else c
        for c in commands or ()
    ]
    return [
        (c.name, *("".join(a.split()) for a in c.args))
        for c in unnamed
        if kinds is None or isinstance(c, kinds)
    ]


@dataclass(frozen=True)
class Call:
    """What the child compiles and calls (``ucf.compile``'s arguments, the shapes given,
    the operand set by its scope, and the thread count)."""

    statement: str
    formats: dict[str, Format]
    schedule: str | None
    target: str
    dtype: str
    index_dtype: str
    shapes: dict[str, Any] | None
    scope: str
    threads: int


class Probe:
    """The child process, started when first needed. Pickled (into a worker process),
    it starts empty: each process has a child of its own. Threads that share one (Dask
    workers in one process) take turns."""

    def __init__(self) -> None:
        self._child: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._held: set[str] = set()  # scopes whose operands the child holds
        self._turn = threading.Lock()

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, _state: dict) -> None:
        self.__init__()

    def first_call(self, call: Call, operands: dict[str, Tensor], seconds: float) -> float:
        """Seconds the first call of ``call`` took in the child; TrialTimeout when it ran
        longer than ``seconds`` (the child is killed), a UcfError with the reason when the
        kernel could not be loaded or run there."""
        with self._turn:
            return self._first_call(call, operands, seconds)

    def _first_call(self, call: Call, operands: dict[str, Tensor], seconds: float) -> float:
        conn = self._connection()
        try:
            if call.scope not in self._held:
                conn.send(("operands", call.scope, operands))
                self._held.add(call.scope)
            conn.send(("call", call))
            kind, value = self._receive(LOAD_SECONDS, "load the kernel")
            if kind == "ready":
                kind, value = self._receive(seconds, "call")
        except TrialTimeout:
            self._stop()
            raise
        except (EOFError, OSError):
            code = self._child.poll() if self._child else None
            self._stop()
            raise UcfError(f"the kernel ended the process that ran it (exit code {code})") from None
        if kind == "error":
            raise UcfError(value)
        return value

    def _receive(self, seconds: float, what: str) -> tuple[str, Any]:
        assert self._conn is not None
        if not self._conn.poll(seconds):
            raise TrialTimeout(
                f"its first call ran longer than {seconds:.3g} s ({LIMIT}x the default's "
                f"time + {MARGIN} s), so it was stopped"
                if what == "call"
                else f"the process that makes its first call did not {what} within "
                f"{seconds:.3g} s, so it was stopped"
            )
        return self._conn.recv()

    def _connection(self) -> Connection:
        if self._conn is None:
            ours, theirs = socket.socketpair()
            env = dict(os.environ)
            from ucf.toolchain import cache

            env["UCF_CACHE_DIR"] = str(cache.cache_dir())  # load what this process compiled
            root = str(Path(__file__).resolve().parents[2])  # the ucf this process runs
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
            self._child = subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                env=env,
                stdin=subprocess.DEVNULL,
            )
            theirs.close()
            self._conn = Connection(ours.detach())
            self._held = set()
        return self._conn

    def close(self) -> None:
        """Stop the child (the next call starts another)."""
        with self._turn:
            self._stop()

    def _stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._child is not None:
            self._child.kill()
            self._child.wait()
            self._child = None
        self._held = set()

    def __del__(self) -> None:
        if getattr(self, "_child", None) is not None:
            self.close()


_CHILD = "import sys; from ucf.tuning.probe import serve; serve(int(sys.argv[1]))"


def serve(fd: int) -> None:
    """The child's loop: hold operands, load and call kernels, say how long a call took."""
    from ucf.exec.kernel import Kernel
    from ucf.toolchain.jit import set_num_threads

    conn = Connection(fd)
    held: dict[str, dict[str, Tensor]] = {}
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message[0] == "operands":
            held[message[1]] = message[2]
            continue
        call: Call = message[1]
        try:
            set_num_threads(call.threads)
            k = Kernel(
                call.statement,
                formats=call.formats,
                schedule=call.schedule,
                target=call.target,
                dtype=call.dtype,
                index_dtype=call.index_dtype,
            )
            conn.send(("ready", None))
            now = clock()  # what the tuning process times trials by, for this thread count
            start = now()
            k(shapes=call.shapes, **held[call.scope])
            conn.send(("done", now() - start))
        except Exception as e:
            conn.send(("error", reason(e)))


def reason(e: Exception) -> str:
    """What a failed trial reports: a UcfError's message, else the exception's type too."""
    return str(e) if isinstance(e, UcfError) else f"{type(e).__name__}: {e}"
