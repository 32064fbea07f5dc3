"""Why 2-thread banded SpMV takes ~6.3 ms in one run and ~9 ms in another (issue 38).

    python bench/spmv_modes.py                   # 10 fresh processes, 12 rounds each
    python bench/spmv_modes.py --processes 20 --rounds 15

Each process builds a banded matrix of bench/peers.py's shape (2M rows, 15 diagonals)
and times ucf's default 2-thread SpMV as peers.py does: each timed call right
after an untimed one, in rounds that alternate "alone" (ucf's calls back to back) and
"after scipy" (two scipy ``A @ x`` first, as in peers.py, where scipy is the contender
before ucf). Beside each timed call's wall time it reads what no other process's load
changes much: the calling thread's CPU time and the other thread's (process CPU time
less the caller's), the adaptive team's lost regions, and once per process the arrays'
huge-page coverage, y's offset from x modulo 4 KB, the same kernel on one thread (CPU
time), and the read bandwidth of two threads at once (two Python threads each taking
``max`` of an array of its own: numpy releases the GIL there).

A slow call then says which kind it is:

- **both ran**: each thread's CPU time is at least 0.85 of the call's wall time. Both
  threads ran the whole call and were slower at it: memory (or the host's sharing of
  its cores and memory among its guests), not ucf's split or its team.
- **one waited**: a thread's CPU time is under 0.85 of the wall time: it started late,
  was descheduled, or had less to do (a split's imbalance).
- **one thread**: the other thread did (almost) nothing: the adaptive team ran the
  call on one thread.

On a loaded machine most calls are "one waited" (another process has the core); the
classes say something about ucf only where the machine is quiet. On 2026-11-29 at
23:28 the slow calls were "both ran" at 9.0-9.2 ms while two threads read 42 GB/s
together (bench/README.md, "Banded SpMV on two threads").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

#: A call is slow when its wall time exceeds this many times the fastest alone call.
SLOW = 1.25
#: A thread "ran the whole call" when its CPU time is at least this share of the wall time.
RAN = 0.85


def _thp_kb(array: np.ndarray) -> tuple[int, int]:
    """Kilobytes of ``array`` in huge pages, and its size in kilobytes (``/proc/self/smaps``)."""
    lo, hi = array.ctypes.data, array.ctypes.data + array.nbytes
    total, cur = 0, None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            a, b = (int(v, 16) for v in head[0].split("-"))
            cur = (a, b) if a < hi and b > lo else None
        elif cur and head[0] == "AnonHugePages:":
            overlap = (min(cur[1], hi) - max(cur[0], lo)) >> 10
            total += min(int(head[1]), overlap)
    return total, array.nbytes >> 10


def _pair_bandwidth(windows: int = 12) -> float | None:
    """GB/s of two threads reading 128 MB each at once, over the windows where both
    threads ran throughout (CPU time >= 0.9 of the window); None if none did."""
    arrays = [np.ones(16 << 20) for _ in range(2)]
    got = [[], []]
    start = threading.Barrier(2)

    def read(me: int) -> None:
        for _ in range(windows):
            start.wait()
            t, w = time.thread_time(), time.perf_counter()
            arrays[me].max()
            got[me].append((time.thread_time() - t, time.perf_counter() - w))

    threads = [threading.Thread(target=read, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rates = [
        2 * arrays[0].nbytes / max(w0, w1) / 1e9
        for (c0, w0), (c1, w1) in zip(got[0][1:], got[1][1:], strict=True)
        if c0 >= 0.9 * w0 and c1 >= 0.9 * w1
    ]
    return float(np.median(rates)) if rates else None


def child(rounds: int) -> dict:
    """One process's measurements (see the module's docstring)."""
    from spmv_spmm import banded

    import ucf
    from ucf.toolchain.jit import team_counters

    rng = np.random.default_rng([38, 0])
    a = banded(2_000_000, 15, rng)
    x = rng.random(a.shape[1])
    k = ucf.compile("y(i) = A(i,j) * x(j)", {"A": "csr"})
    at = ucf.from_scipy(a, "csr")

    def timed() -> tuple[float, float, float, int]:
        k(A=at, x=x)
        lost = team_counters()["lost"]
        c, p, w = time.thread_time(), time.process_time(), time.perf_counter()
        k(A=at, x=x)
        w, c, p = time.perf_counter() - w, time.thread_time() - c, time.process_time() - p
        return w * 1e3, c * 1e3, (p - c) * 1e3, team_counters()["lost"] - lost

    load = os.getloadavg()[0]
    ucf.set_num_threads(1)
    k(A=at, x=x)
    one = float(np.median([timed()[1] for _ in range(4)]))
    ucf.set_num_threads(2)
    for _ in range(3):
        k(A=at, x=x)
    calls: dict[str, list] = {"alone": [], "after scipy": []}
    for r in range(rounds):
        for mode in ("alone", "after scipy")[:: 1 if r % 2 == 0 else -1]:
            if mode == "after scipy":
                a @ x
                a @ x
            calls[mode].append(timed())
    y = np.asarray(k(A=at, x=x))
    thp = [_thp_kb(v) for v in (*at.arrays, x, y)]
    return {
        "utc": time.strftime("%H:%M:%S", time.gmtime()),
        "load": [round(load, 2), round(os.getloadavg()[0], 2)],
        "one_thread_cpu_ms": round(one, 2),
        "calls": calls,
        "thp_share": round(sum(t for t, _ in thp) / sum(n for _, n in thp), 3),
        "y_minus_x_mod_4k": (y.ctypes.data - x.ctypes.data) % 4096,
        "pair_gbps": _pair_bandwidth(),
    }


def kind(wall: float, master: float, worker: float) -> str:
    """What a call's threads did: "one thread", "both ran" or "one waited"."""
    if worker < 1.0:
        return "one thread"
    return "both ran" if min(master, worker) >= RAN * wall else "one waited"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.rounds)))
        return 0
    runs = []
    print(
        "| process | UTC | load | alone ms | after scipy ms | after scipy: CPU ms caller / other "
        "| kinds of the after-scipy calls | 1 thread CPU ms | 2-thread read GB/s | huge pages "
        "| y-x mod 4K |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )
    for p in range(args.processes):
        out = subprocess.run(
            [sys.executable, __file__, "--child", "--rounds", str(args.rounds)],
            capture_output=True,
            text=True,
            check=True,
        )
        run = json.loads(out.stdout.strip().splitlines()[-1])
        runs.append(run)
        alone, after = (np.array(run["calls"][m]) for m in ("alone", "after scipy"))
        kinds = [kind(*c[:3]) for c in after]
        counts = ", ".join(f"{kinds.count(s)} {s}" for s in sorted(set(kinds)))
        bw = run["pair_gbps"]
        print(
            f"| {p} | {run['utc']} | {run['load'][0]:.1f}-{run['load'][1]:.1f} "
            f"| {np.median(alone[:, 0]):.2f} "
            f"| {np.median(after[:, 0]):.2f} | {np.median(after[:, 1]):.2f} / "
            f"{np.median(after[:, 2]):.2f} | {counts} | {run['one_thread_cpu_ms']:.2f} "
            f"| {'-' if bw is None else f'{bw:.0f}'} | {run['thp_share']:.0%} "
            f"| {run['y_minus_x_mod_4k']} |"
        )
    every = np.array([c for r in runs for m in r["calls"].values() for c in m])
    fast = every[:, 0].min()
    slow = every[every[:, 0] > SLOW * fast]
    kinds = [kind(*c[:3]) for c in slow]
    print(f"\nfastest call {fast:.2f} ms; {len(slow)} of {len(every)} calls over {SLOW}x that:")
    for s in ("both ran", "one waited", "one thread"):
        print(f"  {s}: {kinds.count(s)}")
    for mode in ("alone", "after scipy"):
        med = [float(np.median(np.array(r["calls"][mode])[:, 0])) for r in runs]
        print(
            f"{mode}: process medians min {min(med):.2f} / median {np.median(med):.2f} / "
            f"max {max(med):.2f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
