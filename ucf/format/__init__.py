"""What a tensor is: formats (level kinds, level maps, value descriptions), ucf.Tensor,
held and quantized values, files, and interchange with numpy, scipy, torch and DLPack.

The modules that build tensors are imported here: they register what the
constructors ``Tensor.from_coo``, ``Tensor.from_numpy``, ``Tensor.zeros`` and
``Tensor.from_scipy``, and the conversions ``Tensor.convert``, ``Tensor.to_scipy`` and
``Tensor.to_torch`` call (``ucf.format.tensor.BUILDERS``), which must be in place before
any tensor is.
"""

from ucf.format import construction, scipy_layouts, torch_layouts  # noqa: F401  (they register)
