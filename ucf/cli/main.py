"""The ``ucf`` command: compile a statement, run or tune it on files, or run the demo.

Every user mistake the library can diagnose arrives as a :class:`ucf.UcfError`;
the command turns it into one ``ucf: error:`` message and exit status 1, so
shell scripts can tell bad input (1) from bad usage (2) without parsing a
traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from ucf.cli.user_error import UserError
from ucf.codegen import TARGETS

PROG = "ucf"
DTYPES = ("float64", "float32", "int64", "int32")
INDEX_DTYPES = ("int32", "int64")
SMALL_RESULT = 20  # results with at most this many stored entries are printed in full


# --------------------------------------------------------------------------- argument types


def _pair(what: str):
    """An argparse type for ``T:VALUE``; only the first colon splits, since formats use one."""

    def parse(text: str) -> tuple[str, str]:
        name, sep, value = text.partition(":")
        name = name.strip()
        if not sep or not name.isidentifier() or not value:
            raise argparse.ArgumentTypeError(f"expected TENSOR:{what}, got {text!r}")
        return name, value

    parse.__name__ = f"TENSOR:{what}"
    return parse


def _extent(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    try:
        size = int(value)
    except ValueError:
        size = -1
    if not sep or not name.strip().isidentifier() or size < 0:
        raise argparse.ArgumentTypeError(f"expected VAR=N with N >= 0, got {text!r}")
    return name.strip(), size


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


def _to_dict(pairs: Sequence[tuple[str, Any]] | None, what: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, value in pairs or ():
        if name in result and result[name] != value:
            raise UserError(f"{what} for {name} is given twice ({result[name]!r} and {value!r})")
        result[name] = value
    return result


def _schedule(commands: Sequence[str] | None) -> str | None:
    return "; ".join(commands) if commands else None


# --------------------------------------------------------------------------- parser

_COMPILE_EPILOG = """\
examples:
  ucf compile "y(i) = A(i,j) * x(j)" -f A:csr
  ucf compile "C(i,k) = A(i,j) * B(j,k)" -f A:csr --print source
  ucf compile "S(i,j) = A(i,j) + B(i,j)" -f A:csr -f B:csr -f S:csr -o build/add
  ucf compile "y(i) = A(i,j) * x(j)" -f A:csr -o build/spmv --lib static
  ucf compile "y(i) = A(i,j) * x(j)" -f A:csr -o build/taco_spmv --abi taco

With no --print the concrete index notation (CIN) is printed.  -o PREFIX
writes PREFIX.c and PREFIX.h, a standalone kernel whose header documents the
calling convention (docs/abi.md), and ucf.h (ABI version, error codes); its
functions are named after PREFIX (or --name), NAME_check validates a caller's
arrays, and the headers compile as C and C++.  --abi taco writes TACO's
compute/assemble on taco_tensor_t instead.  --target cuda writes PREFIX.cu,
PREFIX.h and the runtime headers the .cu includes.

A variable only on the right-hand side is summed over the smallest operand of
+ or - (or the whole right-hand side) holding all its occurrences, as in TACO:
"y(i) = A(i,j)*x(j) + b(i)" is A @ x + b.  sum(j, ...) sums explicitly;
relu abs sign sqrt sin tanh exp cos sigmoid gelu erf rsqrt max min apply
element-wise.
"""

_RUN_EPILOG = """\
examples:
  ucf run "y(i) = A(i,j) * x(j)" -i A:matrix.mtx -i x:x.npy
  ucf run "y(i) = A(i,j) * x(j)" -f A:csc -i A:matrix.mtx -i x:x.npy -o y:y.npy --time 10
  ucf run "A(i,j) = B(i,k,l) * C(k,j) * D(l,j)" -i B:tensor.tns -i C:c.npy -i D:d.npy

Inputs may be .mtx, .tns, .npy or .npz (scipy.sparse) files.  An input
named by -f is converted to that format; otherwise it keeps the format it
was read in (csr for .mtx/.npz, csf for .tns, dense for .npy).  The output
shape is inferred from the inputs; use --extent VAR=N for index variables
that appear only on the left-hand side.
"""

_TUNE_EPILOG = """\
examples:
  ucf tune "y(i) = A(i,j) * x(j)" -i A:matrix.mtx -i x:x.npy --trials 50
  ucf tune "C(i,k) = A(i,j) * B(j,k)" -f C:csr -i A:a.mtx -i B:b.mtx --n-jobs 2 --plot tune.png

