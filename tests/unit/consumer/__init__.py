"""Unit tests of infermatrix's `consumer` part."""
