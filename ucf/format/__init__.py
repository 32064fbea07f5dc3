"""Storage formats: level kinds, format strings, tensors and file I/O."""
