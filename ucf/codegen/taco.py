"""A kernel behind TACO's calling convention (``--abi taco``).

Code written against TACO-generated kernels calls ``int compute(taco_tensor_t*
out, taco_tensor_t* a, ...)`` and, to allocate the output, ``int
assemble(...)``, with the output first and the operands in the order they
appear in the statement. This module writes that pair as a thin layer over the
ucf kernel, which stays ``static`` in the same file: the layer reads sizes and
arrays out of each ``taco_tensor_t``, checks that the tensor has the order,
mode ordering, mode types and component size the kernel was built for, and
for ``assemble`` allocates the output's arrays with ``malloc`` as TACO does.

TACO stores dense and compressed modes with 32-bit indices, so the kernel must
use int32 indices and formats of dense (U) and compressed (C) levels only.
"""

from __future__ import annotations

from dataclasses import replace

from ucf.codegen import c as cgen
from ucf.codegen.c import c_name
from ucf.errors import UcfError
from ucf.format.format import Format
from ucf.ir import nodes as ir
from ucf.ir.nodes import IR_TO_C
from ucf.lang.ast import Statement, accesses

_STRUCT = """\
#ifndef TACO_TENSOR_T_DEFINED
#define TACO_TENSOR_T_DEFINED
typedef enum { taco_mode_dense, taco_mode_sparse } taco_mode_t;
typedef struct {
  int32_t      order;         /* number of modes */
  int32_t*     dimensions;    /* size of each mode */
  int32_t      csize;         /* bytes per value */
  int32_t*     mode_ordering; /* the mode each level stores */
  taco_mode_t* mode_types;    /* each level's kind */
  uint8_t***   indices;       /* per level: {pos, crd} for sparse levels */
  uint8_t*     vals;          /* the values */
  int32_t      vals_size;     /* number of values */
} taco_tensor_t;
#endif
"""


