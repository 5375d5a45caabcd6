"""Triton shared memory: harness/triton_smem.py in a container of the image, no GPU; a
foreign-CPU cell adopts its native twin's result."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterable

from ... import proc
from ...engine.docker import Engine
from ...errors import StageFailure
from ...model import loadedset, tritonlist, tritontwin
from ...model.engines import harness_name
from ...model.coverage import (
    Arch,
)
from .cache import FAIL, HARNESS_DIR, HARNESS_MOUNT, PASS, SKIP
from .result import Check

TRITON_TIMEOUT_S = 1200


def shared_memory_limits() -> tuple[dict[str, int], str]:
    """Per-block shared memory by arch (rules.yaml attention-backend-arch), and its source."""
    from ...model.rules import load_rules

    spec = load_rules()["attention-backend-arch"]["shared_memory_per_block"]
    return {k: int(v) for k, v in spec["bytes"].items()}, spec["source"]


def triton_smem_args(engine_name: str, backend: str | None, targets: list[Arch],
                     model: str | None, serve_args: Iterable[str] = ()) -> list[str] | None:
    """The harness command line for a cell; None when no limit is known for a target. The
    cell's serve arguments go along: a flag such as --gdn-prefill-backend changes the path
    the engine takes, so the audit follows it."""
    limits, _ = shared_memory_limits()
    traits = loadedset.model_traits(model) or {}
    args = ["--engine", harness_name(engine_name), "--backend", backend or "default"]
    for target in targets:
        if target.sm not in limits:
            return None
        args += ["--arch", f"{target.sm}={limits[target.sm]}"]
    for flag, key in (("--head-dim", "head_dim"), ("--q-heads", "num_q_heads"),
                      ("--kv-heads", "num_kv_heads"), ("--vision-head-dim", "vision_head_dim"),
                      ("--vision-heads", "vision_heads"), ("--gdn-key-heads", "gdn_key_heads"),
                      ("--gdn-value-heads", "gdn_value_heads"),
                      ("--gdn-head-dim", "gdn_head_dim"), ("--gdn-conv-width", "gdn_conv_width")):
        if key in traits:
            args += [flag, str(traits[key])]
    return args + [f"--serve-arg={arg}" for arg in serve_args]


def judge_triton(result: dict[str, Any] | None, backend: str | None, output: str = "",
                 engine: tuple[str, str] | None = None) -> Check:
    """The harness result as a check. Kernels that could not be driven make it `skip`, except
    when the cell's rule-chosen backend is triton: then the choice is unverified and fails.
    With `engine` (name, version), the compiled kernel names are held against that version's
    expected list (data/triton_kernels.yaml): a missing kernel or a chunk_o tile choice off
    the rule fails the check, naming it; an unexpected kernel is named."""
    check = judge_shared_memory(result, backend, output)
    if result is None or engine is None:
        return check
    return hold_kernel_list(check, tritonlist.hold(
        tritonlist.expected_kernels(*engine), *engine, result))


def hold_kernel_list(check: Check, verdict: tritonlist.KernelListVerdict) -> Check:
    """The check with the kernel-list verdict in its data and detail; failed when a kernel
    is missing or chunk_o's tiles are off the rule."""
    check.data["kernel_list"] = verdict.as_dict()
    text = tritonlist.verdict_text(verdict)
    if verdict.failed:
        reason = text if check.status == PASS else f"{check.detail}; {text}"
        return Check(check.name, FAIL, reason, check.data)
    check.detail = f"{check.detail}; {text}"
    return check


