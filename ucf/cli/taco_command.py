"""``ucf taco``: TACO's command line, read as TACO spells it, compiled by ucf.

TACO users type ``taco "y(i) = A(i,j) * x(j)" -f=A:ds -s="split(i,i0,i1,32)"``:
single-dash long options with ``=``, TACO's format letters, schedule commands
separated by commas. This module reads exactly that and maps each option onto
``ucf.compile`` (docs/cli.md has the table). What TACO's tool does beyond printing
and writing code (reading, generating and timing tensors) is ``ucf run``'s job; those
options are refused with the ``ucf run`` spelling, not ignored.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ucf.errors import UcfError

USAGE = """\
usage: ucf taco <index expression> [options]

TACO's command line, compiled by ucf. Options are spelled as TACO spells them:

  -f=<tensor>:<format>[:<modes>]  format letters d (dense), s (sparse), z (sparse
                                  without zeros), u (sparse, not unique) and q/c
                                  (singleton); e.g. A:ds (CSR), B:ds:1,0 (CSC),
                                  C:uq (COO), D:sss (CSF)
  -t=<tensor>:<type>              double, float, int64/long, int32/int, int8/char,
                                  uint8/uchar (operands may hold int8/uint8)
  -s="<command>(<params>)"        schedule commands, separated by commas or given
                                  as several -s (docs/scheduling.md)
  -d=<var/tensor>:<size>          accepted; ucf kernels take their sizes per call
  -print-compute                  print the compute function (the default)
  -print-assembly                 print the assemble function (sparse outputs)
  -print-evaluate                 print both
  -print-kernels                  print the whole C file
  -print-concrete                 print the concrete index notation
  -print-nocolor                  accepted (ucf prints no colours)
  -write-source=<file>            write the kernel behind TACO's compute/assemble
                                  on taco_tensor_t: <file> and its header
  -write-compute=<file>           write the compute function
  -write-assembly=<file>          write the assemble function
  -cuda                           generate CUDA (the compute function's .cu file)
  -prefix=<name>                  prefix of the printed functions' names
  -help, -help=scheduling, -version

Reading, generating and timing tensors (-i, -o, -O, -g, -time, -write-time,
-verify, -read-source) are `ucf run`'s. docs/cli.md maps every option onto
`ucf compile`.
"""

#: TACO's data types that ucf computes in, or holds operand values in.
TYPES = {
    "double": "float64",
    "float": "float32",
    "int64": "int64",
    "long": "int64",
    "longlong": "int64",
    "int32": "int32",
    "int": "int32",
    "int8": "int8",
    "char": "int8",
    "uint8": "uint8",
    "uchar": "uint8",
}
COMPUTE_TYPES = ("float64", "float32", "int64", "int32")
#: TACO's options that run kernels on data, and what ucf spells them as.
RUN_OPTIONS = {
    "-i": "ucf run ... -i T:FILE",
    "-o": "ucf run ... -o T:FILE",
    "-O": "ucf run ... -o T:FILE",
    "-g": "ucf run with an input file (ucf demo makes random data)",
    "-time": "ucf run ... --time N",
    "-write-time": "ucf run ... --time N",
    "-verify": "ucf run (every run is checked by ucf's tests against numpy/scipy)",
    "-read-source": "ucf run",
    "-c": "ucf compile (ucf's kernels assemble in their own pass)",
    "-schedule": '-s="parallelize(i, CPUThread, NoRaces)" and UCF_NUM_THREADS',
    "-nthreads": "UCF_NUM_THREADS=N or ucf.set_num_threads(n)",
    "-print-iteration-graph": "ucf compile ... --print cin",
    "-print-lattice": "ucf compile ... --print cin",
}
PRINTS = (
    "-print-compute",
    "-print-assembly",
    "-print-evaluate",
    "-print-kernels",
    "-print-concrete",
)


class TacoUsageError(UcfError):
    """An option TACO's tool takes that ``ucf taco`` cannot honour, or a misspelt one."""


@dataclass
class Request:
    """TACO's options, read; :meth:`compile_args` turns them into ``ucf.compile``'s."""

    expr: str = ""
    formats: dict[str, str] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    schedule: list[str] = field(default_factory=list)
    prints: list[str] = field(default_factory=list)
    writes: dict[str, str] = field(default_factory=dict)
    cuda: bool = False
    prefix: str = ""


def add_parser(sub: Any) -> None:
    """``ucf taco`` in ``ucf --help``; ``ucf.cli.main`` hands it the raw arguments, since
    argparse cannot read TACO's ``-name=value`` options."""
    sub.add_parser(
        "taco",
        help="TACO's command line: ucf taco EXPR -f=A:ds ... (ucf taco -help)",
        add_help=False,
    )


def parse(argv: list[str]) -> Request | str:
    """TACO's arguments, read as TACO reads them; a string is text to print instead
    (``-help``, ``-version``)."""
    from ucf.format.taco_letters import from_taco

    r = Request()
    for arg in argv:
        text = arg[1:] if arg.startswith("--") else arg
        name, eq, value = text.partition("=")
        if not text.startswith("-") or text == "-":
            if r.expr:
                raise TacoUsageError(f"a second index expression {arg!r}; TACO takes one")
            r.expr = arg
        elif name == "-help":
            return SCHEDULING_HELP if value == "scheduling" else USAGE
        elif name == "-version":
            from ucf._version import __version__

            return f"ucf {__version__} (TACO's command line: ucf taco)\n"
        elif name == "-f":
            tensor, _, spec = value.partition(":")
            letters, _, ordering = spec.partition(":")
            if not tensor or not letters or ordering.count(":"):
                raise TacoUsageError(
                    f"-f={value}: expected -f=<tensor>:<format>[:<modes>] (TACO's packs, a "
                    "fourth part, are not supported)"
                )
            r.formats[tensor] = from_taco(letters, ordering)
        elif name == "-t":
            tensor, _, kind = value.partition(":")
            if kind not in TYPES:
                raise TacoUsageError(
                    f"-t={value}: ucf computes in or holds {', '.join(TYPES)}, not {kind!r}"
                )
            r.types[tensor] = TYPES[kind]
        elif name == "-s":
            r.schedule += _commands(value)
        elif name == "-d" or (name == "-print-nocolor" and not eq):
            continue
        elif name in PRINTS and not eq:
            r.prints.append(name)
        elif name in ("-write-source", "-write-compute", "-write-assembly") and value:
            r.writes[name] = value
        elif name == "-cuda" and not eq:
            r.cuda = True
        elif name == "-prefix":
            r.prefix = value
        elif name in RUN_OPTIONS:
            raise TacoUsageError(f"{name} is not taken by ucf taco; use {RUN_OPTIONS[name]}")
        else:
            raise TacoUsageError(f"unknown option {arg!r} (ucf taco -help lists TACO's options)")
    if not r.expr:
        return USAGE
    return r


def _commands(text: str) -> list[str]:
    """TACO's ``-s`` value: commands separated by commas outside parentheses."""
    commands, depth, start = [], 0, 0
    for k, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if ch in ",;" and depth == 0:
            commands.append(text[start:k])
            start = k + 1
    commands.append(text[start:])
    return [c.strip() for c in commands if c.strip()]


def compile_args(r: Request) -> dict:
    """``ucf.compile``'s arguments for the request: TACO's types become the output's
    dtype, and the values the operands' formats hold."""
    from ucf.lang.parser import parse_statement

    stmt = parse_statement(r.expr)
    out = stmt.lhs.tensor
    formats = dict(r.formats)
    dtype = None
    for tensor, kind in r.types.items():
        if tensor == out:
            if kind not in COMPUTE_TYPES:
                raise TacoUsageError(
                    f"-t={tensor}:{kind}: an output is computed in {', '.join(COMPUTE_TYPES)}"
                )
            dtype = kind
        else:
            formats[tensor] = f"{formats.get(tensor, 'dense')}@{kind}"
    return {
        "formats": formats,
        "schedule": "; ".join(r.schedule) or None,
        "target": "cuda" if r.cuda else "c",
        "dtype": dtype,
    }


def run(argv: list[str]) -> int:
    """``ucf taco ARGS``: print or write what TACO would, from ucf's kernel."""
    import ucf
    from ucf.codegen import c as cgen

    parsed = parse(argv)
    if isinstance(parsed, str):
        print(parsed, end="")
        return 0
    k = ucf.compile(parsed.expr, **compile_args(parsed))
    plan = k._user_plan
    compute = replace(plan.compute, name=f"{parsed.prefix}compute")
    assemble = plan.assemble and replace(plan.assemble, name=f"{parsed.prefix}assemble")
    texts = {
        "-print-compute": [compute],
        "-print-assembly": [assemble] if assemble else [],
        "-print-evaluate": [f for f in (assemble, compute) if f],
    }
    if parsed.cuda:
        texts = {"-print-compute": k.source, "-print-kernels": k.source}
    prints = parsed.prints or ([] if parsed.writes else ["-print-compute"])
    for what in prints:
        if what == "-print-concrete":
            print(k.cin)
        elif what == "-print-kernels" or parsed.cuda:
            print(k.source if parsed.cuda else k.c_source)
        elif not texts[what]:
            print(f"/* {plan.statement}: a dense output needs no assemble function */")
        else:
            print(cgen.functions(texts[what]), end="")
    for what, path in parsed.writes.items():
        if what == "-write-source":
            for written in k.save(Path(path).with_suffix(""), abi="taco"):
                print(f"wrote {written}")
            continue
        fns = texts["-print-compute" if what == "-write-compute" else "-print-assembly"]
        Path(path).write_text(cgen.functions(fns) if fns else "")
        print(f"wrote {path}")
    return 0


def main(argv: list[str]) -> int:
    """Run ``ucf taco`` with the ``ucf`` command's error handling."""
    try:
        return run(argv)
    except UcfError as e:
        print(f"ucf taco: error: {e}", file=sys.stderr)
        return 1


SCHEDULING_HELP = """\
Scheduling commands (-s) change how the kernel computes, never what. Separate
them with commas or give several -s; ucf applies them in order:

  -s="split(i,i0,i1,32),parallelize(i0,CPUThread,NoRaces)"
  -s="reorder(i,k,j)" -s="precompute(A(i,j)*B(j,k),k,kw)"

ucf takes TACO's pos, fuse, split, divide, precompute, reorder, bound, unroll,
parallelize and assemble, each spelled as in TACO; docs/scheduling.md has their
rules and what ucf adds.
"""
