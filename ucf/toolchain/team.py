"""The team a parallel loop runs on: how many threads, and how long they spin
(issue 34: a busy machine).

A parallel region joins at a barrier, so it lasts as long as its slowest thread. On
a machine that other processes hold (a laptop, a CI runner, a shared server; or
numpy's BLAS threads in this very process) a thread the OS has descheduled arrives
milliseconds late, and a kernel of 50 µs took 8 ms. Three things keep that from
happening, none needing an environment variable:

- **The team follows the machine.** The llvm target's parallel loops call
  ``ucf_parallel`` (``ucf.codegen.llvm_team``, JIT-compiled once per process by
  ``ucf.toolchain.jit``) rather than libgomp's ``GOMP_parallel``: it times each
  region, and a loop whose region lost to one thread runs on half the team for a
  while, then tries the larger team again.
- **Threads spin briefly.** After a region libgomp's threads spin for about 3 ms
  (300,000 iterations) before sleeping, burning a core that another process, or
  this process's BLAS threads between two kernel calls, wanted. Unless the user
  set ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``, ucf loads libgomp with
  ``GOMP_SPINCOUNT=SPIN_COUNT`` (about 0.1 ms), long enough that back-to-back calls
  find their threads awake; the variable is removed again once libgomp has read
  it, so child processes do not inherit it. If libgomp was already loaded (by
  another library) its settings stand.
- **The thread count follows the cores this process may use**: the CPUs of its
  affinity mask, and at most its cgroup's CPU quota (a container limited to 2 CPUs
  on a 64-core host), unless ``UCF_NUM_THREADS``, ``OMP_NUM_THREADS`` or
  ``ucf.set_num_threads`` says otherwise.

- **A team of one runs the one-thread plan.** While the parallel loops that hold most
  of a kernel's work (each weighed by its last timed region) wait on one thread, the
  call path runs the plan the default model chose for one thread instead
  (``LoopStates.plan``): a serial plan can differ from a parallel one run alone (a
  sparse add into an output of three levels counts its parallel rows first, where the
  plan for one thread appends them in one pass). A loop that is a small share of the
  work does not decide: an SDDMM's cheap first region that lost to a sleeping worker's
  wake-up would otherwise put the whole kernel on one thread on a quiet machine. When
  the wait is over the parallel plan runs again and its loops try the larger team.
- **The plans race now and then.** A region compares itself with itself on one
  thread, not the parallel plan with the plan for one thread, which may do less work:
  a parallel plan that counts, then fills (a sparse add's did, about 1.6 times the
  one-pass plan's work, before its rows appended in chunks: ``ucf.lower.row_chunks``),
  with each of two threads getting 2/3 of a core wins its regions (wall time 0.75 of
  their work on one thread) while the whole call takes 1.6 times the one-pass plan's.
  So once a parallel loop was timed (below the work threshold the parallel plan runs
  on one thread anyway), the call path races the two plans every so often (an untimed
  call of the plan for one thread, which loads it, then ``RACE_CALLS`` calls of each
  in Thue-Morse order, whole-call wall times, medians compared) and keeps the faster
  until the next race; the calls between races double while one plan keeps winning
  (``RACE_EVERY`` to ``RACE_EVERY_MAX``), so a quiet machine gets its parallel
  speed-up back at the next race and pays for a race in few of its calls. When the
  first race reaches the plan for one thread and finds the parallel plan without its
  parallel loops (an SpMV's, an SpGEMM's, a sparse add's, bcsr SpMM's block rows in
  chunks: ``same_work``), the plans race no more (``LoopStates.unrace``): the regions'
  own timing compares those two already.

The C target's kernels are plain OpenMP (they are standalone C): the spin and the
thread count apply to them, the shrinking team does not.
"""

from __future__ import annotations

import ctypes
import math
import os
import statistics
import time
from pathlib import Path

#: What ``LoopStates.plan`` answers, as bits: run the plan for one thread (else the
#: parallel plan); time this call for a race (``LoopStates.clocked``); the untimed call
#: that opens a race (it loads the plan for one thread).
SOLO, TIMED, WARM = 1, 2, 4
#: Calls before a kernel's first race of its plans (the first call times its loops),
#: and between races, at first and at most.
RACE_FIRST, RACE_EVERY, RACE_EVERY_MAX = 2, 16, 512
#: Timed calls of each plan in a race: the medians decide, so one call that a busy
#: moment (or loading the plan for one thread) slowed does not. The calls alternate in
#: Thue-Morse order (``race_plan``).
RACE_CALLS = 4
#: The count of calls to a race that never comes (``LoopStates.unrace``).
NEVER = 1 << 62

#: The spin count libgomp gets unless the user chose a wait policy (about 0.1 ms on
#: the 2-core AMD machine it was measured on; libgomp's default spun about 4 ms).
SPIN_COUNT = 10_000


