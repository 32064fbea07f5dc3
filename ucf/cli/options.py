"""What the ``ucf`` subcommands share: the argument types (``T:FILE``, ``VAR=N``), the
options of a kernel (statement, formats, schedule, target, dtypes) and of its inputs
read from files, and the check that a tensor is not given two values."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from ucf.cli.user_error import UserError
from ucf.codegen import TARGETS

DTYPES = ("float64", "float32", "int64", "int32")
INDEX_DTYPES = ("int32", "int64")


def pair(what: str):
    """An argparse type for ``T:VALUE``; only the first colon splits, since formats use one."""

    def parse(text: str) -> tuple[str, str]:
        name, sep, value = text.partition(":")
        name = name.strip()
        if not sep or not name.isidentifier() or not value:
            raise argparse.ArgumentTypeError(f"expected TENSOR:{what}, got {text!r}")
        return name, value

    parse.__name__ = f"TENSOR:{what}"
    return parse


def extent(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    try:
        size = int(value)
    except ValueError:
        size = -1
    if not sep or not name.strip().isidentifier() or size < 0:
        raise argparse.ArgumentTypeError(f"expected VAR=N with N >= 0, got {text!r}")
    return name.strip(), size


def positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


def to_dict(pairs: Sequence[tuple[str, Any]] | None, what: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, value in pairs or ():
        if name in result and result[name] != value:
            raise UserError(f"{what} for {name} is given twice ({result[name]!r} and {value!r})")
        result[name] = value
    return result


def joined(commands: Sequence[str] | None) -> str | None:
    return "; ".join(commands) if commands else None


def add_kernel_options(p: argparse.ArgumentParser, schedule: bool = True) -> None:
    p.add_argument("expr", metavar="EXPR", help='the statement, e.g. "y(i) = A(i,j) * x(j)"')
    p.add_argument(
        "-f",
        "--format",
        dest="formats",
        action="append",
        type=pair("FMT"),
        metavar="T:FMT",
        help="storage format of tensor T, e.g. A:csr, A:UC:1,0, B:csf, A:csr@float32 "
        "(values held as float32; repeatable; tensors without one are dense)",
    )
    if schedule:
        add_schedule_option(p)
    p.add_argument(
        "--target",
        choices=TARGETS,
        default="llvm",
        help="code generator: llvm (JIT, the default, no C compiler needed), c (needs cc) or cuda",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="the type the kernel computes and writes in (default: the values the output's "
        "format states, else float64)",
    )
    p.add_argument(
        "--index-dtype",
        choices=INDEX_DTYPES,
        default="int32",
        help="type of pos/crd arrays (int32)",
    )


def add_schedule_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-s",
        "--schedule",
        dest="schedule",
        action="append",
        metavar="SCHED",
        help='scheduling command(s), e.g. "split(i, i0, i1, 32); parallelize(i0, CPUThread, '
        "NoRaces)\" (repeatable; joined with ';'; see docs/scheduling.md). Without -s a "
        "cost model chooses per call (docs/scheduling.md, 'The default schedule')",
    )


def add_input_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-i",
        "--input",
        dest="inputs",
        action="append",
        type=pair("FILE"),
        required=True,
        metavar="T:FILE",
        help="read operand T from FILE (repeatable)",
    )
    p.add_argument(
        "--extent",
        dest="extents",
        action="append",
        type=extent,
        metavar="VAR=N",
        help="extent of an index variable the inputs do not determine (repeatable)",
    )
