"""The package version (one place; the package and its release metadata read it)."""

__version__ = "0.4.0"
