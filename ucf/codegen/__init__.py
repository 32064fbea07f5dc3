"""Code generators: one module per target, each printing the lowered IR."""
