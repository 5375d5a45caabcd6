"""Adapters: the Docker engine (docker.py, the only importer of the SDK) and registries (registry.py)."""
