"""``<name>_check``: the C function that validates a caller's operand arrays.

Kernels trust their inputs: an unsorted ``crd`` makes a merge skip entries and
a coordinate out of range writes out of bounds, without a word. Python
callers get ``ucf.Tensor``'s checks; C callers get this function, generated
for each exported kernel from its operands' formats. It takes the kernel's
own leading arguments (the extents and the operands), so checking is one
more call with the same arguments, and returns one of ucf.h's error codes.

Levels are told apart by their properties (full, branchless, ordered) and
arrays, never by kind, as everywhere in the compiler.
"""

from __future__ import annotations

from ucf.codegen.c import c_name
from ucf.errors import UcfError
from ucf.format.format import Format
from ucf.ir import nodes as ir
from ucf.ir.nodes import IR_TO_C
from ucf.lang.ast import Statement, accesses


def check_params(fn: ir.Function, output: str) -> list[ir.Param]:
    """The compute function's arguments up to the output: extents and operands."""
    return [
        p
        for p in fn.params
        if p.role[0] == "extent" or (p.role[0] != "counts" and p.role[1] != output)
    ]


def group_counts(params: list[ir.Param]) -> dict[str, str]:
    """The arguments the check takes after the kernel's: for each quantized operand
    storage (a parameter prefix), the number of entries of its scale and zero point
    arrays, which C cannot tell from the pointers."""
    return {p.role[1]: c_name(f"{p.role[1]}_groups") for p in params if p.role[0] == "scale"}


def prototype(name: str, params: list[ir.Param]) -> str:
    args = []
    for p in params:
        ctype = IR_TO_C[p.type]
        args.append(
            f"const {ctype}* {c_name(p.name)}" if p.is_array else f"{ctype} {c_name(p.name)}"
        )
    args += [f"int64_t {count}" for count in group_counts(params).values()]
    return f"int {name}_check({', '.join([*args, 'char* msg', 'size_t msg_size'])})"


def declaration(name: str, params: list[ir.Param]) -> str:
    return "\n".join(
        [
            f"/* Optional: validates the arguments {name} would get, up to the output: each",
            " * operand's sizes against the extents, and its index arrays against its format",
            " * (pos from 0 and non-decreasing; crd in range, sorted and unique within each",
            " * segment of a compressed level). After them, <T>_groups gives the number of",
            " * entries of each quantized operand's <T>_scale and <T>_zero: it must equal the",
            " * operand's scale groups, each scale positive and finite, each zero point in",
            " * range. Returns UCF_OK (0) or a UCF_ERR_* code of ucf.h, and writes a message",
            " * into msg (msg_size bytes, NUL-terminated) when msg is not NULL. Reads",
            " * pos[0..parents], crd[0..pos[parents]-1] and <T>_groups scales only. */",
            prototype(name, params) + ";",
            "",
        ]
    )


def definition(
    name: str, params: list[ir.Param], stmt: Statement, formats: dict[str, tuple[str, Format]]
) -> str:
    """The function's C text; ``formats`` maps each operand storage (a parameter prefix)
    to its tensor and format."""
    by_role = {p.role: c_name(p.name) for p in params}
    counts = group_counts(params)
    lines = [
        "#include <math.h>",
        "#include <stdio.h>",
        prototype(name, params) + " {",
        *[f"  (void){c_name(p.name)};" for p in params if p.role[0] == "vals"],
    ]
    for p in params:
        if p.role[0] == "extent":
            var = p.role[1]
            lines += _fail_if(
                f"{c_name(p.name)} < 0",
                "UCF_ERR_DIM",
                f"extent of index variable {var} is %lld",
                [c_name(p.name)],
                depth=1,
            )
    for slot, (tensor, fmt) in formats.items():
        for a in accesses(stmt.rhs):
            if a.tensor != tensor:
                continue
            for m, idx in enumerate(a.indices):
                var = idx.single_variable
                if var is None or ("extent", var) not in by_role:
                    continue
                dim, ext = by_role[("dim", slot, m)], by_role[("extent", var)]
                lines += _fail_if(
                    f"{dim} != {ext}",
                    "UCF_ERR_DIM",
                    f"operand {tensor}: mode {m} has size %lld but index variable {var} "
                    "has extent %lld",
                    [dim, ext],
                    depth=1,
                )
        if not fmt.is_dense or slot in counts:  # dense storage has no arrays to check
            lines += _levels(slot, tensor, fmt, by_role, counts.get(slot))
    lines += ["  return UCF_OK;", "}", ""]
    return "\n".join(lines)


