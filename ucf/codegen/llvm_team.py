"""``ucf_parallel``, the entry the llvm target's parallel loops call instead of
libgomp's ``GOMP_parallel``: it times each region and shrinks a loop's team while the
machine is too busy for it (issue 34; the whole story is in ``ucf.toolchain.team``).

A parallel region joins at a barrier, so it lasts as long as its slowest thread: a
thread the OS has descheduled arrives milliseconds late. ``ucf_parallel`` runs the
region through ``ucf_team_run``, which adds up what the work would take on one
thread: the calling thread's wall time in the loop plus the other threads' CPU time
in it (a time slice another process takes is not counted). A region whose wall time
reaches 0.9 of that lost to one thread: that loop's team is halved for a while
(``BACKOFF_NS``, doubling while it keeps losing, up to ``MAX_BACKOFF_NS``), then one
region tries the larger team again; if it wins, the next wait is half the last.
Each parallel loop keeps its own state (``STATE``, a global of the kernel's
module), so a small loop that does not pay does not shrink a large one's team. On
a quiet machine regions win and nothing changes: the timing costs two clock reads
per thread and region.
"""

from __future__ import annotations

from llvmlite import ir as ll

#: How long a loop whose region lost runs on the smaller team before trying again, at
#: first, and at most (the wait doubles with each loss in a row).
BACKOFF_NS = 2_000_000
MAX_BACKOFF_NS = 1_000_000_000
#: A region lost when its wall time reached LOST_NUM / LOST_DEN of its work on one thread.
LOST_NUM, LOST_DEN = 9, 10
#: The per-loop state a kernel module holds for ``ucf_parallel``: the team cap (0: the
#: whole team), when to try a larger team again (ns), the current wait (0: the first),
#: and the work of the loop's last timed region on one thread (ns: what the call path
#: weighs the loop by, ``ucf.toolchain.team.LoopStates.plan``).
STATE = ll.ArrayType(ll.IntType(64), 4)
#: The name kernels call, with ``GOMP_parallel``'s arguments and their loop's state.
ENTRY = "ucf_parallel"
#: Regions timed and regions lost, process-wide (``ucf.toolchain.jit.team_counters``).
COUNTERS = ("ucf_team_timed", "ucf_team_lost")
#: Set (non-zero) to run every region on the whole team, as plain OpenMP does
#: (``UCF_ADAPTIVE_TEAM=0``: benchmarks compare the two in one run).
FIXED = "ucf_team_fixed"

_I8P = ll.PointerType(ll.IntType(8))
_I32, _I64 = ll.IntType(32), ll.IntType(64)
_FN = ll.FunctionType(ll.VoidType(), [_I8P])
_FNP = ll.PointerType(_FN)
# The region the team runs: the loop's function and data, and the work summed over threads.
_CTX = ll.LiteralStructType([_FNP, _I8P, _I64])
CLOCK_MONOTONIC, CLOCK_THREAD_CPUTIME_ID = 1, 3


def state_name(function: str, loop: int) -> str:
    """The symbol of the state of parallel loop ``loop`` (from 1) of kernel function
    ``function``: the call path reads it (``ucf.toolchain.team.LoopStates``)."""
    return f"{function}.omp{loop}.team"


def entry_type() -> ll.FunctionType:
    """``ucf_parallel``'s type, for the kernels that declare it."""
    return ll.FunctionType(ll.VoidType(), [_FNP, _I8P, _I32, _I32, ll.PointerType(STATE)])


def runtime_ir() -> str:
    """The LLVM IR of ``ucf_parallel`` and the counters it keeps (``ucf_team_timed``,
    ``ucf_team_lost``: regions timed and regions lost, for tests and benchmarks)."""
    mod = ll.Module(name="ucf_team")
    gomp = ll.Function(
        mod, ll.FunctionType(ll.VoidType(), [_FNP, _I8P, _I32, _I32]), "GOMP_parallel"
    )
    max_threads = ll.Function(mod, ll.FunctionType(_I32, []), "omp_get_max_threads")
    thread_num = ll.Function(mod, ll.FunctionType(_I32, []), "omp_get_thread_num")
    timespec = ll.LiteralStructType([_I64, _I64])
    clock = ll.Function(
        mod, ll.FunctionType(_I32, [_I32, ll.PointerType(timespec)]), "clock_gettime"
    )
    counters = {}
    for name in (*COUNTERS, FIXED):
        g = ll.GlobalVariable(mod, _I64, name)
        g.initializer = ll.Constant(_I64, 0)
        counters[name] = g

    now = ll.Function(mod, ll.FunctionType(_I64, [_I32]), "ucf_team_clock")
    now.linkage = "internal"
    b = ll.IRBuilder(now.append_basic_block())
    ts = b.alloca(timespec)
    b.call(clock, [now.args[0], ts])
    sec = b.load(b.gep(ts, [_I32(0), _I32(0)]))
    nsec = b.load(b.gep(ts, [_I32(0), _I32(1)]))
    b.ret(b.add(b.mul(sec, _I64(1_000_000_000)), nsec))

    # Each thread runs the loop's function and adds its work to the region's sum: the
    # calling thread its wall time (its own time, as one thread would spend it), the
    # others their CPU time, which a time slice taken by another process does not count.
    run = ll.Function(mod, _FN, "ucf_team_run")
    run.linkage = "internal"
    b = ll.IRBuilder(run.append_basic_block())
    ctx = b.bitcast(run.args[0], ll.PointerType(_CTX))
    fn = b.load(b.gep(ctx, [_I32(0), _I32(0)]))
    data = b.load(b.gep(ctx, [_I32(0), _I32(1)]))
    master = b.icmp_signed("==", b.call(thread_num, []), _I32(0))
    which = b.select(master, _I32(CLOCK_MONOTONIC), _I32(CLOCK_THREAD_CPUTIME_ID))
    t0 = b.call(now, [which])
    b.call(fn, [data])
    t1 = b.call(now, [which])
    b.atomic_rmw("add", b.gep(ctx, [_I32(0), _I32(2)]), b.sub(t1, t0), "monotonic")
    b.ret_void()

    _entry(mod, gomp, max_threads, now, run, counters)
    return str(mod)


