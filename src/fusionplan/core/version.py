"""The package's version, importable by any layer without importing the package."""

__version__ = "0.1.0"


def triton_version() -> str:
    """The installed Triton's version, or 'none' (the CPU solvers run without it)."""
    try:
        import triton
    except Exception:  # not installed, or an install that does not import: the CPU solvers only
        return "none"
    return triton.__version__
