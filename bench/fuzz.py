"""The long fuzz runs: many random cases, minimized repros of every failure.

```sh
python bench/fuzz.py --cases 10000 --out bench/fuzz-repros/
python bench/fuzz.py --fuzzer statements --cases 10000
python bench/fuzz.py --fuzzer fills --cases 5000
python bench/fuzz.py --cases 2000 --workers 2 --targets llvm --kernels SpMV,SpGEMM
python bench/fuzz.py --case 4711 --seed 0     # rerun one case of an earlier run
python bench/fuzz.py --fuzzer statements --first 5000 --cases 5000   # its second half
```

Two generators, the ones the test suite draws from (three ways to draw):

- ``--fuzzer schedules`` (the default, ``tests/schedule/fuzz_cases.py``): random schedules
  (reorder, split, divide, fuse, pos, bound, unroll, precompute, parallelize) over
  SpMV, SpMM, SDDMM, TTV, MTTKRP, SpGEMM, a sparse add and kernels that read a
  tensor twice or its diagonal, in random formats (blocked with unequal blocks,
  ``nm(n,m)``), plus dynamic-tile and TeSA-plan cases, checked against ``np.einsum``
  on dense copies;
- ``--fuzzer statements`` (``tests/statement_fuzz.py``): random statements (sums,
  products, functions, explicit sum/max/min reductions; tensors read under several
  index lists and with repeated variables) in random formats, some with fills or an
  empty range, some with a dynamic operand or run as a TeSA plan, checked against a
  numpy evaluation of the reduction rule; some are a clash, two operands whose fills
  absorb the operator between them and disagree, under a max or min;
- ``--fuzzer fills``: the statement generator asked for the language's reductions and
  fills in every case, as ``tests/lang/test_fuzz_fills.py`` draws them (no plans, a
  quarter of the cases a clash).

All run on the llvm and c targets. Case ``n`` of seed ``s`` is drawn from
``random.Random("s:n")``, so any case can be rerun alone. Each case runs in a worker
subprocess; a crash or a hang is a failure, not the end of the run (with
``UCF_CFLAGS=... -fsanitize=address`` and ``LD_PRELOAD`` of the ASan runtime, an
out-of-bounds access in a c kernel is such a crash: tests/test_fuzz.py).

After the run, each failure is minimized (commands dropped, operands made dense,
extents and densities reduced, target llvm tried) while it still fails the same way,
and written to ``--out`` as a standalone script plus a JSON record of the original
and the minimized case. The summary table gives accepted / refused / failed cases
per kernel (per case kind for statements). Needs the test extras
(``pip install -e ".[test]"``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT),):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from tests import statement_fuzz  # noqa: E402
from tests.fuzz_common import Outcome, WorkerPool  # noqa: E402
from tests.schedule import fuzz_cases as sf  # noqa: E402

COLUMNS = ("ok", "refused", "racy", "wrong", "error", "crash", "hang")
FUZZERS = {"schedules": sf, "statements": statement_fuzz, "fills": statement_fuzz}


def draw(fuzzer: str, seed: int, n: int, targets: list[str], kernels: list[str]):
    d = sf.RandomDraw(f"{seed}:{n}")
    if fuzzer == "schedules":
        return sf.draw_case(d, targets, kernels)
    return statement_fuzz.draw_case(d, targets, lang=fuzzer == "fills")


def signature(case, outcome: Outcome) -> str:
    """What kind of failure this is: the status and, for errors, the exception's last line
    with numbers and quoted names blanked, so one bug is counted once."""
    if outcome.status != "error":
        return f"{case.group}: {outcome.status}"
    lines = [line for line in outcome.detail.strip().splitlines() if line.strip()]
    if outcome.detail.startswith("CompileError"):
        lines = [line.split("error:", 1)[1] for line in lines if "error:" in line] or lines
        last = "CompileError:" + lines[0]
    else:
        last = lines[-1] if lines else ""
    last = re.sub(r"'[^']*'|‘[^’]*’|\d+", "_", last)[:120]
    return f"{case.group}: error: {last}"


def minimize(pool: WorkerPool, case, outcome: Outcome, budget: int):
    """Take simpler cases (the fuzzer's ``simpler``) while they fail with the same
    signature, for ``budget`` runs."""
    fuzzer = FUZZERS["statements" if isinstance(case, statement_fuzz.Case) else "schedules"]
    want = signature(case, outcome)
    progress = True
    while progress and budget > 0:
        progress = False
        for candidate in fuzzer.simpler(case):
            if budget <= 0:
                break
            budget -= 1
            got = pool.run(candidate)
            if got.failed and signature(candidate, got) == want:
                case, outcome, progress = candidate, got, True
                break
    return case, outcome


def table(counts: dict[str, Counter]) -> str:
    head = f"{'group':8} {'cases':>6} {'accepted':>8} {'refused':>8} {'failed':>6}   " + " ".join(
        f"{c:>7}" for c in COLUMNS
    )
    rows = [head, "-" * len(head)]
    total: Counter = Counter()
    for name in [*sorted(counts), "total"]:
        c = total if name == "total" else counts[name]
        if name != "total":
            total.update(c)
        n = sum(c.values())
        failed = sum(c[s] for s in sf.FAILURES)
        rows.append(
            f"{name:8} {n:>6} {c['ok'] + c['racy']:>8} {c['refused']:>8} {failed:>6}   "
            + " ".join(f"{c[s]:>7}" for s in COLUMNS)
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=1000, help="number of cases (default 1000)")
    ap.add_argument("--seed", type=int, default=0, help="run seed (default 0)")
    ap.add_argument(
        "--first",
        type=int,
        default=0,
        help="number of the first case (default 0): --first 5000 --cases 5000 runs the "
        "second half of a 10000-case run, so a long run can be split or finished",
    )
    ap.add_argument("--case", type=int, help="run only case number CASE of --seed, verbosely")
    ap.add_argument("--workers", type=int, default=2, help="worker subprocesses (default 2)")
    ap.add_argument("--threads", type=int, default=2, help="OpenMP threads per worker (default 2)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per case (default 120)")
    ap.add_argument("--targets", default="llvm,c", help="comma-separated (default llvm,c)")
    ap.add_argument("--kernels", default=",".join(sf.KERNELS), help="comma-separated kernels")
    ap.add_argument(
        "--fuzzer",
        choices=sorted(FUZZERS),
        default="schedules",
        help="random schedules over kernels (default), random statements, or random "
        "statements with a reduction and fills in every case",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "fuzz-repros", help="repro folder")
    ap.add_argument("--budget", type=int, default=80, help="runs to minimize each failure")
    ap.add_argument("--reasons", type=int, default=0, help="print the N commonest refusals")
    args = ap.parse_args(argv)
    targets = args.targets.split(",")
    kernels = args.kernels.split(",")
    unknown = [k for k in kernels if k not in sf.KERNELS]
    if unknown:
        ap.error(f"unknown kernel {unknown[0]}; the kernels are {', '.join(sf.KERNELS)}")

    numbers = [args.case] if args.case is not None else range(args.first, args.first + args.cases)
    cases = (draw(args.fuzzer, args.seed, n, targets, kernels) for n in numbers)
    fuzzer = FUZZERS[args.fuzzer]
    counts: dict[str, Counter] = {}
    reasons: Counter = Counter()
    failures: list[tuple[int, object, Outcome]] = []
    index = {}
    start = time.monotonic()
    with WorkerPool(args.workers, args.timeout, args.threads) as pool:
        done = 0

        def numbered():
            for n, case in zip(numbers, cases, strict=True):
                index[id(case)] = n
                yield case

        for case, outcome in pool.map(numbered()):
            done += 1
            n = index.pop(id(case))
            counts.setdefault(case.group, Counter())[outcome.status] += 1
            if outcome.status == "refused":
                reasons[re.sub(r"\([^()]*\)", "(…)", outcome.detail.splitlines()[0])[:160]] += 1
            if outcome.failed:
                failures.append((n, case, outcome))
                print(f"case {n}: {signature(case, outcome)}", file=sys.stderr, flush=True)
            if args.case is not None:
                print(fuzzer.repro(case, outcome))
            if done % 250 == 0:
                rate = done / (time.monotonic() - start)
                print(
                    f"{done} cases, {len(failures)} failures, {rate:.1f} cases/s",
                    file=sys.stderr,
                    flush=True,
                )
        span = f"seed {args.seed}" + (f", cases {numbers[0]} to {numbers[-1]}" if done else "")
        print(f"\n{done} cases in {time.monotonic() - start:.0f} s ({span})\n")
        print(table(counts))
        if args.reasons:
            print("\ncommonest refusals:")
            for text, k in reasons.most_common(args.reasons):
                print(f"{k:6}  {text}")
        if failures:
            report(pool, failures, args)
    return 1 if failures else 0


def report(pool: WorkerPool, failures, args) -> None:
    """Minimize the first failure of each signature; write every one as a repro."""
    args.out.mkdir(parents=True, exist_ok=True)
    kinds: dict[str, list[int]] = {}
    for n, case, outcome in failures:
        sig = signature(case, outcome)
        first = sig not in kinds
        kinds.setdefault(sig, []).append(n)
        small, small_outcome = case, outcome
        if first and outcome.status != "hang":  # a hang's every try costs a timeout
            small, small_outcome = minimize(pool, case, outcome, args.budget)
        stem = args.out / f"seed{args.seed}-{args.fuzzer}-case{n}-{case.group}-{outcome.status}"
        stem.with_suffix(".py").write_text(FUZZERS[args.fuzzer].repro(small, small_outcome))
        record = {
            "seed": args.seed,
            "case_number": n,
            "signature": sig,
            "case": asdict(case),
            "outcome": asdict(outcome),
            "minimized": asdict(small),
            "minimized_outcome": asdict(small_outcome),
        }
        stem.with_suffix(".json").write_text(json.dumps(record, indent=1))
    print(f"\n{len(failures)} failures of {len(kinds)} kinds; repros in {args.out}:")
    for sig, ns in kinds.items():
        shown = ", ".join(map(str, ns[:8])) + (" …" if len(ns) > 8 else "")
        print(f"{len(ns):6}  {sig}   (cases {shown})")


if __name__ == "__main__":
    sys.exit(main())
