"""What a compiled kernel shows of itself: its repr, its loop nest and the decisions
made for it (``cin``), the schedule the last call ran, its source (LLVM IR, C or
CUDA), host assembly and LLIR, and its export as C or CUDA source (``save``).

Mixed into :class:`ucf.exec.kernel.Kernel` (as ``ucf.exec.calling.Calling`` is),
apart from building and calling because none of it runs a kernel: it reads the plan
the last call in this thread ran (``Kernel._plan``, ``Kernel._built``) and writes
nothing but exported files.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ucf.codegen.kernel_plan import Plan
from ucf.errors import UcfError, boundary
from ucf.format.format import Format
from ucf.ir import nodes as ir
from ucf.lang.ast import Statement
from ucf.toolchain.export import beside, save_c


def describe(k: Any, expr: str, schedule: str | None) -> str:
    """A kernel's repr: what it was compiled from, in the words ``ucf.compile`` takes."""
    formats = ", ".join(f"{n!r}: {f!r}" for n, f in sorted(k.formats.items()))
    shown = "default: chosen per call" if schedule is None else repr(schedule)
    return (
        f"{type(k).__name__}({expr!r}, formats={{{formats}}}, target={k.target!r}, "
        f"dtype={k.dtype}, schedule={shown})"
    )


def export_name(text: str) -> str:
    """``text`` as a C identifier for exported functions: other characters become
    ``_``, and a leading digit gets a ``k`` in front."""
    ident = re.sub(r"\W", "_", text, flags=re.ASCII) or "kernel"
    return "k" + ident if ident[0].isdigit() else ident


class Inspection:
    """Mixed into :class:`ucf.exec.kernel.Kernel`, which provides the plans (``_plan``,
    ``_built``, ``_static``), the call state of this thread (``_local``), and what the
    kernel was compiled from (``_expr``, ``_formats``, ``formats``, ``schedule``,
    ``target``, ``_blocks``)."""

    def __repr__(self) -> str:
        return describe(self, self._expr, self.schedule)

    @property
    def cin(self) -> str:
        """The kernel's loop nest and every decision made for it: with no schedule
        given, those of the kernel the last call in this thread ran."""
        return "\n".join([str(self._plan.cin), *(f"  # {w}" for w in self._built.why)])

    @property
    def schedule_used(self) -> str | None:
        """The schedule text of the kernel the last call in this thread ran (before any
        call, the kernel compiled first): the one given, or the one the default model
        chose for these operands (``""``: the plain loop nest). ``ucf.compile`` with it
        builds that kernel, except where the default runs a convolution on a padded,
        flattened input (``ucf.exec.padded_conv``), which no schedule of the statement
        spells: then it is the model's schedule for the statement as written, the
        kernel the default would run unflattened. None for target cuda's default."""
        if self._built.flat is None or self._local.stats is None:
            return self._plan.schedule
        from ucf import pipeline

        st, threads = self._local.stats
        choices = pipeline.proposals(
            self._expr, self._formats, st, threads, self.formats, self._blocks
        )
        return choices[0].text

    @property
    def source(self) -> str:
        if self.target == "cuda":
            return self._plan.cuda_source
        return self._plan.llvm_ir if self.target == "llvm" else self._plan.c_source

    @property
    def c_source(self) -> str:
        return self._plan.c_source

    @property
    def asm(self) -> str:
        """The host machine code of the kernel, as assembly: what the JIT runs (llvm),
        or what the C compiler emits with the kernel's flags (c). Reading it shows
        whether a loop vectorized, or used an instruction such as AVX-512 VNNI's."""
        if self.target == "llvm":
            from ucf.toolchain import jit

            return jit.assembly(self._plan.llvm_ir)
        if self.target == "c":
            from ucf.toolchain import cc

            return cc.assembly(self._plan.c_source)
        raise UcfError("target cuda has no host assembly; read k.source (nvcc compiles it)")

    @property
    def llir(self) -> list[ir.Function]:
        return [f for f in (self._plan.assemble, self._plan.compute) if f is not None]

    @property
    def parsed_formats(self) -> dict[str, Format]:
        """The formats given, parsed (``formats`` keeps them as spelled, for messages)."""
        return dict(self._formats)

    @property
    def statement(self) -> Statement:
        return self._user_plan.statement

    @property
    def _user_plan(self) -> Plan:
        """The plan of the user's statement: the last call's, unless that ran a
        flattened convolution (``ucf.exec.padded_conv``), whose operands differ."""
        return self._plan if self._built.flat is None else self._static.compiled.plan

    @boundary
    def save(
        self,
        prefix: str | Path,
        name: str | None = None,
        lib: str | None = None,
        abi: str = "ucf",
    ) -> tuple[Path, ...]:
        """Write ``prefix.c`` and ``prefix.h``, and copy ``ucf.h`` beside them:
        standalone, the header documents the ABI (docs/abi.md). Returns the
        paths of the .c and .h files (and of the library, with ``lib``).

        The exported functions are called ``name``, ``name_assemble`` and
        ``name_check`` (``name`` defaults to the prefix's file name made a C
        identifier), so several kernels link into one program. ``lib`` "static"
        or "shared" also builds ``libNAME.a`` or ``libNAME.so`` beside them with
        the system C compiler (``UCF_CC``). ``abi="taco"`` writes the kernel
        behind TACO's ``compute``/``assemble`` on ``taco_tensor_t`` instead.
        Target cuda writes ``prefix.cu`` instead of ``prefix.c``, and copies the
        runtime headers it includes next to it."""
        prefix = Path(prefix)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        name = export_name(name or beside(prefix, "").name)
        if self.target == "cuda":
            from ucf.toolchain.cuda_build import save_cuda

            if abi != "ucf" or lib is not None:
                raise UcfError("target cuda exports .cu source only: no abi='taco' and no lib")
            return save_cuda(self._plan, prefix, name)
        return save_c(self._user_plan, prefix, name, abi, lib)
