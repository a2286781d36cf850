"""The package's version, in a leaf of its own so that a module can record it (a run's
fingerprint) without importing the package's exports."""

__all__ = ["__version__"]

__version__ = "0.1.0"
