"""Dynamic sparse attention and variable sequence lengths (issue 36, Performance).

Run from the repository root:

    python bench/attention.py            # the issue's sizes, 2 threads
    python bench/attention.py --quick    # small sizes: seconds

Attention: batch 1, 4 heads, sequence 4096, head dim 64, float32. The mask is 64 x 64
blocks, 90 % of them masked (Longformer's sliding window of one block each side and a
global block, plus random blocks up to 10 % live), drawn anew for every call (before
the clock starts), and handed to each library in its own form: SDPA gets the dense
boolean mask, ``flex_attention`` (compiled, as its docs require) and ucf the same
``BlockMask``. ucf's time includes building its index from the mask. The functions
take turns on each mask; medians of wall time. Then 50 % masked blocks, and the BERT
layer of examples/bert_layer.py (32 x 128, GLUE-like lengths, and all 128).

Every target row prints met / NOT met. Timings on a shared machine are indicative;
the load average is printed with them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import ucf  # noqa: E402
from ucf.nn import attention_masks as masks  # noqa: E402


def block_pattern(rng: np.random.Generator, blocks: int, live: float) -> np.ndarray:
    """Longformer's blocks (window of one each side, block 0 global) plus random blocks
    until ``live`` of them are live."""
    i = np.arange(blocks)
    pattern = np.abs(i[:, None] - i[None, :]) <= 1
    pattern[0, :] = pattern[:, 0] = True
    want = int(round(live * blocks * blocks)) - int(pattern.sum())
    if want > 0:
        free = np.flatnonzero(~pattern)
        pattern.flat[rng.choice(free, size=min(want, len(free)), replace=False)] = True
    return pattern


def block_mask(pattern: np.ndarray, block: int, seq: int):
    """FlexAttention's BlockMask of ``pattern``: every live block full (no mask_mod)."""
    from torch.nn.attention.flex_attention import BlockMask

    live = torch.from_numpy(pattern)
    counts = live.sum(dim=1).to(torch.int32)[None, None]
    order = torch.argsort((~live).to(torch.int8), dim=1, stable=True).to(torch.int32)
    empty = torch.zeros_like(counts)
    return BlockMask.from_kv_blocks(
        empty,
        order[None, None],
        counts,
        order[None, None],
        BLOCK_SIZE=block,
        seq_lengths=(seq, seq),
    )


def turns(fns: dict, inputs: list, cpu: dict | None = None) -> dict:
    """Median wall seconds of each function over ``inputs``, taking turns per input;
    into ``cpu``, if given, the median CPU seconds of the process (all its threads),
    which other work on a shared machine inflates less than wall time."""
    times: dict = {k: [] for k in fns}
    spent: dict = {k: [] for k in fns}
    for x in inputs:
        for k, fn in fns.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn(x)
            times[k].append(time.perf_counter() - t0)
            spent[k].append(time.process_time() - c0)
    if cpu is not None:
        cpu.update({k: statistics.median(v) for k, v in spent.items()})
    return {k: statistics.median(v) for k, v in times.items()}


def target(name: str, value: float, goal: float, higher: bool = True, unit: str = "x") -> None:
    ok = value >= goal if higher else value <= goal
    sign = ">=" if higher else "<="
    print(f"  {name}: {value:.2f}{unit} (target {sign} {goal}{unit}) {'met' if ok else 'NOT met'}")