def judge_shared_memory(result: dict[str, Any] | None, backend: str | None,
                        output: str = "") -> Check:
    """The harness result's shared-memory verdict as a check."""
    _, source = shared_memory_limits()
    if result is None:
        return Check("triton-smem", FAIL, "the Triton shared-memory harness printed no result: "
                     + proc.tail(output, 10))
    per_kernel = [{"arch": a.get("arch"), "family": f.get("family"), "kernel": k.get("kernel"),
                   "shared": k.get("shared"), "limit": k.get("limit"),
                   "num_warps": k.get("num_warps"), "num_stages": k.get("num_stages")}
                  for a in result.get("archs", []) for f in a.get("families", [])
                  for k in f.get("kernels", [])]
    summary = [{"arch": a.get("arch"), **row} for a in result.get("archs", [])
               for f in a.get("families", []) for row in f.get("summary", [])]
    data: dict[str, Any] = {"backend": backend, "kernels": per_kernel, "summary": summary,
            "paths": {a.get("arch"): a.get("paths", {}) for a in result.get("archs", [])},
            "first_start": {a.get("arch"): a.get("first_start", [])
                            for a in result.get("archs", [])},
            "notes": [f"{a.get('arch')}: {n}" for a in result.get("archs", [])
                      for n in a.get("notes", [])],
            "limit_source": source,
            "archs": [{k: v for k, v in a.items()
                       if k not in ("families", "paths", "first_start", "notes")} |
                      {"not_driven": [f"{f['family']}: {f.get('reason')}"
                                      for f in a.get("families", []) if not f.get("driven")]}
                      for a in result.get("archs", [])]}
    status = result.get("status", FAIL)
    sizes = ", ".join(f"{k['kernel']}[{k['family']}]@{k['arch']} {k['shared']} B"
                      for k in per_kernel)
    if status == PASS:
        return Check("triton-smem", PASS, f"every Triton kernel of the serve path fits the "
                     f"per-block shared memory ({triton_digest(summary) or sizes})"
                     + first_start_digest(data["first_start"]), data)
    if status == SKIP and backend != "triton":
        return Check("triton-smem", SKIP, str(result.get("reason")), data)
    reason = str(result.get("reason"))
    if status == SKIP:
        reason = "the cell's attention backend is triton but its kernels were not verified: " \
            + reason
    return Check("triton-smem", FAIL, reason, data)


def triton_digest(summary: list[dict[str, Any]]) -> str:
    """`kernel[family]@arch min-max B (configs, over)` per kernel, short enough to read."""
    parts = []
    for row in summary:
        size = (f"{row['min_shared']} B" if row["min_shared"] == row["max_shared"]
                else f"{row['min_shared']}-{row['max_shared']} B")
        tuned = f", {row['configs']} configs, {row['over']} over" if row["autotuned"] else ""
        parts.append(f"{row['kernel']}[{row['family']}]@{row['arch']} {size}{tuned}")
    return ", ".join(parts)


def first_start_digest(first: dict[str, list[dict[str, Any]]]) -> str:
    """What the engine compiles at first start, named in the verdict (never passed silently)."""
    seen = dict.fromkeys(item["what"] + (f" for {arch} ({item['count']} kernels, "
                                         f"{item['configs']} configs, "
                                         f"{item['compile_s_here']} s to compile here)"
                                         if "count" in item else "")
                         for arch, items in first.items() for item in items)
    return f"; compiled at first start: {'; '.join(seen)}" if seen else ""


def check_triton_smem(image: str, docker: Engine, engine_name: str, backend: str | None,
                      targets: list[Arch], model: str | None, log_path: Path | None = None,
                      timeout: float = TRITON_TIMEOUT_S, emulated: str | None = None,
                      serve_args: Iterable[str] = (), extra_archs: Iterable[Arch] = (),
                      engine_version: str | None = None, cache: Path | None = None) -> Check:
    """The harness for `targets` (and `extra_archs`, a twin's foreign archs, compiled and
    recorded under data["harness"] but not judged here); with `engine_version`, the kernel
    names are held against that version's expected list (judge_triton). With `cache` (a
    directory), the harness's output is kept by what it depends on (census_key) and a re-audit
    of the same image with the same harness and arguments reads it back instead of compiling
    every kernel again (issue 47: 571 s for the vLLM sm_120 cell on 2 cores); the judging
    below runs again either way."""
    from ...harness import _result as harness_result

    if harness_name(engine_name) == "none":
        return Check("triton-smem", SKIP, f"engine {engine_name}: no Triton attention kernels "
                     "known to the harness")
    extra_archs = list(extra_archs)
    engine = (engine_name, engine_version) if engine_version else None
    args = triton_smem_args(engine_name, backend, [*targets, *extra_archs], model, serve_args)
    if args is None:
        return Check("triton-smem", SKIP, "no shared-memory limit recorded for "
                     + ", ".join(t.sm for t in targets) + " (rules.yaml)")
    try:
        output, key, cached = _census_or_run(image, args, timeout, docker, cache)
    except StageFailure:
        return Check("triton-smem", FAIL, f"the Triton compile check ran over {timeout:.0f} s")
    if log_path is not None:
        with open(log_path, "a", encoding="utf-8") as sink:
            sink.write(f"# harness.triton_smem {' '.join(args)}\n{output}\n")
    parsed = harness_result.parse(output)
    if not cached and not not_started(parsed):
        write_census(cache, key, output)
    if emulated and not_started(parsed):  # torch/Triton cannot start under qemu-user
        return Check("triton-smem", SKIP, f"not verified here: the harness cannot run {emulated} "
                     f"({proc.tail(output, 1)}); run the audit on a native host of the image's "
                     "CPU", {"backend": backend, "emulated": emulated})
    own = tritontwin.restrict_to_archs(parsed, [t.sm for t in targets]) \
        if parsed is not None and extra_archs else parsed
    check = judge_triton(own, backend, output, engine)
    if parsed is not None:
        check.data["harness"] = parsed
    if cached:
        check.data["cached"] = key
        check.detail += " (the census of this image, harness and arguments, read from the cache)"
    return check


