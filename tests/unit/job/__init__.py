"""Unit tests of infermatrix's `job` part."""
