"""What the worker process runs for the page: compile and show every stage, draw the
operands' storage, run against numpy/scipy, and package the kernel for download.

Each job takes and returns plain data (the worker pipes it), and raises
``UcfError`` for anything the user can fix; :func:`describe_error` turns that into
the message and caret the page shows in place.
"""

from __future__ import annotations

import io
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ucf.codegen.c import functions
from ucf.errors import FormatError, OperandError, ParseError, ScheduleError, UcfError
from ucf.serve import carets, reference
from ucf.serve.limits import Limits, check_operand

REPEATS = 5
SEED = 20240601
DEFAULT = Limits()


def warm() -> None:
    """Import and exercise the compiler once, so the page's first view is quick."""
    from ucf.api import compile

    compile("y(i) = A(i,j) * x(j)", {"A": "csr"}).cin  # noqa: B018


def describe_error(e: UcfError, request: dict[str, Any]) -> dict[str, Any]:
    """The page's view of an error: its kind, the library's message, and which input
    it points into with a caret under the offending text."""
    message = str(e)
    where, block = None, None
    schedule = request.get("schedule") or ""
    if isinstance(e, ParseError) and e.line:
        where = "statement" if e.text == request.get("statement") else "schedule"
    elif isinstance(e, ScheduleError) and schedule:
        block = carets.schedule_caret(message, schedule)
        where = "schedule" if block else None
    return {"kind": type(e).__name__, "message": message, "where": where, "caret": block}


def _kernel(statement, formats, schedule, target, dtype, emulate=False):
    from ucf.api import compile

    return compile(
        statement, formats, schedule=schedule, target=target, dtype=dtype, emulate=emulate
    )


def compile_views(
    statement: str,
    formats: dict[str, str],
    schedule: str | None,
    target: str,
    dtype: str | None,
    examples: dict[str, str] | None = None,
    limits: Limits = DEFAULT,
) -> dict[str, Any]:
    """The statement's tensors (for the format editors), their fibertrees, and the
    kernel's concrete index notation and code for ``target``."""
    asked = {"statement": statement, "schedule": schedule}
    try:  # an error is what typing gives half the time: an answer, not a failure
        tensors = _tensors(statement, formats)
    except UcfError as e:
        return {"error": describe_error(e, asked)}
    formats = {t["name"]: t["format"] for t in tensors if t["format"]}
    try:
        pictures = _pictures(tensors, examples or {}, limits)
    except UcfError as e:  # an example being edited: the page keeps its pictures
        return {"tensors": tensors, "error": describe_error(e, asked)}
    try:
        k = _kernel(statement, formats, schedule, target, dtype)
    except UcfError as e:
        return {"tensors": tensors, "pictures": pictures, "error": describe_error(e, asked)}
    views = {"cin": k.cin}
    if target == "cuda":
        views["cuda"] = k.source
    else:
        views["c"] = (
            "/* The kernel's functions; the download holds the whole file, which starts\n"
            " * with the runtime helpers (ucf_runtime.h). */\n" + functions(k.llir)
        )
        if target == "llvm":
            views["llvm"] = k.source
    return {"tensors": tensors, "pictures": pictures, "views": views, "kernel": repr(k)}


def assembly(statement, formats, schedule, target, dtype) -> dict[str, str]:
    """The host machine code (the JIT's, or the C compiler's), asked for separately:
    it costs a full compile."""
    return {"asm": _kernel(statement, formats, schedule, target, dtype).asm}


def _tensors(statement: str, formats: dict[str, str]) -> list[dict[str, Any]]:
    """Each tensor of the statement, output first: its order and how its format
    (given, or dense) reads, level by level."""
    from ucf.format.format import parse_format
    from ucf.lang.ast import accesses
    from ucf.lang.parser import parse_statement

    stmt = parse_statement(statement)
    found = {stmt.lhs.tensor: len(stmt.lhs.indices)}
    for a in accesses(stmt.rhs):
        found.setdefault(a.tensor, len(a.indices))
    result = []
    for name, order in found.items():
        given = formats.get(name, "")
        try:  # a bad format is reported by the compile; its tensor still gets its row
            fmt = parse_format(given or "dense", order=order, tensor=name)
        except FormatError:
            fmt = None
        result.append(
            {
                "name": name,
                "order": order,
                "output": name == stmt.lhs.tensor,
                "format": given,
                "levels": [
                    {"kind": k.spelling, "stores": str(m)}
                    for k, m in zip(fmt.levels, fmt.maps, strict=True)
                ]
                if fmt
                else [],
                "values": fmt.values.name if fmt and fmt.values else "",
                "valid": fmt is not None,
            }
        )
    return result


