"""Unit tests of infermatrix's `cli` part."""
