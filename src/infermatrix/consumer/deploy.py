"""`infermatrix deploy`: a data-parallel deployment of a published, tested image.

One engine server per GPU (no tensor parallelism), each pinned to its GPU by a Compose device
reservation and NVIDIA_VISIBLE_DEVICES, on its own host port. The image is the images.lock
entry's, by digest; the serve command, env and shm size are the ones images.lock recorded at
publish (the data `pull` prints as a `docker run` line); the health route and the attention
backend come from the cell's spec.Launch. On a host without GPUs, N replicas of the CPU cell.

Pure: this module builds the documents; cli/deploy.py reads the inputs (the Proxmox lines come
from host.proxmox.deployment_lines) and writes the files.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..errors import UsageError
from ..job.generate import flag_value
from ..model import capacity
from ..model.profiles import ProfileSpec
from ..model.spec import CONTAINER_MODEL, DEFAULT_PORT, Launch
from ..model.unifiedmem import GIB, Sizing, with_fraction
from ..imageslock import IMAGES_LOCK_NAME
from .pull import serve_command

COMPOSE_NAME = "compose.yaml"
PROXMOX_NAME = "proxmox-lxc.conf"
README_NAME = "README.md"
GPU_LIST = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")
DIGEST_REFERENCE = re.compile(r"[^@\s]+@sha256:[0-9a-f]{64}")
# Loading 27B weights (and compiling kernels on first start) takes minutes: the health check
# only counts failures after the start period.
HEALTH_TIMING = {"gpu": {"interval": "30s", "timeout": "10s", "retries": 3,
                         "start_period": "30m"},
                 "cpu": {"interval": "15s", "timeout": "10s", "retries": 3,
                         "start_period": "15m"}}


@dataclass(frozen=True)
class Deployment:
    compose: dict[str, Any]
    proxmox_lines: list[str] | None  # None on the CPU lane: no GPU to pass to a container
    readme: str

    verified_by: str | None = None  # the key the signed statement verified against; None: not
    sizing: dict[str, Any] | None = None  # ServerSizing.as_dict: what `generate` reads

    def files(self) -> dict[str, str]:
        """File name -> text, as cli/deploy.py writes them into the out directory."""
        out = {COMPOSE_NAME: compose_text(self.compose, self.verified_by),
               README_NAME: self.readme}
        if self.sizing is not None:
            out[SIZING_NAME] = json.dumps(self.sizing, indent=2, sort_keys=True) + "\n"
        if self.proxmox_lines is not None:
            out[PROXMOX_NAME] = "\n".join(self.proxmox_lines) + "\n"
        return out


# --- sizing: each server's concurrent sequences and its predicted throughput (issue 46) -------

SIZING_NAME = "deployment.json"  # job/generate.py DEPLOYMENT_RECORD reads it
DEFAULT_CONTEXT_TOKENS = 8192  # a prompt's tokens the sizing plans for (capacity.PLAN_CONTEXT_TOKENS)
DEFAULT_OUTPUT_TOKENS = 8192  # an answer's tokens (thinking included) the sizing plans for
DEFAULT_PROFILE = "bf16"  # the serve profile (matrix.yaml profiles) every cell is tested with


@dataclass(frozen=True)
class Load:
    """What each server is sized for: deploy's --profile, --context-tokens, --output-tokens
    and --max-seqs (None: the signed command's limit, else the capacity model's)."""
    profile: ProfileSpec  # the serve profile sized and served (matrix.yaml profiles)
    context_tokens: int = DEFAULT_CONTEXT_TOKENS
    output_tokens: int = DEFAULT_OUTPUT_TOKENS
    max_seqs: int | None = None


@dataclass(frozen=True)
class ServerSizing:
    """The engine's sequence limit for each server and the capacity model's prediction."""

    load: Load
    flag: str | None  # --max-num-seqs / --max-running-requests; None: the engine has none
    max_seqs: int | None
    source: str
    device_class: str | None
    model: str
    predicted_tokens_per_s: float | None
    profile_args: tuple[str, ...] = ()  # the profile's flags for the engine (--kv-cache-dtype)

    def as_dict(self) -> dict[str, Any]:
        load = self.load
        return {"max_seqs_flag": self.flag, "max_seqs": self.max_seqs,
                "max_seqs_source": self.source, "device_class": self.device_class,
                "model": self.model, "profile": load.profile.key,
                "profile_args": list(self.profile_args), "checkpoint": load.profile.checkpoint,
                "context_tokens": load.context_tokens, "output_tokens": load.output_tokens,
                "predicted_tokens_per_s_per_replica": self.predicted_tokens_per_s,
                "prediction_source": f"capacity model (data/capacity.yaml): {self.model} on "
                                     f"{self.device_class}, {load.profile.key}, "
                                     f"{load.context_tokens} + {load.output_tokens} tokens at "
                                     f"batch {self.max_seqs}"
                                     if self.predicted_tokens_per_s else None}


def capacity_model_of(model_dir: Path) -> str:
    """The capacity model's shape for the weights deployed: the tiny fixture (its marker
    file) or the matrix's model."""
    fixture = model_dir / "infermatrix-fixture.json"
    return "fixture-tiny" if fixture.is_file() else capacity.DEFAULT_MODEL


