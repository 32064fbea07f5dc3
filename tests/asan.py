"""Saved C kernels built and run under AddressSanitizer with exactly-sized buffers: the
drivers the ASan tests share (``asan_cc``, the compiler probe, is a fixture in
``tests/conftest.py``)."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

import ucf
from tests.helpers import CC
from ucf.codegen import c as cgen
from ucf.exec.outputs import trimmed

# ASan builds at -O0: every load and store the source makes is instrumented (-O1 may keep
# a value in a register and check fewer), and gcc's -O1 with ASan spends 8 s on one
# register-tiled kernel (bcsr(8,8) SpMM: 8.3 s against 0.3 s at -O0), which made the ASan
# families a tenth of the default suite's CPU time.
ASAN_FLAGS = ["-fsanitize=address", "-fno-omit-frame-pointer", "-g", "-O0"]

CTYPE = {"i32": "int32_t", "i64": "int64_t", "f64": "double", "f32": "float"}
CTYPE |= {"i8": "int8_t", "u8": "uint8_t", "f16": "_Float16"}
NPTYPE = {"i32": np.int32, "i64": np.int64, "f64": np.float64, "f32": np.float32}
NPTYPE |= {"i8": np.int8, "u8": np.uint8, "f16": np.float16}


def driver_under_asan(tmp_path, functions, driver: str) -> list[str]:
    """The first two lines the C ``driver`` prints, run with ``functions`` under ASan."""
    if CC is None:
        pytest.skip("needs a C compiler")
    src, exe = tmp_path / "kernel.c", tmp_path / "kernel"
    src.write_text(cgen.source(functions) + driver)
    build = subprocess.run(
        [CC, *ASAN_FLAGS, str(src), "-lm", "-o", str(exe)],
        capture_output=True,
        text=True,
    )
    if build.returncode != 0:
        pytest.skip(f"cc lacks AddressSanitizer support: {build.stderr.strip()[:200]}")
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return run.stdout.split("\n")[:2]


def _operand_array(t: ucf.Tensor, role: tuple) -> np.ndarray:
    """The array of operand ``t`` a kernel parameter with ``role`` takes."""
    if role[0] == "vals":
        return t.vals
    if role[0] == "scale":
        return t.scales.scale
    if role[0] == "zero":
        return t.scales.zero_point
    return t.levels[role[2]][role[0]]


def _c_literal(v, ty: str) -> str:
    if ty.startswith("f"):
        return repr(float(v))
    return f"INT64_C({int(v)})" if ty == "i64" else str(int(v))


def _array(name: str, ty: str, data: np.ndarray, out: list[str]) -> None:
    """Declare ``name`` as a malloc'ed copy of ``data`` with exactly len(data) elements."""
    ct = CTYPE[ty]
    n = len(data)
    out.append(f"  {ct} *{name} = ({ct} *)malloc({n} * sizeof({ct}));")
    if n:
        items = ", ".join(_c_literal(x, ty) for x in data)
        out.append(f"  static const {ct} {name}_init[{n}] = {{{items}}};")
        out.append(f"  memcpy({name}, {name}_init, sizeof({name}_init));")


