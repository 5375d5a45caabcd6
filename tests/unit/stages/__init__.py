"""Unit tests of infermatrix's `stages` part."""