def _entry(mod, gomp, max_threads, now, run, counters) -> None:
    f = ll.Function(mod, entry_type(), ENTRY)
    fn, data, n, flags, state = f.args
    blocks = {
        k: f.append_basic_block(k)
        for k in ("entry", "alone", "check", "whole", "team", "timed", "lost", "won", "done")
    }
    b = ll.IRBuilder(blocks["entry"])

    def field(k: int):
        return b.gep(state, [_I32(0), _I32(k)])

    def load(ptr):
        return b.load_atomic(ptr, "monotonic", 8)

    def store(value, ptr):
        b.store_atomic(value, ptr, "monotonic", 8)

    # n is 1 below the work threshold, else 0 (the calling thread's OpenMP default).
    want = b.select(b.icmp_unsigned("==", n, _I32(0)), b.call(max_threads, []), n)
    want = b.sext(want, _I64)
    fixed = b.icmp_signed("!=", b.load(counters[FIXED]), _I64(0))
    b.cbranch(b.icmp_signed("<=", want, _I64(1)), blocks["alone"], blocks["check"])

    b.position_at_end(blocks["check"])
    b.cbranch(fixed, blocks["whole"], blocks["team"])

    b.position_at_end(blocks["whole"])
    b.call(gomp, [fn, data, n, flags])
    b.branch(blocks["done"])

    b.position_at_end(blocks["alone"])
    b.call(gomp, [fn, data, _I32(1), flags])
    b.branch(blocks["done"])

    b.position_at_end(blocks["team"])
    cap = load(field(0))
    cap = b.select(
        b.or_(b.icmp_signed("==", cap, _I64(0)), b.icmp_signed(">", cap, want)), want, cap
    )
    start = b.call(now, [_I32(CLOCK_MONOTONIC)])
    probing = b.and_(b.icmp_signed("<", cap, want), b.icmp_signed(">=", start, load(field(1))))
    doubled = b.mul(cap, _I64(2))
    bigger = b.select(b.icmp_signed("<", doubled, want), doubled, want)
    team = b.select(probing, bigger, cap)
    b.cbranch(b.icmp_signed("<=", team, _I64(1)), blocks["alone"], blocks["timed"])

    b.position_at_end(blocks["timed"])
    ctx = b.alloca(_CTX)
    b.store(fn, b.gep(ctx, [_I32(0), _I32(0)]))
    b.store(data, b.gep(ctx, [_I32(0), _I32(1)]))
    b.store(_I64(0), b.gep(ctx, [_I32(0), _I32(2)]))
    b.call(gomp, [run, b.bitcast(ctx, _I8P), b.trunc(team, _I32), flags])
    end = b.call(now, [_I32(CLOCK_MONOTONIC)])
    work = b.load(b.gep(ctx, [_I32(0), _I32(2)]))
    b.atomic_rmw("add", counters["ucf_team_timed"], _I64(1), "monotonic")
    store(work, field(3))
    took = b.mul(b.sub(end, start), _I64(LOST_DEN))
    lost = b.icmp_signed(">=", took, b.mul(work, _I64(LOST_NUM)))
    b.cbranch(lost, blocks["lost"], blocks["won"])

    b.position_at_end(blocks["lost"])
    half = b.sdiv(team, _I64(2))
    store(b.select(b.icmp_signed("<", half, _I64(1)), _I64(1), half), field(0))
    wait = load(field(2))
    wait = b.select(b.icmp_signed("==", wait, _I64(0)), _I64(BACKOFF_NS), wait)
    store(b.add(end, wait), field(1))
    twice = b.mul(wait, _I64(2))
    store(
        b.select(b.icmp_signed("<", twice, _I64(MAX_BACKOFF_NS)), twice, _I64(MAX_BACKOFF_NS)),
        field(2),
    )
    # Counted once the state is written: the call path reads the states again when the
    # count moves (``ucf.toolchain.team.LoopStates.plan``).
    b.atomic_rmw("add", counters["ucf_team_lost"], _I64(1), "release")
    b.branch(blocks["done"])

    # A probe that wins halves the wait rather than forgetting it: on a machine that stays
    # busy, a lucky region would otherwise restart the short waits, each ending in a
    # probe that waits for a late thread (what the 99th percentile of a call was made of).
    b.position_at_end(blocks["won"])
    store(team, field(0))
    old = load(field(2))
    half = b.ashr(old, _I64(1))
    half = b.select(b.icmp_signed("<", half, _I64(BACKOFF_NS)), _I64(0), half)
    store(b.select(probing, half, old), field(2))
    b.branch(blocks["done"])

    b.position_at_end(blocks["done"])
    b.ret_void()
