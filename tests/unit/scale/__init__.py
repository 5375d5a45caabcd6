"""Unit tests of infermatrix's `scale` part."""
