"""Adapters: Docker engines (docker.py's Engine; only this package imports the SDK), registries."""