def run_under_asan(
    asan_cc, tmp_path, kernel, out_format, out_shape, extents, operands, threads: int = 1
):
    """Run a saved kernel under ASan; return the output as a ucf.Tensor.

    ``operands`` must already be in the kernel's formats and dtypes (so no
    repacking happens and the parameters name the operands themselves). With
    ``threads`` above 1 the kernel is built with OpenMP and runs on that many.
    """
    prefix = tmp_path / "kern"
    csrc, header = kernel.save(prefix, name="kernel")
    fns = {f.name: f for f in kernel.llir}
    compute = fns["kernel"]
    outname = kernel.statement.lhs.tensor
    fmt = ucf.parse_format(out_format, order=len(out_shape))
    assert "S" not in fmt.letters, "the driver allocates compressed/dense output levels only"
    body: list[str] = []
    declared: set[str] = set()

    def args_for(fn) -> list[str]:
        args = []
        for p in fn.params:
            role = p.role
            if role[0] == "extent":
                args.append(f"INT64_C({extents[role[1]]})")
            elif role[0] == "counts":
                args.append(p.name)
            elif role[0] == "dim":
                shape = out_shape if role[1] == outname else operands[role[1]].shape
                args.append(f"INT64_C({shape[role[2]]})")
            elif role[1] == outname:
                args.append(p.name)
            else:
                t = operands[role[1]]
                if p.name not in declared:
                    arr = _operand_array(t, role)
                    assert arr.dtype == NPTYPE[p.type], (p.name, arr.dtype, p.type)
                    _array(p.name, p.type, arr, body)
                    declared.add(p.name)
                args.append(p.name)
        return args

    compute_args = args_for(compute)
    out_params = [p for p in compute.params if p.is_array and p.output and p.role[1] == outname]
    by_role = {(p.role[0], p.role[2] if len(p.role) > 2 else None): p for p in out_params}
    sizes: dict[str, str] = {}
    if "kernel_assemble" in fns:
        asm = fns["kernel_assemble"]
        asm_args = args_for(asm)
        # A compressed level below only dense ones is counted per segment into its
        # pos array by the assemble pass, which leaves positions (see the header).
        local = {p.role[2] for p in asm.params if p.role[0] == "pos" and p.role[1] == outname}
        body.append(f"  int64_t *{outname}_counts = calloc({fmt.order}, sizeof(int64_t));")
        parent = "INT64_C(1)"
        for lvl, kind in enumerate(fmt.levels):
            dim = out_shape[fmt.mode_order[lvl]]
            if kind.full:
                parent = f"({parent} * INT64_C({dim}))"
            elif lvl in local:
                _garbage(by_role[("pos", lvl)], f"{parent} + 1", body, sizes)
        body.append(f"  kernel_assemble({', '.join(asm_args)});")
        parent = "INT64_C(1)"
        for lvl, kind in enumerate(fmt.levels):
            dim = out_shape[fmt.mode_order[lvl]]
            if kind.full:
                parent = f"({parent} * INT64_C({dim}))"
                continue
            pos, crd = by_role[("pos", lvl)], by_role[("crd", lvl)]
            if lvl not in local:
                _garbage(pos, f"{parent} + 1", body, sizes)
            _garbage(crd, f"{outname}_counts[{lvl}]", body, sizes)
            parent = f"{crd.name}_n"
        vals = by_role[("vals", None)]
        body.append(f"  int64_t {vals.name}_n = {parent};")
    else:
        assert fmt.is_dense
        vals = by_role[("vals", None)]
        n = int(np.prod(out_shape, dtype=np.int64)) if out_shape else 1
        body.append(f"  int64_t {vals.name}_n = {n};")
    ct = CTYPE[vals.type]
    body.append(f"  {ct} *{vals.name} = calloc({vals.name}_n, sizeof({ct}));")
    if kernel._plan.writes_all:
        # its comment says it writes every element: as an embedding program may, leave
        # garbage there (0x7f bytes read as a large float or integer) for it to clear
        body.append(f"  memset({vals.name}, 0x7f, {vals.name}_n * sizeof({ct}));")
    sizes[vals.name] = f"{vals.name}_n"
    body.append(f"  kernel({', '.join(compute_args)});")
    for p in out_params:
        fmt_spec = '"%.17g\\n", (double)' if p.type.startswith("f") else '"%lld\\n", (long long)'
        body.append(f'  printf("%s %lld\\n", "{p.name}", (long long){sizes[p.name]});')
        body.append(
            f"  for (int64_t q = 0; q < {sizes[p.name]}; q++) printf({fmt_spec}{p.name}[q]);"
        )
    body.append("  return 0;")
    driver = tmp_path / "driver.c"
    driver.write_text(
        "#include <stdint.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n"
        f'#include "{header.name}"\n\nint main(void) {{\n' + "\n".join(body) + "\n}\n"
    )
    exe = tmp_path / "driver"
    proc = subprocess.run(
        [
            asan_cc,
            "-std=c99",
            *ASAN_FLAGS,
            f"-I{tmp_path}",
            str(driver),
            str(csrc),
            "-lm",
            *(["-fopenmp"] if threads > 1 else []),
            "-o",
            str(exe),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    run = subprocess.run(
        [str(exe)],
        capture_output=True,
        text=True,
        env={"ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0", "OMP_NUM_THREADS": str(threads)},
    )
    assert run.returncode == 0, run.stderr
    assert "AddressSanitizer" not in run.stderr, run.stderr
    # parse "name count" headers followed by count numbers
    tokens = run.stdout.split()
    arrays = {}
    t = 0
    while t < len(tokens):
        name, n = tokens[t], int(tokens[t + 1])
        arrays[name] = tokens[t + 2 : t + 2 + n]
        t += 2 + n
    levels = []
    for lvl in range(fmt.order):
        lv = {}
        for what in ("pos", "crd"):
            p = by_role.get((what, lvl))
            if p is not None:
                lv[what] = np.array([int(x) for x in arrays[p.name]], dtype=NPTYPE[p.type])
        levels.append(lv)
    vals_arr = np.array([float(x) for x in arrays[vals.name]]).astype(NPTYPE[vals.type])
    idt = kernel.index_dtype
    result = ucf.Tensor(tuple(out_shape), fmt, levels, vals_arr, index_dtype=idt, check=False)
    return trimmed(result) if not fmt.is_dense else result


def _garbage(p, n: str, body: list[str], sizes: dict[str, str]) -> None:
    """An output index array of ``n`` entries filled with garbage: the kernel must
    initialize what it reads, as an embedding C program need not zero them."""
    ct = CTYPE[p.type]
    body.append(f"  int64_t {p.name}_n = {n};")
    body.append(f"  {ct} *{p.name} = malloc(({p.name}_n + 1) * sizeof({ct}));")
    body.append(f"  memset({p.name}, 0x5a, ({p.name}_n + 1) * sizeof({ct}));")
    sizes[p.name] = f"{p.name}_n"
