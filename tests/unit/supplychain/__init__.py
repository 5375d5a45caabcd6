"""Unit tests of infermatrix's `supplychain` part."""
