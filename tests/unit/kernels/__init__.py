"""Unit tests of infermatrix's `kernels` part."""
