"""What a tensor is: formats (level kinds, level maps, value descriptions), ucf.Tensor,
held and quantized values, files, and interchange with numpy, scipy, torch and DLPack.

The interchange modules are imported here: they register the conversions
``Tensor.to_scipy``, ``Tensor.from_scipy`` and ``Tensor.to_torch`` call
(``ucf.format.tensor.INTERCHANGE``), which must be in place before any tensor is.
"""

from ucf.format import scipy_layouts, torch_layouts  # noqa: F401  (they register)