def example(order: int, seed: int) -> np.ndarray:
    """A small sparse example of ``order``: what the pictures show until edited."""
    shape = {0: (), 1: (8,), 2: (4, 6), 3: (3, 3, 4)}.get(order, (2,) * order)
    rng = np.random.default_rng(seed)
    values = np.round(rng.random(shape) * 9 + 1)
    return np.where(rng.random(shape) < 0.35, values, 0.0)


def example_text(a: np.ndarray) -> str:
    """An example as the page edits it: rows of numbers, slices apart by a blank line."""
    if a.ndim <= 1:
        return " ".join(f"{v:g}" for v in np.atleast_1d(a))
    if a.ndim == 2:
        return "\n".join(example_text(row) for row in a)
    return "\n\n".join(example_text(s) for s in a)


def parse_example(text: str, order: int, name: str, limits: Limits) -> np.ndarray:
    """The page's example text back into an array of ``order``."""
    if len(text) > limits.example * 24:
        raise OperandError(f"the example of {name} is longer than the page takes")
    try:
        slices = [
            [[float(v) for v in line.replace(",", " ").split()] for line in block.splitlines()]
            for block in text.strip().split("\n\n")
        ]
        a = np.array(slices if order == 3 else slices[0], dtype=np.float64)
    except ValueError:
        raise OperandError(
            f"the example of {name} must be rows of numbers of one length each"
            + (", its slices apart by a blank line" if order == 3 else "")
        ) from None
    if order == 1:
        a = a.reshape(-1)
    if a.ndim != order or a.size > limits.example:
        raise OperandError(
            f"the example of {name} must have order {order} and at most {limits.example} "
            f"elements, not shape {a.shape}"
        )
    return a


def _pictures(tensors: list[dict], examples: dict[str, str], limits: Limits) -> dict:
    """Each tensor's fibertree in its format, on its example."""
    from ucf.format.construction import from_numpy
    from ucf.format.fibertree import svg

    pictures = {}
    for k, t in enumerate(tensors):
        if t["order"] == 0 or not t["valid"]:
            continue
        given = examples.get(t["name"])
        a = parse_example(given, t["order"], t["name"], limits) if given else example(t["order"], k)
        fmt = t["format"] or "dense"
        pictures[t["name"]] = {
            "svg": svg(from_numpy(a, fmt), t["name"]),
            "example": example_text(a),
        }
    return pictures


# --------------------------------------------------------------------------- runs


def _operands(stmt, formats, size, density, upload, limits):
    """Random operands (seeded) of ``size`` per index, the sparse ones at ``density``,
    with an uploaded Matrix Market matrix in place of its operand."""
    import scipy.io
    import scipy.sparse as sp

    from ucf.format.format import parse_format
    from ucf.lang.ast import accesses

    rng = np.random.default_rng(SEED)
    found = {}
    for a in accesses(stmt.rhs):
        found.setdefault(a.tensor, a)
    extents: dict[str, int] = {}
    dense, sparse = {}, {}
    if upload is not None:
        name = upload["tensor"]
        if name not in found:
            raise OperandError(
                f"the uploaded file is for {name}, which the statement does not read"
            )
        try:
            m = scipy.io.mmread(io.BytesIO(upload["text"].encode()))
        except Exception as e:  # scipy's reader raises many kinds on a bad file
            raise OperandError(f"the uploaded file is not Matrix Market: {e}") from None
        m = sp.csr_array(m) if sp.issparse(m) else np.asarray(m)
        if len(found[name].indices) != m.ndim:
            raise OperandError(
                f"{name} has {len(found[name].indices)} indices; the file is a matrix"
            )
        check_operand(name, m.shape, limits)
        for i, n in zip(found[name].indices, m.shape, strict=True):
            if i.single_variable:
                extents[i.single_variable] = n
        if sp.issparse(m):
            sparse[name], dense[name] = m, m.toarray()
        else:
            dense[name] = m
    for name, access in found.items():
        if name in dense:
            continue
        shape = tuple(extents.get(i.single_variable or "", size) for i in access.indices)
        check_operand(name, shape, limits)
        fmt = parse_format(formats.get(name) or "dense", order=len(shape), tensor=name)
        values = rng.random(shape)
        if fmt.is_dense:
            dense[name] = values
            continue
        dense[name] = np.where(rng.random(shape) < density, values, 0.0)
        if len(shape) == 2:
            sparse[name] = sp.csr_array(dense[name])
    return dense, sparse


