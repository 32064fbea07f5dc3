"""Executing kernels: compilers (llvmlite JIT, cc), the disk cache, binding."""