def server_sizing(entry: dict[str, Any], model_dir: Path, load: Load) -> ServerSizing:
    """Each server's sequence limit: `load.max_seqs`, else the one the signed command sets,
    else the capacity model's for the cell's device class and the serve profile (its weights'
    and KV cache's bytes) at context + output tokens; and the decode ceiling it predicts
    there. The profile's flags for the engine are added to the serve command (with_max_seqs)."""
    engine = (entry.get("labels") or {}).get("io.infermatrix.engine", "")
    flag = capacity.max_seqs_flag(engine) if engine else None
    device = capacity.gpu_for_arch(entry.get("arch") or "")
    model = capacity_model_of(model_dir)
    signed = flag_value([str(w) for w in entry["run"].get("command") or []],
                        (flag,)) if flag else None
    sized_for = (load.profile.key, load.context_tokens, load.output_tokens)
    if load.max_seqs is not None:
        value, source = load.max_seqs, "--max-seqs"
    elif signed and signed.isdigit():
        value, source = int(signed), "the signed serve command"
    elif device and flag and (device != "cpu-lane" or model == "fixture-tiny"):
        value = capacity.max_num_seqs(device, *sized_for, model_key=model)
        source = (f"capacity model: the sequences of {load.context_tokens} + "
                  f"{load.output_tokens} tokens that fit on {device} ({load.profile.key})")
    elif device == "cpu-lane":
        value, source = None, (f"the capacity model sizes only the fixture on the CPU lane, "
                               f"not {model}: the engine's default")
    else:
        value, source = None, "no device class or flag for this engine: the engine's default"
    predicted = None
    if device and value:
        predicted = round(capacity.estimate(device, *sized_for, model_key=model, batch=value
                                            ).ceiling.tokens_per_s, 1)
    return ServerSizing(load, flag, value, source, device, model, predicted,
                        tuple(load.profile.args_for(engine)))


def with_max_seqs(command: list[str], sizing: ServerSizing | None) -> list[str]:
    """The command with the sizing's sequence limit, unless it sets one already."""
    if sizing is None:
        return command
    command = with_profile(command, sizing.profile_args)
    if not sizing.flag or not sizing.max_seqs or \
            flag_value(command, (sizing.flag,)) is not None:
        return command
    return [*command, sizing.flag, str(sizing.max_seqs)]


def with_profile(command: list[str], args: tuple[str, ...] | list[str]) -> list[str]:
    """The command with a serve profile's flags (`--kv-cache-dtype fp8`); a flag the signed
    command sets already is an error, not overridden silently."""
    flags = [a for a in args if a.startswith("--")]
    clash = [f for f in flags if flag_value(command, (f,)) is not None]
    if clash:
        raise UsageError(f"the signed serve command sets {', '.join(clash)} already; the "
                         "profile's flags would contradict it",
                         fix="deploy the profile the cell was published with")
    return [*command, *args]


def profile_matches_checkpoint(needs: tuple[str, ...], config: dict[str, Any] | None
                               ) -> str | None:
    """Why the model directory's config.json does not fit a profile's weights (None: it fits,
    or there is no config.json to tell): FP8 weights (need fp8-gemm) take a checkpoint whose
    quantization_config says quant_method fp8; the others take one without quantization."""
    if config is None:
        return None
    quant = config.get("quantization_config") or \
        (config.get("text_config") or {}).get("quantization_config") or {}
    method = str(quant.get("quant_method") or "") if isinstance(quant, dict) else ""
    if "fp8-gemm" in needs and method != "fp8":
        return (f"the profile serves FP8 weights, but config.json's quantization_config says "
                f"{method or 'nothing'} (not quant_method fp8)")
    if "fp8-gemm" not in needs and method:
        return (f"the profile serves unquantized weights, but config.json's "
                f"quantization_config says quant_method {method}")
    return None


