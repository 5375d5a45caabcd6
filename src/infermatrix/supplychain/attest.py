"""What publish attests about a digest (besides its SBOM, supplychain/sbom.py), and what pull and
deploy require of it. Pure: journal records and files in, predicates and verdicts out.

- The test result (`TEST_RESULT_TYPE`): the audit and smoke verdicts of the tested image id,
  the levels the tag policy required, the smoke host's facts (GPU, driver) and the tool's
  version. `verdict` is "passed" for a cell tagged on every required level, "built, not
  verified" for a static-only tag (tagging.py), "not tagged" otherwise.
  Its `lock` is the signed statement of what a consumer acts on (`lock_statement`): the
  cell, the digest, the image id, arch, CUDA, the driver floor, the tag kind (`verified`:
  tested or static-only), the io.infermatrix labels and
  images.lock's `run` block (command, env, shm, port, health path, MTP flags). pull, deploy and
  verify compare images.lock's entry with it and act on it alone (sign.signed_entry).
- The provenance (`PROVENANCE_TYPE`), SLSA v1: the matrix and template hashes, the base image,
  the lock's hash, the builder and engine, the exact commands of the cell's build log, the times.
"""

from __future__ import annotations

import calendar
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from .. import __version__
from ..engine.artifacts import sha256_file
from ..journal import CellRecord, StageRecord
from ..model.cell import Cell
from ..model import tagpolicy
from ..outcome import Level, SmokeDetails

TEST_RESULT_TYPE = "https://infermatrix.dev/attestations/test-result/v1"
PROVENANCE_TYPE = "https://slsa.dev/provenance/v1"
SBOM_TYPE = "https://cyclonedx.org/bom"
BUILD_TYPE = "https://infermatrix.dev/build/v1"
BUILDER_ID = "https://infermatrix.dev/builder/buildkit"
PASSED = "passed"
NOT_VERIFIED = "built, not verified"
NOT_TAGGED = "not tagged"
# name in images.lock -> predicate type, in the order pull checks them
PREDICATES = {"test-result": TEST_RESULT_TYPE, "sbom": SBOM_TYPE, "provenance": PROVENANCE_TYPE}


# images.lock fields a consumer acts on: signed in the test-result predicate's `lock`
SIGNED_FIELDS = ("cell", "digest", "image_id", "arch", "cuda", "min_driver", "verified",
                 "labels", "run")


def lock_statement(entry: dict[str, Any]) -> dict[str, Any]:
    """The signed statement of an images.lock entry: every field pull, deploy and verify act
    on, as publish wrote it."""
    return {name: entry.get(name) for name in SIGNED_FIELDS}


