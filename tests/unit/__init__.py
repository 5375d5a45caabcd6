"""Unit tests, by the package part they test (no Docker; a few modules hold one or two
Docker-marked tests beside their unit tests)."""
