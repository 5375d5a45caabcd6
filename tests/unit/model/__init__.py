"""Unit tests of infermatrix's `model` part."""
