"""LLIR-to-LLIR passes after lowering: register blocking, int8 pairs, row groups,
fused multiply-adds, and specialization to static operands (dismantle)."""
