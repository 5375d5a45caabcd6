"""Unit tests of the top-level modules (config, errors, state, the import graph) and of the CI rules."""
