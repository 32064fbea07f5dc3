"""SpGEMM's row-bound walk as the default compiles it against the same walk aligned to a
line of code (main d8cde82) and as before banded SpMV's settings (issue 38: did SpGEMM
on two threads get slower when ``ucf.passes.streams`` moved to 6 KB and aligned its walks?).

    OMP_WAIT_POLICY=passive UCF_ADAPTIVE_TEAM=0 python bench/spgemm_streams.py
    OMP_WAIT_POLICY=passive python bench/spgemm_streams.py --rounds 30

`C(i,k) = A(i,j) * B(j,k)`, A and B CSR, C ``csr`` (sorted rows) or ``UQ`` (unsorted),
``A @ A`` on bench/peers.py's operand (100k x 100k, 10 a row at random columns). On
two threads the kernel first counts each row's bound (the sum of B's row lengths over
A's row): that walk over A's row is the one the streams pass fetches and aligns; on
one thread no walk is fetched, so the contenders' kernels are the same code, and their
spread is the noise floor. Contenders, each compiled into a kernel cache of its own
with ``DISTANCE`` and ``LINE`` as bench/banded_spmv.py's ``VARIANTS`` set them:
``default``, ``8 KB, LLVM's placement`` (aca419b's kernel), ``6 KB, LLVM's placement``
and ``8 KB, aligned``; and ``6 KB, count walk aligned``: the default with the walks
of coordinates only aligned too (main d8cde82's kernel, before ``streams._aligns``
left them to LLVM). Since that change the count walk is aligned in none but the last,
so ``default`` and ``6 KB, LLVM's placement`` are the same code.

Every contender of both thread counts and both outputs runs once untimed, then
``--rounds`` rounds; in each, every contender (in an order rotated by one each round)
runs an untimed call and a timed one (the allocator as its own last call left it).
Each timed call records the process CPU time (both threads' time: with
``OMP_WAIT_POLICY=passive`` a thread waiting at a barrier sleeps rather than spins),
the wall time, and the parallel regions ucf's team lost (``ucf.toolchain.team``;
``UCF_ADAPTIVE_TEAM=0`` keeps every region on both threads). Printed per contender:
median and best CPU and wall time, and the median and quartiles over rounds of its
CPU time over the ``default`` contender's in the same round (the machine's slow
phases cancel), and in how many rounds that ratio was above 1.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from banded_spmv import VARIANTS, walk_settings  # noqa: E402
from spmv_spmm import fresh_kernel_cache, uniform  # noqa: E402

import ucf  # noqa: E402
from ucf.passes import streams  # noqa: E402
from ucf.toolchain.jit import team_counters  # noqa: E402

SPGEMM = "C(i,k) = A(i,j) * B(j,k)"


#: The contenders' settings: ``DISTANCE``, ``LINE``, and whether a walk of coordinates
#: only starts a line too.
CONTENDERS = {
    **{name: (*v, False) for name, v in VARIANTS.items()},
    "6 KB, count walk aligned": (6144, 64, True),
}


@contextmanager
def count_walk_aligned(on: bool) -> Iterator[None]:
    """While compiling, every walk fetched into the L1 starts a line, as on main d8cde82."""
    saved = streams._aligns
    if on:
        streams._aligns = lambda arrays, crd, level: level == 1 and streams.LINE > 0
    try:
        yield
    finally:
        streams._aligns = saved


def contender(a, want, out: str, threads: int, distance: int, line: int, counts: bool):
    """A call of the default SpGEMM compiled for ``threads`` with the walks' settings
    given, checked against scipy; ``digest`` names its generated code."""
    ucf.set_num_threads(threads)
    with (
        walk_settings(distance, line),
        count_walk_aligned(counts),
        fresh_kernel_cache("ucf-spgemm-streams-"),
    ):
        k = ucf.compile(SPGEMM, formats={"A": "csr", "B": "csr", "C": out})
        got = k(A=a, B=a).to_scipy()
    diff = abs(got - want)
    assert diff.nnz == 0 or diff.max() <= 1e-12 * abs(want).max(), (out, threads)

    def call():
        ucf.set_num_threads(threads)
        return k(A=a, B=a)

    call.digest = hashlib.sha1(k.source.encode()).hexdigest()[:10]
    return call


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--outputs", nargs="+", default=["csr", "UQ"])
    ap.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    args = ap.parse_args(argv)
    m = uniform(100_000, 10, np.random.default_rng([38, 2]))  # peers.py's spgemm operand
    a = ucf.from_scipy(m, format="csr")
    want = m @ m
    calls = {
        (threads, out, name): contender(a, want, out, threads, *v)
        for threads in args.threads
        for out in args.outputs
        for name, v in CONTENDERS.items()
        if name in args.contenders
    }
    keys = list(calls)
    env = {v: os.environ.get(v, "-") for v in ("OMP_WAIT_POLICY", "UCF_ADAPTIVE_TEAM")}
    print(f"load average at start: {os.getloadavg()[0]:.2f}; {env}")
    for f in calls.values():
        f()
    cpu = {k: [] for k in keys}
    wall = {k: [] for k in keys}
    lost = dict.fromkeys(keys, 0)
    loads = []
    for r in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for k in keys[r % len(keys) :] + keys[: r % len(keys)]:
            calls[k]()
            before = team_counters()["lost"]
            c0, t0 = time.process_time(), time.perf_counter()
            calls[k]()
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
            lost[k] += team_counters()["lost"] - before
    print(
        f"load average at end: {os.getloadavg()[0]:.2f}; over the rounds "
        f"{min(loads):.2f}-{max(loads):.2f}, median {np.median(loads):.2f}\n"
    )
    print(
        "| threads | C | contender | code | CPU median | CPU best | wall median | wall best "
        "| CPU / default's (quartiles) | rounds above 1 | regions lost |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for k in keys:
        threads, out, name = k
        ratio = np.array(cpu[k]) / np.array(cpu[(threads, out, "default")])
        q1, q2, q3 = np.percentile(ratio, [25, 50, 75])
        print(
            f"| {threads} | {out} | {name} | {calls[k].digest} "
            f"| {np.median(cpu[k]) * 1e3:.2f} | {min(cpu[k]) * 1e3:.2f} "
            f"| {np.median(wall[k]) * 1e3:.2f} | {min(wall[k]) * 1e3:.2f} "
            f"| {q2:.3f} ({q1:.3f}-{q3:.3f}) | {int((ratio > 1).sum())} of {len(ratio)} "
            f"| {lost[k]} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
