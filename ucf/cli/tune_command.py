"""``ucf tune``: search schedules of a statement for inputs read from files (``ucf.tune``)
and record the fastest for ``schedule="tuned"``."""

from __future__ import annotations

import argparse
from typing import Any

from ucf.cli.options import add_input_options, add_kernel_options, positive, to_dict
from ucf.cli.run_command import read_inputs

EPILOG = """\
examples:
  ucf tune "y(i) = A(i,j) * x(j)" -i A:matrix.mtx -i x:x.npy --trials 50
  ucf tune "C(i,k) = A(i,j) * B(j,k)" -f C:csr -i A:a.mtx -i B:b.mtx --n-jobs 2 --plot tune.png

Each trial compiles one schedule, checks its result against the default
schedule's and times it.  The study is kept in the cache directory, so running
the command again adds trials to it.  The best schedule is recorded for these
formats, dtypes and input sizes, where ucf.compile(..., schedule="tuned")
finds it (docs/tuning.md).  Inputs are read as for "ucf run".
"""


def add_parser(sub: Any) -> None:
    pt = sub.add_parser(
        "tune",
        help="search for a faster schedule on tensors read from files",
        description="Search schedules of a statement for the inputs read from files "
        '(Optuna, TPE), and record the fastest for schedule="tuned".',
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_kernel_options(pt, schedule=False)
    add_input_options(pt)
    pt.add_argument("--trials", type=positive, default=50, metavar="N", help="trials to add (50)")
    pt.add_argument("--n-jobs", type=positive, default=1, metavar="N", help="worker processes (1)")
    pt.add_argument("--seed", type=int, metavar="N", help="seed of the sampler")
    pt.add_argument(
        "--timeout", type=float, metavar="SECONDS", help="stop adding trials after this long"
    )
    pt.add_argument(
        "--storage",
        metavar="URL",
        help="Optuna storage URL of the study (default: tune.db in the cache directory)",
    )
    pt.add_argument("--plot", metavar="PNG", help="write the trial history and importances here")
    pt.add_argument(
        "--search-formats",
        action="store_true",
        help="also try other formats for the sparse inputs (their conversion is timed apart)",
    )
    pt.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    import ucf

    formats = to_dict(args.formats, "format")
    operands = read_inputs(args, formats)
    result = ucf.tune(
        args.expr,
        formats=formats,
        trials=args.trials,
        n_jobs=args.n_jobs,
        storage=args.storage,
        seed=args.seed,
        timeout=args.timeout,
        target=args.target,
        dtype=args.dtype,
        index_dtype=args.index_dtype,
        shapes=to_dict(args.extents, "extent") or None,
        progress=False if args.no_progress else None,
        search_formats=args.search_formats,
        **operands,
    )
    print(f"default:  {result.default_time * 1e6:.1f} us per call")
    trials = len(result.study.trials)
    if result.is_default:
        if any(t.value is not None for t in result.study.trials):
            print(f"tuned:    no trial beat the default ({trials} trials in the study)")
        else:
            print(f"tuned:    every trial failed ({trials} trials in the study), for example:")
            for schedule, why in list(result.reasons.items())[:3]:
                print(f"  {schedule or '(no commands)'}: {why}")
        print(f"schedule: {result.schedule or '(serial, no commands)'} (the default's)")
    else:
        print(
            f"tuned:    {result.time * 1e6:.1f} us per call ({result.speedup:.2f}x; "
            f"{trials} trials in the study)"
        )
        print(f"schedule: {result.schedule or '(serial, no commands)'}")
        if result.conversion_time:
            shown = " ".join(f"{n}:{f}" for n, f in result.formats.items())
            took = result.conversion_time * 1e6
            print(f"formats:  {shown} (converting to them takes {took:.1f} us)")
        print('recorded for schedule="tuned"')
    if args.plot:
        print(f"wrote {result.plot(args.plot)}")
    return 0
