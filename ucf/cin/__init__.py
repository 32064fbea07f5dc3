"""Concrete index notation: loop order, conversions, and how they were chosen."""
