"""The Einsum language: parsing, AST and affine index forms."""
