"""Unit tests of infermatrix's `harness` part."""
