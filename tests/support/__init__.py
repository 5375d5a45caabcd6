"""Helpers the tests share: engines, registries, sshd, fixtures, recorded answers."""