Each trial compiles one schedule, checks its result against the default
schedule's and times it.  The study is kept in the cache directory, so running
the command again adds trials to it.  The best schedule is recorded for these
formats, dtypes and input sizes, where ucf.compile(..., schedule="tuned")
finds it (docs/tuning.md).  Inputs are read as for "ucf run".
"""

_DEMO_EPILOG = """\
example:
  ucf demo --size 5000

Runs SpMV, SpMM, sparse addition and MTTKRP on random data (fixed seed),
checks each result against numpy/scipy and prints timings.
"""


def _add_kernel_options(p: argparse.ArgumentParser, schedule: bool = True) -> None:
    p.add_argument("expr", metavar="EXPR", help='the statement, e.g. "y(i) = A(i,j) * x(j)"')
    p.add_argument(
        "-f",
        "--format",
        dest="formats",
        action="append",
        type=_pair("FMT"),
        metavar="T:FMT",
        help="storage format of tensor T, e.g. A:csr, A:UC:1,0, B:csf, A:csr@float32 "
        "(values held as float32; repeatable; tensors without one are dense)",
    )
    if schedule:
        _add_schedule_option(p)
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


def _add_schedule_option(p: argparse.ArgumentParser) -> None:
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


def _add_input_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-i",
        "--input",
        dest="inputs",
        action="append",
        type=_pair("FILE"),
        required=True,
        metavar="T:FILE",
        help="read operand T from FILE (repeatable)",
    )
    p.add_argument(
        "--extent",
        dest="extents",
        action="append",
        type=_extent,
        metavar="VAR=N",
        help="extent of an index variable the inputs do not determine (repeatable)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The full parser; separate from :func:`main` so tests and docs can inspect it."""
    from ucf._version import __version__

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="ucf: a sparse tensor-algebra compiler. Write C(i,k) = A(i,j) * B(j,k), "
        "pick a format per tensor and get a kernel.",
        epilog='Run "ucf COMMAND --help" for examples.',
    )
    parser.add_argument("--version", action="version", version=f"ucf {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    fmt = argparse.RawDescriptionHelpFormatter
    pc = sub.add_parser(
        "compile",
        help="compile a statement and print or save the code",
        description="Compile a statement and print its CIN or code, or save a standalone C kernel.",
        epilog=_COMPILE_EPILOG,
        formatter_class=fmt,
    )
    _add_kernel_options(pc)
    pc.add_argument(
        "-o",
        "--output",
        dest="prefix",
        metavar="PREFIX",
        help="write PREFIX.c and PREFIX.h (PREFIX.cu for --target cuda) and ucf.h beside them",
    )
    pc.add_argument(
        "--name",
        help="name of the exported functions: NAME and NAME_assemble (default: PREFIX's "
        "file name as a C identifier), so several kernels link into one program",
    )
    pc.add_argument(
        "--lib",
        choices=("static", "shared"),
        help="with -o, also build libNAME.a or libNAME.so with the system C compiler",
    )
    pc.add_argument(
        "--abi",
        choices=("ucf", "taco"),
        default="ucf",
        help="with -o, the calling convention: ucf (NAME, NAME_assemble, NAME_check; the "
        "default) or taco (int compute(taco_tensor_t* out, ...) and assemble, as TACO "
        "generates them; docs/abi.md)",
    )
    pc.add_argument(
        "--print",
        dest="show",
        choices=("cin", "llir", "source"),
        help="what to print: cin (concrete index notation, the default), llir "
        "(ucf's low-level IR, which every code generator reads) or source (the "
        "target's code: LLVM IR for llvm, C for c)",
    )

    pr = sub.add_parser(
        "run",
        help="run a statement on tensors read from files",
        description="Compile a statement, run it on tensors read from files, "
        "and print or save the result.",
        epilog=_RUN_EPILOG,
        formatter_class=fmt,
    )
    _add_kernel_options(pr)
    _add_input_options(pr)
    pr.add_argument(
        "-o",
        "--output",
        dest="output",
        type=_pair("FILE"),
        metavar="T:FILE",
        help="write the result (T is the output tensor) to FILE; otherwise print a summary",
    )
    pr.add_argument(
        "--time",
        dest="repeat",
        type=_positive,
        metavar="N",
        help="after a warm-up call, time N samples (each of enough calls to last about "
        "2 ms; up to 3N while they spread widely) and print their median and spread",
    )
    pr.add_argument(
        "--emulate", action="store_true", help="with --target cuda, run the CUDA source on the CPU"
    )

    pt = sub.add_parser(
        "tune",
        help="search for a faster schedule on tensors read from files",
        description="Search schedules of a statement for the inputs read from files "
        '(Optuna, TPE), and record the fastest for schedule="tuned".',
        epilog=_TUNE_EPILOG,
        formatter_class=fmt,
    )
    _add_kernel_options(pt, schedule=False)
    _add_input_options(pt)
    pt.add_argument("--trials", type=_positive, default=50, metavar="N", help="trials to add (50)")
    pt.add_argument("--n-jobs", type=_positive, default=1, metavar="N", help="worker processes (1)")
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

    pd = sub.add_parser(
        "demo",
        help="run built-in kernels on random data and compare with scipy",
        description="Run SpMV, SpMM, sparse add and MTTKRP on random data, check "
        "them against numpy/scipy and print timings.",
        epilog=_DEMO_EPILOG,
        formatter_class=fmt,
    )
    pd.add_argument(
        "--size",
        type=_positive,
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

    from ucf.cli import show, taco_command
    from ucf.serve import command as serve

    for module in (taco_command, show, serve):  # each imports what it runs with only when run
        module.add_parser(sub)

    pk = sub.add_parser(
        "cache",
        help="show or clear the kernel cache",
        description="The kernel cache keeps compiled kernels on disk (UCF_CACHE_DIR, else "
        "the user cache directory). It holds at most UCF_CACHE_MAX_MB megabytes (1024); "
        "beyond that the least recently used kernels are removed (a process checks the "
        "directory every 64 writes, and when its own writes pass the limit). Deleting it is always "
        "safe: kernels are rebuilt when next needed.",
    )
    pk.add_argument(
        "action", choices=("info", "clear"), help="info: where and how big; clear: empty it"
    )
    return parser


# --------------------------------------------------------------------------- commands


def _compile(args: argparse.Namespace, formats: dict[str, str]) -> Any:
    import ucf

    return ucf.compile(
        args.expr,
        formats=formats,
        schedule=_schedule(args.schedule),
        target=args.target,
        dtype=args.dtype,
        index_dtype=args.index_dtype,
        emulate=getattr(args, "emulate", False),
    )


def _cmd_compile(args: argparse.Namespace) -> int:
    k = _compile(args, _to_dict(args.formats, "format"))
    show = args.show or ("cin" if args.prefix is None else None)
    if show == "cin":
        print(k.cin)
    elif show == "llir":
        from ucf.ir.printer import format_functions

        print(format_functions(k.llir), end="")
    elif show == "source":
        print(k.source)
    if args.prefix is not None:
        for path in k.save(args.prefix, name=args.name, lib=args.lib, abi=args.abi):
            print(f"wrote {path}")
    elif args.name or args.lib or args.abi != "ucf":
        raise UserError("--name, --lib and --abi name and build the files -o writes; add -o PREFIX")
    return 0


def _read_inputs(args: argparse.Namespace, formats: dict[str, str]) -> dict[str, Any]:
    """The operands named by -i, read and given the value and index dtypes asked for.
    Inputs without -f keep the format they were read in (added to ``formats``) rather
    than being densified, which is what the kernel would assume."""
    import ucf
    from ucf.lang.ast import accesses
    from ucf.lang.parser import parse_statement

    paths = _to_dict(args.inputs, "input file")
    stmt = parse_statement(args.expr)
    outname = stmt.lhs.tensor
    reads = sorted({a.tensor for a in accesses(stmt.rhs)})
    if outname in paths:
        raise UserError(f"{outname} is the output of the statement; it cannot be an input (-i)")
    for name in paths:
        if name not in reads:
            raise UserError(
                f"-i names {name}, which the statement does not read (it reads {', '.join(reads)})"
            )
    for name in reads:
        if name not in paths:
            raise UserError(f"no input for {name}; pass -i {name}:FILE")
    from ucf.exec.shapes import check_orders
    from ucf.format.format import parse_formats
    from ucf.lang.ast import statement_orders
    from ucf.pipeline import compute_dtype

    orders = statement_orders(stmt)
    computed = compute_dtype(args.expr, parse_formats(formats, orders), args.dtype)
    operands = {}
    for name, path in paths.items():
        t = ucf.read(path, formats.get(name))
        check_orders(orders, {name: t})  # before its format joins the statement's
        held = None if t.format.values else computed  # stated values stay as they are
        operands[name] = t.convert(index_dtype=args.index_dtype, dtype=held)
        formats.setdefault(name, str(t.format))
    return operands


def _cmd_run(args: argparse.Namespace) -> int:
    import ucf
    from ucf.lang.parser import parse_statement

    formats = _to_dict(args.formats, "format")
    outname = parse_statement(args.expr).lhs.tensor
    if args.output is not None and args.output[0] != outname:
        raise UserError(f"-o names {args.output[0]}, but the statement's output is {outname}")
    operands = _read_inputs(args, formats)
    k = _compile(args, formats)
    shapes = _to_dict(args.extents, "extent")
    try:
        result = k(shapes=shapes or None, **operands)
    except ucf.ShapeError as e:
        # The library's hint names the Python keyword; point at the flag instead.
        raise UserError(
            re.sub(r"pass shapes=\{'(\w+)': n\}", r"pass --extent \1=N", str(e))
        ) from None
    if args.repeat:
        # Samples of batched calls, more of them where a busy moment spread them out
        # (ucf.tuning.measure.sampled): a median and its spread, not one lucky or unlucky call.
        from ucf.tuning.measure import sampled

        print(f"time: {sampled(lambda: k(shapes=shapes or None, **operands), args.repeat)}")
    if args.output is not None:
        ucf.write(args.output[1], result)
        print(f"wrote {outname} to {args.output[1]}")
    else:
        _summarize(outname, result)
    return 0


def _summarize(name: str, t: Any) -> None:
    fmt = f"format '{t.format}', " if t.order else ""
    print(f"{name}: shape {t.shape}, {fmt}dtype {t.dtype}, nnz {t.nnz}")
    if t.order == 0:
        print(f"  {name}() = {t.to_numpy().item()!r}")
        return
    if t.nnz > SMALL_RESULT:
        return
    coords, vals = t.to_coo()
    for c, v in zip(coords.tolist(), vals.tolist(), strict=True):
        print(f"  {name}({', '.join(map(str, c))}) = {v!r}")


def _cmd_tune(args: argparse.Namespace) -> int:
    import ucf

    formats = _to_dict(args.formats, "format")
    operands = _read_inputs(args, formats)
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
        shapes=_to_dict(args.extents, "extent") or None,
        progress=False if args.no_progress else None,
        search_formats=args.search_formats,
        **operands,
    )
    print(f"default:  {result.default_time * 1e6:.1f} us per call")
    trials = len(result.study.trials)
    if result.schedule is None:
        if any(t.value is not None for t in result.study.trials):
            print(f"tuned:    no trial beat the default ({trials} trials in the study)")
        else:
            print(f"tuned:    every trial failed ({trials} trials in the study), for example:")
            for schedule, why in list(result.reasons.items())[:3]:
                print(f"  {schedule or '(no commands)'}: {why}")
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


def _cmd_demo(args: argparse.Namespace) -> int:
    from ucf.demo import run_demo

    return run_demo(args.size, args.target)


def _cmd_cache(args: argparse.Namespace) -> int:
    from ucf.toolchain import cache

    if args.action == "clear":
        print(f"removed {cache.clear()} entries from {cache.cache_dir()}")
        return 0
    n, used, cap = len(cache.entries()), cache.size(), cache.limit()
    print(f"directory: {cache.cache_dir()}")
    print(f"entries:   {n}")
    print(f"size:      {used / 2**20:.1f} MB of {cap / 2**20:.0f} MB (UCF_CACHE_MAX_MB)")
    return 0


_COMMANDS = {
    "compile": _cmd_compile,
    "run": _cmd_run,
    "tune": _cmd_tune,
    "demo": _cmd_demo,
    "cache": _cmd_cache,
    "show": lambda args: importlib.import_module("ucf.cli.show").run(args),
    "serve": lambda args: importlib.import_module("ucf.serve.command").run(args),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ucf`` script; returns the exit status instead of exiting.

    Returning (rather than calling ``sys.exit``) lets tests call it in-process.
    argparse still exits with status 2 on usage errors, which it owns.
    """
    import ucf

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["taco"]:  # TACO's own spelling, which argparse cannot read
        from ucf.cli import taco_command

        return taco_command.main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "emulate", False) and args.target != "cuda":
        parser.error("--emulate only applies to --target cuda")
    try:
        return _COMMANDS[args.command](args)
    except (ucf.UcfError, UserError) as e:
        return _fail(str(e))
    except BrokenPipeError:
        # The reader stopped early (`ucf compile ... | head`): what it read is all it
        # wanted, so end quietly, and keep the interpreter's final flush from failing.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        return _fail(f"{where}{e.strerror or e}")


def _fail(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 1
