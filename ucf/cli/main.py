"""The ``ucf`` command: compile a statement, run or tune it on files, or run the demo.

Every user mistake the library can diagnose arrives as a :class:`ucf.UcfError`;
the command turns it into one ``ucf: error:`` message and exit status 1, so
shell scripts can tell bad input (1) from bad usage (2) without parsing a
traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ucf.cli import (
    cache_command,
    compile_command,
    demo_command,
    run_command,
    show,
    taco_command,
    tune_command,
)
from ucf.cli.user_error import UserError
from ucf.serve import command as serve

PROG = "ucf"
#: Each subcommand's module, in the order ``ucf --help`` lists them: ``add_parser(sub)``
#: adds its options, and ``run(args)`` runs it (importing what it runs with only then;
#: ``ucf taco`` is handed its raw arguments instead, TACO's spelling, ``main``).
SUBCOMMANDS = {
    "compile": compile_command,
    "run": run_command,
    "tune": tune_command,
    "demo": demo_command,
    "taco": taco_command,
    "show": show,
    "serve": serve,
    "cache": cache_command,
}


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
    for module in SUBCOMMANDS.values():
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ucf`` script; returns the exit status instead of exiting.

    Returning (rather than calling ``sys.exit``) lets tests call it in-process.
    argparse still exits with status 2 on usage errors, which it owns.
    """
    import ucf

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["taco"]:  # TACO's own spelling, which argparse cannot read
        return taco_command.main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "emulate", False) and args.target != "cuda":
        parser.error("--emulate only applies to --target cuda")
    try:
        return SUBCOMMANDS[args.command].run(args)
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
