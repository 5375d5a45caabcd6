"""Unit tests of infermatrix's `reproducibility` part."""
