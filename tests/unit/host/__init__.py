"""Unit tests of infermatrix's `host` part."""
