"""A BERT-base encoder layer over a padded batch of variable-length sequences.

SparDA's dynamic sequence length scenario (section 5.1.2): a batch of 32 sequences
padded to 128 tokens, lengths drawn from a GLUE-like distribution (mean about 40 %
of the maximum). The padding is dynamic sparsity over token rows; ucf's layer
computes the valid tokens only, in torch:

- the four linear layers (queries-keys-values, output, and the feed-forward pair) are
  ``ucf.nn.PackedLinear``: each call builds the STile index of the valid rows and
  multiplies only those (``C(e,t,n) = R(e,t) * X(t,d) * W(e,d,n)``, rows as the
  dynamic operand), returning the padded layout with zeros in the padding;
- attention is ``ucf.attention(..., lengths=...)``: no tile past a sequence's length;
- GELU, the residuals and LayerNorm are torch's, on the padded tensors.

The reference is the same layer in plain torch (``scaled_dot_product_attention``
with the key padding mask). The valid tokens' outputs are checked against it, and
both layers are timed, taking turns on the same batches (median).

    python examples/bert_layer.py [--quick] [--full] [--batch 32] [--max-len 128]

``--full`` gives every sequence the maximum length: nothing to skip, so the ratio
measures the overhead of the dynamic path.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # when imported from elsewhere
from _common import options  # noqa: E402

import ucf  # noqa: E402

HIDDEN, HEADS, FFN = 768, 12, 3072


def glue_lengths(rng: np.random.Generator, batch: int, max_len: int) -> np.ndarray:
    """Sequence lengths like GLUE's tokenized sentences: a skewed distribution (log-normal)
    with mean about 40 % of ``max_len``, cut to [4, max_len]."""
    mean = 0.4 * max_len
    sigma = 0.5
    mu = math.log(mean) - sigma**2 / 2
    return np.clip(np.round(rng.lognormal(mu, sigma, batch)), 4, max_len).astype(np.int64)


def layers(hidden: int, heads: int, ffn: int, seed: int):
    """The torch reference layer and ucf's, with the same weights."""
    import torch

    torch.manual_seed(seed)

    class Reference(torch.nn.Module):
        """Post-LayerNorm BERT layer; padding masked out of the keys."""

        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(hidden, 3 * hidden)
            self.out = torch.nn.Linear(hidden, hidden)
            self.ln1 = torch.nn.LayerNorm(hidden)
            self.up = torch.nn.Linear(hidden, ffn)
            self.down = torch.nn.Linear(ffn, hidden)
            self.ln2 = torch.nn.LayerNorm(hidden)

        def heads(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, heads, -1).permute(2, 0, 3, 1, 4)
            return q.contiguous(), k.contiguous(), v.contiguous()

        def rest(self, x, a):
            b, _, s, _ = a.shape
            h = self.ln1(x + self.out(a.transpose(1, 2).reshape(b, s, -1)))
            return self.ln2(h + self.down(torch.nn.functional.gelu(self.up(h))))

        def forward(self, x, lengths):
            q, k, v = self.heads(x)
            keys = torch.arange(x.shape[1])[None, :] < lengths[:, None]
            a = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=keys[:, None, None, :]
            )
            return self.rest(x, a)

    class Ucf(torch.nn.Module):
        """The same layer computing the valid tokens only."""

        def __init__(self, ref: Reference):
            super().__init__()
            lin = ucf.nn.PackedLinear
            self.qkv, self.out = lin(hidden, 3 * hidden), lin(hidden, hidden)
            self.up, self.down = lin(hidden, ffn), lin(ffn, hidden)
            self.ln1, self.ln2 = ref.ln1, ref.ln2
            self.load_state_dict(ref.state_dict(), strict=False)
            self.attention = ucf.nn.SparseAttention()

        def forward(self, x, lengths):
            b, s, _ = x.shape
            q, k, v = self.qkv(x, lengths).view(b, s, 3, heads, -1).permute(2, 0, 3, 1, 4)
            a = self.attention(q.contiguous(), k.contiguous(), v.contiguous(), lengths=lengths)
            h = self.ln1(x + self.out(a.transpose(1, 2).reshape(b, s, -1), lengths))
            up = torch.nn.functional.gelu(self.up(h, lengths))
            return self.ln2(h + self.down(up, lengths))

    ref = Reference().eval()
    return ref, Ucf(ref).eval()


def interleaved(fns: dict, repeat: int) -> dict:
    """The median seconds of each function, the functions taking turns."""
    times: dict = {k: [] for k in fns}
    for fn in fns.values():
        fn()  # warm-up: compiles, first allocations
    for _ in range(max(1, repeat)):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def run(batch: int, max_len: int, full: bool, seed: int, threads: int, repeat: int, quick: bool):
    """Check ucf's layer against torch's on the valid tokens; return (ok, times, lengths)."""
    import torch

    torch.set_num_threads(threads)
    hidden, heads, ffn = (64, 4, 128) if quick else (HIDDEN, HEADS, FFN)
    rng = np.random.default_rng(seed)
    if full:
        lengths = np.full(batch, max_len, dtype=np.int64)
    else:
        lengths = glue_lengths(rng, batch, max_len)
    ref, mine = layers(hidden, heads, ffn, seed)
    x = torch.from_numpy(rng.standard_normal((batch, max_len, hidden)).astype(np.float32))
    n = torch.from_numpy(lengths)
    with torch.no_grad():
        want, got = ref(x, n), mine(x, n)
        valid = torch.arange(max_len)[None, :] < n[:, None]
        err = float((got[valid] - want[valid]).abs().max())
        ok = err <= 1e-3 * max(1.0, float(want[valid].abs().max()))
        times = interleaved({"torch": lambda: ref(x, n), "ucf": lambda: mine(x, n)}, repeat)
    return ok, err, times, lengths


def main(argv: Sequence[str] | None = None) -> int:
    def extra(p):
        p.add_argument("--batch", type=int, default=32)
        p.add_argument("--max-len", type=int, default=128)
        p.add_argument("--full", action="store_true", help="every sequence at the maximum length")

    args = options(__doc__.splitlines()[0], argv, extra)
    batch, max_len = (4, 32) if args.quick else (args.batch, args.max_len)
    ok, err, times, lengths = run(
        batch, max_len, args.full, args.seed, args.threads, args.repeat, args.quick
    )
    print(
        f"batch {batch} x {max_len}, lengths mean {lengths.mean():.1f} "
        f"({lengths.sum() / (batch * max_len):.0%} valid), {args.threads} threads"
    )
    print(f"valid tokens: max abs error {err:.2e} against torch: {'ok' if ok else 'FAIL'}")
    print(
        f"torch dense padded layer: {times['torch'] * 1e3:.1f} ms; ucf: {times['ucf'] * 1e3:.1f} "
        f"ms; ucf is {times['torch'] / times['ucf']:.2f}x faster"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    # ucf and torch share one OpenMP pool; threads spinning between the two libraries'
    # calls would take the cores of a small machine from whichever runs next.
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    sys.exit(main())