def attention_rows(args) -> None:
    b, h, s, d, g = (1, 2, 512, 64, 64) if args.quick else (1, 4, 4096, 64, 64)
    blocks = s // g
    gen = torch.Generator().manual_seed(args.seed)
    q, k, v = (torch.randn(b, h, s, d, generator=gen) for _ in range(3))
    rng = np.random.default_rng(args.seed)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def inputs(live: float, n: int):
        out = []
        for _ in range(n):
            p = block_pattern(rng, blocks, live)
            dense = torch.from_numpy(np.repeat(np.repeat(p, g, 0), g, 1))
            out.append((dense, block_mask(p, g, s)))
        return out

    masks_90 = inputs(0.1, args.repeat + 1)
    dense0, blk0 = masks_90[0]
    err = float((ucf.attention(q, k, v, mask=blk0) - sdpa(q, k, v, attn_mask=dense0)).abs().max())
    print(f"ucf against SDPA on one mask: max abs error {err:.1e}")
    fns = {
        "sdpa": lambda m: sdpa(q, k, v, attn_mask=m[0]),
        "ucf": lambda m: ucf.attention(q, k, v, mask=m[1], granularity=(g, g)),
        "ucf index": lambda m: masks.resolve(m[1], (b, h, s, s), (g, g)),
        "ucf (bool mask)": lambda m: ucf.attention(q, k, v, mask=m[0], granularity=(g, g)),
    }
    flex_note = ""
    try:
        from torch.nn.attention.flex_attention import flex_attention

        flex = torch.compile(flex_attention)
        flex(q, k, v, block_mask=blk0)
        fns["flex"] = lambda m: flex(q, k, v, block_mask=m[1])
    except Exception as e:  # noqa: BLE001 - whatever stops it on this CPU is reported
        flex_note = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    for fn in fns.values():
        fn(masks_90[0])  # warm-up: compiles
    cpu: dict = {}
    t = turns(fns, masks_90[1:], cpu)
    load = os.getloadavg()[0]
    print(f"\nattention {b} x {h} heads x {s} x {d}, 64 x 64 blocks, 90 % masked, load {load:.1f}")
    for k_, v_ in t.items():
        print(f"  {k_}: {v_ * 1e3:.1f} ms")
    target("forward, SDPA (dense bool mask) / ucf", t["sdpa"] / t["ucf"], 3.0)
    if "flex" in t:
        target("forward, flex_attention (same BlockMask) / ucf", t["flex"] / t["ucf"], 1.0)
        print(
            f"    (in CPU seconds: flex {cpu['flex'] * 1e3:.1f} ms, ucf {cpu['ucf'] * 1e3:.1f} "
            f"ms, {cpu['flex'] / cpu['ucf']:.2f}x; informative, the row is wall time)"
        )
    else:
        print(f"  flex_attention does not run here ({flex_note})")
    target("index build share of ucf's forward", 100 * t["ucf index"] / t["ucf"], 5.0, False, "%")

    def both(fn):
        def run(m):
            qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
            fn(qq, kk, vv, m).sum().backward()

        return run

    grads = {
        "sdpa": both(lambda qq, kk, vv, m: sdpa(qq, kk, vv, attn_mask=m[0])),
        "ucf": both(lambda qq, kk, vv, m: ucf.attention(qq, kk, vv, mask=m[1])),
    }
    for fn in grads.values():
        fn(masks_90[0])
    tg = turns(grads, masks_90[1:])
    print(f"forward + backward, load {os.getloadavg()[0]:.1f}")
    for k_, v_ in tg.items():
        print(f"  {k_}: {v_ * 1e3:.1f} ms")
    target("forward + backward, SDPA / ucf", tg["sdpa"] / tg["ucf"], 2.5)
    if "flex" in t:
        print("  flex_attention: no backward on the CPU in torch 2.13 (NotImplementedError)")
    masks_50 = inputs(0.5, args.repeat + 1)
    half = {k_: fns[k_] for k_ in ("sdpa", "ucf")}
    for fn in half.values():
        fn(masks_50[0])
    th = turns(half, masks_50[1:])
    print(f"50 % masked, load {os.getloadavg()[0]:.1f}")
    for k_, v_ in th.items():
        print(f"  {k_}: {v_ * 1e3:.1f} ms")
    target("forward at 50 %, SDPA / ucf (not slower)", th["sdpa"] / th["ucf"], 1.0)


def bert_rows(args) -> None:
    from bert_layer import run

    batch, max_len = (4, 32) if args.quick else (32, 128)
    for full, goal, name in ((False, 1.5, "GLUE-like lengths"), (True, None, "all 128")):
        ok, err, t, lengths = run(
            batch, max_len, full, args.seed, args.threads, args.repeat, args.quick
        )
        valid = lengths.sum() / (batch * max_len)
        print(
            f"\nBERT layer, {batch} x {max_len}, {name} ({valid:.0%} valid), load "
            f"{os.getloadavg()[0]:.1f}: torch {t['torch'] * 1e3:.1f} ms, ucf "
            f"{t['ucf'] * 1e3:.1f} ms (valid tokens {'match' if ok else 'DIFFER'}, {err:.1e})"
        )
        if goal is None:
            target("ucf / torch time with no padding", t["ucf"] / t["torch"], 1.1, False)
        else:
            target("torch dense padded / ucf", t["torch"] / t["ucf"], goal)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=7, help="masks (batches) timed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--section", choices=("attention", "bert"), default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    ucf.set_num_threads(args.threads)
    if args.section in (None, "attention"):
        attention_rows(args)
    if args.section in (None, "bert"):
        bert_rows(args)


if __name__ == "__main__":
    # ucf and torch share one OpenMP pool; threads spinning between the two libraries'
    # calls would take the cores of a small machine from whichever runs next.
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    main()
