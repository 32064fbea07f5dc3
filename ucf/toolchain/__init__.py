"""Turning generated code into something callable: the llvmlite JIT, the C and CUDA
builds, the kernel cache on disk, exported sources, and the trampoline for packed
arguments."""
