"""Calling compiled kernels: binding operands to parameters, extents, blocked and
padded calls, recycled outputs, replayed calls, static operands, and the kernel
classes."""
