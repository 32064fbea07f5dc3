"""Lowering CIN to LLIR: level iterators, merge lattices, output assembly."""