def spin_setting() -> dict[str, str]:
    """The environment to load libgomp with: a bounded spin (``SPIN_COUNT``) unless the
    user chose a wait policy or libgomp is loaded already (then nothing can change)."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return {}
    try:
        if "libgomp" in Path("/proc/self/maps").read_text():
            return {}
    except OSError:
        pass
    return {"GOMP_SPINCOUNT": str(SPIN_COUNT)}


def available_cores() -> int:
    """The CPUs this process may run on: its affinity mask, capped by its cgroup's CPU
    quota (rounded up), where the system says."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = cgroup_quota()
    return max(1, min(cores, math.ceil(quota))) if quota else max(1, cores)


def cgroup_quota() -> float | None:
    """The CPU quota of this process's cgroup in CPUs (cgroup v2's ``cpu.max`` of its
    group or the tightest of its ancestors', else v1's ``cfs_quota_us``), or None."""
    found = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: the unified hierarchy
            group = Path("/sys/fs/cgroup") / path.lstrip("/")
            for d in (group, *group.parents):
                if not str(d).startswith("/sys/fs/cgroup"):
                    break
                found.append(_quota((d / "cpu.max").read_text, None) if d.exists() else None)
        elif "cpu" in controllers.split(","):
            base = Path("/sys/fs/cgroup/cpu")
            found.append(
                _quota(
                    (base / "cpu.cfs_quota_us").read_text, (base / "cpu.cfs_period_us").read_text
                )
            )
    quotas = [q for q in found if q]
    return min(quotas) if quotas else None


def _quota(read_quota, read_period) -> float | None:
    try:
        words = read_quota().split()
        quota, period = words[0], (words[1] if read_period is None else read_period().strip())
        if quota in ("max", "-1"):
            return None
        return int(quota) / int(period)
    except (OSError, ValueError, IndexError, ZeroDivisionError):
        return None


class LoopStates:
    """The team state of each parallel loop of one llvm kernel (``ucf.codegen.llvm_team``:
    the team cap, when the loop tries a larger team again, and the work of its last
    timed region), read by the call path, and the race of the kernel's parallel plan
    against the plan for one thread."""

    __slots__ = (
        "states",
        "_lost",
        "_fixed",
        "_seen",
        "_until",
        "_answer",
        "_left",
        "_every",
        "_solo",
        "_race",
    )

    def __init__(
        self,
        address,
        functions: list[str],
        lost: ctypes.c_int64,
        fixed: ctypes.c_int64 | None = None,
    ) -> None:
        """``address`` finds a symbol of the kernel's library (0: none); the loops of each
        function are numbered from 1 (``llvm_team.state_name``). ``lost`` is the
        process-wide count of regions lost (``ucf.toolchain.jit.team_counter``), ``fixed``
        the flag that runs every region on the whole team (then the plans do not race)."""
        from ucf.codegen import llvm_team

        found = []
        for fn in functions:
            loop = 1
            while at := address(llvm_team.state_name(fn, loop)):
                found.append((ctypes.c_int64 * 4).from_address(at))
                loop += 1
        self.states = tuple(found)
        self._lost, self._fixed = lost, ctypes.c_int64(0) if fixed is None else fixed
        self._seen, self._until, self._answer = -1, 0, 0
        self._left, self._every, self._solo, self._race = RACE_FIRST, RACE_EVERY, False, None

    def plan(self) -> int:
        """The plan a call runs: the parallel plan (0) or the plan for one thread
        (``SOLO``), with ``TIMED`` when the call is one of a race: the caller times it
        and gives ``clocked`` its wall time.

        A loop starts to wait on one thread only when a region is lost, and a wait
        ends only by time; a race is due after a count of calls: so the answer is kept
        until the process's count of lost regions moves, a wait ends or a race is due.
        A remembered call of a quiet machine then reads one counter and counts itself
        down rather than reading every loop's state or a clock."""
        self._left -= 1
        if self._left > 0 and self._lost.value == self._seen:
            return self._answer
        return self._look(self._lost.value)

    def _look(self, lost: int) -> int:
        now = time.monotonic_ns()
        if lost != self._seen or (self._until and now >= self._until):
            self._seen, self._until = lost, self.decide(now)
        self._answer = SOLO if self._until or self._solo else 0
        if self._until:
            # Loops wait on one thread: the parallel plan would run on one; no race
            # meanwhile, and each call looks at the clock until the wait ends (then a
            # race is due: the loops' wait says the machine changed).
            self._left = 0
            return self._answer
        if self._left > 0:
            return self._answer
        if self._every == NEVER:  # unraced: the wait is over, no race comes
            self._left = NEVER
            return self._answer
        if self._fixed.value or not any(state[0] for state in self.states):
            # A fixed team runs the parallel plan as plain OpenMP does; no loop timed, no
            # region above the work threshold: the parallel plan ran on one thread.
            self._left = RACE_EVERY
            return self._answer
        race = self._race  # read once: another Python thread's clocked() may end it
        if race is None:
            # A race opens with an untimed call of the plan for one thread: its first
            # call loads (or compiles) it and touches its buffers, which no timed call
            # of a race should carry.
            self._race = ([], [])
            return SOLO | WARM
        return race_plan(len(race[0]) + len(race[1])) | TIMED

    def stepped(self, plan: int, parallel, solo) -> int:
        """The plan a call runs that ``plan`` sends to ``solo``, the plan for one thread
        (both kernels' chosen plans, ``ucf.exec.kernel._Built``): where the step is a
        race's and ``solo`` does the work of ``parallel`` (``same_work``), the races
        end and the call runs the parallel plan (0); else ``plan``."""
        if plan & (TIMED | WARM) and same_work(parallel, solo):
            self.unrace()  # the loops' own timing compares these plans already
            return 0
        return plan

    def unrace(self) -> None:
        """Race no more: the plan for one thread is the parallel plan without its parallel
        loops, so a region timed against itself on one thread compares the two already
        (``same_work``)."""
        self._race, self._solo, self._every = None, False, NEVER
        self._left = 0 if self._until else NEVER  # a wait goes on looking at the clock
        self._answer = SOLO if self._until else 0

    def clocked(self, plan: int, ns: int) -> None:
        """A raced call of ``plan`` took ``ns``. Once each plan has ``RACE_CALLS``, the
        one of the lower median runs until the next race; the calls until then double
        while the same plan wins, and start again from ``RACE_EVERY`` when the other
        does."""
        race = self._race
        if race is None:
            return
        race[plan & SOLO].append(ns)
        parallel, solo = race
        if len(parallel) < RACE_CALLS or len(solo) < RACE_CALLS:
            return
        won = statistics.median(solo) < statistics.median(parallel)
        self._every = min(2 * self._every, RACE_EVERY_MAX) if won == self._solo else RACE_EVERY
        self._solo, self._race, self._left = won, None, self._every
        self._answer = SOLO if won or self._until else 0

    def decide(self, now: int) -> int:
        """When the loops' answer next changes if it is one thread (ns), else 0.

        Yes when the loops that lost with a larger team and wait on one thread hold
        most of the work of the kernel's timed loops (each weighed by its last timed
        region on one thread): the call is then mostly serial anyway, and the plan for
        one thread runs it better (it may append in one pass where parallel rows
        count first). A loop that is a small share of the work, such
        as the cheap first region of an SDDMM that lost to a sleeping thread's
        wake-up, does not decide the plan. Loops never timed (below the work threshold)
        weigh nothing; a loop that won with a larger team, or whose wait is over (it
        tries the larger team next), weighs against."""
        shrunk = total = 0
        until = None
        for cap, end, _, work in self.states:
            if cap == 0:
                continue
            total += work
            if cap == 1 and now < end:
                shrunk += work
                until = end if until is None else min(until, end)
        return until if until is not None and 2 * shrunk > total else 0