def run(
    statement: str,
    formats: dict[str, str],
    schedule: str | None,
    target: str,
    dtype: str | None,
    size: int,
    density: float,
    upload: dict | None = None,
    limits: Limits = DEFAULT,
) -> dict[str, Any]:
    """Run the kernel on random (or uploaded) operands; check it against numpy and
    time it against scipy (or numpy), best of several runs as ``ucf demo`` does."""
    from ucf.demo import best_ms
    from ucf.format.construction import from_numpy
    from ucf.format.format import parse_format
    from ucf.lang.parser import parse_statement

    stmt = parse_statement(statement)
    dense, sparse = _operands(stmt, formats, size, density, upload, limits)
    k = _kernel(statement, formats, schedule, target, dtype, emulate=target == "cuda")
    operands = {
        n: from_numpy(a, parse_format(formats.get(n) or "dense", order=a.ndim).structure)
        for n, a in dense.items()
    }
    start = time.perf_counter()
    result = k(**operands)
    first_ms = (time.perf_counter() - start) * 1e3
    check_operand(stmt.lhs.tensor, result.shape, limits)
    ucf_ms = best_ms(lambda: k(**operands), REPEATS)
    got = result.to_numpy()
    report = {
        "shape": list(result.shape),
        "nnz": int(result.nnz),
        "ucf_ms": ucf_ms,
        "first_ms": first_ms,
        "target": target + (" (CUDA on the CPU emulator)" if target == "cuda" else ""),
        "correct": None,
    }
    if not reference.plain(stmt):
        report["reference"] = "none: numpy has no reading of affine indices"
        return report
    want = reference.dense(stmt, dense)
    form = reference.scipy_form(stmt, sparse, dense)
    if form is not None:
        fn, described = form
    else:
        fn, described = (lambda: reference.dense(stmt, dense)), "numpy on dense copies"
    scale = max(float(np.abs(want).max()) if want.size else 0.0, 1.0)
    error = float(np.abs(got - want).max()) if want.size else 0.0
    tolerance = 1e-4 if k.dtype == np.float32 else 1e-9
    report.update(
        correct=bool(np.allclose(got, want, rtol=tolerance, atol=tolerance * scale)),
        max_error=error,
        reference=described,
        reference_ms=best_ms(fn, REPEATS),
    )
    return report


# --------------------------------------------------------------------------- download


def download(statement, formats, schedule, target, dtype, name: str) -> dict[str, Any]:
    """The kernel as the embedding examples take it: ``name.c``, ``name.h`` and
    ``ucf.h`` (``name.cu`` and the CUDA runtime headers for target cuda), zipped.
    Written in a fresh temporary directory, never at a path a request names."""
    k = _kernel(statement, formats, schedule, target, dtype)
    buffer = io.BytesIO()
    with tempfile.TemporaryDirectory(prefix="ucf-serve-") as tmp:
        k.save(Path(tmp) / name, name=name)
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
            for path in sorted(Path(tmp).iterdir()):
                z.write(path, f"{name}/{path.name}")
    return {"filename": f"{name}.zip", "data": buffer.getvalue()}
