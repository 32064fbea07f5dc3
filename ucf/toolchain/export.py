"""Writing a compiled kernel's files for programs built outside Python (docs/abi.md).

``Kernel.save`` lands here. Every export copies ``ucf.h`` (ABI version, error
codes, ``ucf_tensor_t``) next to the kernel's files, so the directory builds on
its own.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from ucf.codegen import c as cgen
from ucf.codegen import c_check
from ucf.codegen.kernel_plan import Plan
from ucf.errors import UcfError
from ucf.resources import runtime_dir

ABIS = ("ucf", "taco")


def beside(prefix: Path, suffix: str) -> Path:
    """``prefix`` with ``suffix`` added: dots in the name stay (``kernel.v2`` gives
    ``kernel.v2.c``), and a ``.c``, ``.h`` or ``.cu`` the user already gave is replaced."""
    if prefix.suffix in (".c", ".h", ".cu"):
        prefix = prefix.with_suffix("")
    return prefix.parent / f"{prefix.name}{suffix}"


def copy_runtime(directory: Path, names: tuple[str, ...] = ("ucf.h",)) -> list[Path]:
    """Copy shipped runtime headers into ``directory``; their new paths."""
    paths = [directory / n for n in names]
    for n, path in zip(names, paths, strict=True):
        shutil.copyfile(runtime_dir() / n, path)
    return paths


def save_c(plan: Plan, prefix: Path, name: str, abi: str, lib: str | None) -> tuple[Path, ...]:
    """Write ``prefix.c`` and ``prefix.h`` in ucf's convention, with a ``NAME_check``
    function, or in TACO's, and copy ``ucf.h`` beside them; build a library when
    ``lib`` names one. Returns the paths of the .c, the .h and the library."""
    if abi not in ABIS:
        raise UcfError(f"unknown ABI '{abi}'; choose one of {', '.join(ABIS)}")
    compute = plan.compute.name
    fns = [
        replace(f, name=name + f.name.removeprefix(compute))
        for f in (plan.assemble, plan.compute)
        if f is not None
    ]
    slots = {s.name: (s.tensor, s.format) for s in plan.cin.slots.values()}
    guard = f"UCF_{name.upper()}_H"
    title = str(plan.statement)
    h, csrc = beside(prefix, ".h"), beside(prefix, ".c")
    if abi == "taco":
        if plan.computed_format != plan.output_format:
            raise UcfError(
                f"--abi taco: the kernel writes its output as '{plan.computed_format}' and "
                f"converts it to '{plan.output_format}' in Python, which C cannot do; choose "
                f"'{plan.computed_format}' for the output"
            )
        from ucf.codegen.taco import TacoExport

        export = TacoExport(fns, plan.statement, slots, plan.output_format, plan.local_level)
        h.write_text(export.header(guard, title))
        csrc.write_text(export.source(h.name, plan.helpers))
    else:
        params = c_check.check_params(fns[-1], plan.statement.lhs.tensor)
        check = c_check.definition(name, params, plan.cin.statement, slots)
        h.write_text(cgen.header(fns, guard, title, c_check.declaration(name, params)))
        csrc.write_text(f'#include "{h.name}"\n' + cgen.source([*plan.helpers, *fns]) + check)
    copy_runtime(prefix.parent)
    if lib is None:
        return csrc, h
    from ucf.toolchain import cc

    return csrc, h, cc.build_library(csrc, prefix.parent / name, lib)