class TacoExport:
    """The header and source of one kernel in TACO's convention."""

    def __init__(
        self,
        fns: list[ir.Function],
        stmt: Statement,
        slots: dict[str, tuple[str, Format]],
        out_format: Format,
        local_level: int | None,
    ):
        self.stmt, self.out_format, self.local = stmt, out_format, local_level
        self.out = stmt.lhs.tensor
        self.operands = list(dict.fromkeys(a.tensor for a in accesses(stmt.rhs)))
        self.formats = {self.out: out_format}
        for slot, (tensor, fmt) in slots.items():
            if slot != tensor:
                raise UcfError(
                    f"--abi taco: the kernel reads {tensor} as '{fmt}', another format than "
                    "its own, which it cannot convert in C; give a schedule whose loop order "
                    f"follows {tensor}'s format"
                )
            self.formats[tensor] = fmt
        for tensor, fmt in self.formats.items():
            if fmt.blocked or any(not k.full and k.segment_array is None for k in fmt.levels):
                raise UcfError(
                    f"--abi taco: {tensor} has format '{fmt}'; TACO's taco_tensor_t holds "
                    "dense (U) and compressed (C) levels only"
                )
            if fmt.values is not None and not fmt.values.plain:
                raise UcfError(
                    f"--abi taco: {tensor} holds {fmt.values} values; TACO's taco_tensor_t "
                    "has no place for packed bits or scales (use the default abi)"
                )
        compute = next(f for f in fns if not f.name.endswith("_assemble"))
        # Each tensor's value type: an operand's format may hold narrower values.
        self.types = {p.role[1]: IR_TO_C[p.type] for p in compute.params if p.role[0] == "vals"}
        self.vt = self.types[self.out]
        if any(
            p.is_array and p.role[0] in ("pos", "crd") and p.type != "i32"
            for f in fns
            for p in f.params
        ):
            raise UcfError(
                "--abi taco needs int32 indices (TACO's); compile with index_dtype='int32'"
            )
        self.fns = [replace(f, name="ucf_" + f.name, internal=True) for f in fns]
        self.compute = next(f for f in self.fns if not f.name.endswith("_assemble"))
        self.assemble = next((f for f in self.fns if f.name.endswith("_assemble")), None)
        self.extents = self._extents(compute)

    def _extents(self, fn: ir.Function) -> dict[str, str]:
        """Each index variable's extent, read off the first tensor it indexes plainly."""
        found: dict[str, str] = {}
        for a in [self.stmt.lhs, *accesses(self.stmt.rhs)]:
            for m, idx in enumerate(a.indices):
                v = idx.single_variable
                if v is not None:
                    found.setdefault(v, f"(int64_t){c_name(a.tensor)}->dimensions[{m}]")
        result = {}
        for p in fn.params:
            if p.role[0] == "extent":
                if p.role[1] not in found:
                    raise UcfError(
                        f"--abi taco: index variable {p.role[1]} indexes no tensor plainly, so "
                        "its extent cannot be read from a taco_tensor_t"
                    )
                result[p.role[1]] = found[p.role[1]]
        return result

    # ----------------------------------------------------------------- text
    def prototypes(self) -> list[str]:
        args = ", ".join(f"taco_tensor_t* {c_name(t)}" for t in [self.out, *self.operands])
        return [f"int compute({args})", f"int assemble({args})"]

    def header(self, guard: str, title: str) -> str:
        compute, assemble = self.prototypes()
        return "\n".join(
            [
                f"/* {title}",
                " *",
                " * Generated by ucf with TACO's calling convention (docs/abi.md): the output",
                " * first, then the operands in the order the statement reads them. assemble",
                " * allocates the output's arrays (indices[l][0] pos and [l][1] crd of a sparse",
                " * level, vals) with malloc and stores them in the output, which the caller",
                " * frees with free; compute computes the values into them (for a dense output,",
                " * into vals, which assemble or the caller allocated). Both return 0, or a",
                " * UCF_ERR_* code when a tensor's order, mode ordering, mode types or csize",
                " * differ from the kernel's, or malloc fails (7: UCF_ERR_ARG, 6: UCF_ERR_ALLOC).",
                " */",
                f"#ifndef {guard}",
                f"#define {guard}",
                "#include <stdint.h>",
                _STRUCT,
                "#ifdef __cplusplus",
                'extern "C" {',
                "#endif",
                f"{compute};",
                f"{assemble};",
                "#ifdef __cplusplus",
                "}",
                "#endif",
                f"#endif /* {guard} */",
                "",
            ]
        )

    def source(self, header_name: str, helpers: list[ir.Function]) -> str:
        compute, assemble = self.prototypes()
        head = [f'#include "{header_name}"', '#include "ucf.h"', "#include <string.h>"]
        body = [
            _MATCHES,
            f"{assemble} {{",
            *self._prologue(),
            *(self._sparse(allocate=True) if self.assemble else self._dense_assemble()),
            "  return UCF_OK;",
            "}",
            "",
            f"{compute} {{",
            *self._prologue(),
            *(self._sparse(allocate=False) if self.assemble else self._dense_compute()),
            "  return UCF_OK;",
            "}",
            "",
        ]
        return "\n".join([*head, cgen.source([*helpers, *self.fns]), *body])

    def _prologue(self) -> list[str]:
        lines = []
        for t in [self.out, *self.operands]:
            fmt = self.formats[t]
            order = ", ".join(str(m) for m in fmt.mode_order) or "0"
            kinds = ", ".join("0" if k.full else "1" for k in fmt.levels) or "0"
            lines += [
                "  {",
                f"    static const int32_t ucf_order[] = {{{order}}};",
                f"    static const int ucf_kinds[] = {{{kinds}}};",
                f"    if (!ucf_taco_matches({c_name(t)}, {fmt.order}, ucf_order, ucf_kinds, "
                f"(int32_t)sizeof({self.types[t]}))) return UCF_ERR_ARG;",
                "  }",
            ]
        for v, expr in self.extents.items():
            lines.append(f"  const int64_t ucf_n_{v} = {expr};")
            lines.append(f"  (void)ucf_n_{v};")
        return lines

    def _args(self, fn: ir.Function, out: dict[tuple, str]) -> str:
        args = []
        for p in fn.params:
            role = p.role
            if role[0] == "extent":
                args.append(f"ucf_n_{role[1]}")
            elif role[0] == "counts":
                args.append("ucf_counts")
            elif role[1] == self.out and role[0] != "dim":
                args.append(out[role])
            elif role[0] == "dim":
                args.append(f"(int64_t){c_name(role[1])}->dimensions[{role[2]}]")
            elif role[0] == "vals":
                args.append(f"(const {self.types[role[1]]}*){c_name(role[1])}->vals")
            else:
                slot = 0 if role[0] == "pos" else 1
                args.append(f"(const int32_t*){c_name(role[1])}->indices[{role[2]}][{slot}]")
        return ", ".join(args)

    def _level_size(self, lvl: int) -> str:
        return f"(int64_t){c_name(self.out)}->dimensions[{self.out_format.mode_order[lvl]}]"

    def _dense_size(self) -> str:
        return " * ".join(self._level_size(lvl) for lvl in range(self.out_format.order)) or "1"

    def _dense_assemble(self) -> list[str]:
        o = c_name(self.out)
        return [
            f"  const int64_t ucf_n = {self._dense_size()};",
            f"  {o}->vals = (uint8_t*)calloc(ucf_n > 0 ? ucf_n : 1, sizeof({self.vt}));",
            f"  if ({o}->vals == NULL) return UCF_ERR_ALLOC;",
            f"  {o}->vals_size = (int32_t)ucf_n;",
        ]

    def _dense_compute(self) -> list[str]:
        o = c_name(self.out)
        out = {("vals", self.out): f"({self.vt}*){o}->vals"}
        lines = []
        if self.stmt.op == "=":
            lines.append(
                f"  memset({o}->vals, 0, (size_t)({self._dense_size()}) * sizeof({self.vt}));"
            )
        return [*lines, f"  {self.compute.name}({self._args(self.compute, out)});"]

    def _sparse(self, allocate: bool) -> list[str]:
        """Count, size (and allocate) the output, then compute into it; ``pos`` of a level
        the assemble pass fills is passed to both passes."""
        o, fmt = c_name(self.out), self.out_format
        out: dict[tuple, str] = {("vals", self.out): "ucf_vals"}
        lines = [f"  int64_t ucf_counts[{len(fmt.levels)}];", f"  {self.vt}* ucf_vals = NULL;"]
        sparse = [lvl for lvl, k in enumerate(fmt.levels) if not k.full]
        for lvl in sparse:
            for key in ("pos", "crd"):
                out[(key, self.out, lvl)] = f"ucf_{key}{lvl}"
                lines.append(f"  int32_t* ucf_{key}{lvl} = NULL;")
        if self.local is not None:
            above = " * ".join(self._level_size(lvl) for lvl in range(self.local)) or "1"
            pos = f"ucf_pos{self.local}"
            if allocate:
                lines += [
                    f"  {pos} = (int32_t*)malloc(sizeof(int32_t) * ({above} + 1));",
                    f"  if ({pos} == NULL) return UCF_ERR_ALLOC;",
                ]
            else:
                lines.append(f"  {pos} = (int32_t*){o}->indices[{self.local}][0];")
        lines.append(f"  {self.assemble.name}({self._args(self.assemble, out)});")
        lines.append("  int64_t ucf_n = 1;")
        for lvl, kind in enumerate(fmt.levels):
            if kind.full:
                lines.append(f"  ucf_n *= {self._level_size(lvl)};")
                continue
            if not allocate:
                for slot, key in enumerate(("pos", "crd")):
                    if key == "crd" or lvl != self.local:
                        lines.append(f"  ucf_{key}{lvl} = (int32_t*){o}->indices[{lvl}][{slot}];")
            elif lvl != self.local:
                lines.append(f"  ucf_pos{lvl} = (int32_t*)malloc(sizeof(int32_t) * (ucf_n + 1));")
            if allocate:
                lines.append(
                    f"  ucf_crd{lvl} = (int32_t*)malloc(sizeof(int32_t) * "
                    f"(ucf_counts[{lvl}] > 0 ? ucf_counts[{lvl}] : 1));"
                )
            lines.append(f"  ucf_n = ucf_counts[{lvl}];")
        if allocate:
            bad = " || ".join(f"ucf_{k}{lvl} == NULL" for lvl in sparse for k in ("pos", "crd"))
            frees = " ".join(f"free(ucf_{k}{lvl});" for lvl in sparse for k in ("pos", "crd"))
            lines += [
                f"  ucf_vals = ({self.vt}*)calloc(ucf_n > 0 ? ucf_n : 1, sizeof({self.vt}));",
                f"  if (ucf_vals == NULL || {bad}) {{",
                f"    {frees} free(ucf_vals);",
                "    return UCF_ERR_ALLOC;",
                "  }",
            ]
        else:
            lines += [
                f"  ucf_vals = ({self.vt}*){o}->vals;",
                f"  memset(ucf_vals, 0, (size_t)ucf_n * sizeof({self.vt}));",
            ]
        lines.append(f"  {self.compute.name}({self._args(self.compute, out)});")
        if allocate:
            for lvl in sparse:
                lines += [
                    f"  {o}->indices[{lvl}][0] = (uint8_t*)ucf_pos{lvl};",
                    f"  {o}->indices[{lvl}][1] = (uint8_t*)ucf_crd{lvl};",
                ]
            lines.append(f"  {o}->vals = (uint8_t*)ucf_vals;")
        # The final size: entries whose segments stayed empty were dropped.
        lines.append("  ucf_n = 1;")
        for lvl, kind in enumerate(fmt.levels):
            lines.append(
                f"  ucf_n *= {self._level_size(lvl)};"
                if kind.full
                else f"  ucf_n = ucf_pos{lvl}[ucf_n];"
            )
        lines.append(f"  {o}->vals_size = (int32_t)ucf_n;")
        return lines


_MATCHES = """\
/* Whether t has the order, mode ordering, mode types and csize the kernel takes. */
static int ucf_taco_matches(const taco_tensor_t* t, int32_t order, const int32_t* ordering,
                            const int* kinds, int32_t csize) {
  if (t == NULL || t->order != order || t->csize != csize) return 0;
  for (int32_t l = 0; l < order; l++) {
    if (t->mode_ordering[l] != ordering[l] || (int)t->mode_types[l] != kinds[l]) return 0;
  }
  return 1;
}
"""