def _census_or_run(image: str, args: list[str], timeout: float, docker: Engine,
                   cache: Path | None) -> tuple[str, str | None, bool]:
    """(the harness's output, its census key, whether it was read from the census cache):
    read back when `cache` holds it, else run (StageFailure past `timeout`)."""
    key = census_key(docker.image_id_of(image), args) if cache is not None else None
    output = read_census(cache, key)
    if output is not None:
        return output, key, True
    return run_triton_harness(image, args, timeout, docker), key, False


def harness_digest() -> str:
    """sha256 over the harness's own sources (mounted into the container, so part of what the
    census depends on besides the image)."""
    digest = hashlib.sha256()
    for path in sorted(HARNESS_DIR.rglob("*.py")):
        digest.update(str(path.relative_to(HARNESS_DIR)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def census_key(image_id: str | None, args: list[str]) -> str | None:
    """What a Triton census depends on: the image's content (its id: the engine's sources,
    Triton, torch), the harness's sources and its arguments (archs, model shapes, backend,
    serve flags). None without an image id: nothing to key it by, so nothing is cached."""
    if not image_id:
        return None
    text = json.dumps({"image": image_id, "harness": harness_digest(), "args": args},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def read_census(cache: Path | None, key: str | None) -> str | None:
    if cache is None or key is None:
        return None
    try:
        return (cache / f"{key}.txt").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def write_census(cache: Path | None, key: str | None, output: str) -> None:
    """Keep a census that ran (not one that never started: that is learnt again next time)."""
    if cache is None or key is None:
        return
    from ...state import write_text_atomic

    write_text_atomic(cache / f"{key}.txt", output)


def serve_paths(image: str, docker: Engine, engine_name: str, targets: list[Arch],
                model: str | None, serve_args: Iterable[str]) -> dict[str, Any]:
    """The backend choices the engine makes for this serve command on each target (the
    harness's --paths-only: its own selection logic in a container of the image, no compile)."""
    from ...harness import _result as harness_result

    args = triton_smem_args(engine_name, None, targets, model, serve_args) or []
    output = run_triton_harness(image, [*args, "--paths-only"], TRITON_TIMEOUT_S, docker)
    parsed = harness_result.parse(output) or {}
    return {a.get("arch"): a.get("paths", {}) for a in parsed.get("archs", [])}


def run_triton_harness(image: str, args: list[str], timeout: float, docker: Engine) -> str:
    """harness.triton_smem in a container of the image, no network; its output. StageFailure
    when it runs over `timeout` (the container is removed either way)."""
    from ...engine import docker as engine

    mount = engine.Mount(str(HARNESS_DIR), HARNESS_MOUNT, read_only=True)
    container = docker.run_container(engine.ContainerSpec(
        image, args, entrypoint=["python3", "-m", "harness.triton_smem"], mounts=[mount],
        network="none", env={"PYTHONPATH": str(Path(HARNESS_MOUNT).parent)},
        labels={"io.infermatrix.stage": "audit"}))
    try:
        docker.wait_container(container, timeout=timeout)
        return docker.container_logs(container)
    finally:
        docker.remove_container(container)


def not_started(result: dict[str, Any] | None) -> bool:
    """The harness printed nothing, or every arch's compile process died before a result (a
    crash, not a measured kernel): nothing about the kernels was learnt."""
    if result is None:
        return True
    archs = result.get("archs") or []
    return bool(archs) and all(a.get("crashed") for a in archs)
