"""Code generators: one module per target, each printing the lowered IR."""

#: The targets a kernel can be built for (here, not in a generator's module, so that the
#: command line can list them without importing a compiler).
TARGETS = ("llvm", "c", "cuda")
