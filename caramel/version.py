"""The version of caramel (one place, read by the package, the command line, caches and results)."""

__version__ = "0.1.0"
