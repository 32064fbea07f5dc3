"""The size of generated code where merges' case chains nest: fills fuzz seed 120 case 279
and a family of its shape (a sum of operands, two read with a repeated variable, over
formats blocked nowhere, in C alone, or as in the case).

Per statement: the case bodies the lowering built (each a copy of the loops below its
merge; ``ucf.lower.coiterate.CoiterationMixin.CASES``), the lines of C and of LLVM IR,
and the CPU seconds to generate both. ``--cases N`` sets the budget (a large N keeps
every chain, as before the budget); run with ``PYTHONPATH`` at an older checkout to
measure it (it then has no budget to set).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings

import ucf
from ucf.lower import coiterate

TERMS = ["A(l,k,j)", "C(k,l,l)", "B(j,i,l)", "C(k,i,i)"]
BLOCKED = [
    {"A": "CCC:2,0,1", "B": "CCC", "C": "CCC:0,2,1"},
    {"A": "CCC:2,0,1", "B": "CCC", "C": "CCCC:0,2/2,1,2%2"},
    {"A": "CCUC:2/1,0,1,2%1", "B": "CCCU:0/1,1,2,0%1", "C": "CUCC:0,2/2,1,2%2"},
]
CASE = "X(i,k) = sum(j, -(A(l,k,j) + ((C(k,l,l) + B(j,i,l)) + C(k,i,i))))"


def rows():
    for blocked, formats in enumerate(BLOCKED):
        for n in (2, 3, 4):
            used = TERMS[:n]
            names = {t[0] for t in used}
            expr = f"X(i,k) = sum(j, -({' + '.join(used)}))"
            yield f"{n} terms, blocked {blocked}", expr, {k: formats[k] for k in names}
    yield "fills seed 120 case 279", CASE, BLOCKED[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, help="the budget of case bodies (CASES)")
    args = parser.parse_args()
    if args.cases is not None:
        coiterate.CoiterationMixin.CASES = args.cases
    warnings.simplefilter("ignore", ucf.ConversionWarning)
    built = [0]
    body = coiterate.CoiterationMixin._case_body

    def counted(self, *a, **k):
        built[0] += 1
        return body(self, *a, **k)

    coiterate.CoiterationMixin._case_body = counted
    print("| statement | case bodies | lines of C | lines of LLVM IR | generate (CPU s) |")
    print("|---|---|---|---|---|")
    for name, expr, formats in rows():
        built[0] = 0
        start = time.process_time()
        # a fresh cache, removed after: the kernels' keys do not hold the budget
        with tempfile.TemporaryDirectory(prefix="ucf-case-chains-") as cache:
            os.environ["UCF_CACHE_DIR"] = cache
            lines = [
                ucf.compile(expr, formats=formats, target=t).source.count("\n")
                for t in "c llvm".split()
            ]
        took = time.process_time() - start
        print(f"| {name} | {built[0] // 2} | {lines[0]} | {lines[1]} | {took:.2f} |", flush=True)
    print(f"load: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