def statement_digest(statement: dict[str, Any]) -> str:
    """sha256 of a statement's canonical JSON (images.lock's `signing.statement`: publish signs
    the digest again when what it would sign changed)."""
    text = json.dumps(statement, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _status(stage: StageRecord | None) -> str | None:
    return str(stage.status) if stage else None


def smoke_host_facts(smoke: SmokeDetails) -> dict[str, Any]:
    """The smoke host as smoke recorded it: whether it had a GPU, and the device, compute
    capability and driver the gpu level saw."""
    gpu = smoke.levels.get("gpu", Level()).extra
    facts: dict[str, Any] = {"gpu": bool(smoke.host_gpu)}
    for key in ("device", "capability", "driver_version", "driver"):
        if gpu.get(key) is not None:
            facts[key] = gpu[key]
    for key in ("device", "capability", "driver_version"):
        value = (gpu.get("device_facts") or {}).get(key)
        if value is not None:
            facts.setdefault(key, value)
    return facts


def test_result(record: CellRecord, cell: Cell) -> dict[str, Any]:
    """The test-result predicate of a cell from its journal record."""
    tag, smoke, audit = record.stage("tag"), record.stage("smoke"), record.stage("audit")
    policy, kind = record.tag.policy or tagpolicy.DEFAULT_POLICY, record.tag.kind
    if _status(tag) == "pass" and kind == tagpolicy.TESTED:
        verdict = PASSED
    elif _status(tag) == "pass" and kind == tagpolicy.STATIC_ONLY:
        verdict = NOT_VERIFIED
    else:
        verdict = NOT_TAGGED
    return {
        "cell": cell.id,
        "verdict": verdict,
        "kind": kind,
        "image_id": record.tag.image_id or record.smoke.image_id,
        "tagged_image_id": record.tag.tagged_image_id,
        "required_levels": tagpolicy.required_levels(policy, cell),
        "policy": policy,
        "levels": {name: level.summary() for name, level in sorted(record.smoke.levels.items())},
        "smoke": {"status": _status(smoke), "finished": smoke.finished if smoke else None,
                  "image_id": record.smoke.image_id, "tokens_per_s": record.smoke.tokens_per_s,
                  # the job's shape, where the workload level ran (issue 43): its figures
                  "workload": record.smoke.workload},
        "audit": {"status": _status(audit), "finished": audit.finished if audit else None,
                  "reason": audit.reason if audit else None,
                  "checks": [{"name": c.name, "status": c.status, "detail": c.detail}
                             for c in record.audit.checks]},
        "host": smoke_host_facts(record.smoke),
        "tool": {"name": "infermatrix", "version": __version__},
    }


def verdict_problem(predicate: dict[str, Any], image_id: str | None,
                    require: list[str] | None = None) -> str | None:
    """Why a verified test-result predicate does not let the image run, or None.

    `require`: the levels the consumer requires (default: those the publisher's tag policy
    required, as the predicate says); each must have passed, and the verdict must be "passed".
    """
    verdict = predicate.get("verdict")
    if verdict != PASSED:
        return f"the test-result attestation says {verdict!r}, not {PASSED!r}"
    tested = predicate.get("tagged_image_id") or predicate.get("image_id")
    if image_id and tested and image_id not in (tested, predicate.get("image_id")):
        return f"the test-result attestation is of image {tested}, not {image_id}"
    levels = predicate.get("levels") or {}
    wanted = list(require) if require is not None else list(predicate.get("required_levels") or [])
    for name in wanted:
        status = (levels.get(name) or {}).get("status")
        if status != "pass":
            why = "did not run" if status is None else f"is {status!r}"
            return f"required level {name!r} {why} in the test-result attestation"
    return None


# --- provenance ----------------------------------------------------------------------------

def tree_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []


def logged_commands(log: str | Path | None) -> list[str]:
    """The exact commands a stage log recorded (proc.run writes `$ <command>` first)."""
    if not log or not Path(log).is_file():
        return []
    with Path(log).open(encoding="utf-8", errors="replace") as handle:
        return [line[2:].rstrip("\n") for line in handle if line.startswith("$ ")]


def _started(stage: StageRecord | None) -> str | None:
    finished, seconds = (stage.finished, stage.duration_s) if stage else (None, None)
    if not finished or seconds is None:
        return None
    try:
        end = calendar.timegm(time.strptime(finished, "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end - seconds))


NOT_RECORDED = "not recorded at build time (built by an infermatrix that did not record it)"


def recorded_bases(record: CellRecord) -> dict[str, dict[str, Any]]:
    """Base reference -> {"id", "digest"} as the build stage recorded them when it built the
    image (build.base_images); for a record without them, the base stage's references with
    `note` NOT_RECORDED and no id (an id read now could be another image's)."""
    if record.build.base_images is not None:
        return {ref: dict(base) if isinstance(base, dict) else {"id": base}
                for ref, base in record.build.base_images.items()}
    return {str(ref): {"id": None, "digest": None, "note": NOT_RECORDED}
            for ref in record.details_of("base").get("images") or []}


def provenance(record: CellRecord, cell: Cell, *, matrix_path: Path, root: Path,
               lock_path: Path, cell_dir: Path, engine_facts: dict[str, Any]) -> dict[str, Any]:
    """The SLSA v1 provenance predicate of a cell's image: its base images as the build
    recorded them (recorded_bases, not as the engine holds them now), the commands its build
    log recorded; `engine_facts`: the Docker engine's version and platform (what built it)."""
    build, details = record.stage("build"), record.build

    def file_dep(path: Path, name: str) -> dict[str, Any]:
        return {"uri": f"file:{name}", "digest": {"sha256": sha256_file(path)}}

    def rel(path: Path) -> str:
        try:
            return str(path.relative_to(root))
        except ValueError:
            return str(path)

    deps = [file_dep(matrix_path, rel(matrix_path))]
    deps += [file_dep(p, rel(p)) for p in tree_files(root / "templates")]
    if lock_path.is_file():
        deps.append(file_dep(lock_path, rel(lock_path)))
    deps += [file_dep(p, rel(p)) for p in tree_files(cell_dir)]
    for ref, base in sorted(recorded_bases(record).items()):
        image_id, digest = base.get("id"), base.get("digest")
        dep: dict[str, Any] = {"uri": f"docker-image:{ref}", "name": "base"}
        if image_id and image_id.startswith("sha256:"):
            dep["digest"] = {"sha256": image_id.split(":", 1)[1]}  # the image id (config)
        notes = {k: v for k, v in (("image_id", image_id), ("manifest_digest", digest),
                                   ("note", base.get("note"))) if v}
        if notes:
            dep["annotations"] = notes
        deps.append(dep)
    for name, kernel in sorted(details.kernels.items()):
        deps.append({"uri": f"infermatrix-kernel:{name}", "name": kernel.get("key"),
                     "annotations": {k: kernel.get(k) for k in ("cache", "source")
                                     if kernel.get(k) is not None}})
    builder = record.builder
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {"cell": cell.id, "matrix": rel(matrix_path),
                                   "engine": cell.engine, "engine_version": cell.engine_version,
                                   "arch": cell.arch, "cuda": cell.cuda, "torch": cell.torch},
            "internalParameters": {"build_args": details.build_args,
                                   "secret_ids": details.secret_ids,
                                   "input_hash": record.input_hash},
            "resolvedDependencies": deps,
        },
        "runDetails": {
            "builder": {"id": BUILDER_ID,
                        "version": {"infermatrix": __version__,
                                    **{k: str(v) for k, v in engine_facts.items() if v}},
                        "builderDependencies": [{"name": builder.get("name"),
                                                 "uri": builder.get("endpoint")}]
                        if builder else []},
            "metadata": {"invocationId": record.input_hash or cell.id,
                         "startedOn": _started(build),
                         "finishedOn": build.finished if build else None},
            "byproducts": [{"name": "commands", "mediaType": "text/plain",
                            "annotations": {"commands": logged_commands(
                                build.log if build else None)}}],
        },
    }
