"""The library version (one place; the package face, the cache keys and the CLI read it)."""

__version__ = "0.2.5"
