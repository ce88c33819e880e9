"""The package's version, importable by any layer without importing the package."""

__version__ = "0.1.0"
