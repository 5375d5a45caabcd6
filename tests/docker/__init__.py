"""Tests against the real Docker engine, registry and engine servers."""
