"""Unit tests of infermatrix's `engine` part."""
