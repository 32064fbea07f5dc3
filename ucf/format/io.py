"""Reading and writing tensors in the common interchange formats.

The suffix picks the container: ``.mtx`` (Matrix Market), ``.tns`` (FROSTT),
``.npy`` (dense numpy) and ``.npz`` (scipy.sparse).  ``.mtx`` and ``.tns``
may carry an extra ``.gz``.  Every failure surfaces as a :class:`UcfError`
naming the path, so the CLI can report it in one line.
"""

from __future__ import annotations

import gzip
import os
import warnings
from pathlib import Path
from typing import IO, Any

import numpy as np

from ucf.errors import FormatError, OperandError, ShapeError, UcfError, boundary
from ucf.format.construction import from_coo, from_numpy
from ucf.format.interop import as_tensor
from ucf.format.scipy_layouts import from_scipy
from ucf.format.tensor import Tensor

SUFFIXES = (".mtx", ".tns", ".npy", ".npz")

_SHAPE_TAG = "# shape:"


def _suffix(path: Path) -> tuple[str, bool]:
    suffixes = [s.lower() for s in path.suffixes]
    gz = bool(suffixes) and suffixes[-1] == ".gz"
    if gz:
        suffixes = suffixes[:-1]
    suffix = suffixes[-1] if suffixes else ""
    if suffix not in SUFFIXES or (gz and suffix not in (".mtx", ".tns")):
        shown = "".join(path.suffixes) or "(none)"
        raise FormatError(
            f"{path}: unknown file type '{shown}'; use one of {', '.join(SUFFIXES)} "
            "(.mtx and .tns may be gzipped)"
        )
    return suffix, gz


def _open(path: Path, mode: str, gz: bool) -> IO[Any]:
    if gz:
        return gzip.open(path, mode + "t" if "b" not in mode else mode)
    return open(path, mode)


@boundary
def read(path: str | os.PathLike[str], format: Any = None) -> Tensor:
    """Load a tensor; ``format`` defaults to csr (.mtx, .npz), csf (.tns) or dense (.npy)."""
    p = Path(path)
    suffix, gz = _suffix(p)
    try:
        if suffix == ".mtx":
            return _read_mtx(p, format)
        if suffix == ".tns":
            return _read_tns(p, format, gz)
        if suffix == ".npy":
            arr = np.load(p, allow_pickle=False)
            return from_numpy(arr, format)
        import scipy.sparse as sp

        return from_scipy(sp.load_npz(p), format)
    except UcfError as e:
        if str(p) in str(e):
            raise
        raise type(e)(f"{p}: {e}") from None
    except (OSError, ValueError, EOFError, KeyError, TypeError) as e:
        raise OperandError(f"{p}: cannot read {suffix} file: {e}") from None


@boundary
def write(path: str | os.PathLike[str], tensor: Any) -> None:
    """Save a tensor (or anything :func:`as_tensor` accepts) in the suffix's container."""
    p = Path(path)
    suffix, gz = _suffix(p)
    try:
        t = tensor if isinstance(tensor, Tensor) else as_tensor(tensor)
        if suffix in (".mtx", ".npz") and t.order != 2:
            raise FormatError(f"{suffix} files hold matrices; this tensor has order {t.order}")
        if suffix == ".mtx":
            import scipy.io

            with _open(p, "wb", gz) as fh:
                scipy.io.mmwrite(fh, t.to_scipy())
        elif suffix == ".tns":
            _write_tns(p, t, gz)
        elif suffix == ".npy":
            np.save(p, t.to_numpy(), allow_pickle=False)
        else:
            import scipy.sparse as sp

            sp.save_npz(p, t.to_scipy())
    except UcfError as e:
        if str(p) in str(e):
            raise
        raise type(e)(f"{p}: {e}") from None
    except (OSError, ValueError, TypeError) as e:
        raise OperandError(f"{p}: cannot write {suffix} file: {e}") from None


# --------------------------------------------------------------------------- Matrix Market


def _read_mtx(p: Path, format: Any) -> Tensor:
    """Symmetric, skew and hermitian files come back expanded by scipy's reader."""
    import scipy.io

    m = scipy.io.mmread(p)
    if isinstance(m, np.ndarray):
        return from_numpy(m, "csr" if format is None else format)
    return from_scipy(m, "csr" if format is None else format)


# --------------------------------------------------------------------------- FROSTT


def _tns_header_shape(p: Path, gz: bool) -> tuple[int, ...] | None:
    """The ``# shape:`` comment this module writes, so trailing empty slices survive."""
    with _open(p, "r", gz) as fh:
        for line in fh:
            s = line.strip()
            if not s:
                continue
            if not s.startswith("#"):
                return None
            if s.lower().startswith(_SHAPE_TAG):
                try:
                    return tuple(int(x) for x in s[len(_SHAPE_TAG) :].split())
                except ValueError:
                    raise FormatError(f"bad shape comment {s!r}") from None
    return None


def _read_tns(p: Path, format: Any, gz: bool) -> Tensor:
    shape = _tns_header_shape(p, gz)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "input contained no data"
            data = np.loadtxt(p, dtype=np.float64, comments="#", ndmin=2)
    except ValueError as e:
        raise FormatError(f"not a FROSTT file (lines of 'i1 ... iN value'): {e}") from None
    if data.size == 0:
        if shape is None:
            raise FormatError("no entries and no '# shape:' comment; cannot infer the shape")
        data = np.zeros((0, len(shape) + 1))
    if data.shape[1] < 2:
        raise FormatError("each line needs at least one coordinate and a value")
    raw = data[:, :-1]
    coords = raw.astype(np.int64)
    if np.any(coords != raw):
        k = int(np.argmax(np.any(coords != raw, axis=1)))
        raise FormatError(f"entry {k}: coordinates must be integers, got {raw[k].tolist()}")
    coords -= 1
    if coords.size and coords.min() < 0:
        k = int(np.argmax(np.any(coords < 0, axis=1)))
        raise FormatError(f"entry {k}: coordinates are 1-based, got {(coords[k] + 1).tolist()}")
    order = coords.shape[1]
    if shape is not None and len(shape) != order:
        raise ShapeError(f"shape comment has {len(shape)} modes but entries have {order}")
    fmt = "csf" if format is None else format
    return from_coo(coords, data[:, -1], shape, fmt, index_dtype=np.int32)


def _write_tns(p: Path, t: Tensor, gz: bool) -> None:
    """Write stored nonzeros only, 1-based, with the shape in a comment other tools skip."""
    coords, vals = t.to_coo()
    keep = vals != 0
    coords, vals = coords[keep] + 1, vals[keep]
    header = _SHAPE_TAG + " " + " ".join(map(str, t.shape))
    n = t.order
    if vals.dtype.kind == "i":
        table = np.column_stack([coords, vals.astype(np.int64)])
        fmt = ["%d"] * (n + 1)
    else:
        table = np.column_stack([coords.astype(np.float64), vals.astype(np.float64)])
        fmt = ["%d"] * n + ["%.17g"]
    with _open(p, "w", gz) as fh:
        fh.write(header + "\n")
        if len(vals):
            np.savetxt(fh, table.reshape(len(vals), n + 1), fmt=fmt, delimiter=" ")
