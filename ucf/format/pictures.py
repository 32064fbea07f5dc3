"""``ucf.show``: a fibertree picture of anything a kernel takes. Apart from
``fibertree`` (the drawing, which Tensor's own ``_repr_svg_`` uses) because it first
turns the operand into a Tensor (``interop``), which sits above Tensor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ucf.errors import OperandError, boundary
from ucf.format.fibertree import png, svg
from ucf.format.interop import as_tensor


@boundary
def show(tensor: Any, path: str | Path | None = None, *, format: Any = None, name: str = "T"):
    """Draw ``tensor``'s fibertree: return the SVG text, or write ``path`` (``.svg`` or
    ``.png``) and return it. ``tensor`` is anything a kernel takes (a ucf.Tensor, a
    numpy array, a scipy or torch sparse matrix); ``format`` stores it another way
    first, so ``ucf.show(a, format="bcsr(2,2)")`` pictures BCSR on your own data."""
    t = as_tensor(tensor, format=format, name=name)
    if path is None:
        return svg(t, name)
    path = Path(path)
    if path.suffix.lower() == ".png":
        return png(t, path, name)
    if path.suffix.lower() != ".svg":
        raise OperandError(f"ucf.show writes .svg or .png files, not '{path.name}'")
    path.write_text(svg(t, name))
    return path
