"""The version, in one place: pyproject.toml reads it, and so does the cache key."""

__version__ = "0.1.0"
