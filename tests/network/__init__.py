"""Tests that need the package index (PyPI)."""
