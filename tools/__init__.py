"""Tools for working on this repository (not installed with the package)."""
