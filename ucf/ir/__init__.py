"""LLIR: the small typed imperative IR that every code generator reads."""
