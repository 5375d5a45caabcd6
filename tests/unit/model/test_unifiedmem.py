"""Engine memory on a GPU that shares the host's memory (DGX Spark / GB10; model/unifiedmem.py,
issue 30): sizing from MemAvailable, the deploy it writes and doctor's report. Pure."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infermatrix.cli import main
from infermatrix.host import doctor
from infermatrix.model import unifiedmem
from infermatrix.model.cell import Cell
from infermatrix.stages import publish
from tests.unit.consumer.test_deploy import REPO, lock_entry
from tests.unit.host.test_doctor import HOST, readers

GIB = 2**30
GB10_MEMINFO = HOST / "gb10-sample" / "root" / "proc" / "meminfo"
SM121 = Cell("13.0", "2.11.0", "vllm", "0.20.1", "sm_121")


def test_meminfo_is_read_in_bytes():
    total, available = unifiedmem.parse_meminfo(GB10_MEMINFO.read_text())
    assert total == 127599928 * 1024 and available == 117964624 * 1024
    with pytest.raises(ValueError, match="MemAvailable"):
        unifiedmem.parse_meminfo("MemTotal: 1 kB\n")


def test_the_budget_is_what_is_available_now_less_the_headroom():
    total, available = unifiedmem.parse_meminfo(GB10_MEMINFO.read_text())
    sizing = unifiedmem.size(total, available, "vllm")
    assert sizing.headroom == int(0.10 * total)  # 12.2 GiB: more than the 12 GiB minimum
    assert sizing.budget == available - sizing.headroom
    assert sizing.fraction == 0.82  # 100.3 of 121.7 GiB, rounded down
    assert sizing.flag == "--gpu-memory-utilization" and sizing.shm_size == "8g"
    assert "budget 100.3 GiB" in sizing.describe()
    # a busier host gets less, not the nominal share of the total
    busy = unifiedmem.size(total, available - 40 * GIB, "sglang")
    assert busy.fraction == 0.49 and busy.flag == "--mem-fraction-static"
    two = unifiedmem.size(total, available, "vllm", servers=2)
    assert two.budget == sizing.budget // 2


def test_below_the_floor_nothing_is_started():
    with pytest.raises(unifiedmem.UnifiedMemoryShort) as caught:
        unifiedmem.size(128 * GIB, 20 * GIB, "vllm")
    message = str(caught.value)
    assert "only 20.0 GiB" in message and "16 GiB floor" in message and "\n" not in message


@pytest.mark.parametrize("command, expected", [
    (["vllm", "serve", "/model"], ["vllm", "serve", "/model", "--gpu-memory-utilization", "0.5"]),
    (["serve", "--gpu-memory-utilization", "0.9", "--port", "8000"],
     ["serve", "--port", "8000", "--gpu-memory-utilization", "0.5"]),
    (["serve", "--gpu-memory-utilization=0.9"], ["serve", "--gpu-memory-utilization", "0.5"]),
])
def test_the_fraction_flag_replaces_a_recorded_one(command, expected):
    sizing = unifiedmem.Sizing(100, 80, 10, 50, 0.5, "8g", "--gpu-memory-utilization")
    expected = [a if a != "0.5" else "0.50" for a in expected]
    assert unifiedmem.with_fraction(command, sizing) == expected


def test_unified_arches_come_from_data():
    assert unifiedmem.unified_arch("sm_121") and unifiedmem.unified_arch("sm_121a")
    assert unifiedmem.unified_arch("sm_120") is None
    assert unifiedmem.unified_capability("12.1") == "sm_121"
    assert unifiedmem.unified_capability("9.0") is None


@pytest.fixture
def gb10_lock(tmp_path) -> Path:
    from infermatrix.config import load_matrix

    matrix = load_matrix(REPO / "matrix.yaml")
    lock = publish.empty_images_lock()
    lock["images"][SM121.id] = lock_entry(matrix, SM121)
    path = tmp_path / "images.lock"
    publish.write_images_lock(path, lock)
    return path


def test_deploy_of_an_sm121_cell_sizes_the_engine_and_says_so(tmp_path, gb10_lock, capsys):
    out, models = tmp_path / "out", tmp_path / "models"
    models.mkdir()
    code = main(["deploy", SM121.id, "--matrix", str(REPO / "matrix.yaml"), "--lock",
                 str(gb10_lock), "--model-dir", str(models), "--out", str(out),
                 "--skip-verify", "--gpus", "0", "--memory-from", str(GB10_MEMINFO)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "unified memory: MemAvailable 112.5 of 121.7 GiB" in printed
    service = yaml.safe_load((out / "compose.yaml").read_text())["services"]["gpu0"]
    command = service["command"]
    assert command.count("--gpu-memory-utilization") == 1
    assert command[command.index("--gpu-memory-utilization") + 1] == "0.82"
    assert service["mem_limit"] == "100g" and service["shm_size"] == "8g"
    assert "budget 100.3 GiB" in service["labels"]["io.infermatrix.unified-memory"]
    assert "shares the host's memory" in (out / "README.md").read_text()


def test_deploy_on_a_host_without_room_exits_1_and_writes_nothing(tmp_path, gb10_lock, capsys):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 127599928 kB\nMemAvailable: 20000000 kB\n")
    out = tmp_path / "out"
    code = main(["deploy", SM121.id, "--matrix", str(REPO / "matrix.yaml"), "--lock",
                 str(gb10_lock), "--model-dir", str(tmp_path), "--out", str(out),
                 "--skip-verify", "--gpus", "0", "--memory-from", str(meminfo)])
    assert code == 1 and not out.exists()
    assert "under the 16 GiB floor" in capsys.readouterr().err


def test_doctor_reports_the_unified_pool_of_a_gb10():
    facts = doctor.gather(readers("gb10-sample/nvidia-smi.csv", root=HOST / "gb10-sample" / "root"))
    unified = facts.as_dict()["unified_memory"]
    assert unified["arch"] == "sm_121" and unified["fraction"] == 0.82
    lines = doctor.report_lines(facts, [])
    assert any(line.startswith("unified:  GPU 0") for line in lines)
    assert any("budget 100.3 GiB" in line for line in lines)
    # a discrete card: nothing of the kind
    h200 = doctor.gather(readers("h200-580/nvidia-smi.csv", root=HOST / "gb10-sample" / "root"))
    assert h200.as_dict()["unified_memory"] is None


def test_verify_sizes_an_sm121_engine_from_memavailable_before_anything_runs(tmp_path, gb10_lock,
                                                                              capsys, monkeypatch):
    """The consumer's `verify` on a GB10 sizes the engine as deploy does (fraction flag,
    container memory limit, /dev/shm) and says so before it looks for the image: here on an
    engine endpoint nobody answers (exit 4, no verdict), so the test needs no Docker
    (tests/docker/test_verify_docker.py runs verify on a real engine)."""
    from infermatrix.consumer import verify

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)

    entry = publish.read_images_lock(gb10_lock)["images"][SM121.id]
    sizing = verify.unified_sizing(entry, GB10_MEMINFO)
    assert sizing is not None and sizing.fraction == 0.82 and sizing.flag == \
        "--gpu-memory-utilization"
    assert verify.unified_sizing({**entry, "arch": "sm_120"}, GB10_MEMINFO) is None
    out = tmp_path / "verdict.json"
    code = main(["verify", SM121.id, "--lock", str(gb10_lock), "--model-dir", str(tmp_path),
                 "--memory-from", str(GB10_MEMINFO), "--out", str(out), "--skip-verify"])
    printed = capsys.readouterr()
    assert f"{SM121.id}: unified memory: MemAvailable 112.5 of 121.7 GiB" in printed.out
    assert code == 4 and "cannot reach the Docker engine" in printed.err and not out.exists()


def test_verify_on_a_gb10_without_room_exits_1_and_writes_no_verdict(tmp_path, gb10_lock, capsys):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 127599928 kB\nMemAvailable: 20000000 kB\n")
    out = tmp_path / "verdict.json"
    code = main(["verify", SM121.id, "--lock", str(gb10_lock), "--model-dir", str(tmp_path),
                 "--memory-from", str(meminfo), "--out", str(out), "--skip-verify"])
    assert code == 1 and not out.exists()
    assert "under the 16 GiB floor" in capsys.readouterr().err
