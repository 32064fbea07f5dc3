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


@cache
def native(cc: tuple[str, ...], flags: tuple[str, ...]) -> tuple[str, ...]:
    """What ``-march=native`` (or ``-mcpu``/``-mtune=native``) means on this host, as the
    compiler expands it: part of a cached library's key, so that a cache directory
    shared with another CPU (a network home, a cluster's workers) does not hand it code
    with instructions it lacks. The target options of the compiler proper's command
    line (``cc -###``): gcc's ``-march=znver1 -mavx2 -mno-avx512f ...``, clang's
    ``-target-cpu`` and ``-target-feature`` pairs. Empty without a native flag."""
    if not any(f.endswith("=native") for f in flags):
        return ()
    probe = [*cc, *flags, "-###", "-x", "c", "-c", os.devnull, "-o", os.devnull]
    try:
        proc = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ("unknown",)
    lines = [line for line in proc.stderr.splitlines() if "cc1" in line]
    tokens = [t.strip('"') for t in shlex.split(lines[0])] if lines else []
    kept: list[str] = []
    for prev, t in zip(["", *tokens], tokens, strict=False):
        if t.startswith("-m") or prev in ("-target-cpu", "-target-feature"):
            kept.append(t)
    return tuple(kept) or ("unknown",)


def identity() -> dict[str, object]:
    """What decides the bytes ``build_shared`` produces, for the cache key."""
    cc = compiler()
    flags = cflags()
    return {
        "cc": cc,
        "cc_path": shutil.which(cc[0]),
        "cc_version": version(cc[0]),
        "cflags": flags,
        "native": list(native(tuple(cc), tuple(flags))),
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


def assembly(source: str) -> str:
    """The assembly the C compiler emits for ``source`` with the kernel's flags."""
    flags = [f for f in cflags() if f not in ("-shared", "-fPIC")]
    with tempfile.TemporaryDirectory(prefix="ucf-asm-") as tmp:
        src, asm = Path(tmp) / "kernel.c", Path(tmp) / "kernel.s"
        src.write_text(source)
        cmd = [*compiler(), *flags, "-S", "-o", str(asm), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(f"{' '.join(cmd)} failed:\n{proc.stderr.strip()}")
        return asm.read_text()


def build_library(source: Path, stem: Path, kind: str) -> Path:
    """Compile an exported kernel into ``libSTEM.a`` (``kind`` "static") or
    ``libSTEM.so`` ("shared") beside it, with ``UCF_CC`` and ``UCF_CFLAGS`` minus
    the flags that make a shared object (``-shared``, which a static library
    must not get)."""
    if kind not in ("static", "shared"):
        raise CompileError(f"a library is 'static' or 'shared', not {kind!r}")
    flags = [f for f in cflags() if f != "-shared"]
    lib = stem.parent / f"lib{stem.name}.{'a' if kind == 'static' else 'so'}"
    with tempfile.TemporaryDirectory(prefix="ucf-lib-") as tmp:
        obj = Path(tmp) / "kernel.o"
        if kind == "shared":
            cmd = [*compiler(), *flags, "-shared", "-o", str(lib), str(source), "-lm"]
        else:
            cmd = [*compiler(), *flags, "-c", "-o", str(obj), str(source)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(f"{' '.join(cmd)} failed:\n{proc.stderr.strip()}")
        if kind == "static":
            ar = subprocess.run(["ar", "rcs", str(lib), str(obj)], capture_output=True, text=True)
            if ar.returncode != 0:
                raise CompileError(f"ar rcs {lib} failed:\n{ar.stderr.strip()}")
    return lib
