"""Compiling generated C with the system compiler into a shared library."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from ucf.errors import CompileError
from ucf.exec.cache import atomic_write

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


def build_shared(source: str, dest: Path, include_dir: Path | None = None) -> None:
    """Compile ``source`` to ``dest`` (written atomically, so concurrent builds are safe)."""
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
        atomic_write(dest, so.read_bytes())
