"""``ucf demo``: built-in kernels on random data, checked against numpy/scipy and timed
(``ucf.demo``)."""

from __future__ import annotations

import argparse
from typing import Any

from ucf.cli.options import positive

EPILOG = """\
example:
  ucf demo --size 5000

Runs SpMV, SpMM, sparse addition and MTTKRP on random data (fixed seed),
checks each result against numpy/scipy and prints timings.
"""


def add_parser(sub: Any) -> None:
    pd = sub.add_parser(
        "demo",
        help="run built-in kernels on random data and compare with scipy",
        description="Run SpMV, SpMM, sparse add and MTTKRP on random data, check "
        "them against numpy/scipy and print timings.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    pd.add_argument(
        "--size",
        type=positive,
        default=20000,
        metavar="N",
        help="rows and columns of the random sparse matrices (20000)",
    )
    pd.add_argument(
        "--target",
        choices=("llvm", "c"),
        default="llvm",
        help="code generator (llvm, no C compiler needed)",
    )


def run(args: argparse.Namespace) -> int:
    from ucf.demo import run_demo

    return run_demo(args.size, args.target)
