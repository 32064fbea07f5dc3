"""The wait for a panel of the team's cache on a busy machine (issue 34): bcsr(32,32)
SpMM 1024^3 float32, 90 % zero blocks, 2 threads, while ``yes`` holds a core.

Run from the repository root:

    python bench/panel_wait.py --base /tmp/base   # /tmp/base: an archive of main

In a team's shared cache of B panels (``ucf.passes.panels``) a thread that needs a
panel another thread is packing waits for its tag; if the packer is descheduled the
waiter spins. This times that kernel (the block rows in parallel, so the team shares
its panels) in this tree and in ``--base`` (the tree before a change: ``git archive``
of main), in processes of their own that take turns, round after round, each with
its own kernel cache; per tree and mode (``ships``: ucf's adaptive team; ``whole``:
every region on both threads, ``jit.set_whole_team``) the median, 90th and 99th
percentile of the calls. Results are checked against numpy first.

Target: with the whole team, this tree's 99th percentile <= the base's (the polite
wait must not lose in the tail it exists for), and its median <= 1.05x the base's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SPMM = "C(i,j) = A(i,k) * B(k,j)"
SCHEDULE = "parallelize(i_blk, CPUThread, NoRaces)"
MODES = ("ships", "whole")


def worker(mode: str, calls: int) -> None:
    """Time ``calls`` single calls of the kernel in this process; print them as JSON."""
    import ucf
    from ucf.toolchain import jit

    rng = np.random.default_rng(34)
    n, block = 1024, 32
    live = rng.random((n // block, n // block)) < 0.10
    a = (np.kron(live, np.ones((block, block))) * rng.standard_normal((n, n))).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    ucf.set_num_threads(2)
    jit.set_whole_team(mode == "whole")
    fmt = f"bcsr({block},{block})"
    k = ucf.compile(SPMM, formats={"A": fmt}, dtype="float32", schedule=SCHEDULE)
    t = ucf.from_numpy(a, format=fmt)
    got = k(A=t, B=b).to_numpy()
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-3, atol=1e-3)
    for _ in range(20):
        k(A=t, B=b)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        k(A=t, B=b)
        times.append(time.perf_counter() - start)
    print(json.dumps({"team": "team" in k.cin, "at": ucf.__file__, "times": times}))


def run(tree: Path, mode: str, calls: int) -> list[float]:
    env = dict(os.environ, PYTHONPATH=str(tree), UCF_CACHE_DIR=f"/tmp/ucf-panel-wait-{tree.name}")
    args = [sys.executable, __file__, "--worker", mode, "--calls", str(calls)]
    out = subprocess.run(args, env=env, cwd=tree, capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["team"], f"{tree}: the kernel did not share its panels in a team"
    assert res["at"].startswith(str(tree)), f"{tree}: ran ucf from {res['at']}"
    return res["times"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, help="the tree before the change (git archive)")
    ap.add_argument("--calls", type=int, default=300, help="timed calls per tree and mode")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.worker, a.calls)
        return 0
    trees = {"base": a.base, "this": ROOT} if a.base else {"this": ROOT}
    times: dict[tuple[str, str], list[float]] = {(t, m): [] for t in trees for m in MODES}
    load = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL)
    try:
        for r in range(a.rounds):
            order = list(trees.items()) if r % 2 == 0 else list(reversed(trees.items()))
            for mode in MODES:
                for name, tree in order:
                    times[name, mode] += run(tree.resolve(), mode, a.calls // a.rounds)
    finally:
        load.kill()
        load.wait()
    print(f"load average {os.getloadavg()[0]:.2f} (plus the yes process)")
    print(f"{'tree':6} {'mode':6} {'calls':>5} {'median ms':>10} {'p90 ms':>8} {'p99 ms':>8}")
    stats = {}
    for (name, mode), ts in times.items():
        med, p90, p99 = (float(np.percentile(ts, q)) * 1e3 for q in (50, 90, 99))
        stats[name, mode] = med, p99
        print(f"{name:6} {mode:6} {len(ts):5} {med:10.2f} {p90:8.2f} {p99:8.2f}")
    if a.base:
        (bm, b99), (tm, t99) = stats["base", "whole"], stats["this", "whole"]
        met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
        print(f"whole p99 this/base {t99 / b99:.2f}x (target <= 1.00x): {met(t99 <= b99)}")
        print(f"whole median this/base {tm / bm:.2f}x (target <= 1.05x): {met(tm <= 1.05 * bm)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
