"""A two-layer MLP block with sparsity attributes (SparTA's TeSA), end to end.

    T(t,h) = X(t,d) * W1(d,h)
    U(t,h) = relu(T(t,h))
    Y(t,e) = U(t,h) * W2(h,e)

W1 and W2 are pruned in 32x32 blocks (90 % of the blocks) plus 1 % of
fine-grained elements; the blocks are int8, the fine-grained elements 32-bit.
The script propagates the attributes through the program (a pruned column of
W1 prunes that column of T and U and the matching row of W2; a pruned row of
W2 prunes the column of U and W1 that fed it), prints the sparsity before and
after, transforms the program into a plan (each weight split by width and by
block cover into a BCSR part and a CSC part), compiles it with the weights
static, checks it against numpy, and times it against torch dense (numpy when
torch is not installed).

    python examples/tesa_mlp.py [--quick] [--target c]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # when imported from elsewhere
from _common import median_time, options, report, sparsity_option  # noqa: E402

import ucf  # noqa: E402

PROGRAM = "T(t,h) = X(t,d) * W1(d,h)\nU(t,h) = relu(T(t,h))\nY(t,e) = U(t,h) * W2(h,e)"
BLOCK = 32


def weight_attr(rng, rows: int, cols: int, sparsity: float) -> ucf.TeSA:
    """32x32 blocks kept with probability 1 - sparsity, at 8 bits, plus 1 % of the
    elements at 32 bits."""
    blocks = np.kron(rng.random((rows // BLOCK, cols // BLOCK)) >= sparsity, np.ones((32, 32)))
    fine = rng.random((rows, cols)) < 0.01
    return ucf.TeSA(np.where(blocks > 0, 8, np.where(fine, 32, 0)))


def main(argv: Sequence[str] | None = None) -> int:
    args = options(__doc__.splitlines()[0], argv, sparsity_option)
    tokens, hidden, ffn = (16, 128, 256) if args.quick else (128, 768, 3072)
    rng = np.random.default_rng(args.seed)
    attrs = {
        "W1": weight_attr(rng, hidden, ffn, args.sparsity),
        "W2": weight_attr(rng, ffn, hidden, args.sparsity),
    }
    p = ucf.program(PROGRAM, shapes={"X": (tokens, hidden)}, attrs=attrs)
    before = {name: a.sparsity for name, a in p.attrs.items()}
    after = p.propagate()
    print(f"{'tensor':6} {'shape':>12} {'sparsity before':>16} {'after':>7}")
    for name, a in after.items():
        print(f"{name:6} {str(a.shape):>12} {before[name]:16.3f} {a.sparsity:7.3f}")

    costs = {(1, 1): 1.0, (BLOCK, BLOCK): 0.2 * BLOCK * BLOCK}  # a block element: 1/5 of a CSR one
    plan = p.transform(ucf.Policy(bits={8, 32}, blocks=costs))
    print(plan)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    w1 = rng.standard_normal((hidden, ffn)).astype(np.float32)
    w2 = rng.standard_normal((ffn, hidden)).astype(np.float32)
    run = plan.compile(target=args.target, static={"W1": w1, "W2": w2})
    m1, m2 = np.where(after["W1"].mask, w1, 0), np.where(after["W2"].mask, w2, 0)
    # The 8-bit blocks are stored as int8: the plan is checked against numpy on the
    # weights as it stores them, and its distance from float32 weights is reported.
    ref = np.maximum(x @ plan.stored("W1", w1), 0) @ plan.stored("W2", w2)
    exact = np.maximum(x @ m1, 0) @ m2
    moved = np.abs(ref - exact).max() / np.abs(exact).max()
    print(f"int8 storage moves Y by at most {moved:.1e} of max|Y|")
    t_plan = median_time(lambda: run(X=x), args.repeat)
    status = report("plan (ucf)", run(X=x)["Y"], ref, t_plan)
    try:
        import torch

        torch.set_num_threads(args.threads)
        tx, t1, t2 = torch.from_numpy(x), torch.from_numpy(m1), torch.from_numpy(m2)
        name, dense = "torch dense", lambda: torch.relu(tx @ t1) @ t2
    except ImportError:
        name, dense = "numpy dense", lambda: np.maximum(x @ m1, 0) @ m2
    t_dense = median_time(dense, args.repeat)
    print(f"{name}: {t_dense * 1e3:.3f} ms; the plan takes {t_plan / t_dense:.2f}x its time")
    return status


if __name__ == "__main__":
    sys.exit(main())
