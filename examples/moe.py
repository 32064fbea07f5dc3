"""Mixture-of-Experts with dynamic routing: one ucf kernel, a new routing every call.

    C(e,t,n) = R(e,t) * X(t,d) * W(e,d,n)

R holds each token's gate weight for the experts it is routed to (top-k of a
random softmax) and zeros elsewhere: its sparsity is known only when the call
comes. R is a dynamic operand with 1 x 1 micro-tiles (``dynamic={"R": (1, 1)}``),
so every call builds the index of the live (expert, token) pairs and computes
only those rows of C: each expert's live tokens are gathered as rows of X scaled
by their gates into a dense tile, multiplied by the expert's W with a
register-blocked micro-kernel, and written to their rows of C. The result is checked
against numpy, and timed against the two baselines SparDA names: a loop of
torch matmuls over the experts (each on its gathered tokens, "serial") and one
batched matmul over the experts with every expert's tokens padded to the
largest count ("padded"). Both baselines write the same dense C.

    python examples/moe.py [--quick] [--experts 8] [--top 2] [--target c]
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # when imported from elsewhere
from _common import median_time, options, report  # noqa: E402

import ucf  # noqa: E402

STATEMENT = "C(e,t,n) = R(e,t) * X(t,d) * W(e,d,n)"


def routing(rng: np.random.Generator, experts: int, tokens: int, top: int) -> np.ndarray:
    """R(e,t): each token's softmax gate weights on its ``top`` experts, zero elsewhere."""
    logits = rng.standard_normal((tokens, experts)).astype(np.float32)
    chosen = np.argsort(-logits, axis=1)[:, :top]
    gates = np.take_along_axis(logits, chosen, axis=1)
    gates = np.exp(gates - gates.max(axis=1, keepdims=True))
    gates /= gates.sum(axis=1, keepdims=True)
    r = np.zeros((experts, tokens), dtype=np.float32)
    np.put_along_axis(r.T, chosen, gates, axis=1)
    return r


def compile_moe(target: str = "llvm") -> ucf.Kernel:
    """The kernel: R dynamic, one (expert, token) pair per micro-tile."""
    return ucf.compile(STATEMENT, dynamic={"R": (1, 1)}, dtype=np.float32, target=target)


def reference(r: np.ndarray, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.einsum("et,td,edn->etn", r, x, w, optimize=True)


def baselines(threads: int):
    """The per-expert torch loop and the padded batched matmul, or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)

    def serial(
        r: np.ndarray, x: np.ndarray, w: np.ndarray, out: np.ndarray | None = None
    ) -> np.ndarray:
        """A new C, or ``out`` zeroed and written."""
        tr, tx, tw = torch.from_numpy(r), torch.from_numpy(x), torch.from_numpy(w)
        shape = (r.shape[0], r.shape[1], w.shape[2])
        c = torch.zeros(shape) if out is None else torch.from_numpy(out).zero_()
        for e in range(r.shape[0]):
            idx = torch.nonzero(tr[e]).flatten()
            if len(idx):
                c[e, idx] = tr[e, idx, None] * (tx[idx] @ tw[e])
        return c.numpy()

    def padded(r: np.ndarray, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        tr, tx, tw = torch.from_numpy(r), torch.from_numpy(x), torch.from_numpy(w)
        experts, tokens = r.shape
        live = tr != 0
        counts = live.sum(dim=1)
        cap = int(counts.max()) if experts else 0
        # each expert's tokens in order, padded with token 0 (its gate is 0 there)
        order = torch.argsort((~live).to(torch.int8), dim=1, stable=True)[:, :cap]
        slots = torch.arange(cap)[None, :] < counts[:, None]
        gate = torch.where(slots, torch.gather(tr, 1, order), 0.0)
        out = torch.bmm(tx[order], tw) * gate[..., None]
        c = torch.zeros((experts, tokens, w.shape[2]))
        c.scatter_add_(1, order[..., None].expand(-1, -1, w.shape[2]), out)
        return c.numpy()

    return serial, padded


def main(argv: Sequence[str] | None = None) -> int:
    def extra(p):
        p.add_argument("--experts", type=int, default=8)
        p.add_argument("--top", type=int, default=2, help="experts per token (default 2)")

    args = options(__doc__.splitlines()[0], argv, extra)
    tokens, d, n = (96, 32, 24) if args.quick else (2048, 512, 512)
    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal((tokens, d)).astype(np.float32)
    w = (rng.standard_normal((args.experts, d, n)) / np.sqrt(d)).astype(np.float32)
    kernel = compile_moe(args.target)
    routes = [routing(rng, args.experts, tokens, args.top) for _ in range(3)]
    print(
        f"{args.experts} experts, top-{args.top}, {tokens} tokens, d={d}, n={n}, "
        f"{args.threads} threads"
    )
    status = 0
    for r in routes:  # one kernel, a new routing each call
        status |= report("ucf, dynamic R", kernel(R=r, X=x, W=w), reference(r, x, w))
    calls = iter(routes * (args.repeat + 2))
    t_ucf = median_time(lambda: kernel(R=next(calls), X=x, W=w), args.repeat)
    print(f"ucf, dynamic R: {t_ucf * 1e3:.2f} ms (index build included)")
    found = baselines(args.threads)
    if found is None:
        print("torch is not installed: no baselines (pip install 'ucf[torch]')")
        return status
    for name, fn in zip(("torch per-expert loop", "torch padded bmm"), found, strict=True):
        status |= report(name, fn(routes[0], x, w), reference(routes[0], x, w))
        t = median_time(lambda fn=fn: fn(next(calls), x, w), args.repeat)
        print(f"{name}: {t * 1e3:.2f} ms; ucf is {t / t_ucf:.2f}x faster")
    return status


if __name__ == "__main__":
    # ucf and torch share one OpenMP pool; threads spinning between the two libraries'
    # calls would take the cores of a small machine from whichever runs next.
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    sys.exit(main())
