"""``ucf show``: draw a tensor's fibertree (``ucf.show``) from a file or random data."""

from __future__ import annotations

import argparse
from typing import Any

EPILOG = """\
examples:
  ucf show matrix.mtx -f bcsr(2,2) -o bcsr.svg
  ucf show --random 4x8 --density 0.3 -f csr -o csr.png
  ucf show --random 3x3x4 -f csf --name T > csf.svg

The picture has a row per storage level (its kind and the mode it stores),
a node per stored position with its coordinate, and the values under the last
level; large tensors are drawn in part and the picture says so.
"""


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(n) for n in text.lower().split("x"))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"expected extents like 4x8, got {text!r}")
    return shape


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "show",
        help="draw a tensor's storage as a fibertree (SVG or PNG)",
        description="Draw the fibertree of a tensor read from a file, or of a random one, "
        "in a storage format.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("input", nargs="?", metavar="FILE", help=".mtx, .tns, .npy or .npz file")
    p.add_argument("-f", "--format", metavar="FMT", help="store it in this format first")
    p.add_argument("--random", type=_shape, metavar="SHAPE", help="a random tensor, e.g. 4x8")
    p.add_argument("--density", type=float, default=0.3, help="of --random (0.3)")
    p.add_argument("--seed", type=int, default=0, help="of --random (0)")
    p.add_argument("--name", default="T", help="the tensor's name in the picture (T)")
    p.add_argument("-o", "--output", metavar="PATH", help="write .svg or .png (else SVG on stdout)")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    import ucf
    from ucf.cli.user_error import UserError

    if (args.input is None) == (args.random is None):
        raise UserError("give a FILE or --random SHAPE (one of them)")
    if args.input is not None:
        tensor = ucf.read(args.input, args.format)
    else:
        if not 0 <= args.density <= 1:
            raise UserError(f"--density is a fraction between 0 and 1, got {args.density}")
        rng = np.random.default_rng(args.seed)
        values = np.round(rng.random(args.random) * 9 + 1)
        tensor = np.where(rng.random(args.random) < args.density, values, 0.0)
    drawn = ucf.show(tensor, args.output, format=args.format, name=args.name)
    print(f"wrote {drawn}" if args.output else drawn)
    return 0