def _levels(slot: str, tensor: str, fmt: Format, by_role: dict, groups: str | None) -> list[str]:
    """Walk the levels outer to inner, with ``parents`` the positions of the level above;
    check the scales of a quantized operand (``groups`` entries) at its scale level."""
    lines = ["  {", "    int64_t parents = 1;"]
    scale_level = fmt.values.level if groups is not None else None
    if groups is not None and scale_level is None:
        lines += _scales(slot, tensor, fmt, by_role, groups)
    run: list[tuple[int, str]] = []  # (level, crd) of a non-unique level and its singletons
    run_pos, run_parents = "", ""
    for lvl, (kind, m) in enumerate(zip(fmt.levels, fmt.maps, strict=True)):
        where = f"operand {tensor}: level {lvl}"
        dim = f"{slot}_d{lvl}"
        size = by_role[("dim", slot, m.mode)]
        if m.mod:
            size = str(m.mod)
        elif m.div != 1:
            size = f"({size} + {m.div - 1}) / {m.div}"
        lines.append(f"    const int64_t {dim} = {size};")
        if kind.full:
            lines.append(f"    parents *= {dim};")
        elif kind.segment_array is not None:  # segments of coordinates (pos, crd)
            pos = by_role[(kind.segment_array, slot, lvl)]
            crd = by_role[(kind.coordinate_array, slot, lvl)]
            unique = fmt.unique(lvl)
            lines += _compressed(where, pos, crd, dim, kind.ordered, unique)
            if not unique:
                run, run_pos, run_parents = [(lvl, crd)], pos, f"{slot}_p{lvl}"
                lines.append(f"    const int64_t {run_parents} = parents;")
            lines.append(f"    parents = (int64_t){pos}[parents];")
        elif kind.segment_width:
            w = kind.segment_width
            crd = by_role[(kind.coordinate_array, slot, lvl)]
            lines += _fixed(where, crd, dim, w, kind.ordered)
            lines.append(f"    parents *= {w};")
        elif kind.branchless:
            crd = by_role[(kind.coordinate_array, slot, lvl)]
            lines += [
                "    for (int64_t q = 0; q < parents; q++) {",
                *_in_range(where, crd, dim, depth=3),
                "    }",
            ]
            run.append((lvl, crd))
            if kind.ordered and fmt.run_end(run[0][0]) == lvl + 1:
                lines += _run(tensor, run, run_pos, run_parents, fmt.unique(lvl))
        else:
            raise UcfError(
                f"operand {tensor}: a {kind.name} level has no C check yet; export without "
                "it is not possible"
            )
        if lvl == scale_level:
            lines += _scales(slot, tensor, fmt, by_role, groups)
    return [*lines, "    (void)parents;", "  }"]


def _scales(slot: str, tensor: str, fmt: Format, by_role: dict, groups: str) -> list[str]:
    """A quantized operand's scale arrays: as many entries as scale groups (``parents``,
    the positions of the scale level, or one per tensor), each scale positive and
    finite, each zero point in the range of its kind."""
    values = fmt.values
    per = "the tensor" if values.level is None else f"each position of level {values.level}"
    expected = "1" if values.level is None else "parents"
    scale, zero = by_role[("scale", slot)], by_role[("zero", slot)]
    where = f"operand {tensor}"
    lines = _fail_if(
        f"{groups} != {expected}",
        "UCF_ERR_SCALE",
        f"{where}: {groups} is %lld, but the format has %lld scale group(s), one for {per}",
        [groups, expected],
    )
    lines += [
        f"    for (int64_t g = 0; g < {groups}; g++) {{",
        *_fail_if(
            f"!({scale}[g] > 0.0f) || !isfinite({scale}[g])",
            "UCF_ERR_SCALE",
            f"{where}: scale %lld is %g, not positive and finite",
            ["g"],
            depth=3,
            doubles=(f"{scale}[g]",),
        ),
        *_fail_if(
            f"{zero}[g] < {values.kind.lo} || {zero}[g] > {values.kind.hi}",
            "UCF_ERR_SCALE",
            f"{where}: zero point %lld is %lld, outside the {values.name} range "
            f"{values.kind.lo}..{values.kind.hi}",
            ["g", f"{zero}[g]"],
            depth=3,
        ),
        "    }",
    ]
    return lines