def race_plan(n: int) -> int:
    """The plan of a race's ``n``-th call, in Thue-Morse order (parallel, one thread,
    one thread, parallel, one thread, parallel, parallel, one thread): each plan gets
    as many of the race's odd and even calls, and of its early and late ones. A user's
    calls have patterns of their own (a kernel called twice a step, first cold, then
    warm; its first calls still paging in each thread's buffers), and a race that ran
    one plan's calls first gave them all to it: bench/block_peak.py's bcsr product,
    called right after other work and then again straight away, lost its first race
    with the parallel plan (medians 2.1 against 1.3 ms) and ran on one thread at 1.5 ms
    where its parallel plan takes 1.0."""
    return SOLO if n.bit_count() & 1 else 0


def same_work(parallel, solo) -> bool:
    """Whether the plan for one thread is the parallel plan without its parallel loops:
    the same commands but ``parallelize``, the same passes over a sparse output (both
    kernels' chosen plans, ``ucf.exec.kernel._Built``). Then a region timed against
    itself on one thread compares the two plans, and they need not race
    (``LoopStates.unrace``). A split whose blocks the parallel plan shares out is no
    other work where both append in one pass (their rows run in chunks of their own:
    ``ucf.lower.row_chunks``) or both write a dense output (the blocks run the rows in
    their order: the default's dynamic chunks of skewed or heavy rows, such as bcsr
    SpMM's block rows, which raced on a quiet machine and ran 5 of every race's calls
    on one thread). A plan for one thread that appends in one pass where the parallel
    rows count first (an output of more levels than a row's and a column's) races."""
    from ucf.schedule.loops import SplitCommand
    from ucf.schedule.requests import Parallelize

    if solo.compiled is parallel.compiled:
        return True
    if solo.commands is None or parallel.commands is None:
        return False
    kept = [c for c in parallel.commands if not isinstance(c, Parallelize)]
    one, other = parallel.compiled.plan, solo.compiled.plan
    if (one.one_pass and other.one_pass) or (
        one.computed_format.is_dense and other.computed_format.is_dense
    ):
        # rows in chunks of their own (one pass) or in the order of the split's blocks
        # (a dense output): the same work, whatever split shared them out
        shared = {c.var for c in parallel.commands if isinstance(c, Parallelize)}
        kept = [c for c in kept if not (isinstance(c, SplitCommand) and c.outer in shared)]
    return kept == list(solo.commands) and (
        parallel.compiled.plan.one_pass == solo.compiled.plan.one_pass
    )
