"""``ucf cache``: where the kernel cache is and how big, or empty it."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    pk = sub.add_parser(
        "cache",
        help="show or clear the kernel cache",
        description="The kernel cache keeps compiled kernels on disk (UCF_CACHE_DIR, else "
        "the user cache directory). It holds at most UCF_CACHE_MAX_MB megabytes (1024); "
        "beyond that the least recently used kernels are removed (a process checks the "
        "directory every 64 writes, and when its own writes pass the limit). Deleting it is always "
        "safe: kernels are rebuilt when next needed.",
    )
    pk.add_argument(
        "action", choices=("info", "clear"), help="info: where and how big; clear: empty it"
    )


def run(args: argparse.Namespace) -> int:
    from ucf.toolchain import cache

    if args.action == "clear":
        print(f"removed {cache.clear()} entries from {cache.cache_dir()}")
        return 0
    n, used, cap = len(cache.entries()), cache.size(), cache.limit()
    print(f"directory: {cache.cache_dir()}")
    print(f"entries:   {n}")
    print(f"size:      {used / 2**20:.1f} MB of {cap / 2**20:.0f} MB (UCF_CACHE_MAX_MB)")
    return 0
