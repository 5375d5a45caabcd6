"""Reproducibility: `repro` builds a rendered cell twice without BuildKit's cache and compares
the images file by file, with every input of the cell and how it is pinned (`infermatrix lock
--verify-repro`). It drives the build step's own functions; no step imports it."""