def parse_indices(spec: str, flag: str, unit: str, hint: str) -> list[int]:
    """`0-7` -> [0..7], `0,2,5` -> [0, 2, 5]; ranges and lists mix (`0-3,6`)."""
    text = spec.replace(" ", "")
    if not GPU_LIST.fullmatch(text):
        raise UsageError(f"{flag} {spec!r} is not a {unit} list: {hint}")
    indices: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        low, high = int(first), int(last or first)
        if high < low:
            raise UsageError(f"{flag} {spec!r}: range {part} runs backwards; write {high}-{low}")
        indices += range(low, high + 1)
    repeated = sorted({i for i in indices if indices.count(i) > 1})
    if repeated:
        raise UsageError(f"{flag} {spec!r} names {unit} {repeated[0]} twice")
    return indices


def parse_gpus(spec: str) -> list[int]:
    return parse_indices(spec, "--gpus", "GPU", "give indices as `nvidia-smi -L` numbers "
                         "them, e.g. --gpus 0-7 or --gpus 0,2,5 (one server per GPU)")


def parse_cpus(spec: str) -> list[int]:
    return parse_indices(spec, "--cpus", "CPU", "give CPU numbers as `lscpu` or "
                         "/sys/devices/system/cpu names them, e.g. --cpus 0-15")


def host_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity: a cgroup's cpuset included)."""
    return sorted(os.sched_getaffinity(0))


def cpu_sets(replicas: int, cpus: list[int]) -> list[str | None]:
    """Disjoint contiguous CPU sets, one per CPU replica, as Compose's `cpuset` writes them.

    vLLM's CPU backend pins its OpenMP threads ("auto": the allowed CPUs of a NUMA node, the
    last ones reserved for its scheduler). Replicas that share a host without a cpuset each pin
    to the same CPUs, and one starves the other: measured on 2 cores, 2 replicas, both bound
    to CPU 0; one answered 56 of 60 prompts, the other 4, and none of the first 400 when cold.
    With fewer CPUs than replicas no set is given (they must share)."""
    size = len(cpus) // replicas if replicas else 0
    if size == 0:
        return [None] * replicas
    return [_cpu_range(cpus[i * size:(i + 1) * size]) for i in range(replicas)]


