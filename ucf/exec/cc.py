"""Compiling generated C with the system compiler into a shared library."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from ucf.errors import CompileError

DEFAULT_CFLAGS = "-O3 -march=native -ffp-contract=off -fopenmp -fPIC -shared"


def compiler() -> list[str]:
    cc = shlex.split(os.environ.get("UCF_CC", "cc"))
    if shutil.which(cc[0]) is None:
        raise CompileError(
            f"target 'c' needs a C compiler, and '{cc[0]}' was not found "
            "(set UCF_CC, or use the default target 'llvm', which needs none)"
        )
    return cc


def cflags() -> list[str]:
    return shlex.split(os.environ.get("UCF_CFLAGS", DEFAULT_CFLAGS))


@cache
def version(tool: str) -> str:
    """The first line ``tool --version`` prints: part of a cached library's key, so that
    a compiler upgrade rebuilds it."""
    try:
        proc = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    lines = (proc.stdout or proc.stderr).splitlines()
    return lines[0] if lines else "unknown"


def identity() -> dict[str, object]:
    """What decides the bytes ``build_shared`` produces, for the cache key."""
    cc = compiler()
    return {
        "cc": cc,
        "cc_path": shutil.which(cc[0]),
        "cc_version": version(cc[0]),
        "cflags": cflags(),
    }


def build_shared(source: str, include_dir: Path | None = None) -> bytes:
    """Compile ``source`` into a shared library and return its bytes."""
    with tempfile.TemporaryDirectory(prefix="ucf-cc-") as tmp:
        src = Path(tmp) / "kernel.c"
        src.write_text(source)
        so = Path(tmp) / "kernel.so"
        cmd = [*compiler(), *cflags(), "-o", str(so), str(src), "-lm"]
        if include_dir is not None:
            cmd.insert(1, f"-I{include_dir}")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(f"{' '.join(cmd)} failed:\n{proc.stderr.strip()}")
        return so.read_bytes()
