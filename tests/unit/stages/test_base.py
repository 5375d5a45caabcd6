"""Debootstrap bases: the host's mirror and content-derived tags (a real build and import:
tests/docker/test_base_docker.py)."""

from __future__ import annotations

import pytest

from infermatrix.stages import base
from infermatrix.config import load_matrix
from infermatrix.errors import ConfigError

DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example.org/debian-security
Suites: bookworm-security
Components: main
"""


def test_deb822_sources_give_the_main_mirror_and_the_snapshot_noted():
    sources = base.parse_deb822_sources(DEB822)
    picked = base.pick_debian_mirror(sources, "bookworm")
    assert picked.uri == "http://mirror.example.org/debian"
    assert picked.snapshot == "20250520T000000Z"  # the stanza's comment names it


def test_snapshot_mirror_is_recorded():
    text = ("Types: deb\nURIs: http://snapshot.debian.org/archive/debian/20250520T000000Z/\n"
            "Suites: bookworm\n")
    picked = base.pick_debian_mirror(base.parse_deb822_sources(text), "bookworm")
    assert picked.snapshot == "20250520T000000Z"


def test_one_line_sources_list():
    text = ("# comment\ndeb [signed-by=/k.gpg] http://ftp.example.net/debian/ bookworm main\n"
            "deb http://security.example.net/debian-security bookworm-security main\n")
    picked = base.pick_debian_mirror(base.parse_sources_list(text), "bookworm")
    assert picked.uri == "http://ftp.example.net/debian" and picked.snapshot is None


def test_disabled_and_source_only_stanzas_are_skipped():
    text = "Types: deb-src\nURIs: http://a/debian\nSuites: bookworm\n\n" \
           "Types: deb\nURIs: http://b/debian\nSuites: bookworm\nEnabled: no\n"
    assert base.parse_deb822_sources(text) == []


def test_recipe_tag_is_content_derived(test_matrix_path):
    matrix = load_matrix(test_matrix_path)
    sources = base.parse_deb822_sources(DEB822)
    first = base.recipe_for(matrix, "bookworm", sources=sources, architecture="amd64")
    assert first == base.recipe_for(matrix, "bookworm", sources=sources, architecture="amd64")
    assert set(base.REQUIRED_PACKAGES) <= set(first.packages)
    assert first.mirror == "http://mirror.example.org/debian"
    assert first.ref.startswith("infermatrix/base-bookworm:bookworm-")
    other_arch = base.recipe_for(matrix, "bookworm", sources=sources, architecture="arm64")
    assert other_arch.ref != first.ref
    # `mirror: null` resolves to this host's mirror for the build, but the tag hashes only what
    # matrix.yaml declares: committed Dockerfiles render the same on every machine.
    no_sources = base.recipe_for(matrix, "bookworm", sources=[], architecture="amd64")
    assert no_sources.mirror == base.FALLBACK_MIRROR and no_sources.ref == first.ref
    assert first.labels("now")["io.infermatrix.base.mirror"] == "http://mirror.example.org/debian"


def test_image_ref_of_a_wheels_base_is_its_from_base(test_matrix_path):
    matrix = load_matrix(test_matrix_path)
    assert base.image_ref(matrix, "cuda-wheels") == base.image_ref(matrix, "bookworm")


def test_registry_base_is_not_built_here():
    matrix = load_matrix("matrix.yaml")
    with pytest.raises(ConfigError):
        base.image_ref(matrix, "nvidia-devel")


def test_an_arm64_base_has_its_own_tag_and_needs_an_emulator_on_x86(test_matrix_path, tmp_path):
    matrix = load_matrix(test_matrix_path)
    amd64 = base.image_ref(matrix, "bookworm", "linux/amd64")
    arm64 = base.image_ref(matrix, "bookworm", "linux/arm64")
    assert amd64 != arm64
    binfmt = tmp_path / "binfmt"
    binfmt.mkdir()
    assert base.can_run_foreign(base.host_architecture(), binfmt)
    foreign = "arm64" if base.host_architecture() == "amd64" else "amd64"
    assert not base.can_run_foreign(foreign, binfmt)
    (binfmt / base.QEMU_BINFMT[foreign]).write_text("enabled\ninterpreter /usr/bin/qemu\n")
    assert base.can_run_foreign(foreign, binfmt)
