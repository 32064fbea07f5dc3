"""``ucf compile``: compile a statement and print its CIN, LLIR or code, or save a
standalone C (or CUDA) kernel with its header."""

from __future__ import annotations

import argparse
from typing import Any

from ucf.cli.options import add_kernel_options, joined, to_dict
from ucf.cli.user_error import UserError

EPILOG = """\
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


def add_parser(sub: Any) -> None:
    pc = sub.add_parser(
        "compile",
        help="compile a statement and print or save the code",
        description="Compile a statement and print its CIN or code, or save a standalone C kernel.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_kernel_options(pc)
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


def compiled(args: argparse.Namespace, formats: dict[str, str]) -> Any:
    import ucf

    return ucf.compile(
        args.expr,
        formats=formats,
        schedule=joined(args.schedule),
        target=args.target,
        dtype=args.dtype,
        index_dtype=args.index_dtype,
        emulate=getattr(args, "emulate", False),
    )


def run(args: argparse.Namespace) -> int:
    k = compiled(args, to_dict(args.formats, "format"))
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
