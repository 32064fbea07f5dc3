"""``ucf run``: compile a statement, run it on tensors read from files, and print a
summary of the result or write it; ``--time`` times it."""

from __future__ import annotations

import argparse
import re
from typing import Any

from ucf.cli.compile_command import compiled
from ucf.cli.options import add_input_options, add_kernel_options, pair, positive, to_dict
from ucf.cli.user_error import UserError

SMALL_RESULT = 20  # results with at most this many stored entries are printed in full

EPILOG = """\
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


def add_parser(sub: Any) -> None:
    pr = sub.add_parser(
        "run",
        help="run a statement on tensors read from files",
        description="Compile a statement, run it on tensors read from files, "
        "and print or save the result.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_kernel_options(pr)
    add_input_options(pr)
    pr.add_argument(
        "-o",
        "--output",
        dest="output",
        type=pair("FILE"),
        metavar="T:FILE",
        help="write the result (T is the output tensor) to FILE; otherwise print a summary",
    )
    pr.add_argument(
        "--time",
        dest="repeat",
        type=positive,
        metavar="N",
        help="after a warm-up call, time N samples (each of enough calls to last about "
        "2 ms; up to 3N while they spread widely) and print their median and spread",
    )
    pr.add_argument(
        "--emulate", action="store_true", help="with --target cuda, run the CUDA source on the CPU"
    )


def read_inputs(args: argparse.Namespace, formats: dict[str, str]) -> dict[str, Any]:
    """The operands named by -i, read and given the value and index dtypes asked for.
    Inputs without -f keep the format they were read in (added to ``formats``) rather
    than being densified, which is what the kernel would assume."""
    import ucf
    from ucf.lang.ast import accesses
    from ucf.lang.parser import parse_statement

    paths = to_dict(args.inputs, "input file")
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


def run(args: argparse.Namespace) -> int:
    import ucf
    from ucf.lang.parser import parse_statement

    formats = to_dict(args.formats, "format")
    outname = parse_statement(args.expr).lhs.tensor
    if args.output is not None and args.output[0] != outname:
        raise UserError(f"-o names {args.output[0]}, but the statement's output is {outname}")
    operands = read_inputs(args, formats)
    k = compiled(args, formats)
    shapes = to_dict(args.extents, "extent")
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