def _cpu_range(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (the cpuset list syntax)."""
    runs: list[list[int]] = []
    for cpu in cpus:
        if runs and cpu == runs[-1][-1] + 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def locked_entry(lock: dict[str, Any], cell_id: str, lock_name: str = IMAGES_LOCK_NAME
                 ) -> dict[str, Any]:
    """The images.lock entry of the cell, with a digest reference to pin."""
    images = lock.get("images") or {}
    entry = images.get(cell_id)
    if entry is None:
        known = ", ".join(sorted(images)) or "none"
        raise UsageError(f"cell {cell_id} is not in {lock_name} (published cells: {known})",
                         fix="run `infermatrix publish --select CELL` for a tested cell, or "
                         "pass --lock PATH to the images.lock that has it")
    reference = entry.get("reference") or ""
    if not entry.get("digest") or not DIGEST_REFERENCE.fullmatch(reference):
        raise UsageError(f"{lock_name}: cell {cell_id} has no digest reference "
                         f"(reference {reference!r})", fix="publish it again with "
                         f"`infermatrix publish --select {cell_id}`, which pins the digest")
    if not entry.get("run", {}).get("command"):
        raise UsageError(f"{lock_name}: cell {cell_id} records no serve command (`run`)",
                         fix="publish it again with this version of infermatrix")
    return entry


# --- the Compose document -------------------------------------------------------------------

@dataclass(frozen=True)
class Request:
    """One deployment as `infermatrix deploy` asks for it; cli/deploy.py builds it once."""
    entry: dict[str, Any]  # the verified images.lock entry
    launch: Launch  # the signed launch: health route, attention backend, shm
    model_dir: str  # host directory with the weights, mounted read-only
    gpus: list[int] | None = None  # one server per GPU (`gpu<N>`)
    cpu_replicas: int | None = None  # or N CPU servers (`cpu<i>`), each on its share of `cpus`
    cpus: list[int] | None = None  # None: this host's (host_cpus)
    base_port: int | None = None  # the first server's host port (None: the image's)
    bind: str = "127.0.0.1"
    lxc_lines: list[str] | None = None  # host.proxmox.deployment_lines: proxmox-lxc.conf
    lxc_nodes: dict[int, list[str]] | None = None  # GPU -> its /dev nodes, in an LXC guest
    unified: Sizing | None = None  # each GPU server's share of a unified-memory host
    sizing: ServerSizing | None = None  # each server's sequence limit and serve profile


def health_test(route: str, port: int) -> list[str]:
    """The engine's health route over loopback; python3 is in every engine image, curl may not
    be. urlopen raises on a non-2xx answer, so the exit status is the verdict."""
    url = f"http://127.0.0.1:{port}{route}"
    return ["CMD", "python3", "-c",
            f"import urllib.request; urllib.request.urlopen({url!r}, timeout=5)"]


def gpu_reservation(gpu: int) -> dict[str, Any]:
    return {"resources": {"reservations": {"devices": [
        {"driver": "nvidia", "device_ids": [str(gpu)], "capabilities": ["gpu"]}]}}}


def service(r: Request, port: int, gpu: int | None, cpuset: str | None = None
            ) -> dict[str, Any]:
    """One engine server: the locked image by digest, its command on `port`, the model
    read-only, shm, health check; with `gpu`, pinned to that GPU (and, inside an LXC guest,
    given its /dev nodes as devices); on a unified-memory GPU (`r.unified`), its memory
    fraction, container memory limit and /dev/shm from the host's available memory."""
    entry, launch, unified = r.entry, r.launch, r.unified
    run = entry["run"]
    env = dict(sorted(run.get("env", {}).items()))
    if gpu is not None:
        env["NVIDIA_VISIBLE_DEVICES"] = str(gpu)
    body: dict[str, Any] = {
        "image": entry["reference"],
        "command": with_max_seqs(serve_command(entry, port, r.model_dir), r.sizing),
        "environment": env,
        "ports": [f"{r.bind}:{port}:{port}"],
        "shm_size": run.get("shm_size") or launch.shm_size,
        "volumes": [{"type": "bind", "source": r.model_dir, "target": CONTAINER_MODEL,
                     "read_only": True}],
        "healthcheck": {"test": health_test(launch.health or "", port),
                        **HEALTH_TIMING["gpu" if gpu is not None else "cpu"]},
        "restart": "unless-stopped",
        "labels": {"io.infermatrix.cell": entry["cell"],
                   "io.infermatrix.attention-backend": launch.attention_backend or "default"},
    }
    if cpuset is not None:  # a CPU replica's own CPUs (cpu_sets)
        body["cpuset"] = cpuset
    if gpu is None:
        return body
    if unified is not None:
        body["command"] = with_fraction(body["command"], unified)
        body["shm_size"] = unified.shm_size
        body["mem_limit"] = f"{unified.budget // GIB}g"
        body["labels"]["io.infermatrix.unified-memory"] = unified.describe()
    body["deploy"] = gpu_reservation(gpu)
    nodes = (r.lxc_nodes or {}).get(gpu)
    if nodes:  # no-cgroups in an unprivileged LXC: the nodes passed explicitly
        body["devices"] = [f"/dev/{node}:/dev/{node}" for node in nodes]
    return body


def compose_document(r: Request) -> dict[str, Any]:
    """One service per GPU (`gpu<N>`), or one per CPU replica (`cpu<i>`), ports from the base
    port up in service order."""
    check_lane(r.entry, r.launch, r.gpus, r.cpu_replicas)
    base = r.base_port or r.entry["run"].get("port") or DEFAULT_PORT
    named: list[tuple[str, int | None, str | None]]  # (service, GPU, CPU set)
    if r.gpus:
        named = [(f"gpu{g}", g, None) for g in r.gpus]
    else:
        replicas = r.cpu_replicas or 0
        sets = cpu_sets(replicas, r.cpus if r.cpus is not None else host_cpus())
        named = [(f"cpu{i}", None, sets[i]) for i in range(replicas)]
    return {"services": {name: service(r, base + index, gpu, cpuset)
                         for index, (name, gpu, cpuset) in enumerate(named)}}


def check_lane(entry: dict[str, Any], launch: Launch, gpus: list[int] | None,
               cpu_replicas: int | None) -> None:
    cell, is_gpu = entry["cell"], bool(entry["run"].get("gpu"))
    if not launch.health:
        raise UsageError(f"the engine of {cell} has no health route (matrix.yaml engines.*."
                         "health): it serves no model to deploy")
    if cpu_replicas is not None and cpu_replicas < 1:
        raise UsageError(f"--cpu-lane {cpu_replicas}: give at least 1 replica")
    if gpus and cpu_replicas:
        raise UsageError("give --gpus or --cpu-lane, not both")
    if is_gpu and not gpus:
        raise UsageError(f"{cell} is a GPU cell: pass --gpus (e.g. --gpus 0-7); --cpu-lane "
                         "deploys the CPU cell")
    if not is_gpu and not cpu_replicas:
        raise UsageError(f"{cell} is a CPU cell: pass --cpu-lane N for N replicas")
    if not is_gpu and gpus:
        raise UsageError(f"{cell} is a CPU cell: --gpus does not apply, use --cpu-lane N")


NOT_VERIFIED = ("NOT VERIFIED: written with --skip-verify; neither the image's signature, its "
                "test result nor this serve command was checked")


def verification_line(verified_by: str | None) -> str:
    if verified_by is None:
        return NOT_VERIFIED
    return (f"verified: the image's signature, test result and serve command (the signed "
            f"statement) against {verified_by}")


def compose_text(document: dict[str, Any], verified_by: str | None = None) -> str:
    return ("# Written by `infermatrix deploy`: start with `docker compose up -d` (or Debian's "
            "`docker-compose up -d`).\n"
            f"# {verification_line(verified_by)}\n"
            + yaml.safe_dump(document, sort_keys=False, default_flow_style=False, width=100))


# --- README ---------------------------------------------------------------------

README = """\
# Deployment of {cell}

Image `{reference}` (pinned by digest, from images.lock; published {published}, tested:
{verified}): {count} server(s), one per {unit}, attention backend {backend}.

**{verification}**

Start it in this directory with whichever Compose is installed:

    docker compose up -d      # the Compose v2 plugin
    docker-compose up -d      # Debian's docker-compose package

`docker compose ps` shows each service `healthy` once its model has loaded (minutes); the
health check asks `{health}`.

| service | GPU / CPUs | endpoint |
|---|---|---|
{rows}
{notes}"""
GPU_NOTE = "GPU services need the NVIDIA Container Toolkit on the host (device reservations).\n"
PROXMOX_NOTE = (f"Inside a Proxmox LXC guest, first add the lines of `{PROXMOX_NAME}` on the "
                "Proxmox host (and deploy with --lxc).\n")


def readme_text(r: Request, compose: dict[str, Any], has_proxmox: bool) -> str:
    entry, launch, unified = r.entry, r.launch, (r.unified if r.gpus else None)
    services = compose["services"]
    rows = []
    for name, body in services.items():
        host, port, _ = body["ports"][0].rsplit(":", 2)
        gpu = body["environment"].get("NVIDIA_VISIBLE_DEVICES") or \
            (f"CPUs {body['cpuset']}" if body.get("cpuset") else "-")
        rows.append(f"| {name} | {gpu} | http://{host}:{port}/v1 |")
    notes = (GPU_NOTE if launch.gpu else "") + (PROXMOX_NOTE if has_proxmox else "")
    if unified is not None:
        notes += (f"This GPU shares the host's memory. Sized when this was written ("
                  f"{unified.describe()}). Write it again with `infermatrix deploy` when the "
                  "host's load changes (data/unified_memory.yaml says why).\n")
    return README.format(
        cell=entry["cell"], reference=entry["reference"],
        published=entry.get("published", "?"), verified=entry.get("verified", "?"),
        verification=verification_line(entry.get("verified_by")),
        count=len(services), unit="GPU" if launch.gpu else "replica",
        backend=launch.attention_backend or "the engine default", health=launch.health,
        rows="\n".join(rows), notes=("\n" + notes) if notes else "")


def deployment(r: Request) -> Deployment:
    """The files of a deployment; `r.lxc_lines` become proxmox-lxc.conf (GPU lanes only)."""
    compose = compose_document(r)
    proxmox_lines = r.lxc_lines if r.gpus else None
    return Deployment(compose, proxmox_lines, readme_text(r, compose, proxmox_lines is not None),
                      r.entry.get("verified_by"), r.sizing.as_dict() if r.sizing else None)