def _compressed(where: str, pos: str, crd: str, dim: str, ordered: bool, unique: bool):
    lines = _fail_if(
        f"{pos}[0] != 0", "UCF_ERR_POS", f"{where}: pos[0] is %lld, not 0", [f"{pos}[0]"]
    )
    lines += [
        "    for (int64_t p = 0; p < parents; p++) {",
        *_fail_if(
            f"{pos}[p + 1] < {pos}[p]",
            "UCF_ERR_POS",
            f"{where}: pos decreases at %lld (%lld after %lld)",
            ["p + 1", f"{pos}[p + 1]", f"{pos}[p]"],
            depth=3,
        ),
        f"      for (int64_t q = {pos}[p]; q < {pos}[p + 1]; q++) {{",
        *_in_range(where, crd, dim, depth=4),
    ]
    if ordered:
        prev = f"q > {pos}[p] && "
        if unique:
            lines += _fail_if(
                f"{prev}{crd}[q] == {crd}[q - 1]",
                "UCF_ERR_CRD_DUPLICATE",
                f"{where}: coordinate %lld repeats at position %lld in the segment of parent %lld",
                [f"{crd}[q]", "q", "p"],
                depth=4,
            )
        lines += _fail_if(
            f"{prev}{crd}[q] < {crd}[q - 1]",
            "UCF_ERR_CRD_ORDER",
            f"{where}: crd not sorted in the segment of parent %lld: %lld after %lld at "
            "position %lld",
            ["p", f"{crd}[q]", f"{crd}[q - 1]", "q"],
            depth=4,
        )
    elif unique:  # no order to compare neighbours by: each entry against the earlier ones,
        # quadratic in a segment's length but needing no scratch memory in the check
        lines += [
            f"        for (int64_t r = {pos}[p]; r < q; r++) {{",
            *_fail_if(
                f"{crd}[r] == {crd}[q]",
                "UCF_ERR_CRD_DUPLICATE",
                f"{where}: coordinate %lld repeats at position %lld in the segment of parent %lld",
                [f"{crd}[q]", "q", "p"],
                depth=5,
            ),
            "        }",
        ]
    return [*lines, "      }", "    }"]


def _fixed(where: str, crd: str, dim: str, w: int, ordered: bool) -> list[str]:
    """Each parent's ``w`` coordinates: in range, and increasing when the level is ordered
    (a fixed-width level is unique)."""
    lines = [f"    for (int64_t q = 0; q < parents * {w}; q++) {{", *_in_range(where, crd, dim, 3)]
    if ordered:
        lines += _fail_if(
            f"q % {w} != 0 && {crd}[q] <= {crd}[q - 1]",
            "UCF_ERR_CRD_ORDER",
            f"{where}: crd not increasing in the segment of parent %lld: %lld after %lld at "
            "position %lld",
            [f"q / {w}", f"{crd}[q]", f"{crd}[q - 1]", "q"],
            depth=3,
        )
    return [*lines, "    }"]


def _in_range(where: str, crd: str, dim: str, depth: int) -> list[str]:
    """Fail unless coordinate ``crd[q]`` lies in [0, dim)."""
    return _fail_if(
        f"{crd}[q] < 0 || {crd}[q] >= {dim}",
        "UCF_ERR_CRD_RANGE",
        f"{where}: crd[%lld] = %lld is outside [0, %lld)",
        ["q", f"{crd}[q]", dim],
        depth=depth,
    )


def _run(tensor: str, run: list[tuple[int, str]], pos: str, parents: str, unique: bool):
    """A non-unique compressed level and the singletons below it (COO) share positions:
    within each segment of the compressed level, the coordinate tuples must increase."""
    levels = f"levels {run[0][0]}-{run[-1][0]}"
    compare = [
        f"        if (c == 0) c = ({crd}[q] > {crd}[q - 1]) - ({crd}[q] < {crd}[q - 1]);"
        for _, crd in run
    ]
    lines = [
        f"    for (int64_t p = 0; p < {parents}; p++) {{",
        f"      for (int64_t q = {pos}[p] + 1; q < {pos}[p + 1]; q++) {{",
        "        int c = 0;",
        *compare,
        *_fail_if(
            "c < 0",
            "UCF_ERR_CRD_ORDER",
            f"operand {tensor}: {levels}: coordinates not sorted at position %lld",
            ["q"],
            depth=4,
        ),
    ]
    if unique:
        lines += _fail_if(
            "c == 0",
            "UCF_ERR_CRD_DUPLICATE",
            f"operand {tensor}: {levels}: coordinates repeat at position %lld",
            ["q"],
            depth=4,
        )
    return [*lines, "      }", "    }"]


def _fail_if(
    cond: str,
    code: str,
    text: str,
    values: list[str],
    depth: int = 2,
    doubles: tuple[str, ...] = (),
) -> list[str]:
    """Return ``code`` with the message ``text`` (``%lld`` for ``values``, then ``%g`` for
    ``doubles``) when ``cond`` holds."""
    pad = "  " * depth
    args = "".join(f", (long long)({v})" for v in values)
    args += "".join(f", (double)({v})" for v in doubles)
    return [
        f"{pad}if ({cond}) {{",
        f'{pad}  if (msg != NULL && msg_size > 0) snprintf(msg, msg_size, "{text}"{args});',
        f"{pad}  return {code};",
        f"{pad}}}",
    ]
