"""Publish tagged cells to a registry under immutable tags and record them in images.lock
(imageslock.py); pulling them back by digest is consumer/pull.py.

Only cells whose `tag` stage passed are published, and only the exact image id that stage
tested. Before a push the tag's remote manifest is read: the same image (its config digest is
the image id) is a no-op, another image is refused unless `allow_retag`. A registry only
creates a tag when the manifest is put, after every layer, so an interrupted push leaves no
tag. Moving aliases (`publish.aliases`) are pushed after every immutable tag, each to the
newest cell that shares it, and recorded in images.lock.

images.lock (YAML, sorted keys) holds per published cell the reference to pull by digest, the
versions inside (from the image's io.infermatrix.* labels), arch, CUDA, minimum driver, the
smoke results and the command that serves the model; `infermatrix pull` and `doctor` read it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from packaging.version import InvalidVersion, Version

from .. import journal
from ..journal import CellRecord
from ..engine import registry as registries
from ..config import Matrix
from ..errors import ImageGone, StageFailure, UsageError
from ..model.cell import CPU, Cell
from ..names import CREDENTIALS_FIX, reference_problem
from ..model.selectors import Selection
from ..state import StatePaths
from ..model.rules import load_drivers, min_driver_for
from ..model.spec import CONTAINER_MODEL, CellSpec
from ..watch import Heartbeat
from ..imageslock import (  # noqa: F401
    IMAGES_LOCK_HEADER, IMAGES_LOCK_NAME, IMAGES_LOCK_VERSION, dump_images_lock,
    empty_images_lock, images_lock_problems, read_images_lock, write_images_lock)
from .steps import Run, StepRecord, StepStatus, echo, step_record  # noqa: F401
from .tagging import render_tag

LABEL_PREFIX = "io.infermatrix."
CONTAINER_MODEL_DIR = CONTAINER_MODEL


# --- cells from images ----------------------------------------------------------------------

def infermatrix_labels(labels: dict[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in sorted((labels or {}).items()) if k.startswith(LABEL_PREFIX)}


def cell_from_labels(labels: dict[str, str]) -> Cell:
    """The cell an image says it is, from its io.infermatrix.* labels."""
    try:
        return Cell(cuda=labels["io.infermatrix.cuda"], torch=labels["io.infermatrix.torch"],
                    engine=labels["io.infermatrix.engine"],
                    engine_version=labels["io.infermatrix.engine.version"],
                    arch=labels["io.infermatrix.arch"])
    except KeyError as exc:
        raise StageFailure(f"image lacks the label {exc.args[0]}") from None


def parse_kernels_label(text: str | None) -> dict[str, str]:
    """`flash-attn=2.8.3,flashinfer=0.6.8` -> {"flash-attn": "2.8.3", ...}."""
    pairs = [p.split("=", 1) for p in (text or "").split(",") if "=" in p]
    return {name.strip(): version.strip() for name, version in pairs}


def versions_from_labels(labels: dict[str, str]) -> dict[str, Any]:
    return {"torch": labels.get("io.infermatrix.torch"),
            "engine": labels.get("io.infermatrix.engine"),
            "engine_version": labels.get("io.infermatrix.engine.version"),
            "python": labels.get("io.infermatrix.python"),
            "kernels": parse_kernels_label(labels.get("io.infermatrix.kernels"))}


# --- tags -----------------------------------------------------------------------------------

def target_repository(matrix: Matrix, registry: str | None = None) -> str:
    """`<registry>/<repository>` from matrix.yaml `publish` (or a --registry override)."""
    publish = matrix.publish
    registry = registry or publish.get("registry")
    if not registry:
        raise matrix.error("publish.registry is not set", "publish",
                           fix="set publish.registry (e.g. ghcr.io/acme) or pass --registry")
    problem = reference_problem(registry)
    if problem:
        raise UsageError(problem, fix=CREDENTIALS_FIX)
    repository = publish.get("repository", "infermatrix")
    full = f"{registry.rstrip('/')}/{repository}"
    registries.registry_host(full)  # a registry without a host is a usage error
    return full


def registry_configured(matrix: Matrix, registry: str | None = None) -> bool:
    """Whether the publish step has somewhere to push (publish.registry, or --registry)."""
    return bool(registry or matrix.publish.get("registry"))


def alias_rank(entry: dict[str, Any]) -> tuple:
    """Newest first: engine version, then torch, then CUDA (the alias winner is the max)."""
    def version(text: str | None) -> Version:
        try:
            return Version(text or "0")
        except InvalidVersion:
            return Version("0")
    v = entry.get("versions", {})
    return (version(v.get("engine_version")), version(v.get("torch")),
            version(entry.get("cuda")), entry.get("cell", ""))


def run_spec(matrix: Matrix, spec: CellSpec) -> dict[str, Any]:
    """How to serve the model from this image (images.lock's `run`): the run's CellSpec's
    launch (engine command, env, GPU and shm needs, health path, attention backend), and the
    MTP flags that `deploy`/`pull` add where the model directory holds the MTP weights.

    `{port}` and `{model}` stay as placeholders: `pull` fills them for the consumer's host.
    """
    from ..model.mtp import engine_flags

    assert spec.launch is not None, f"{spec.id} has no launch"
    run = spec.launch.as_run()
    mtp = engine_flags(matrix.model, spec.cell.engine)
    if mtp:  # added by `deploy`/`pull` only where the model directory holds MTP weights
        run["mtp_args"] = mtp
    return run


def smoke_summary(record: CellRecord) -> dict[str, Any]:
    """The smoke results worth keeping in images.lock: per level status, reason, duration."""
    smoke, details = record.stage("smoke"), record.smoke
    return {"status": str(smoke.status) if smoke else None,
            "finished": smoke.finished if smoke else None,
            "levels": {name: level.summary() for name, level in sorted(details.levels.items())},
            "host_gpu": details.host_gpu, "tokens_per_s": details.tokens_per_s,
            "workload": details.workload}


def images_lock_entry(cand: Candidate, labels: dict[str, str], run: dict[str, Any],
                      repository: str, tag: str, digest: str, published: str) -> dict[str, Any]:
    """The candidate's images.lock entry (the cell its `labels` say), pushed to
    `repository:tag` as `digest`."""
    cell, record, image_id = cell_from_labels(labels), cand.record, cand.image_id
    return {
        "cell": cell.id, "repository": repository, "tag": tag, "digest": digest,
        "reference": f"{repository}@{digest}", "image_id": image_id, "published": published,
        "arch": cell.arch, "cuda": cell.cuda,
        # the image's driver floor (plan: CUDA runtime, PTX ISA of PTX-only objects)
        "min_driver": (labels or {}).get("io.infermatrix.driver.floor") or min_driver_for(cell.cuda),
        "min_driver_source": None if cell.cuda == CPU else load_drivers()["source"],
        "versions": versions_from_labels(labels), "labels": infermatrix_labels(labels),
        "verified": record.tag.kind or "tested",  # or static-only (tagging.py)
        "tested_image_id": record.tag.image_id or image_id,
        "smoke": smoke_summary(record),
        "run": run,
    }


# --- what to publish ------------------------------------------------------------------------

@dataclass
class Candidate:
    cell_id: str
    image_id: str | None
    record: CellRecord
    problem: str | None = None  # why it cannot be published although its tag stage passed


def tested_image_id(record: CellRecord) -> str | None:
    """The image the tag stage put its tag on (None when it did not pass).

    That is the tested image itself, or for a static-only tag the derived image tagging.py
    commits from it (details `tagged_image_id`). Refuses a cell rebuilt since it was tagged
    (the journal's image id moved on from the tested one)."""
    tag = record.stage("tag")
    if tag is None or tag.status != journal.Status.PASS:
        return None
    tested, current = record.tag.image_id, record.image_id
    if tested and current and tested != current:
        raise StageFailure(f"{record.cell}: rebuilt since it was tagged (tagged {tested}, "
                           f"built {current}); run smoke and tag again")
    return record.tag.tagged_image_id or tested or current


def tagged_cells(state: StatePaths, selection: Selection) -> list[Candidate]:
    found = []
    for cell_id, record in journal.load_records(state).items():
        if not selection(cell_id):
            continue
        try:
            image_id = tested_image_id(record)
        except StageFailure as exc:
            found.append(Candidate(cell_id, None, record, str(exc)))
            continue
        if image_id:
            found.append(Candidate(cell_id, image_id, record))
    return found


def failed_tags(state: StatePaths, selection: Selection) -> dict[str, str]:
    """Selected cells whose tag stage failed (cell -> why): nothing of theirs is published,
    and the run says so with exit 1."""
    found = {}
    for cell_id, record in journal.load_records(state).items():
        tag = record.stage("tag")
        if selection(cell_id) and tag is not None and tag.status == journal.Status.FAIL:
            reason = tag.reason.splitlines()[0] if tag.reason else ""
            found[cell_id] = f"its tag stage failed ({reason}); fix it and run `infermatrix tag`"
    return found


# --- publish --------------------------------------------------------------------------------

@dataclass
class PublishResult:
    pushed: list[str] = field(default_factory=list)  # cell ids
    unchanged: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # cell id -> why
    failed: dict[str, str] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)  # alias -> "pushed"|"unchanged"

    @property
    def ok(self) -> bool:
        return not self.refused and not self.failed


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Publisher:
    """Publishes candidates one at a time; the lock is rewritten after each cell."""

    def __init__(self, run: Run, repository: str, creds: registries.RegistryCredentials,
                 say: Callable[[str], None] = print, signer: Any = None,
                 cells: dict[str, CellSpec] | None = None) -> None:
        self.ctx, self.repository, self.creds, self.say = run.ctx, repository, creds, say
        self.cells = cells or {}  # the run's CellSpecs by cell id: their launch serves here
        self.docker = run.docker  # the engine that holds the tested images and pushes them
        self.lock_path = lock_path(run)
        self.allow_retag = run.options.allow_retag
        self.signer = signer  # sign.Signer, or None: published unsigned
        self.lock = read_images_lock(self.lock_path)
        self.result = PublishResult()

    def publish_cell(self, cand: Candidate) -> None:
        if cand.problem or not cand.image_id:
            raise StageFailure(cand.problem or f"{cand.cell_id}: no tested image id")
        info = self.docker.inspect_image(cand.image_id)
        if info is None:
            raise ImageGone(f"the tested image {cand.image_id} is no longer in Docker",
                            fix="build, smoke and tag the cell again")
        labels = (info.get("Config") or {}).get("Labels") or {}
        cell = cell_from_labels(labels)
        if cell.id != cand.cell_id or labels.get("io.infermatrix.cell", cell.id) != cell.id:
            raise StageFailure(f"image {cand.image_id} is labelled as cell {cell.id}, "
                               f"the journal says {cand.cell_id}")
        tag = render_tag(self.ctx.matrix.publish.get("tag", "{cell_id}"), cell, self.ctx.matrix)
        spec = self.cells.get(cell.id)
        if spec is None:  # before the push: a mistake pushes nothing
            raise StageFailure(f"{cell.id} is tagged but not planned in {self.ctx.matrix.path} "
                               "(pruned or removed since), so its serve command is not known",
                               fix="publish with the matrix.yaml the image was built from")
        run = run_spec(self.ctx.matrix, spec)
        started = time.monotonic()
        remote = registries.remote_manifest(self.repository, tag, self.creds)
        if remote is not None and remote.config_digest == cand.image_id:
            digest, action = remote.digest, "unchanged"
        else:
            if remote is not None and not self.allow_retag:
                self.result.refused[cand.cell_id] = (
                    f"{self.repository}:{tag} already holds digest {remote.digest} (image "
                    f"{remote.config_digest or 'unknown'}), not the tested image "
                    f"{cand.image_id}; tags are immutable (pass --allow-retag to move it)")
                journal.record_stage(self.ctx.state, cand.cell_id, "publish", journal.Status.FAIL,
                                     reason=self.result.refused[cand.cell_id])
                return
            digest, action = self._push_verified(cand.image_id, tag), "pushed"
        old = self.lock["images"].get(cand.cell_id, {})
        published = old["published"] if old.get("digest") == digest and old.get("published") \
            else _now()
        entry = images_lock_entry(cand, labels, run, self.repository, tag, digest, published)
        entry["signing"] = self._signing(cand, spec, entry, old)
        self.lock["images"][cand.cell_id] = entry
        write_images_lock(self.lock_path, self.lock)
        journal.record_stage(self.ctx.state, cand.cell_id, "publish", journal.Status.PASS,
                             duration_s=time.monotonic() - started,
                             details={"tag": f"{self.repository}:{tag}", "digest": digest,
                                      "reference": entry["reference"], "action": action,
                                      # what `report --merge` puts in a merged images.lock
                                      "lock_entry": entry})
        getattr(self.result, action).append(cand.cell_id)
        signed = "signed" if entry["signing"] else "UNSIGNED"
        self.say(f"{action:9} {self.repository}:{tag}  {digest}  ({cand.cell_id}, {signed})")

    def _signing(self, cand: Candidate, spec: CellSpec, entry: dict[str, Any],
                 old: dict[str, Any]) -> dict[str, Any] | None:
        """images.lock's `signing` of a pushed digest: signed now, kept when this key's
        signature and attestations are already on it, or None without a signing key."""
        if self.signer is None:
            return None
        from ..supplychain import sign
        if sign.still_signed(old, entry, self.signer, self.creds):
            return old["signing"]
        return sign.sign_entry(self.ctx, self.signer, entry, cand.record, spec, self.creds,
                               self.docker)

    def _push_verified(self, image_id: str, tag: str) -> str:
        """Push, then read the tag back: it must hold the image that was tested."""
        with Heartbeat(f"push of {self.repository}:{tag}"):
            digest = registries.push_image(self.docker, image_id, self.repository, tag,
                                           self.creds)
        remote = registries.remote_manifest(self.repository, tag, self.creds)
        if remote is None or remote.digest != digest or remote.config_digest != image_id:
            raise StageFailure(f"after the push {self.repository}:{tag} holds "
                               f"{remote.digest if remote else 'nothing'}, expected {digest} "
                               f"(image {image_id})")
        return digest

    def publish_aliases(self) -> None:
        """Point each alias at the newest published cell that shares it (images here only)."""
        templates = self.ctx.matrix.publish.get("aliases", [])
        winners: dict[str, dict[str, Any]] = {}
        for entry in self.lock["images"].values():
            if entry.get("repository") != self.repository or \
                    not self.docker.image_exists(entry["image_id"]):
                continue
            cell = cell_from_labels(entry["labels"])
            for i, template in enumerate(templates):
                alias = render_tag(template, cell, self.ctx.matrix, ("publish", "aliases", i))
                if alias not in winners or alias_rank(entry) > alias_rank(winners[alias]):
                    winners[alias] = entry
        for alias, entry in sorted(winners.items()):
            remote = registries.remote_manifest(self.repository, alias, self.creds)
            if remote is not None and remote.digest == entry["digest"]:
                action = "unchanged"
            else:
                self._push_verified(entry["image_id"], alias)
                action = "pushed"
            self.lock["aliases"][alias] = {"cell": entry["cell"], "digest": entry["digest"],
                                           "tag": f"{self.repository}:{alias}"}
            write_images_lock(self.lock_path, self.lock)
            self.result.aliases[alias] = action
            self.say(f"{action:9} {self.repository}:{alias} -> {entry['cell']} (alias)")


def lock_path(run: Run) -> Path:
    """The images.lock publish updates: `--lock`, else the one beside matrix.yaml."""
    return run.options.images_lock or run.ctx.root / IMAGES_LOCK_NAME


def publish(run: Run, selection: Selection | None = None,
            creds: registries.RegistryCredentials | None = None,
            say: Callable[[str], None] = print, cells: list[CellSpec] | None = None
            ) -> PublishResult:
    """Push every tagged cell from `run.docker` (its options: the registry, the images.lock,
    retagging); refused or failed cells are reported, the others go on. `cells`: the run's
    CellSpecs (images.lock's serve command comes from them); planned here when not given.

    A refused credential, an unreachable registry or a TLS failure stops the run at once."""
    ctx, selection = run.ctx, selection or Selection()
    repository = target_repository(ctx.matrix, run.options.registry)
    read_images_lock(lock_path(run))  # a damaged images.lock stops the run before any push
    candidates = tagged_cells(ctx.state, selection)
    tag_failures = failed_tags(ctx.state, selection)
    if not candidates:
        say("no tagged cells to publish (a cell publishes after its tag stage passes)")
        return PublishResult(failed=tag_failures)
    if cells is None:  # called on its own: the candidates as the loader plans them
        from .lock import plan_cells
        wanted = {c.cell_id for c in candidates}
        cells = [ctx.spec(p) for p in plan_cells(ctx) if p.planned and p.id in wanted]
    from ..supplychain import sign
    signer = sign.signer_from_env()  # a bad key setting stops the run before any push
    from ..engine import cosign
    cosign.use_state_dir(ctx.state.root)  # cosign's credentials: <state>/secrets, 0700
    creds = creds or registries.credentials_for(repository)
    say(f"publishing {len(candidates)} cell(s) to {repository} as {creds.describe()}")
    say(f"signing: {signer.describe()}" if signer else
        "signing: none (no INFERMATRIX_COSIGN_KEY / _KEY_FILE): published UNSIGNED; pull and "
        "deploy refuse an unsigned digest unless given --skip-verify")
    publisher = Publisher(run, repository, creds, say, signer, {c.id: c for c in cells or []})
    publisher.result.failed.update(tag_failures)
    for cand in candidates:
        try:
            publisher.publish_cell(cand)
        except (registries.RegistryAuthError, registries.RegistryUnreachable,
                registries.RegistryTLSError):
            raise  # every later cell would fail the same way
        except StageFailure as exc:
            publisher.result.failed[cand.cell_id] = str(exc)
            journal.record_stage(ctx.state, cand.cell_id, "publish", journal.Status.FAIL, reason=str(exc))
    if publisher.result.ok:  # aliases only move when every immutable tag is in place
        publisher.publish_aliases()
    return publisher.result

# --------------------------------------------------------------------------------------------
# The pipeline step
# --------------------------------------------------------------------------------------------

def step(run: Run, cells: list[CellSpec]) -> StepRecord:
    """Push the tagged ones of `cells` (`infermatrix publish` and the main job alike); the
    note is the count line, each refused or failed cell gets a line with its reason."""
    options = run.options
    if not options.publish or not registry_configured(run.ctx.matrix, options.registry):
        return StepRecord("publish", StepStatus.NOT_CONFIGURED,
                          note="no publish.registry in matrix.yaml (or --no-publish)")
    if not cells:  # an empty selection would mean every cell
        return step_record("publish", [], [])
    result = publish(run, Selection([c.id for c in cells]), say=echo,
                     cells=cells)  # their CellSpecs: the serve command
    for cell_id, why in sorted(result.refused.items()):
        echo(f"refused   {cell_id}: {why}")
    for cell_id, why in sorted(result.failed.items()):
        echo(f"failed    {cell_id}: {why}")
    return step_record("publish", [*result.pushed, *result.unchanged],
                       [*result.refused, *result.failed],
                       note=f"published {len(result.pushed)}, unchanged {len(result.unchanged)}, "
                            f"refused {len(result.refused)}, failed {len(result.failed)}")
