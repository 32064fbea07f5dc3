"""What one request to ``ucf serve`` may cost, and the checks that hold it to that.

Every field of a request is bounded before the worker sees it, so an oversize
statement, schedule, operand or upload is refused with a message that names the
limit rather than eating the machine. Time is bounded by the worker
(``ucf.serve.worker``), which is killed when a job passes its limit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ucf.codegen import TARGETS
from ucf.errors import UcfError

DTYPES = ("float64", "float32", "int64", "int32")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}\Z")


class LimitError(UcfError):
    """A request beyond what the server takes (``ucf serve``'s limits)."""


@dataclass(frozen=True)
class Limits:
    statement: int = 1000  # characters
    schedule: int = 4000  # characters
    format: int = 200  # characters per tensor's format
    tensors: int = 16  # formats given
    extent: int = 20_000  # the largest extent of a random or uploaded operand
    elements: int = 4_000_000  # elements of an operand or output (they are checked densely)
    upload: int = 8 * 2**20  # bytes of an uploaded Matrix Market file
    body: int = 10 * 2**20  # bytes of a request
    example: int = 400  # elements of an operand's example in the fibertree view
    compile_seconds: float = 20.0
    run_seconds: float = 30.0


def kernel_fields(data: Any, limits: Limits) -> dict[str, Any]:
    """The statement, formats, schedule, target and dtype of a request, checked."""
    if not isinstance(data, dict):
        raise LimitError("the request is not a JSON object")
    stmt = _text(data, "statement", limits.statement, required=True)
    schedule = _text(data, "schedule", limits.schedule)
    formats = data.get("formats") or {}
    if not isinstance(formats, dict) or len(formats) > limits.tensors:
        raise LimitError(f"formats: at most {limits.tensors} tensors, each named once")
    for name, fmt in formats.items():
        if not NAME.match(str(name)) or not isinstance(fmt, str) or len(fmt) > limits.format:
            raise LimitError(
                f"format of {str(name)[:40]!r}: a tensor name and a format of at most "
                f"{limits.format} characters"
            )
    target = data.get("target") or "llvm"
    if target not in TARGETS:
        raise LimitError(f"target: one of {', '.join(TARGETS)}, not {str(target)[:20]!r}")
    dtype = data.get("dtype") or None
    if dtype is not None and dtype not in DTYPES:
        raise LimitError(f"dtype: one of {', '.join(DTYPES)}, not {str(dtype)[:20]!r}")
    return {
        "statement": stmt,
        "formats": {k: v.strip() for k, v in formats.items() if v.strip()},
        "schedule": schedule.strip() or None,
        "target": target,
        "dtype": dtype,
    }


def _text(data: dict, key: str, most: int, required: bool = False) -> str:
    value = data.get(key) or ""
    if not isinstance(value, str):
        raise LimitError(f"{key}: expected text")
    if len(value) > most:
        raise LimitError(f"the {key} has {len(value)} characters; ucf serve takes at most {most}")
    if required and not value.strip():
        raise LimitError(f"write a {key}")
    return value


def run_fields(data: dict, limits: Limits) -> dict[str, Any]:
    """The size, density, seed and upload of a run request, checked."""
    size = data.get("size", 1000)
    density = data.get("density", 0.01)
    if not isinstance(size, int) or not 1 <= size <= limits.extent:
        raise LimitError(f"size: an extent from 1 to {limits.extent}, got {size!r}")
    if not isinstance(density, (int, float)) or not 0 < density <= 1:
        raise LimitError(f"density: a fraction in (0, 1], got {density!r}")
    upload = data.get("upload") or None
    if upload is not None:
        if not isinstance(upload, dict) or not NAME.match(str(upload.get("tensor", ""))):
            raise LimitError("upload: {tensor: NAME, text: Matrix Market text}")
        text = upload.get("text")
        if not isinstance(text, str) or len(text.encode()) > limits.upload:
            raise LimitError(
                f"the uploaded file is larger than {limits.upload // 2**20} MB, ucf serve's limit"
            )
    return {"size": size, "density": float(density), "upload": upload}


def check_operand(name: str, shape: tuple[int, ...], limits: Limits) -> None:
    """Refuse an operand (or output) beyond the extent and element limits, naming it."""
    shown = "x".join(map(str, shape)) or "a scalar"
    if shape and max(shape) > limits.extent:
        raise LimitError(f"{name} would be {shown}; ucf serve takes extents up to {limits.extent}")
    if math.prod(shape) > limits.elements:
        raise LimitError(
            f"{name} would have {math.prod(shape):,} elements ({shown}); ucf serve takes at "
            f"most {limits.elements:,} per tensor (lower the size)"
        )
