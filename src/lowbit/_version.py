"""The package version (one place; ``lowbit.__version__`` and file headers read it)."""

__version__ = "0.1.0"
